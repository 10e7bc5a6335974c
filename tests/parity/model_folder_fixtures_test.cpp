// Model folders written by the real Hugging Face libraries (transformers' save_pretrained,
// torchvision state dicts saved with safetensors; versions in tests/fixtures/model_folders/
// versions.json) open with ModelFolder, and every tensor's name, shape, dtype, sum and first
// values match the expected.json that PyTorch wrote beside each (float64 sums of the stored
// values).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_folder.hpp"
#include "meganeura/error.hpp"

namespace mg {
namespace {

const std::filesystem::path kFixtures =
    std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests" / "fixtures" / "model_folders";

io::StoredDType stored_dtype_of(const std::string& torch_name) {
  const std::map<std::string, io::StoredDType> dtypes = {{"float32", io::StoredDType::f32},
                                                         {"float16", io::StoredDType::f16},
                                                         {"bfloat16", io::StoredDType::bf16},
                                                         {"float64", io::StoredDType::f64},
                                                         {"int64", io::StoredDType::i64}};
  const auto it = dtypes.find(torch_name);
  if (it == dtypes.end()) throw Error("expected.json names an unknown dtype " + torch_name);
  return it->second;
}

// A folder with save_pretrained's weights opens as a folder; a torchvision state dict is one
// .safetensors file beside expected.json, opened as a file.
std::filesystem::path model_path(const std::filesystem::path& fixture) {
  if (std::filesystem::exists(fixture / "config.json")) return fixture;
  for (const auto& entry : std::filesystem::directory_iterator(fixture)) {
    if (entry.path().extension() == ".safetensors") return entry.path();
  }
  return fixture;
}

void expect_matches_expected_json(const std::string& name) {
  SCOPED_TRACE(name);
  const std::filesystem::path fixture = kFixtures / name;
  std::ifstream expected_stream(fixture / "expected.json");
  ASSERT_TRUE(expected_stream) << "no expected.json in " << fixture;
  const nlohmann::json expected = nlohmann::json::parse(expected_stream);
  const io::ModelFolder folder = io::ModelFolder::open(model_path(fixture));

  std::vector<std::string> expected_names;
  for (const auto& [tensor_name, want] : expected.items()) expected_names.push_back(tensor_name);
  std::sort(expected_names.begin(), expected_names.end());
  ASSERT_EQ(folder.tensor_names(), expected_names);
  for (const auto& [tensor_name, want] : expected.items()) {
    SCOPED_TRACE(tensor_name);
    const io::TensorView& view = folder.at(tensor_name);
    EXPECT_EQ(view.shape, want["shape"].get<Shape>());
    EXPECT_EQ(view.stored_dtype, stored_dtype_of(want["dtype"].get<std::string>()));
    const std::vector<float> values = io::tensor_as_f32(view);
    double sum = 0;
    double magnitude = 0;
    for (float value : values) {
      sum += value;
      magnitude += std::fabs(value);
    }
    // Only the order of the float64 additions differs from PyTorch's: each of the n additions
    // rounds by at most 2^-53 of the running magnitude.
    const double bound = static_cast<double>(values.size()) * 0x1p-52 * magnitude;
    EXPECT_NEAR(sum, want["sum"].get<double>(), bound);
    const std::vector<double> first = want["first"].get<std::vector<double>>();
    ASSERT_GE(values.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(values[i], first[i]) << "element " << i;
  }
}

TEST(HuggingFaceModelFolders, TinyLlamaF32SingleFile) {
  expect_matches_expected_json("llama_tiny_f32");
  const io::ModelFolder folder = io::ModelFolder::open(kFixtures / "llama_tiny_f32");
  ASSERT_TRUE(folder.has_config());
  EXPECT_EQ(folder.config()["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(folder.config()["vocab_size"], 2000);
  EXPECT_EQ(folder.files().size(), 1u);
  EXPECT_EQ(folder.files()[0].metadata().at("format"), "pt");
}

TEST(HuggingFaceModelFolders, TinyLlamaBf16Sharded) {
  expect_matches_expected_json("llama_tiny_bf16_sharded");
  const io::ModelFolder folder = io::ModelFolder::open(kFixtures / "llama_tiny_bf16_sharded");
  EXPECT_EQ(folder.files().size(), 3u);
  EXPECT_EQ(folder.at("model.norm.weight").dtype, DType::bf16);
}

}  // namespace
}  // namespace mg
