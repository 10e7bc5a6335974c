// `meganeura fashion-folder`, `meganeura train --model resnet18 --data IMAGE_DIR` and `meganeura
// infer` on ResNet checkpoints as a user runs them, with a tiny ResNet-18 (--width 4, 32x32
// images) so that Lavapipe runs it in seconds: bad files named and skipped, checkpoints with
// running statistics and class names, resume, top-5 output, and fine-tuning from torchvision
// state-dict names and from a Hugging Face ResNetForImageClassification folder with a new head.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

const std::string kTiny = " --model resnet18 --width 4 --size 32 --batch 8";

fs::path scratch(const std::string& name) {
  const fs::path folder = fs::temp_directory_path() /
                          ("meganeura-resnet-cli-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(folder);
  fs::create_directories(folder);
  return folder;
}

void append_chunk(std::string& png, const char* type, const std::string& data) {
  const uint32_t length = static_cast<uint32_t>(data.size());
  for (int shift = 24; shift >= 0; shift -= 8) png += static_cast<char>(length >> shift);
  const std::string body = std::string(type, 4) + data;
  png += body;
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
  for (int shift = 24; shift >= 0; shift -= 8) png += static_cast<char>(crc >> shift);
}

// An RGB PNG with 16-bit samples (a bright square on black), written by hand since the project's
// encoder writes 8-bit ones.
void write_16bit_png(const fs::path& path, int side) {
  std::string header;
  for (int value : {0, 0, 0, side, 0, 0, 0, side}) header += static_cast<char>(value);
  header +=
      std::string{16, 2, 0, 0, 0};  // bit depth, colour type RGB, compression, filter, interlace
  std::string raw;
  for (int y = 0; y < side; ++y) {
    raw += '\0';
    for (int x = 0; x < side * 3; ++x)
      raw += std::string(2, (y > side / 4 && y < 3 * side / 4) ? '\xf0' : '\0');
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string compressed(size, '\0');
  compress(reinterpret_cast<Bytef*>(compressed.data()), &size,
           reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()));
  compressed.resize(size);
  std::string png = "\x89PNG\r\n\x1a\n";
  append_chunk(png, "IHDR", header);
  append_chunk(png, "IDAT", compressed);
  append_chunk(png, "IEND", "");
  std::ofstream(path, std::ios::binary) << png;
}

// Fashion-MNIST as PNG folders plus the bad files a real folder has: corrupt JPEGs, an empty
// file, a 16-bit PNG (decodes) and an empty class folder.
fs::path image_folder(const fs::path& folder) {
  const fs::path data = folder / "fashion";
  const Result written = run("fashion-folder " + data.string() + " --size 32 --limit 48");
  EXPECT_EQ(written.status, 0) << written.output;
  // In the validation split too, which decodes every file.
  for (const char* split : {"train", "test"}) {
    std::ofstream(data / split / "3-dress/corrupt.jpg", std::ios::binary)
        << "\xff\xd8\xff\xe0 not a jpeg";
  }
  std::ofstream(data / "train/3-dress/empty.png");
  write_16bit_png(data / "train/8-bag/sixteen.png", 32);
  fs::create_directories(data / "train/9-ankle-boot/nested");
  for (const auto& entry : fs::directory_iterator(data / "train/9-ankle-boot"))
    if (entry.is_regular_file()) fs::remove(entry.path());
  return data;
}

std::vector<float> floats_of(const mg::io::TensorRecord& record) {
  std::vector<float> values(record.bytes.size() / 4);
  std::memcpy(values.data(), record.bytes.data(), record.bytes.size());
  return values;
}

TEST(ResNetCli, TrainsOnAnImageFolderWithBadFilesResumesAndInfers) {
  const fs::path folder = scratch("train");
  const fs::path data = image_folder(folder);
  const fs::path out = folder / "run";
  const std::string common = " --data " + data.string() + kTiny + " --checkpoint-every 2";
  const Result first = run("train --out " + out.string() + common + " --max-steps 3");
  ASSERT_EQ(first.status, 0) << first.output;
  for (const char* named : {"corrupt.jpg", "empty.png", "9-ankle-boot"})
    EXPECT_NE(first.output.find(named), std::string::npos) << named << "\n" << first.output;
  EXPECT_EQ(first.output.find("sixteen.png"), std::string::npos) << "a 16-bit PNG decodes";
  for (const char* file : {"checkpoint.safetensors", "metrics.jsonl", "training.png"})
    EXPECT_TRUE(fs::exists(out / file)) << file;

  const Result resumed = run("train --out " + out.string() + common + " --max-steps 5 --resume " +
                             (out / "checkpoint.safetensors").string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  const mg::io::Checkpoint checkpoint = mg::io::load_checkpoint(out / "checkpoint.safetensors");
  EXPECT_EQ(checkpoint.step, 5);
  EXPECT_EQ(checkpoint.extra.at("classes").size(), 10u);
  EXPECT_EQ(checkpoint.extra.at("classes")[3], "3-dress");
  cli_test::expect_unreadable_resume_refused("--out " + (folder / "unread").string() + common,
                                             folder);
  // Five training steps moved the running statistics off their start (mean 0, variance 1).
  const mg::io::TensorRecord* mean = checkpoint.find("layer1.0.bn1.running_mean");
  ASSERT_NE(mean, nullptr);
  double moved = 0;
  for (float value : floats_of(*mean)) moved += std::abs(value);
  EXPECT_GT(moved, 1e-4);

  // The validation accuracy the run printed is what infer measures on the same folder.
  const std::smatch found = [&] {
    std::smatch match;
    std::regex_search(resumed.output, match, std::regex("validation accuracy: ([0-9.]+)%"));
    return match;
  }();
  ASSERT_FALSE(found.empty()) << resumed.output;
  const Result evaluated = run("infer " + (out / "checkpoint.safetensors").string() + " --data " +
                                   (data / "test").string() + " --json",
                               false);
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_NEAR(100 * nlohmann::json::parse(evaluated.output)["accuracy"].get<double>(),
              std::stod(found[1]), 0.01);

  const fs::path image = *fs::directory_iterator(data / "test/1-trouser");
  const Result inferred =
      run("infer " + (out / "checkpoint.safetensors").string() + " " + image.string() + " --json",
          false);
  ASSERT_EQ(inferred.status, 0) << inferred.output;
  const nlohmann::json top = nlohmann::json::parse(inferred.output).at(0).at("top");
  ASSERT_EQ(top.size(), 5u);
  double total = 0;
  for (size_t i = 0; i < top.size(); ++i) {
    total += top[i]["probability"].get<double>();
    if (i > 0) {
      EXPECT_LE(top[i]["probability"], top[i - 1]["probability"]);
    }
  }
  EXPECT_LE(total, 1.0 + 1e-9);
  EXPECT_EQ(top[0]["class"], checkpoint.extra["classes"][top[0]["index"].get<int>()]);
  const Result printed =
      run("infer " + (out / "checkpoint.safetensors").string() + " " + image.string() + " --top 3");
  EXPECT_NE(printed.output.find(top[0]["class"].get<std::string>()), std::string::npos)
      << printed.output;
  fs::remove_all(folder);
}

// The Hugging Face name of a torchvision one (docs/RESNET.md's table), for a basic-block model.
std::string hugging_face_name(const std::string& name) {
  std::smatch match;
  if (name == "conv1.weight") return "resnet.embedder.embedder.convolution.weight";
  if (name.starts_with("bn1.")) return "resnet.embedder.embedder.normalization." + name.substr(4);
  if (name.starts_with("fc.")) return "classifier.1." + name.substr(3);
  const std::string prefix = "resnet.encoder.stages.";
  if (std::regex_match(name, match, std::regex(R"(layer(\d)\.(\d+)\.conv(\d)\.weight)")))
    return prefix + std::to_string(std::stoi(match[1]) - 1) + ".layers." + match[2].str() +
           ".layer." + std::to_string(std::stoi(match[3]) - 1) + ".convolution.weight";
  if (std::regex_match(name, match, std::regex(R"(layer(\d)\.(\d+)\.bn(\d)\.(.*))")))
    return prefix + std::to_string(std::stoi(match[1]) - 1) + ".layers." + match[2].str() +
           ".layer." + std::to_string(std::stoi(match[3]) - 1) + ".normalization." + match[4].str();
  if (std::regex_match(name, match, std::regex(R"(layer(\d)\.(\d+)\.downsample\.(\d)\.(.*))")))
    return prefix + std::to_string(std::stoi(match[1]) - 1) + ".layers." + match[2].str() +
           ".shortcut." + (match[3] == "0" ? "convolution." : "normalization.") + match[4].str();
  ADD_FAILURE() << "no Hugging Face name for " << name;
  return name;
}

// Weights of a 10-class model fine-tuned on 3 classes: every tensor but the head loads (a
// vanishing learning rate keeps them as loaded), the head is new.
// A learning rate of 1e30 blows the weights up with the first update, so the second step's
// forward overflows: the run stops non_finite, --detect-anomaly names the op that made the
// first NaN or infinity, in the forward pass, with the parameter nearest to it, and the
// checkpoint holds no running statistic of the dropped step.
TEST(ResNetCli, DetectAnomalyNamesTheFirstOp) {
  const fs::path folder = scratch("anomaly");
  const Result written =
      run("fashion-folder " + (folder / "fashion").string() + " --size 32 --limit 16");
  ASSERT_EQ(written.status, 0) << written.output;
  const Result found =
      run("train --out " + (folder / "run").string() + " --data " + (folder / "fashion").string() +
          kTiny + " --lr 1e30 --max-steps 4 --detect-anomaly");
  EXPECT_EQ(found.status, 73) << found.output;
  EXPECT_NE(found.output.find("the first non-finite value is %"), std::string::npos)
      << found.output;
  EXPECT_NE(found.output.find("(forward, near '"), std::string::npos) << found.output;
  // The dropped step kept the running statistics too: the checkpoint's are those of step 1.
  const mg::io::Checkpoint checkpoint =
      mg::io::load_checkpoint(folder / "run" / "checkpoint.safetensors");
  size_t statistics = 0;
  for (const mg::io::TensorRecord& record : checkpoint.tensors) {
    if (record.name.find("running_") == std::string::npos) continue;
    ++statistics;
    for (float value : floats_of(record)) EXPECT_TRUE(std::isfinite(value)) << record.name;
  }
  EXPECT_GT(statistics, 0u);
  fs::remove_all(folder);
}

TEST(ResNetCli, FineTunesTorchvisionAndHuggingFaceWeightsWithANewHead) {
  const fs::path folder = scratch("finetune");
  const fs::path data = folder / "three";
  for (const char* name : {"a", "b", "c"}) fs::create_directories(data / name);
  const fs::path fashion = image_folder(folder);
  int copied = 0;
  for (const auto& entry : fs::recursive_directory_iterator(fashion / "test")) {
    if (entry.path().extension() != ".png") continue;
    fs::copy_file(entry.path(), data / std::string(1, "abc"[copied % 3]) / entry.path().filename(),
                  fs::copy_options::overwrite_existing);
    ++copied;
  }
  // A 10-class starting point: the graph's own initialisation, saved by a short run.
  const fs::path start = folder / "start";
  ASSERT_EQ(run("train --out " + start.string() + " --data " + fashion.string() + kTiny +
                " --max-steps 1 --validation 0 --epochs 1")
                .status,
            0);
  const mg::io::Checkpoint trained = mg::io::load_checkpoint(start / "checkpoint.safetensors");
  mg::io::SafetensorsFile torchvision, hugging_face;
  for (const mg::io::TensorRecord& record : trained.tensors) {
    if (record.name.starts_with("optimizer.")) continue;
    torchvision.tensors.push_back(record);
    mg::io::TensorRecord renamed = record;
    renamed.name = hugging_face_name(record.name);
    hugging_face.tensors.push_back(renamed);
  }
  mg::io::write_safetensors(folder / "tv.safetensors", torchvision);
  const fs::path hf = folder / "hf";
  fs::create_directories(hf);
  mg::io::write_safetensors(hf / "model.safetensors", hugging_face);
  std::ofstream(hf / "config.json")
      << nlohmann::json{{"model_type", "resnet"},
                        {"architectures", {"ResNetForImageClassification"}},
                        {"depths", {2, 2, 2, 2}},
                        {"hidden_sizes", {4, 8, 16, 32}},
                        {"embedding_size", 4},
                        {"layer_type", "basic"},
                        {"hidden_act", "relu"},
                        {"num_labels", 10}}
             .dump();

  // The second run holds a quarter of the 48 images out at random.
  for (const auto& [model, split] :
       {std::pair{
            std::string(" --model resnet18 --weights ") + (folder / "tv.safetensors").string(),
            std::string(" --validation 0")},
        std::pair{" --model " + hf.string(), std::string(" --validation 0.25")}}) {
    const fs::path out = folder / "tuned";
    fs::remove_all(out);
    const Result tuned =
        run("train --out " + out.string() + " --data " + data.string() + model + split +
            " --size 32 --batch 8 --max-steps 1 --optimizer sgd --lr 1e-30");
    ASSERT_EQ(tuned.status, 0) << tuned.output;
    EXPECT_NE(
        tuned.output.find(split == " --validation 0" ? "48 training images, no validation"
                                                     : "36 training images, 12 validation images"),
        std::string::npos)
        << tuned.output;
    EXPECT_NE(tuned.output.find("new head fc for 3 classes (the weights have 10)"),
              std::string::npos)
        << tuned.output;
    const mg::io::Checkpoint checkpoint = mg::io::load_checkpoint(out / "checkpoint.safetensors");
    EXPECT_EQ(checkpoint.find("fc.weight")->shape, (mg::Shape{3, 32}));
    for (const char* name :
         {"conv1.weight", "layer3.1.conv2.weight", "layer4.0.downsample.1.bias"}) {
      const std::vector<float> loaded = floats_of(*checkpoint.find(name));
      const std::vector<float> expected = floats_of(*trained.find(name));
      ASSERT_EQ(loaded.size(), expected.size());
      for (size_t i = 0; i < loaded.size(); ++i)
        ASSERT_NEAR(loaded[i], expected[i], 1e-6) << model << " " << name << "[" << i << "]";
    }
  }
  const Result wrong =
      run("train --out " + (folder / "wrong").string() + " --data " + data.string() +
          " --model resnet34 --weights " + (folder / "tv.safetensors").string());
  EXPECT_EQ(wrong.status, 1);
  EXPECT_NE(wrong.output.find("pass --model resnet18"), std::string::npos) << wrong.output;
  fs::remove_all(folder);
}

}  // namespace
