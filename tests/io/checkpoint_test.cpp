#include "io/checkpoint.hpp"

#include <gtest/gtest.h>

#include "scratch_dir.hpp"
#include "tensor_samples.hpp"

namespace mg::io {
namespace {

using testing::expect_error;

class CheckpointTest : public testing::ScratchDirTest {
 protected:
  Checkpoint sample() {
    std::mt19937 random(5);
    Checkpoint checkpoint;
    checkpoint.model_config = {{"kind", "mlp"}, {"hidden", {128, 64}}, {"classes", 10}};
    checkpoint.step = 1234;
    checkpoint.epoch = 3;
    checkpoint.optimizer = {{"kind", "adamw"}, {"lr", 1e-3}, {"beta1", 0.9}};
    checkpoint.extra = {{"batcher", {{"seed", 1}, {"position", 640}}}};
    checkpoint.tensors.push_back(
        testing::random_tensor("model.layers.0.weight", DType::f32, {4, 6}, random));
    checkpoint.tensors.push_back(
        testing::random_tensor("model.layers.0.bias", DType::f32, {4}, random));
    checkpoint.tensors.push_back(
        testing::random_tensor("optimizer.model.layers.0.weight.m", DType::f32, {4, 6}, random));
    return checkpoint;
  }
};

TEST_F(CheckpointTest, RoundTripKeepsEverything) {
  const Checkpoint saved = sample();
  save_checkpoint(path("runs/x/ckpt.safetensors"), saved);
  const Checkpoint loaded = load_checkpoint(path("runs/x/ckpt.safetensors"));
  EXPECT_EQ(loaded.model_config, saved.model_config);
  EXPECT_EQ(loaded.step, saved.step);
  EXPECT_EQ(loaded.epoch, saved.epoch);
  EXPECT_EQ(loaded.optimizer, saved.optimizer);
  EXPECT_EQ(loaded.extra, saved.extra);
  ASSERT_EQ(loaded.tensors.size(), saved.tensors.size());
  for (const TensorRecord& tensor : saved.tensors) {
    const TensorRecord* found = loaded.find(tensor.name);
    ASSERT_NE(found, nullptr) << tensor.name;
    EXPECT_EQ(found->shape, tensor.shape);
    EXPECT_EQ(found->bytes, tensor.bytes);
  }
}

TEST_F(CheckpointTest, IsReadableAsPlainSafetensors) {
  save_checkpoint(path("ckpt.safetensors"), sample());
  const SafetensorsFile file = read_safetensors(path("ckpt.safetensors"));
  const auto header = nlohmann::json::parse(file.metadata.at("meganeura"));
  EXPECT_EQ(header["format"], kCheckpointFormat);
  EXPECT_EQ(header["step"], 1234);
  EXPECT_NE(file.find("model.layers.0.bias"), nullptr);
}

TEST_F(CheckpointTest, MissingFile) {
  expect_error([&] { load_checkpoint(path("none.safetensors")); },
               {"no checkpoint at " + path("none.safetensors").string()});
}

TEST_F(CheckpointTest, PlainWeightsFileIsNotACheckpoint) {
  SafetensorsFile weights;
  weights.tensors = sample().tensors;
  write_safetensors(path("weights.safetensors"), weights);
  expect_error([&] { load_checkpoint(path("weights.safetensors")); },
               {path("weights.safetensors").string(), "not a Meganeura checkpoint"});
}

TEST_F(CheckpointTest, UnsupportedFormatVersion) {
  SafetensorsFile file;
  file.metadata["meganeura"] = R"({"format": 2, "step": 1, "epoch": 0})";
  write_safetensors(path("future.safetensors"), file);
  expect_error([&] { load_checkpoint(path("future.safetensors")); },
               {path("future.safetensors").string(), "format version 2", "version 1"});
}

TEST_F(CheckpointTest, CorruptMetadata) {
  SafetensorsFile file;
  file.metadata["meganeura"] = "{format";
  write_safetensors(path("bad.safetensors"), file);
  expect_error([&] { load_checkpoint(path("bad.safetensors")); },
               {"checkpoint " + path("bad.safetensors").string(), "not valid JSON"});
  file.metadata["meganeura"] = R"({"format": 1, "epoch": 0})";
  write_safetensors(path("bad.safetensors"), file);
  expect_error([&] { load_checkpoint(path("bad.safetensors")); }, {"no integer \"step\""});
}

TEST_F(CheckpointTest, DeeplyNestedMetadataIsRefusedBeforeParsing) {
  SafetensorsFile file;
  file.metadata["meganeura"] = R"({"format": 1, "step": 1, "epoch": 0, "extra": )" +
                               std::string(30000, '[') + std::string(30000, ']') + "}";
  write_safetensors(path("deep.safetensors"), file);
  try {
    load_checkpoint(path("deep.safetensors"));
    FAIL() << "deeply nested metadata was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path("deep.safetensors").string()), std::string::npos) << message;
    EXPECT_NE(message.find("nests JSON deeper than 16 levels"), std::string::npos) << message;
    EXPECT_LT(message.size(), 400u);
  }
}

TEST_F(CheckpointTest, NegativeOrHugeStepAndEpochAreCorrupt) {
  SafetensorsFile file;
  for (const char* fields :
       {R"("step": -5, "epoch": 0)", R"("step": -9223372036854775808, "epoch": 0)",
        R"("step": 18446744073709551615, "epoch": 0)", R"("step": 1, "epoch": -1)"}) {
    file.metadata["meganeura"] = std::string(R"({"format": 1, )") + fields + "}";
    write_safetensors(path("range.safetensors"), file);
    expect_error([&] { load_checkpoint(path("range.safetensors")); },
                 {path("range.safetensors").string(), "is corrupt", "outside 0.."});
  }
}

TEST_F(CheckpointTest, TruncatedCheckpointSaysSo) {
  save_checkpoint(path("ckpt.safetensors"), sample());
  std::filesystem::resize_file(path("ckpt.safetensors"),
                               std::filesystem::file_size(path("ckpt.safetensors")) - 10);
  expect_error([&] { load_checkpoint(path("ckpt.safetensors")); },
               {"checkpoint " + path("ckpt.safetensors").string() + " is truncated"});
}

TEST_F(CheckpointTest, ModelMismatchShowsBothConfigs) {
  const nlohmann::json program = {{"kind", "mlp"}, {"hidden", {128}}};
  const nlohmann::json saved = {{"kind", "mlp"}, {"hidden", {256}}};
  check_same_model(program, program, "ckpt.safetensors");
  expect_error([&] { check_same_model(program, saved, "runs/a/ckpt.safetensors"); },
               {"checkpoint runs/a/ckpt.safetensors was saved for model " + saved.dump(),
                "but the program is " + program.dump()});
}

}  // namespace
}  // namespace mg::io
