#include "data/fashion_mnist.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>

#include "scratch_dir.hpp"

namespace mg::data {
namespace {

using io::testing::expect_error;

bool have_dataset() {
  return std::filesystem::exists(std::filesystem::path(kFashionMnistDir) /
                                 "t10k-labels-idx1-ubyte.gz");
}

std::array<int64_t, 10> label_histogram(const Dataset& dataset) {
  std::array<int64_t, 10> counts{};
  for (int32_t label : dataset.labels) ++counts.at(static_cast<size_t>(label));
  return counts;
}

TEST(FashionMnist, TrainSplitHas6000OfEachClass) {
  if (!have_dataset()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  const Dataset train = load_fashion_mnist(kFashionMnistDir, "train");
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  EXPECT_EQ(train.images.size(), 60000u * 28 * 28);
  for (int64_t count : label_histogram(train)) EXPECT_EQ(count, 6000);
  const auto [low, high] = std::minmax_element(train.images.begin(), train.images.end());
  EXPECT_EQ(*low, 0.0f);
  EXPECT_EQ(*high, 1.0f);
}

TEST(FashionMnist, TestSplitHas1000OfEachClassAndLimitTakesAPrefix) {
  if (!have_dataset()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  const Dataset test = load_fashion_mnist(kFashionMnistDir, "test");
  EXPECT_EQ(test.count, 10000);
  for (int64_t count : label_histogram(test)) EXPECT_EQ(count, 1000);

  const Dataset head = load_fashion_mnist(kFashionMnistDir, "test", 100);
  EXPECT_EQ(head.count, 100);
  ASSERT_EQ(head.images.size(), 100u * 28 * 28);
  EXPECT_TRUE(std::equal(head.images.begin(), head.images.end(), test.images.begin()));
  EXPECT_TRUE(std::equal(head.labels.begin(), head.labels.end(), test.labels.begin()));
  // Fashion-MNIST's first test image is an ankle boot.
  EXPECT_EQ(kFashionMnistClasses[head.labels[0]], "Ankle boot");
  EXPECT_GT(*std::max_element(head.images.begin(), head.images.begin() + 784), 0.5f);

  EXPECT_EQ(load_fashion_mnist(kFashionMnistDir, "test", 20000).count, 10000);
}

class FashionMnistErrors : public io::testing::ScratchDirTest {
 protected:
  void write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    gzFile file = gzopen(path(name).c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(file);
  }

  static std::vector<uint8_t> header(std::initializer_list<uint32_t> words) {
    std::vector<uint8_t> bytes;
    for (uint32_t word : words) {
      for (int shift = 24; shift >= 0; shift -= 8)
        bytes.push_back(static_cast<uint8_t>(word >> shift));
    }
    return bytes;
  }

  // A valid two-image 2x2 split with labels {3, 7}.
  void write_valid_test_split() {
    auto images = header({0x803, 2, 2, 2});
    images.insert(images.end(), {0, 64, 128, 255, 255, 128, 64, 1});
    write_gz("t10k-images-idx3-ubyte.gz", images);
    auto labels = header({0x801, 2});
    labels.insert(labels.end(), {3, 7});
    write_gz("t10k-labels-idx1-ubyte.gz", labels);
  }
};

TEST_F(FashionMnistErrors, SmallHandMadeSplitLoads) {
  write_valid_test_split();
  const Dataset dataset = load_fashion_mnist(dir_, "test");
  EXPECT_EQ(dataset.count, 2);
  EXPECT_EQ(dataset.labels, (std::vector<int32_t>{3, 7}));
  EXPECT_FLOAT_EQ(dataset.images[3], 1.0f);
  EXPECT_FLOAT_EQ(dataset.images[1], 64 / 255.0f);
}

TEST_F(FashionMnistErrors, MissingDirectorySuggestsThePackage) {
  expect_error([&] { load_fashion_mnist(path("absent"), "train"); },
               {path("absent").string(), "apt-get install dataset-fashion-mnist"});
}

TEST_F(FashionMnistErrors, MissingFileAndUnknownSplit) {
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {path("t10k-images-idx3-ubyte.gz").string(), "missing"});
  expect_error([&] { load_fashion_mnist(dir_, "validation"); }, {"validation"});
}

TEST_F(FashionMnistErrors, BadMagicNumber) {
  write_valid_test_split();
  write_gz("t10k-labels-idx1-ubyte.gz", header({0x803, 2}));
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {path("t10k-labels-idx1-ubyte.gz").string(), "magic number"});
}

TEST_F(FashionMnistErrors, CountMismatchTruncationAndBadLabels) {
  write_valid_test_split();
  write_gz("t10k-labels-idx1-ubyte.gz", header({0x801, 3}));
  expect_error([&] { load_fashion_mnist(dir_, "test"); }, {"2 images", "3 labels"});

  auto labels = header({0x801, 2});
  labels.push_back(1);
  write_gz("t10k-labels-idx1-ubyte.gz", labels);
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {path("t10k-labels-idx1-ubyte.gz").string(), "truncated"});

  labels.push_back(12);
  write_gz("t10k-labels-idx1-ubyte.gz", labels);
  expect_error([&] { load_fashion_mnist(dir_, "test"); }, {"label 12"});

  labels.back() = 2;
  labels.push_back(5);
  write_gz("t10k-labels-idx1-ubyte.gz", labels);
  expect_error([&] { load_fashion_mnist(dir_, "test"); }, {"more data than its header declares"});
}

TEST_F(FashionMnistErrors, HeaderCountsBeyondTheFileAreRefusedBeforeAllocating) {
  write_valid_test_split();
  write_gz("t10k-images-idx3-ubyte.gz", header({0x803, 0xFFFFFFFF, 28, 28}));
  write_gz("t10k-labels-idx1-ubyte.gz", header({0x801, 0xFFFFFFFF}));
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {path("t10k-images-idx3-ubyte.gz").string(), "too few to hold them"});

  write_gz("t10k-images-idx3-ubyte.gz", header({0x803, 1000, 4096, 4096}));
  write_gz("t10k-labels-idx1-ubyte.gz", header({0x801, 1000}));
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {"declares 16777216000 bytes of pixels", "too few to hold them"});
}

TEST_F(FashionMnistErrors, EmptySplitIsAnError) {
  write_gz("t10k-images-idx3-ubyte.gz", header({0x803, 0, 28, 28}));
  write_gz("t10k-labels-idx1-ubyte.gz", header({0x801, 0}));
  expect_error([&] { load_fashion_mnist(dir_, "test"); },
               {path("t10k-images-idx3-ubyte.gz").string(), "holds no images"});
}

}  // namespace
}  // namespace mg::data
