// Image folders: torchvision's scanning rules, bad files named and skipped, the transforms
// (resampling against PyTorch's antialiased bilinear interpolation, which follows PIL's filter;
// torchvision's crop arithmetic by hand), the background batcher's order, determinism across
// thread counts and resume, and the Fashion-MNIST export read back.
#include "data/image_folder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <set>

#include "io/image.hpp"
#include "scratch_dir.hpp"

namespace mg::data {
namespace {

using io::testing::expect_error;

io::Image random_image(int width, int height, int channels, unsigned seed) {
  std::mt19937 random(seed);
  io::Image image{width, height, channels,
                  std::vector<uint8_t>(static_cast<size_t>(width) * height * channels)};
  for (auto& value : image.pixels) value = static_cast<uint8_t>(random());
  return image;
}

io::Image flat_image(int width, int height, int channels, uint8_t value) {
  return {width, height, channels,
          std::vector<uint8_t>(static_cast<size_t>(width) * height * channels, value)};
}

class ImageFolderTest : public io::testing::ScratchDirTest {
 protected:
  std::filesystem::path make(const std::string& relative) {
    const auto file = path(relative);
    std::filesystem::create_directories(file.parent_path());
    return file;
  }
};

TEST_F(ImageFolderTest, ScansClassesLikeTorchvisionAndSkipsBadEntries) {
  io::write_png(make("root/cat/b.png"), random_image(10, 8, 1, 1));
  io::write_jpeg(make("root/cat/deeper/a.JPG"), random_image(12, 9, 3, 2));
  io::write_png(make("root/dog/c.png"), random_image(7, 7, 4, 3));
  io::testing::write_text(make("root/dog/empty.png"), "");
  io::testing::write_text(make("root/dog/notes.txt"), "not an image");
  io::testing::write_text(make("root/ant/d.pgm"), "P2 2 2 255 0 50 100 150\n");
  std::filesystem::create_directories(path("root/bee"));
  io::write_png(make("root/.thumbnails/x.png"), random_image(4, 4, 3, 4));
  io::write_png(make("root/cat/.hidden/y.png"), random_image(4, 4, 3, 5));

  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("root"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"ant", "bee", "cat", "dog"}));
  std::vector<std::pair<std::string, int32_t>> samples;
  for (const ImageFolderSample& sample : folder.samples()) {
    samples.emplace_back(std::filesystem::relative(sample.path, path("root")).string(),
                         sample.label);
  }
  EXPECT_EQ(samples,
            (std::vector<std::pair<std::string, int32_t>>{
                {"ant/d.pgm", 0}, {"cat/b.png", 2}, {"cat/deeper/a.JPG", 2}, {"dog/c.png", 3}}));
  for (const char* fragment : {"empty.png: the file is empty", "class bee", "keeps label 1",
                               "ignoring 1 files", "notes.txt"}) {
    EXPECT_NE(log.find(fragment), std::string::npos) << "stderr lacks '" << fragment << "':\n"
                                                     << log;
  }

  std::filesystem::create_directories(path("bare/only_class"));
  io::testing::write_text(make("bare/only_class/zero.jpg"), "");
  ::testing::internal::CaptureStderr();
  expect_error([&] { ImageFolder{path("bare")}; }, {path("bare").string(), "has no images"});
  ::testing::internal::GetCapturedStderr();
  expect_error([&] { ImageFolder{path("absent")}; }, {path("absent").string(), "not a folder"});
}

TEST_F(ImageFolderTest, SubsetKeepsClassesAndPicksExamples) {
  for (const char* file : {"root/a/1.pgm", "root/a/2.pgm", "root/b/3.pgm", "root/c/4.pgm"})
    io::testing::write_text(make(file), "P2 1 1 255 7\n");
  const ImageFolder folder(path("root"));
  const std::vector<int64_t> picked = {3, 1};
  const ImageFolder part = folder.subset(picked);
  EXPECT_EQ(part.classes(), folder.classes());
  EXPECT_EQ(part.root(), folder.root());
  ASSERT_EQ(part.size(), 2);
  EXPECT_EQ(part.samples()[0].path, folder.samples()[3].path);
  EXPECT_EQ(part.samples()[0].label, 2);
  EXPECT_EQ(part.samples()[1].path, folder.samples()[1].path);
  EXPECT_EQ(part.samples()[1].label, 0);
  const std::vector<int64_t> outside = {4};
  expect_error([&] { folder.subset(outside); }, {"example 4 is outside", "4 images"});
  expect_error([&] { folder.subset({}); }, {"is empty"});
}

TEST_F(ImageFolderTest, ResampleMatchesPyTorchAntialiasedBilinear) {
  if (!std::filesystem::exists(io::testing::kPython)) GTEST_SKIP() << "no Python";
  const io::Image image = random_image(23, 17, 3, 9);
  io::testing::write_bytes(
      path("image.raw"),
      std::vector<std::byte>(
          reinterpret_cast<const std::byte*>(image.pixels.data()),
          reinterpret_cast<const std::byte*>(image.pixels.data()) + image.pixels.size()));
  // (box x, y, width, height, output width, height): shrinking, growing, both, a crop.
  const std::vector<std::array<int64_t, 6>> cases = {
      {0, 0, 23, 17, 7, 5}, {0, 0, 23, 17, 40, 31}, {0, 0, 23, 17, 11, 30}, {3, 2, 15, 11, 9, 13}};
  std::string arguments;
  for (const auto& item : cases) {
    for (int64_t value : item) arguments += " " + std::to_string(value);
  }
  io::testing::write_text(path("resample.py"), R"PY(
import sys, torch
import torch.nn.functional as F
data = open(sys.argv[1], "rb").read()
image = torch.tensor(list(data), dtype=torch.float64).reshape(17, 23, 3).permute(2, 0, 1)[None] / 255
values = [int(v) for v in sys.argv[3:]]
with open(sys.argv[2], "w") as out:
    for i in range(0, len(values), 6):
        x, y, w, h, ow, oh = values[i:i + 6]
        crop = image[:, :, y:y + h, x:x + w]
        result = F.interpolate(crop, size=(oh, ow), mode="bilinear", align_corners=False, antialias=True)
        out.write(" ".join("%.9g" % v for v in result.flatten().tolist()) + "\n")
)PY");
  ASSERT_EQ(
      io::testing::run_python(path("resample.py"), path("image.raw").string() + " " +
                                                       path("expected.txt").string() + arguments),
      0);
  std::ifstream expected_file(path("expected.txt"));
  for (const auto& [x, y, width, height, out_width, out_height] : cases) {
    std::vector<float> actual(static_cast<size_t>(3 * out_width * out_height));
    resample(image, 3, {x, y, width, height}, out_width, out_height, {0, 0, out_width, out_height},
             actual);
    double worst = 0;
    for (float value : actual) {
      double expected = 0;
      ASSERT_TRUE(expected_file >> expected);
      worst = std::max(worst, std::abs(value - expected));
    }
    EXPECT_LT(worst, 1e-5) << width << "x" << height << " -> " << out_width << "x" << out_height;
  }
}

TEST(ImageTransforms, CentreCropFollowsTorchvisionArithmetic) {
  // 13x9 (landscape): Resize(6) gives int(6 * 13 / 9) = 8 x 6; CenterCrop(4) starts at
  // round((8 - 4) / 2) = 2 and round((6 - 4) / 2) = 1.
  const io::Image image = random_image(13, 9, 3, 4);
  ImageTransform transform;
  transform.size = 4;
  transform.resize_to = 6;
  transform.mean = {0, 0, 0};
  transform.std = {1, 1, 1};
  std::mt19937_64 random(1);
  std::vector<float> out(3 * 16);
  apply_transform(image, transform, random, out);
  std::vector<float> expected(3 * 16);
  resample(image, 3, {0, 0, 13, 9}, 8, 6, {2, 1, 4, 4}, expected);
  EXPECT_EQ(out, expected);

  // Normalisation per channel, gray repeated into three channels, and a crop larger than the
  // image padded with zeros (before normalisation, as torchvision pads the PIL image).
  const io::Image gray = flat_image(3, 3, 1, 51);
  transform = ImageTransform{};
  transform.size = 5;
  transform.resize_to = 0;
  std::vector<float> padded(3 * 25);
  apply_transform(gray, transform, random, padded);
  for (int c = 0; c < 3; ++c) {
    const float inside = (0.2f - kImageNetMean[c]) / kImageNetStd[c];
    const float outside = (0.0f - kImageNetMean[c]) / kImageNetStd[c];
    for (int y = 0; y < 5; ++y) {
      for (int x = 0; x < 5; ++x) {
        const bool in = x >= 1 && x <= 3 && y >= 1 && y <= 3;
        EXPECT_NEAR(padded[c * 25 + y * 5 + x], in ? inside : outside, 1e-5) << c << y << x;
      }
    }
  }
  expect_error([&] { apply_transform(gray, transform, random, std::span(padded).first(10)); },
               {"needs 75 floats"});
}

TEST(ImageTransforms, RandomResizedCropAndFlipFollowTorchvisionRules) {
  std::mt19937_64 random(7);
  for (int i = 0; i < 500; ++i) {
    const CropBox box = random_resized_crop_box(60, 40, 0.08, random);
    ASSERT_GE(box.x, 0);
    ASSERT_GE(box.y, 0);
    ASSERT_LE(box.x + box.width, 60);
    ASSERT_LE(box.y + box.height, 40);
    const double area = static_cast<double>(box.width * box.height) / (60 * 40);
    EXPECT_GE(area, 0.06);  // 0.08 up to the rounding of each side
    const double ratio = static_cast<double>(box.width) / box.height;
    if (box.width < 60 || box.height < 40) {
      EXPECT_GT(ratio, 0.75 * 0.8);
      EXPECT_LT(ratio, 4.0 / 3.0 * 1.25);
    }
  }
  // No box of ratio 3/4..4/3 fits a 100x1 image: the fallback is a centred 1x1 crop.
  const CropBox fallback = random_resized_crop_box(100, 1, 0.08, random);
  EXPECT_EQ((std::array<int64_t, 4>{fallback.x, fallback.y, fallback.width, fallback.height}),
            (std::array<int64_t, 4>{49, 0, 1, 1}));

  // The flip mirrors what the same crop gives without it.
  const io::Image image = random_image(30, 20, 3, 8);
  ImageTransform transform = imagenet_train_transform(8);
  ImageTransform unflipped = transform;
  unflipped.horizontal_flip = false;
  int flipped_count = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::mt19937_64 with_flip(seed), without_flip(seed);
    std::vector<float> a(3 * 64), b(3 * 64);
    apply_transform(image, transform, with_flip, a);
    apply_transform(image, unflipped, without_flip, b);
    if (a == b) continue;
    ++flipped_count;
    for (size_t row = 0; row < 24; ++row)
      std::reverse(b.begin() + row * 8, b.begin() + row * 8 + 8);
    EXPECT_EQ(a, b) << "seed " << seed;
  }
  EXPECT_GT(flipped_count, 10);
  EXPECT_LT(flipped_count, 30);
}

// Example i of `count` is a flat image of value 10 * i + 5 in class i % 3, so a batch reveals
// which examples it holds.
class NumberedFolderTest : public ImageFolderTest {
 protected:
  void SetUp() override {
    ImageFolderTest::SetUp();
    for (int i = 0; i < kCount; ++i) {
      io::write_png(
          make("numbers/class" + std::to_string(i % 3) + "/" + std::to_string(10 + i) + ".png"),
          flat_image(5 + i, 6, i % 2 ? 3 : 1, static_cast<uint8_t>(10 * i + 5)));
    }
  }

  static ImageBatcherOptions options(int64_t batch, int workers, bool drop_last = false) {
    ImageBatcherOptions result;
    result.batch_size = batch;
    result.seed = 17;
    result.drop_last = drop_last;
    result.workers = workers;
    result.transform.size = 4;
    result.transform.resize_to = 4;
    result.transform.mean = {0, 0, 0};
    result.transform.std = {1, 1, 1};
    return result;
  }

  // The example indices of the next batch, checking labels and flatness.
  static std::vector<int> next_examples(ImageFolderBatcher& batcher) {
    std::vector<float> images(static_cast<size_t>(batcher.batch_size() * batcher.image_floats()));
    std::vector<int32_t> labels(static_cast<size_t>(batcher.batch_size()));
    const int64_t count = batcher.next(images, labels);
    std::vector<int> examples;
    for (int64_t i = 0; i < count; ++i) {
      const float value = images[static_cast<size_t>(i * batcher.image_floats())] * 255.0f;
      const int example = static_cast<int>(std::lround((value - 5) / 10));
      EXPECT_NEAR(value, 10 * example + 5, 1e-3);
      EXPECT_NEAR(images[static_cast<size_t>((i + 1) * batcher.image_floats() - 1)] * 255.0f, value,
                  1e-3);
      EXPECT_EQ(labels[static_cast<size_t>(i)], example % 3);
      examples.push_back(example);
    }
    return examples;
  }

  static constexpr int kCount = 11;
};

TEST_F(NumberedFolderTest, EpochsArePermutationsInTheSameOrderForAnyThreadCount) {
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("numbers"));
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(folder.size(), kCount);
  ImageFolderBatcher one(folder, options(4, 1));
  ImageFolderBatcher four(folder, options(4, 4));
  EXPECT_EQ(one.batches_per_epoch(), 3);
  std::vector<std::vector<int>> epochs;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> order;
    for (int b = 0; b < 3; ++b) {
      const std::vector<int> batch = next_examples(one);
      EXPECT_EQ(batch.size(), b < 2 ? 4u : 3u);
      EXPECT_EQ(next_examples(four), batch);
      order.insert(order.end(), batch.begin(), batch.end());
    }
    EXPECT_TRUE(one.epoch_finished());
    EXPECT_EQ(one.epoch(), epoch);
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < kCount; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  // The folder order is sorted by path, so epoch_order's indices are those examples.
  std::vector<int> expected;
  for (uint32_t index : epoch_order(kCount, 17, 1)) {
    const std::string stem = folder.samples()[index].path.stem().string();
    expected.push_back(std::stoi(stem) - 10);
  }
  EXPECT_EQ(epochs[1], expected);
}

TEST_F(NumberedFolderTest, RandomCropsRepeatAcrossThreadCountsAndResume) {
  // Textured images so that crops and flips show.
  for (int i = 0; i < kCount; ++i) {
    io::write_png(
        path("numbers/class" + std::to_string(i % 3) + "/" + std::to_string(10 + i) + ".png"),
        random_image(20 + i, 15, 3, static_cast<unsigned>(i)));
  }
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("numbers"));
  ::testing::internal::GetCapturedStderr();
  ImageBatcherOptions train = options(3, 1, true);
  train.transform = imagenet_train_transform(6);
  std::vector<std::vector<float>> reference;
  BatcherState after_two;
  {
    ImageFolderBatcher batcher(folder, train);
    for (int b = 0; b < 7; ++b) {
      if (b == 2) after_two = batcher.state();
      std::vector<float> images(static_cast<size_t>(3 * batcher.image_floats()));
      std::vector<int32_t> labels(3);
      EXPECT_EQ(batcher.next(images, labels), 3);
      reference.push_back(images);
    }
  }
  EXPECT_EQ(after_two.position, 6);
  train.workers = 3;
  ImageFolderBatcher resumed(folder, train);
  resumed.restore(after_two);
  for (int b = 2; b < 7; ++b) {
    std::vector<float> images(static_cast<size_t>(3 * resumed.image_floats()));
    std::vector<int32_t> labels(3);
    resumed.next(images, labels);
    EXPECT_EQ(images, reference[static_cast<size_t>(b)]) << "batch " << b;
  }
  EXPECT_NE(reference[0], reference[3]);  // epoch 1 shuffles and crops anew
  expect_error([&] { resumed.restore({17, 3, 0, 4}); }, {"position 4"});
  expect_error([&] { resumed.restore({18, 3, 0, 3}); }, {"seed 18"});
  expect_error([&] { ImageFolderBatcher(folder, options(12, 1, true)); }, {"larger than"});
}

// The batchers of two ranks of a data-parallel run: each decodes its half of every batch, and
// the halves in rank order are one process's batches, epoch after epoch, and after a restore.
TEST_F(NumberedFolderTest, ShardsMakeUpTheBatchesOfOneProcess) {
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("numbers"));
  ::testing::internal::GetCapturedStderr();
  ImageFolderBatcher whole(folder, options(4, 2, true));
  std::vector<std::unique_ptr<ImageFolderBatcher>> ranks;
  for (int64_t rank = 0; rank < 2; ++rank) {
    ImageBatcherOptions shard = options(4, 1 + static_cast<int>(rank), true);
    shard.shard = Shard{rank, 2};
    ranks.push_back(std::make_unique<ImageFolderBatcher>(folder, shard));
    EXPECT_EQ(ranks.back()->shard_size(), 2);
  }
  for (int b = 0; b < 6; ++b) {
    if (b == 3) {
      for (auto& rank : ranks) rank->restore(whole.state());
    }
    std::vector<int> halves = next_examples(*ranks[0]);
    const std::vector<int> second = next_examples(*ranks[1]);
    EXPECT_EQ(halves.size(), 2u);
    halves.insert(halves.end(), second.begin(), second.end());
    EXPECT_EQ(halves, next_examples(whole)) << "batch " << b;
    EXPECT_EQ(ranks[1]->state(), whole.state());
  }
  ImageBatcherOptions odd = options(3, 1, true);
  odd.shard = Shard{0, 2};
  expect_error([&] { ImageFolderBatcher(folder, odd); }, {"batch of 3", "2 equal shards"});
}

TEST_F(NumberedFolderTest, UndecodableFilesAreNamedOnceAndReplaced) {
  // Examples 0 and 1 break: a damaged PNG and a truncated JPEG. Each is replaced by the next
  // example in folder (path) order: class0/13.png (example 3) and class1/14.png (example 4).
  io::testing::write_text(path("numbers/class0/10.png"), "\x89PNG\r\n\x1a\n-broken-");
  std::filesystem::remove(path("numbers/class1/11.png"));
  const auto jpeg = io::encode_jpeg(random_image(8, 8, 3, 1));
  io::testing::write_bytes(path("numbers/class1/11.jpg"),
                           std::vector<std::byte>(jpeg.begin(), jpeg.begin() + 30));
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("numbers"));
  ImageFolderBatcher batcher(folder, options(4, 2));
  std::multiset<int> seen;
  for (int b = 0; b < 6; ++b) {
    const std::vector<int> batch = next_examples(batcher);
    EXPECT_EQ(batch.size(), b % 3 < 2 ? 4u : 3u);
    seen.insert(batch.begin(), batch.end());
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(seen.count(0), 0u);
  EXPECT_EQ(seen.count(1), 0u);
  EXPECT_EQ(seen.count(3), 4u);  // itself and a replacement, in each of two epochs
  EXPECT_EQ(seen.count(4), 4u);
  for (const char* file : {"class0/10.png:", "class1/11.jpg:"}) {
    const std::string line = "skipping " + path("numbers").string() + "/" + file;
    EXPECT_NE(log.find(line), std::string::npos) << log;
    EXPECT_EQ(log.find(line), log.rfind(line)) << "named more than once:\n" << log;
  }
}

TEST_F(ImageFolderTest, NothingDecodableIsAnError) {
  io::testing::write_text(make("bad/a/x.png"), "not a png at all");
  io::testing::write_text(make("bad/b/y.jpg"), "nor a jpeg");
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("bad"));
  ImageBatcherOptions options;
  options.batch_size = 2;
  options.transform.size = 4;
  ImageFolderBatcher batcher(folder, options);
  std::vector<float> images(2 * 48);
  std::vector<int32_t> labels(2);
  expect_error([&] { batcher.next(images, labels); }, {path("bad").string(), "none of its 2"});
  ::testing::internal::GetCapturedStderr();
}

TEST_F(ImageFolderTest, DatasetsWriteAsFoldersThatReadBack) {
  Dataset dataset{6, 4, 4, {}, {}};
  std::mt19937 random(3);
  for (int i = 0; i < 6 * 16; ++i)
    dataset.images.push_back(static_cast<float>(random() % 256) / 255);
  dataset.labels = {2, 0, 1, 2, 2, 0};
  write_image_folder(dataset, path("out"), 8, {"0-zero", "1-one", "2-two"});
  ::testing::internal::CaptureStderr();
  const ImageFolder folder(path("out"));
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"0-zero", "1-one", "2-two"}));
  ASSERT_EQ(folder.size(), 6);
  for (const ImageFolderSample& sample : folder.samples()) {
    const int index = std::stoi(sample.path.stem().string());
    EXPECT_EQ(sample.label, dataset.labels[static_cast<size_t>(index)]);
    const io::Image image = io::read_image(sample.path);
    ASSERT_EQ(image.width, 8);
    ASSERT_EQ(image.channels, 1);
    io::Image source{4, 4, 1, {}};
    for (int k = 0; k < 16; ++k) {
      source.pixels.push_back(
          static_cast<uint8_t>(std::lround(dataset.images[index * 16 + k] * 255)));
    }
    std::vector<float> expected(64);
    resample(source, 1, {0, 0, 4, 4}, 8, 8, {0, 0, 8, 8}, expected);
    for (int k = 0; k < 64; ++k) {
      EXPECT_NEAR(image.pixels[static_cast<size_t>(k)], expected[static_cast<size_t>(k)] * 255,
                  0.5001);
    }
  }
  EXPECT_EQ(fashion_mnist_folder_names().front(), "0-t-shirt-top");
  EXPECT_EQ(fashion_mnist_folder_names().back(), "9-ankle-boot");
}

TEST_F(ImageFolderTest, FashionMnistExportHasBothSplitsInLabelOrder) {
  if (!std::filesystem::exists(kFashionMnistDir))
    GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  write_fashion_image_folder(kFashionMnistDir, path("fashion"), 32, 20);
  EXPECT_FALSE(std::filesystem::exists(path("fashion.partial")));
  for (const char* split : {"train", "test"}) {
    ::testing::internal::CaptureStderr();
    const ImageFolder folder(path("fashion") / split);
    ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(folder.classes(), fashion_mnist_folder_names());
    const Dataset source = load_fashion_mnist(kFashionMnistDir, split, 20);
    ASSERT_EQ(folder.size(), 20);
    for (const ImageFolderSample& sample : folder.samples()) {
      EXPECT_EQ(sample.label,
                source.labels[static_cast<size_t>(std::stoi(sample.path.stem().string()))]);
    }
    EXPECT_EQ(io::read_image(folder.samples().front().path).width, 32);
  }
  expect_error([&] { write_fashion_image_folder(kFashionMnistDir, path("fashion"), 32, 1); },
               {path("fashion").string(), "already exists"});
}

}  // namespace
}  // namespace mg::data
