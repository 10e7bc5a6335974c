// tests/parity/safetensors_lite.py, the reader and writer the PyTorch twins use, against the C++
// reader and writer: files written by one are read by the other with the same names, dtypes,
// shapes and values, and torch's own f16/bf16 rounding agrees with save_model_folder's. One
// Python run (importing torch is slow) serves both directions, so they are one test: ctest runs
// each test in a process of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/model_folder.hpp"
#include "parity/run_command.hpp"

namespace mg {
namespace {

// The Python side: writes python.safetensors (seeded tensors of every dtype the twins use) and
// prints, as JSON, what it wrote and what it read from the folders the C++ side saved.
constexpr const char* kDriver = R"PY(
import json
import sys
import numpy
import torch
directory, lite_directory = sys.argv[1:3]
sys.path.insert(0, lite_directory)
import safetensors_lite

generator = torch.Generator().manual_seed(31)
def normal(*shape):
    return torch.randn(*shape, generator=generator)
written = {
    "model.layers.0.self_attn.q_proj.weight": normal(6, 4),
    "model.norm.weight": normal(5).to(torch.bfloat16),
    "decoder.conv.weight": normal(2, 3, 2).half(),
    "classifier.bias": normal(3).double(),
    "bn1.num_batches_tracked": torch.tensor(40123, dtype=torch.int64),
    "attention_mask": torch.tensor([True, False, True]),
    # Transposed: the writer must store it row-major.
    "lm_head.weight": normal(4, 6).t(),
}
safetensors_lite.save(directory + "/python.safetensors", written, metadata={"format": "pt"})
report = {"written": {name: {"shape": list(t.shape), "values": t.double().flatten().tolist()}
                      for name, t in written.items()}}

originals = torch.from_numpy(numpy.fromfile(directory + "/originals.bin", dtype=numpy.float32))
with open(directory + "/shapes.json") as file:
    shapes = json.load(file)
for dtype_name, dtype in (("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)):
    tensors, metadata = safetensors_lite.load_with_metadata(
        "%s/%s/model.safetensors" % (directory, dtype_name))
    read = {"metadata": metadata}
    offset = 0
    for name, shape in shapes:
        count = int(numpy.prod(shape))
        expected = originals[offset:offset + count].reshape(shape).to(dtype)
        offset += count
        read[name] = {"dtype": str(tensors[name].dtype), "shape": list(tensors[name].shape),
                      "equal": bool(torch.equal(tensors[name], expected))}
    report[dtype_name] = read
print(json.dumps(report))
)PY";

struct Format {
  DType dtype;
  std::string name;
  std::string torch_name;
};
const Format kFormats[] = {{DType::f32, "f32", "torch.float32"},
                           {DType::f16, "f16", "torch.float16"},
                           {DType::bf16, "bf16", "torch.bfloat16"}};

// Saves one folder per format from seeded values spanning 2^-15 .. 2^16, runs the driver and
// returns its report.
nlohmann::json save_folders_and_run_python(const std::filesystem::path& directory,
                                           std::vector<io::SavedTensor>& saved) {
  std::mt19937 random(41);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  saved = {{"embed.weight", {7, 5}, {}}, {"norm.weight", {9}, {}}};
  std::ofstream originals(directory / "originals.bin", std::ios::binary);
  nlohmann::json shapes = nlohmann::json::array();
  for (io::SavedTensor& tensor : saved) {
    tensor.values.resize(static_cast<size_t>(element_count(tensor.shape)));
    for (float& v : tensor.values) v = value(random) * std::ldexp(1.0f, random() % 30 - 15);
    originals.write(reinterpret_cast<const char*>(tensor.values.data()),
                    static_cast<std::streamsize>(tensor.values.size() * sizeof(float)));
    shapes.push_back({tensor.name, tensor.shape});
  }
  originals.close();
  std::ofstream(directory / "shapes.json") << shapes.dump();
  for (const Format& format : kFormats) {
    io::save_model_folder(directory / format.name, {{"model_type", "tiny"}}, saved,
                          {.dtype = format.dtype});
  }
  std::ofstream(directory / "driver.py") << kDriver;
  const std::string output =
      run_command("/usr/bin/python3 " + (directory / "driver.py").string() + " " +
                  directory.string() + " " + MEGANEURA_SOURCE_DIR + "/tests/parity 2>&1");
  try {
    return nlohmann::json::parse(output);
  } catch (const nlohmann::json::exception&) {
    ADD_FAILURE() << "the Python driver printed no JSON report:\n" << output;
    return nlohmann::json::object();
  }
}

void expect_cpp_reads_python_file(const std::filesystem::path& directory,
                                  const nlohmann::json& report) {
  ASSERT_TRUE(report.contains("written"));
  const nlohmann::json& written = report["written"];
  const io::ModelFolder folder = io::ModelFolder::open(directory / "python.safetensors");
  EXPECT_EQ(folder.files()[0].metadata().at("format"), "pt");
  ASSERT_EQ(folder.tensor_names().size(), written.size());
  const std::map<std::string, io::StoredDType> dtypes = {
      {"model.layers.0.self_attn.q_proj.weight", io::StoredDType::f32},
      {"model.norm.weight", io::StoredDType::bf16},
      {"decoder.conv.weight", io::StoredDType::f16},
      {"classifier.bias", io::StoredDType::f64},
      {"bn1.num_batches_tracked", io::StoredDType::i64},
      {"attention_mask", io::StoredDType::boolean},
      {"lm_head.weight", io::StoredDType::f32}};
  for (const auto& [name, want] : written.items()) {
    SCOPED_TRACE(name);
    const io::TensorView& view = folder.at(name);
    EXPECT_EQ(view.stored_dtype, dtypes.at(name));
    EXPECT_EQ(view.shape, want["shape"].get<Shape>());
    const std::vector<double> values = want["values"].get<std::vector<double>>();
    const std::vector<float> read = io::tensor_as_f32(view);
    ASSERT_EQ(read.size(), values.size());
    size_t non_zero = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      // Every dtype here but F64 holds values f32 represents exactly; F64 rounds to nearest.
      EXPECT_EQ(read[i], static_cast<float>(values[i])) << "element " << i;
      non_zero += values[i] != 0;
    }
    EXPECT_GT(non_zero, 0u);
  }
}

void expect_python_reads_cpp_folders(const std::vector<io::SavedTensor>& saved,
                                     const nlohmann::json& report) {
  for (const Format& format : kFormats) {
    SCOPED_TRACE(format.name);
    ASSERT_TRUE(report.contains(format.name));
    const nlohmann::json& read = report[format.name];
    EXPECT_EQ(read["metadata"], (nlohmann::json{{"format", "pt"}}));
    for (const io::SavedTensor& tensor : saved) {
      EXPECT_EQ(read[tensor.name]["dtype"], format.torch_name) << tensor.name;
      EXPECT_EQ(read[tensor.name]["shape"].get<Shape>(), tensor.shape) << tensor.name;
      EXPECT_TRUE(read[tensor.name]["equal"].get<bool>())
          << tensor.name << ": torch rounds the originals differently from what was saved";
    }
  }
}

TEST(SafetensorsLite, PythonAndCppReadEachOthersFiles) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() /
      ("meganeura-safetensors-lite-" + std::to_string(::getpid()));
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  std::vector<io::SavedTensor> saved;
  const nlohmann::json report = save_folders_and_run_python(directory, saved);
  expect_cpp_reads_python_file(directory, report);
  expect_python_reads_cpp_folders(saved, report);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace mg
