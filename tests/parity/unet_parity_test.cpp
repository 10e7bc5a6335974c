// U-Net parity with PyTorch (Debian's python3-torch, CPU, float64; bench/unet_twin.py follows
// diffusers' UNet2DConditionModel): a tiny config's noise prediction, every parameter's
// gradient, three AdamW steps, and the DDIM and Euler samplers with classifier-free guidance,
// all from one run of the twin on the weights Meganeura started from.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/unet.hpp"
#include "parity/run_command.hpp"
#include "runtime/unet_runtime.hpp"

namespace mg {
namespace {

constexpr int64_t kBatch = 2, kSide = 16, kTokens = 5, kAdamWSteps = 3, kSamplerSteps = 3;
constexpr double kLearningRate = 1e-3, kGuidance = 3.0;

nlohmann::json tiny_config() {
  return {{"_class_name", "UNet2DConditionModel"},
          {"in_channels", 4},
          {"out_channels", 4},
          {"sample_size", kSide},
          {"block_out_channels", {32, 64}},
          {"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
          {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
          {"mid_block_type", "UNetMidBlock2DCrossAttn"},
          {"layers_per_block", 1},
          {"attention_head_dim", 2},
          {"cross_attention_dim", 32},
          {"norm_num_groups", 8},
          {"norm_eps", 1e-5},
          {"flip_sin_to_cos", true},
          {"freq_shift", 0},
          {"act_fn", "silu"}};
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(static_cast<double>(actual[i]) - expected[i], 2);
    norm += std::pow(static_cast<double>(expected[i]), 2);
  }
  return std::sqrt(difference / std::max(norm, 1e-30));
}

std::vector<float> values_of(const io::TensorRecord& record) {
  std::vector<float> values(record.bytes.size() / 4);
  std::memcpy(values.data(), record.bytes.data(), record.bytes.size());
  return values;
}

io::TensorRecord record_of(std::string name, Shape shape, const std::vector<float>& values) {
  io::TensorRecord record{std::move(name), DType::f32, std::move(shape), {}};
  record.bytes.resize(values.size() * 4);
  std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
  return record;
}

std::vector<float> normal_values(size_t count, uint64_t seed, float deviation = 1.0f) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, deviation);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

class UNetParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    config_ = new models::UNetConfig(models::unet_config_from_json(tiny_config(), "tiny config"));
    inputs_ = new std::map<std::string, std::vector<float>>{
        {models::kUNetSample, normal_values(kBatch * 4 * kSide * kSide, 1)},
        {models::kUNetTimestep, {37.0f, 811.0f}},
        {models::kUNetContext, normal_values(kBatch * kTokens * 32, 2)},
        {models::kUNetNoise, normal_values(kBatch * 4 * kSide * kSide, 3)},
        {"latents", normal_values(4 * kSide * kSide, 4)},
        {"context", normal_values(2 * kTokens * 32, 5)}};
    // Weights drawn as PyTorch's default initialisation draws them (U(-1/sqrt(fan_in), ...)),
    // and the norms' affine parameters around one and zero so that their gradients and effects
    // are not those of exact ones and zeros.
    weights_ = new std::map<std::string, std::vector<float>>();
    std::map<std::string, int64_t> fan_in;
    std::mt19937_64 generator(100);
    for (const auto& [name, shape] : models::unet_parameters(*config_)) {
      const std::string prefix = name.substr(0, name.rfind('.'));
      size_t count = 1;
      for (int64_t extent : shape) count *= static_cast<size_t>(extent);
      if (shape.size() >= 2) fan_in[prefix] = static_cast<int64_t>(count) / shape[0];
      std::vector<float> values(count);
      if (shape.size() == 1 && !fan_in.contains(prefix)) {
        std::normal_distribution<float> normal(name.ends_with(".weight") ? 1.0f : 0.0f, 0.2f);
        for (float& value : values) value = normal(generator);
      } else {
        const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in.at(prefix)));
        std::uniform_real_distribution<float> uniform(-bound, bound);
        for (float& value : values) value = uniform(generator);
      }
      (*weights_)[name] = values;
    }

    // One folder a process: ctest runs this suite's tests side by side.
    const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                            ("meganeura-unet-parity-" + std::to_string(::getpid()));
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
    io::SafetensorsFile weights, inputs;
    for (const auto& [name, shape] : models::unet_parameters(*config_))
      weights.tensors.push_back(record_of(name, shape, weights_->at(name)));
    io::write_safetensors(directory / "weights.safetensors", weights);
    inputs.tensors = {
        record_of("sample", {kBatch, 4, kSide, kSide}, inputs_->at(models::kUNetSample)),
        record_of("timestep", {kBatch}, inputs_->at(models::kUNetTimestep)),
        record_of("encoder_hidden_states", {kBatch, kTokens, 32},
                  inputs_->at(models::kUNetContext)),
        record_of("noise", {kBatch, 4, kSide, kSide}, inputs_->at(models::kUNetNoise)),
        record_of("latents", {1, 4, kSide, kSide}, inputs_->at("latents")),
        record_of("context", {2, kTokens, 32}, inputs_->at("context")),
        record_of("guidance", {1}, {static_cast<float>(kGuidance)}),
        record_of("sampler_steps", {1}, {static_cast<float>(kSamplerSteps)})};
    io::write_safetensors(directory / "inputs.safetensors", inputs);
    std::ofstream(directory / "config.json") << tiny_config().dump();
    const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/unet_twin.py";
    const std::filesystem::path out = directory / "twin.safetensors";
    run_command("/usr/bin/python3 " + script + " " + (directory / "config.json").string() + " " +
                (directory / "weights.safetensors").string() + " " +
                (directory / "inputs.safetensors").string() + " " + out.string() + " " +
                std::to_string(kAdamWSteps) + " " + std::to_string(kLearningRate) + " 2>&1");
    twin_ = new io::SafetensorsFile(io::read_safetensors(out, "twin output"));
    std::filesystem::remove_all(directory);
  }

  static void TearDownTestSuite() {
    delete config_;
    delete inputs_;
    delete weights_;
    delete twin_;
  }

  static std::vector<float> twin(const std::string& name) {
    const io::TensorRecord* record = twin_->find(name);
    if (!record) throw Error("the twin wrote no " + name);
    return values_of(*record);
  }

  static void write_weights(Session& session) {
    for (const auto& [name, values] : *weights_) session.write(name, values);
  }

  static void set_model_inputs(Session& session) {
    for (const char* name :
         {models::kUNetSample, models::kUNetTimestep, models::kUNetContext, models::kUNetNoise})
      session.set_input(name, inputs_->at(name));
  }

  static inline models::UNetConfig* config_ = nullptr;
  static inline std::map<std::string, std::vector<float>>* inputs_ = nullptr;
  static inline std::map<std::string, std::vector<float>>* weights_ = nullptr;
  static inline io::SafetensorsFile* twin_ = nullptr;
};

TEST_F(UNetParity, NoisePredictionAndEveryGradient) {
  Graph graph = models::unet_loss_graph(*config_, {kBatch, kSide, kSide, kTokens}, true);
  const std::map<ValueId, ValueId> grads =
      gradients(graph, graph.output(models::kUNetLoss), graph.leaves("parameter"));
  for (const auto& [parameter, grad] : grads)
    graph.set_output("grad." + graph.node(parameter).name, grad);
  Session session(graph);
  write_weights(session);
  set_model_inputs(session);
  session.run();
  EXPECT_LT(relative_l2(session.output(models::kUNetNoisePrediction), twin("noise_pred")), 1e-4);
  EXPECT_NEAR(session.scalar_output(models::kUNetLoss), twin("loss")[0], 1e-4 * twin("loss")[0]);
  for (const auto& [name, values] : *weights_)
    EXPECT_LT(relative_l2(session.output("grad." + name), twin("grad." + name)), 1e-3) << name;
}

TEST_F(UNetParity, AdamWStepsFollowPyTorch) {
  Graph graph = models::unet_loss_graph(*config_, {kBatch, kSide, kSide, kTokens});
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = kLearningRate;
  optimizer.weight_decay = 0.01;
  add_training(graph, graph.output(models::kUNetLoss), optimizer);
  Session session(graph);
  write_weights(session);
  set_model_inputs(session);
  const std::vector<float> expected = twin("losses");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kAdamWSteps));
  for (int64_t step = 0; step < kAdamWSteps; ++step) {
    for (const auto& [name, value] : optimizer_inputs(optimizer, step))
      session.set_input(name, std::vector<float>{static_cast<float>(value)});
    session.run();
    EXPECT_NEAR(session.scalar_output(models::kUNetLoss), expected[step], 2e-4 * expected[step])
        << "step " << step;
  }
}

// The sampler program (one run = one step, replayed) with classifier-free guidance against the
// twin's own DDIM and Euler loops over diffusers' schedules.
TEST_F(UNetParity, GuidedDdimAndEulerSamplersFollowTheTwin) {
  Session session(models::unet_sampler_graph(*config_, {1, kSide, kSide, kTokens}, true));
  write_weights(session);
  const models::NoiseSchedule schedule = models::scaled_linear_schedule();
  for (const models::Sampler sampler : {models::Sampler::ddim, models::Sampler::euler}) {
    const double scale = models::initial_noise_scale(schedule, sampler, kSamplerSteps);
    std::vector<float> initial = inputs_->at("latents");
    for (float& value : initial) value = static_cast<float>(value * scale);
    const std::vector<float> latents = models::run_sampler(
        session, initial, models::sampler_steps(schedule, sampler, kSamplerSteps),
        inputs_->at("context"), kGuidance);
    const std::string name(models::sampler_name(sampler));
    EXPECT_LT(relative_l2(latents, twin(name)), 1e-4) << name;
  }
}

}  // namespace
}  // namespace mg
