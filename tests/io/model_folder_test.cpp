#include "io/model_folder.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <bit>
#include <cmath>
#include <limits>
#include <optional>

#include "scratch_dir.hpp"
#include "tensor_samples.hpp"

namespace mg::io {
namespace {

using testing::expect_error;

// `value` rounded, independently of the library's bit manipulation, to a binary format with
// `precision` significant bits and normal exponents down to `min_exponent` (below it the step
// stays fixed: subnormals): to nearest, ties to even, past `max_finite` to infinity.
double reference_round(double value, int precision, int min_exponent, double max_finite) {
  if (!std::isfinite(value) || value == 0) return value;
  int exponent = 0;
  std::frexp(std::fabs(value), &exponent);  // |value| in [2^(exponent - 1), 2^exponent)
  const double step = std::ldexp(1.0, std::max(exponent - 1, min_exponent) - (precision - 1));
  const double rounded = std::nearbyint(std::fabs(value) / step) * step;
  if (rounded > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), value);
  return std::copysign(rounded, value);
}

double reference_f16(double value) {
  return reference_round(value, 11, -14, 65504.0);
}
double reference_bf16(double value) {
  return reference_round(value, 8, -126, std::ldexp(255.0, 120));
}

// IEEE binary16 bits to their value, written out from the format's definition.
double decode_f16(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int fraction = bits & 0x3FF;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (exponent == 31) {
    return fraction ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(fraction, -24);
  return sign * std::ldexp(1024 + fraction, exponent - 25);
}

// bfloat16 is the upper half of an f32.
double decode_bf16(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

std::vector<uint16_t> stored_halves(const TensorView& view) {
  std::vector<uint16_t> halves(view.bytes.size() / 2);
  std::memcpy(halves.data(), view.bytes.data(), view.bytes.size());
  return halves;
}

std::vector<float> random_values(size_t count, std::mt19937& random) {
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<float> values(count);
  for (float& v : values) v = value(random);
  return values;
}

// Values of every magnitude from below the smallest subnormal to past the largest finite value of
// the format, both signs, plus exact ties.
std::vector<float> values_across_range(int min_power, int max_power, std::mt19937& random) {
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::vector<float> values;
  for (int power = min_power; power <= max_power; ++power) {
    for (int i = 0; i < 4; ++i) {
      const float sign = (random() & 1) ? -1.0f : 1.0f;
      values.push_back(sign * std::ldexp(mantissa(random), power));
    }
  }
  return values;
}

class ModelFolderTest : public testing::ScratchDirTest {
 protected:
  // A tiny Llama-like set of tensors with seeded values.
  std::vector<SavedTensor> sample_tensors(uint32_t seed = 5) {
    std::mt19937 random(seed);
    const std::vector<std::pair<std::string, Shape>> shapes = {
        {"model.embed_tokens.weight", {16, 8}},
        {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
        {"model.layers.0.mlp.up_proj.weight", {12, 8}},
        {"model.layers.0.input_layernorm.weight", {8}},
        {"model.norm.weight", {8}},
        {"lm_head.weight", {16, 8}},
        {"scale", {}}};
    std::vector<SavedTensor> tensors;
    for (const auto& [name, shape] : shapes) {
      size_t count = 1;
      for (int64_t dim : shape) count *= static_cast<size_t>(dim);
      tensors.push_back({name, shape, random_values(count, random)});
    }
    return tensors;
  }

  nlohmann::json sample_config() {
    return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 8}, {"vocab_size", 16}};
  }

  void expect_values(const ModelFolder& folder, const std::vector<SavedTensor>& tensors) {
    ASSERT_EQ(folder.tensor_names().size(), tensors.size());
    for (const SavedTensor& tensor : tensors) {
      const TensorView& view = folder.at(tensor.name);
      EXPECT_EQ(view.shape, tensor.shape) << tensor.name;
      EXPECT_EQ(tensor_as_f32(view), tensor.values) << tensor.name;
    }
  }

  // A file with the given raw JSON header and `data_bytes` bytes of data.
  void write_raw(const std::filesystem::path& file, const std::string& header, size_t data_bytes) {
    std::vector<std::byte> bytes(8 + header.size() + data_bytes, std::byte{0x3C});
    const uint64_t length = header.size();
    std::memcpy(bytes.data(), &length, 8);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    testing::write_bytes(file, bytes);
  }

  // Two shards and an index over them, each given as name lists; tensors are random f32 [3].
  void write_sharded(const std::filesystem::path& dir, const std::vector<std::string>& first,
                     const std::vector<std::string>& second, const nlohmann::json& weight_map) {
    std::mt19937 random(9);
    std::filesystem::create_directories(dir);
    const std::vector<std::string>* shards[] = {&first, &second};
    for (int i = 0; i < 2; ++i) {
      SafetensorsFile file;
      for (const std::string& name : *shards[i]) {
        file.tensors.push_back(testing::random_tensor(name, DType::f32, {3}, random));
      }
      write_safetensors(dir / ("model-0000" + std::to_string(i + 1) + "-of-00002.safetensors"),
                        file);
    }
    testing::write_text(
        dir / "model.safetensors.index.json",
        nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
  }

  size_t entries_in(const std::filesystem::path& dir) {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir),
                                             std::filesystem::directory_iterator()));
  }
};

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

TEST_F(ModelFolderTest, SingleFileRoundTripKeepsConfigNamesShapesAndValues) {
  const auto tensors = sample_tensors();
  save_model_folder(path("llama"), sample_config(), tensors);
  EXPECT_TRUE(std::filesystem::exists(path("llama/config.json")));
  EXPECT_TRUE(std::filesystem::exists(path("llama/model.safetensors")));
  EXPECT_EQ(entries_in(path("llama")), 2u);
  EXPECT_EQ(entries_in(dir_), 1u) << "the staging folder was left behind";

  const ModelFolder folder = ModelFolder::open(path("llama"));
  EXPECT_TRUE(folder.has_config());
  EXPECT_EQ(folder.config(), sample_config());
  EXPECT_EQ(folder.files().size(), 1u);
  EXPECT_EQ(folder.files()[0].metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  std::vector<std::string> names;
  for (const SavedTensor& tensor : tensors) names.push_back(tensor.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(folder.tensor_names(), names);
  expect_values(folder, tensors);
  EXPECT_EQ(folder.at("scale").shape, Shape{});
  EXPECT_EQ(folder.find("model.layers.1.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(folder.at("lm_head.weight").dtype, DType::f32);
}

TEST_F(ModelFolderTest, ShardsSplitAtTheLimitAndListEveryTensorInTheIndex) {
  const auto tensors = sample_tensors();
  // 600 bytes: embed (512) alone, q_proj (256) + up_proj (384) exceed it, and so on.
  save_model_folder(path("sharded"), sample_config(), tensors, {.max_shard_bytes = 600});
  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(path("sharded/model.safetensors.index.json")));
  const std::map<std::string, std::string> expected_map = {
      {"model.embed_tokens.weight", "model-00001-of-00004.safetensors"},
      {"model.layers.0.self_attn.q_proj.weight", "model-00002-of-00004.safetensors"},
      {"model.layers.0.mlp.up_proj.weight", "model-00003-of-00004.safetensors"},
      {"model.layers.0.input_layernorm.weight", "model-00003-of-00004.safetensors"},
      {"model.norm.weight", "model-00003-of-00004.safetensors"},
      {"lm_head.weight", "model-00004-of-00004.safetensors"},
      {"scale", "model-00004-of-00004.safetensors"}};
  EXPECT_EQ((index["weight_map"].get<std::map<std::string, std::string>>()), expected_map);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(),
            (128 + 64 + 96 + 8 + 8 + 128 + 1) * 4u);
  EXPECT_FALSE(std::filesystem::exists(path("sharded/model.safetensors")));
  EXPECT_EQ(entries_in(path("sharded")), 6u);

  const ModelFolder folder = ModelFolder::open(path("sharded"));
  EXPECT_EQ(folder.files().size(), 4u);
  expect_values(folder, tensors);
}

TEST_F(ModelFolderTest, DiffusersNamesAreFoundSingleAndSharded) {
  const auto tensors = sample_tensors(8);
  save_model_folder(path("unet"), {{"_class_name", "UNet2DConditionModel"}}, tensors,
                    {.weights_name = "diffusion_pytorch_model"});
  EXPECT_TRUE(std::filesystem::exists(path("unet/diffusion_pytorch_model.safetensors")));
  expect_values(ModelFolder::open(path("unet")), tensors);
  save_model_folder(path("unet_sharded"), nlohmann::json::object(), tensors,
                    {.max_shard_bytes = 1000, .weights_name = "diffusion_pytorch_model"});
  EXPECT_TRUE(
      std::filesystem::exists(path("unet_sharded/diffusion_pytorch_model.safetensors.index.json")));
  EXPECT_TRUE(std::filesystem::exists(
      path("unet_sharded/diffusion_pytorch_model-00001-of-00002.safetensors")));
  expect_values(ModelFolder::open(path("unet_sharded")), tensors);
}

TEST_F(ModelFolderTest, HalfPrecisionValuesAreRoundedToNearestEven) {
  std::mt19937 random(21);
  struct Case {
    DType dtype;
    double (*reference)(double);
    double (*decode)(uint16_t);
    std::vector<float> values;
  };
  std::vector<Case> cases = {
      {DType::f16, reference_f16, decode_f16, values_across_range(-27, 17, random)},
      {DType::bf16, reference_bf16, decode_bf16, values_across_range(-135, 127, random)}};
  // Exact ties: halfway between two representable values, each way of the even one.
  const float f16_ties[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f,
                            3 * 0x1p-25f,    0x1p-14f - 0x1p-25f, 65519.0f,
                            65520.0f,        -(2048.0f + 1.0f)};
  const float bf16_ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(256.0f + 1.0f), 0x1p-133f * 1.5f,
                             std::numeric_limits<float>::max()};
  cases[0].values.insert(cases[0].values.end(), std::begin(f16_ties), std::end(f16_ties));
  cases[1].values.insert(cases[1].values.end(), std::begin(bf16_ties), std::end(bf16_ties));

  for (const Case& test : cases) {
    SCOPED_TRACE(std::string(safetensors_dtype_name(test.dtype)));
    const std::vector<SavedTensor> tensors = {
        {"values", {static_cast<int64_t>(test.values.size())}, test.values}};
    save_model_folder(path("half"), nullptr, tensors, {.dtype = test.dtype});
    const ModelFolder folder = ModelFolder::open(path("half"));
    EXPECT_FALSE(folder.has_config());
    const TensorView& view = folder.at("values");
    EXPECT_EQ(view.dtype, test.dtype);
    const std::vector<uint16_t> stored = stored_halves(view);
    const std::vector<float> read = tensor_as_f32(view);
    ASSERT_EQ(read.size(), test.values.size());
    size_t infinities = 0;
    for (size_t i = 0; i < test.values.size(); ++i) {
      const double expected = test.reference(test.values[i]);
      EXPECT_EQ(test.decode(stored[i]), expected) << "bits of " << test.values[i];
      EXPECT_EQ(read[i], expected) << test.values[i];
      infinities += std::isinf(expected);
    }
    EXPECT_GT(infinities, 0u) << "the range should reach past the largest finite value";
  }
}

TEST_F(ModelFolderTest, HalfPrecisionKeepsInfinityAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {inf, -inf, nan, -nan};
  for (DType dtype : {DType::f16, DType::bf16}) {
    save_model_folder(path("special"), nullptr, {{"x", {4}, values}}, {.dtype = dtype});
    const ModelFolder folder = ModelFolder::open(path("special"));
    const std::vector<uint16_t> stored = stored_halves(folder.at("x"));
    const uint16_t infinity_bits = dtype == DType::f16 ? 0x7C00 : 0x7F80;
    EXPECT_EQ(stored[0], infinity_bits);
    EXPECT_EQ(stored[1], 0x8000 | infinity_bits);
    for (int i : {2, 3}) {
      EXPECT_EQ(stored[i] & infinity_bits, infinity_bits);
      EXPECT_NE(stored[i] & ~(0x8000 | infinity_bits), 0) << "a NaN must not become infinity";
    }
    const std::vector<float> read = tensor_as_f32(folder.at("x"));
    EXPECT_EQ(read[0], inf);
    EXPECT_EQ(read[1], -inf);
    EXPECT_TRUE(std::isnan(read[2]) && std::isnan(read[3]));
  }
}

TEST_F(ModelFolderTest, SingleStateDictFileConvertsEveryStoredDType) {
  // A torchvision-style state dict: no config, F64 and integer buffers among the weights.
  std::mt19937 random(13);
  const std::vector<double> f64 = {1.0 / 3.0, -2.5e-3, 7.25};
  const std::vector<int64_t> i64 = {-16777216, 0, 12345, 16777216};
  const std::vector<uint8_t> u8 = {0, 7, 255};
  const std::vector<int8_t> i8 = {-128, 5, 127};
  const std::vector<uint8_t> flags = {1, 0, 1};
  std::string header = "{";
  std::vector<std::byte> data;
  const auto add = [&](const std::string& name, const std::string& dtype, size_t count,
                       const void* values, size_t element_bytes) {
    const size_t begin = data.size();
    data.resize(begin + count * element_bytes);
    std::memcpy(data.data() + begin, values, count * element_bytes);
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"" +
              dtype + "\",\"shape\":[" + std::to_string(count) + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  };
  add("fc.bias", "F64", f64.size(), f64.data(), 8);
  add("bn1.num_batches_tracked", "I64", i64.size(), i64.data(), 8);
  add("pixels", "U8", u8.size(), u8.data(), 1);
  add("offsets", "I8", i8.size(), i8.data(), 1);
  add("mask", "BOOL", flags.size(), flags.data(), 1);
  header += "}";
  std::vector<std::byte> bytes(8 + header.size());
  const uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  bytes.insert(bytes.end(), data.begin(), data.end());
  testing::write_bytes(path("resnet.safetensors"), bytes);

  const ModelFolder folder = ModelFolder::open(path("resnet.safetensors"));
  EXPECT_FALSE(folder.has_config());
  EXPECT_EQ(folder.config(), nlohmann::json::object());
  EXPECT_EQ(folder.at("fc.bias").stored_dtype, StoredDType::f64);
  EXPECT_EQ(folder.at("fc.bias").dtype, DType::f32);
  EXPECT_EQ(folder.at("bn1.num_batches_tracked").dtype, DType::i32);
  const auto as_floats = [](const auto& values) {
    return std::vector<float>(values.begin(), values.end());
  };
  EXPECT_EQ(tensor_as_f32(folder.at("fc.bias")), as_floats(f64));
  EXPECT_EQ(tensor_as_f32(folder.at("bn1.num_batches_tracked")), as_floats(i64));
  EXPECT_EQ(tensor_as_f32(folder.at("pixels")), as_floats(u8));
  EXPECT_EQ(tensor_as_f32(folder.at("offsets")), as_floats(i8));
  EXPECT_EQ(tensor_as_f32(folder.at("mask")), as_floats(flags));
  expect_error([&] { read_safetensors(path("resnet.safetensors")); },
               {path("resnet.safetensors").string(), "unsupported dtype 'F64'"});
}

TEST_F(ModelFolderTest, IntegersFloatsCannotHoldAndOddBoolsAreRefused) {
  const int64_t big[] = {3, 16777217};
  TensorView view{"counter", DType::i32, {2}, std::as_bytes(std::span(big)), StoredDType::i64};
  expect_error([&] { tensor_as_f32(view); }, {"'counter'", "16777217", "element 1"});
  const uint8_t bools[] = {1, 2};
  view = {"mask", DType::i32, {2}, std::as_bytes(std::span(bools)), StoredDType::boolean};
  expect_error([&] { tensor_as_f32(view); }, {"'mask'", "byte 2"});
  view = {"short", DType::i32, {3}, std::as_bytes(std::span(bools)), StoredDType::boolean};
  expect_error([&] { tensor_as_f32(view); }, {"'short'", "[3]", "2 bytes"});
}

TEST_F(ModelFolderTest, SaveReplacesAnExistingFolderAndCopiesFiles) {
  std::filesystem::create_directories(path("out"));
  testing::write_text(path("out/stale.txt"), "from an earlier save");
  testing::write_text(path("tokenizer.json"), R"({"model": {"type": "BPE"}})");
  const auto tensors = sample_tensors(2);
  save_model_folder(path("out/"), sample_config(), tensors,
                    {.copy_files = {path("tokenizer.json")}});
  EXPECT_FALSE(std::filesystem::exists(path("out/stale.txt")));
  EXPECT_EQ(testing::read_bytes(path("out/tokenizer.json")),
            testing::read_bytes(path("tokenizer.json")));
  EXPECT_EQ(entries_in(dir_), 2u) << "a staging or old folder was left behind";
  expect_values(ModelFolder::open(path("out")), tensors);
}

TEST_F(ModelFolderTest, FailedSaveLeavesTheOldFolderIntact) {
  const auto old = sample_tensors(3);
  save_model_folder(path("out"), sample_config(), old);
  auto bad = sample_tensors(4);
  bad[2].values.pop_back();
  expect_error([&] { save_model_folder(path("out"), sample_config(), bad); },
               {path("out").string(), bad[2].name, "[12, 8]", "95 values"});
  bad = sample_tensors(4);
  bad.push_back(bad[0]);
  expect_error([&] { save_model_folder(path("out"), sample_config(), bad); }, {"used twice"});
  expect_error(
      [&] {
        save_model_folder(path("out"), sample_config(), sample_tensors(4),
                          {.copy_files = {path("missing.json")}});
      },
      {"no file to copy", "missing.json"});
  expect_error(
      [&] {
        save_model_folder(path("out"), sample_config(), sample_tensors(4), {.dtype = DType::i32});
      },
      {"f32, f16 or bf16"});
  expect_error([&] { save_model_folder(path("out"), nlohmann::json::array(), old); },
               {"JSON object"});
  expect_values(ModelFolder::open(path("out")), old);
  EXPECT_EQ(entries_in(dir_), 1u);
}

TEST_F(ModelFolderTest, SaveKilledMidWayLeavesTheOldFolderIntact) {
  const auto old = sample_tensors(3);
  save_model_folder(path("out"), sample_config(), old);
  // Eight shards of 64 KiB, then one of 1 MiB. The child may write files of at most 512 KiB, so
  // the kernel kills it (SIGXFSZ) in the middle of the ninth shard, after eight complete ones.
  std::mt19937 random(12);
  std::vector<SavedTensor> big;
  for (int i = 0; i < 8; ++i) {
    big.push_back({"layer." + std::to_string(i), {16, 1024}, random_values(16 * 1024, random)});
  }
  big.push_back({"head", {256, 1024}, random_values(256 * 1024, random)});
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit limit{512 << 10, 512 << 10};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      save_model_folder(path("out"), sample_config(), big, {.max_shard_bytes = 64 << 10});
    } catch (...) {
      ::_exit(2);  // never back into the test runner from the child
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << "status " << status;
  expect_values(ModelFolder::open(path("out")), old);
  const std::filesystem::path staging = path(".out.tmp." + std::to_string(child));
  EXPECT_TRUE(std::filesystem::exists(staging / "model-00008-of-00009.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(staging / "model-00009-of-00009.safetensors"));
}

TEST_F(ModelFolderTest, ViewsStayValidWhenTheFolderMoves) {
  const auto tensors = sample_tensors(6);
  save_model_folder(path("m"), sample_config(), tensors, {.max_shard_bytes = 600});
  std::optional<ModelFolder> holder;
  {
    ModelFolder opened = ModelFolder::open(path("m"));
    const TensorView* before = opened.find("lm_head.weight");
    holder.emplace(std::move(opened));
    EXPECT_EQ(holder->find("lm_head.weight"), before);
  }
  std::vector<ModelFolder> folders;
  folders.push_back(std::move(*holder));
  holder.reset();
  expect_values(folders[0], tensors);
}

TEST_F(ModelFolderTest, CheckTensorsListsEveryMismatchByName) {
  save_model_folder(path("m"), sample_config(), sample_tensors());
  const ModelFolder folder = ModelFolder::open(path("m"));
  std::map<std::string, Shape> expected;
  for (const std::string& name : folder.tensor_names()) expected[name] = folder.at(name).shape;
  check_tensors(folder, "LlamaForCausalLM", expected);

  auto tied = expected;
  tied.erase("scale");
  check_tensors(folder, "LlamaForCausalLM", tied, {}, {"sca"});
  expected["model.layers.1.norm.weight"] = {8};
  check_tensors(folder, "LlamaForCausalLM", expected, {"model.layers.1.norm.weight"});

  expected["model.embed_tokens.weight"] = {100, 8};
  expected["model.layers.0.input_layernorm.weight"] = {4, 2};
  expected.erase("scale");
  try {
    check_tensors(folder, "LlamaForCausalLM", expected);
    FAIL() << "mismatches were not reported";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()),
              "model folder " + path("m").string() +
                  " does not match LlamaForCausalLM: missing model.layers.1.norm.weight; "
                  "unexpected scale; model.embed_tokens.weight is [16, 8], expected [100, 8]; "
                  "model.layers.0.input_layernorm.weight is [8], expected [4, 2]");
  }
}

TEST_F(ModelFolderTest, CheckTensorsCapsEachListAtTenNames) {
  std::mt19937 random(17);
  std::vector<SavedTensor> tensors;
  for (int i = 0; i < 13; ++i)
    tensors.push_back({"extra." + std::to_string(i), {2}, random_values(2, random)});
  save_model_folder(path("m"), nullptr, tensors);
  std::map<std::string, Shape> expected;
  for (int i = 0; i < 12; ++i) expected["wanted." + std::to_string(i)] = {2};
  expect_error(
      [&] { check_tensors(ModelFolder::open(path("m")), "Tiny", expected); },
      {"missing wanted.0, wanted.1, ", "wanted.7 and 2 more; unexpected extra.0, ", " and 3 more"});
}

TEST_F(ModelFolderTest, MissingTensorErrorNamesFolderAndNearestNames) {
  save_model_folder(path("m"), sample_config(), sample_tensors());
  const ModelFolder folder = ModelFolder::open(path("m"));
  expect_error(
      [&] { folder.at("model.layers.0.mlp.down_proj.weight"); },
      {"model folder " + path("m").string(), "no tensor 'model.layers.0.mlp.down_proj.weight'",
       "'model.layers.0.input_layernorm.weight'", "'model.layers.0.mlp.up_proj.weight'"});
}

TEST_F(ModelFolderTest, ShardProblemsNameTheFolderAndTheFile) {
  const nlohmann::json map = {{"a", kShard1}, {"b", kShard2}};
  write_sharded(path("ok"), {"a"}, {"b"}, map);
  EXPECT_EQ(ModelFolder::open(path("ok")).tensor_names(), (std::vector<std::string>{"a", "b"}));

  write_sharded(path("missing"), {"a"}, {"b"}, map);
  std::filesystem::remove(path("missing") / kShard2);
  expect_error([&] { ModelFolder::open(path("missing")); },
               {path("missing").string(), kShard2, "missing"});

  write_sharded(path("twice"), {"a", "b"}, {"b"}, map);
  expect_error([&] { ModelFolder::open(path("twice")); },
               {path("twice").string(), "'b' is stored twice", kShard1, kShard2});

  write_sharded(path("lacks"), {"a", "b"}, {"c"}, {{"a", kShard1}, {"b", kShard2}, {"c", kShard2}});
  expect_error([&] { ModelFolder::open(path("lacks")); },
               {path("lacks").string(), "puts tensor 'b' in " + std::string(kShard2), "lacks it"});

  write_sharded(path("unlisted"), {"a"}, {"b", "c"}, map);
  expect_error([&] { ModelFolder::open(path("unlisted")); },
               {path("unlisted").string(), kShard2, "'c'", "does not list"});

  write_sharded(path("escape"), {"a"}, {"b"},
                {{"a", kShard1}, {"b", "../" + std::string(kShard2)}});
  expect_error([&] { ModelFolder::open(path("escape")); },
               {"model.safetensors.index.json", "not a file name inside the folder"});

  write_sharded(path("no_map"), {"a"}, {"b"}, map);
  testing::write_text(path("no_map/model.safetensors.index.json"), R"({"metadata": {}})");
  expect_error([&] { ModelFolder::open(path("no_map")); },
               {path("no_map/model.safetensors.index.json").string(), "weight_map"});

  testing::write_text(path("no_map/model.safetensors.index.json"), "{\"weight_map\": ");
  expect_error([&] { ModelFolder::open(path("no_map")); },
               {path("no_map/model.safetensors.index.json").string(), "not valid JSON"});
}

TEST_F(ModelFolderTest, CorruptShardHeadersNameTheShard) {
  const nlohmann::json map = {{"a", kShard1}, {"b", kShard2}};
  const auto entry = [](const std::string& name, const std::string& offsets) {
    return "\"" + name + R"(":{"dtype":"F32","shape":[2],"data_offsets":)" + offsets + "}";
  };
  const std::filesystem::path shard = path("bad") / kShard2;
  const std::pair<std::string, std::string> cases[] = {
      {"{" + entry("b", "[0,8]") + "," + entry("c", "[4,12]") + "}", "overlap"},
      {"{" + entry("b", "[8,16]") + "}", "truncated"},
      {"{\"b\":" + std::string(200, '[') + std::string(200, ']') + "}", "nests deeper"}};
  for (const auto& [header, problem] : cases) {
    SCOPED_TRACE(problem);
    write_sharded(path("bad"), {"a"}, {"b"}, map);
    write_raw(shard, header, 12);
    expect_error([&] { ModelFolder::open(path("bad")); }, {shard.string(), problem});
  }
  write_sharded(path("bad"), {"a"}, {"b"}, map);
  std::vector<std::byte> huge(16, std::byte{0});
  const uint64_t length = 100'000'001;
  std::memcpy(huge.data(), &length, 8);
  testing::write_bytes(shard, huge);
  expect_error([&] { ModelFolder::open(path("bad")); }, {shard.string(), "100 MB"});
}

TEST_F(ModelFolderTest, FolderProblemsAreExplained) {
  expect_error([&] { ModelFolder::open(path("nowhere")); }, {"no model folder", "nowhere"});
  std::filesystem::create_directories(path("empty"));
  expect_error([&] { ModelFolder::open(path("empty")); },
               {path("empty").string(), "has no model.safetensors"});
  testing::write_text(path("empty/pytorch_model.bin"), "pickle");
  expect_error([&] { ModelFolder::open(path("empty")); }, {"safe_serialization=True"});

  save_model_folder(path("m"), sample_config(), sample_tensors());
  testing::write_text(path("m/config.json"), "{\"hidden_size\": 8,\n oops}");
  expect_error([&] { ModelFolder::open(path("m")); },
               {"model config " + path("m/config.json").string(), "not valid JSON"});
  testing::write_text(path("m/config.json"), "[8]");
  expect_error([&] { ModelFolder::open(path("m")); }, {"not a JSON object"});
}

}  // namespace
}  // namespace mg::io
