// Training parity with PyTorch (Debian's python3-torch, CPU, float64): the same classifier from
// the same initial weights on the same batches; the GPU losses must agree at every step.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.hpp"
#include "meganeura/session.hpp"
#include "models/classifier.hpp"
#include "parity/run_command.hpp"

namespace mg {
namespace {

void expect_parity(const std::string& architecture, int64_t batch, int steps, double tolerance) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("meganeura-parity-" + architecture);
  std::filesystem::create_directories(directory);
  OptimizerConfig optimizer;
  optimizer.learning_rate = 1e-3;
  models::ClassifierConfig config;
  config.architecture = architecture;
  SessionOptions options;
  options.seed = 3;
  Session session(models::build_classifier_training(config, batch, optimizer), options);

  io::SafetensorsFile weights;
  for (const std::string& name : session.persistent_names()) {
    if (name.rfind("model.", 0) != 0) continue;
    const std::vector<float> values = session.read(name);
    io::TensorRecord record{name, DType::f32, session.leaf_type(name).shape, {}};
    record.bytes.resize(values.size() * 4);
    std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
    weights.tensors.push_back(std::move(record));
  }
  io::write_safetensors(directory / "weights.safetensors", weights);

  std::mt19937_64 generator(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::ofstream batches(directory / "batches.bin", std::ios::binary);
  std::vector<double> gpu_losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> images(static_cast<size_t>(batch * 784));
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (float& value : images) value = pixel(generator);
    for (int32_t& label : labels) label = static_cast<int32_t>(generator() % 10);
    batches.write(reinterpret_cast<const char*>(images.data()), images.size() * 4);
    batches.write(reinterpret_cast<const char*>(labels.data()), labels.size() * 4);
    session.set_input(models::kImagesInput, images);
    session.set_input(models::kLabelsInput, labels);
    for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
      session.set_input(name, std::vector<float>{static_cast<float>(value)});
    }
    session.run();
    gpu_losses.push_back(session.scalar_output("loss"));
  }
  batches.close();

  const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/train_parity.py";
  const std::string output = run_command(
      "/usr/bin/python3 " + script + " " + (directory / "weights.safetensors").string() + " " +
      (directory / "batches.bin").string() + " " + architecture + " " + std::to_string(batch) +
      " " + std::to_string(steps) + " " + std::to_string(optimizer.learning_rate) + " 2>&1");
  const std::vector<double> torch_losses = nlohmann::json::parse(output).get<std::vector<double>>();
  ASSERT_EQ(torch_losses.size(), gpu_losses.size());
  for (size_t step = 0; step < gpu_losses.size(); ++step) {
    EXPECT_NEAR(gpu_losses[step], torch_losses[step], tolerance * std::abs(torch_losses[step]))
        << "step " << step;
  }
  std::filesystem::remove_all(directory);
}

TEST(PytorchParity, CnnFiftyAdamSteps) {
  expect_parity("cnn", 16, 50, 1e-3);
}

TEST(PytorchParity, MlpFiftyAdamSteps) {
  expect_parity("mlp", 16, 50, 1e-3);
}

}  // namespace
}  // namespace mg
