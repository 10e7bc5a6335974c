// Loss scaling (OptimizerConfig::loss_scaling, scaled_gradients, LossScaler) with the f64
// reference interpreter: a scaled step equals the unscaled one and the scale rescues f16
// cotangents that underflow; and the scaler's rules. (A scale that overflows f32 needs f32
// arithmetic, which the f64 reference does not have: tests/gpu/training_test.cpp drops it.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/train.hpp"
#include "ops/interpreter.hpp"

namespace mg {
namespace {

// loss = sum(0.5 * (p - target)^2) over a seeded random p, so the gradient is p - target.
struct Quadratic {
  Graph graph;
  Environment environment;

  explicit Quadratic(const OptimizerConfig& config) {
    const Tensor p = parameter(graph, "p", {4}, Init::zeros());
    const Tensor t = input(graph, "target", {4});
    add_training(graph, sum_all(square(p - t) * 0.5).id(), config);
    std::mt19937 random(7);
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<double> start(4);
    for (double& value : start) value = normal(random);
    environment.leaves["p"] = HostTensor({4}, start);
    initialise_leaves(graph, environment, 0);
  }

  // One run at `scale` (ignored without loss scaling); returns the graph's outputs by name.
  std::map<std::string, double> run(const OptimizerConfig& config, int64_t index,
                                    const std::vector<double>& target, double scale) {
    environment.leaves["target"] = HostTensor({4}, target);
    std::map<std::string, double> inputs = optimizer_inputs(config, index);
    inputs[kLossScaleInput] = scale;
    for (const auto& [name, value] : inputs) {
      if (graph.find_leaf(name) != kNoValue) environment.leaves[name] = HostTensor({}, value);
    }
    const std::vector<HostTensor> values = step(graph, environment);
    std::map<std::string, double> outputs;
    for (const auto& [name, value] : graph.outputs()) outputs[name] = values[value].data[0];
    return outputs;
  }
};

std::vector<double> random_target(std::mt19937& random, double spread) {
  std::normal_distribution<double> normal(0.0, spread);
  std::vector<double> target(4);
  for (double& value : target) value = normal(random);
  return target;
}

OptimizerConfig checked_adamw() {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::adamw;
  config.learning_rate = 0.05;
  config.weight_decay = 0.1;
  config.clip_norm = 1.0;
  config.accumulation_steps = 2;
  config.skip_non_finite = true;
  return config;
}

// Every configuration's way of unscaling: a multiply before accumulation and clipping, or the
// reciprocal folded into the optimizer's factors (Adam's moments, SGD's step) where the update
// reads the raw gradient. Parameters, every optimizer state and the clipped norm match the
// unscaled run whatever the scale of each micro-step (it may change inside an accumulation
// group); the folded factors round differently from a multiply, hence the tolerance.
TEST(LossScaling, ScaledStepsEqualTheUnscaledOnes) {
  OptimizerConfig adam;
  adam.learning_rate = 0.05;
  adam.skip_non_finite = true;
  OptimizerConfig adam_l2 = adam;
  adam_l2.weight_decay = 0.1;
  OptimizerConfig nesterov = adam;
  nesterov.kind = OptimizerConfig::Kind::sgd;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  OptimizerConfig sgd = nesterov;
  sgd.momentum = 0.0;
  sgd.nesterov = false;
  const std::vector<std::pair<const char*, OptimizerConfig>> configs{
      {"adamw clipped and accumulated", checked_adamw()},
      {"adam", adam},
      {"adam with l2", adam_l2},
      {"sgd nesterov", nesterov},
      {"sgd", sgd}};
  const std::vector<double> scales{65536.0, 1.0, 0x1p40, 1024.0, 32768.0, 2.0};
  for (const auto& [label, plain] : configs) {
    OptimizerConfig scaled = plain;
    scaled.loss_scaling = true;
    Quadratic reference(plain), problem(scaled);
    std::mt19937 random(11);
    for (int64_t k = 0; k < static_cast<int64_t>(scales.size()); ++k) {
      const std::vector<double> target = random_target(random, 3.0);
      const auto expected = reference.run(plain, k, target, 1.0);
      const auto got = problem.run(scaled, k, target, scales[k]);
      EXPECT_EQ(got.at(kNonFiniteOutput), 0.0) << label << " " << k;
      EXPECT_DOUBLE_EQ(got.at("loss"), expected.at("loss")) << label << " " << k;
      if (plain.clip_norm > 0) {
        EXPECT_DOUBLE_EQ(got.at("gradient_norm"), expected.at("gradient_norm")) << label;
      }
      ASSERT_EQ(problem.environment.leaves.size(), reference.environment.leaves.size() + 1);
      for (const auto& [name, want] : reference.environment.leaves) {
        const std::vector<double>& have = problem.environment.leaves.at(name).data;
        for (size_t i = 0; i < want.data.size(); ++i)
          EXPECT_NEAR(have[i], want.data[i], 1e-12 * (1 + std::abs(want.data[i])))
              << label << " " << name << " micro-step " << k << " element " << i;
      }
    }
  }
}

TEST(LossScaling, OffBuildsNoScaleAndNeedsTheNonFiniteGate) {
  OptimizerConfig config = checked_adamw();
  Quadratic off(config);
  EXPECT_EQ(off.graph.find_leaf(kLossScaleInput), kNoValue);
  config.loss_scaling = true;
  Quadratic on(config);
  EXPECT_NE(on.graph.find_leaf(kLossScaleInput), kNoValue);
  EXPECT_FALSE(optimizer_inputs(config, 0).contains(kLossScaleInput));
  config.skip_non_finite = false;
  EXPECT_THROW(Quadratic{config}, Error);
}

// The failure loss scaling exists for: a product on f16 operands (as fast precision's
// cooperative matrices make it) receives a cotangent below f16's smallest subnormal (2^-24),
// which rounds to zero, and so does every gradient before it. Seeded with the scale the
// cotangent is an f16 normal, and the gradient divided back is the true one to f16 precision.
TEST(LossScaling, ScaleKeepsF16CotangentsFromUnderflowing) {
  Graph graph;
  const Tensor p = parameter(graph, "p", {8}, Init::zeros());
  const Tensor x = input(graph, "x", {8});
  const Tensor product = cast(cast(p, DType::f16) * cast(x, DType::f16), DType::f32);
  const double tiny = 1e-9;
  const ValueId loss = (sum_all(product) * tiny).id();
  Graph unscaled_graph = graph;
  const ValueId unscaled = gradients(unscaled_graph, loss, {p.id()}).at(p.id());
  const ValueId scaled = scaled_gradients(graph, loss, {p.id()}).at(p.id());
  EXPECT_THROW(scaled_gradients(graph, loss, {p.id()}), Error);

  std::mt19937 random(5);
  std::uniform_real_distribution<double> uniform(0.5, 2.0);
  std::vector<double> p_values(8), x_values(8);
  for (double& value : p_values) value = uniform(random);
  for (double& value : x_values) value = uniform(random);
  Environment environment;
  environment.leaves["p"] = HostTensor({8}, p_values);
  environment.leaves["x"] = HostTensor({8}, x_values);
  const std::vector<double> lost = evaluate(unscaled_graph, environment)[unscaled].data;
  for (double value : lost) EXPECT_EQ(value, 0.0);
  environment.leaves[kLossScaleInput] = HostTensor({}, LossScaler::kInitialScale);
  const std::vector<double> got = evaluate(graph, environment)[scaled].data;
  for (size_t i = 0; i < got.size(); ++i) {
    const double truth = tiny * x_values[i];
    EXPECT_NEAR(got[i] / LossScaler::kInitialScale, truth, 2e-3 * truth) << i;
  }
}

TEST(LossScaler, HalvesOnADroppedStepAtTheCurrentScale) {
  LossScaler scaler;
  EXPECT_EQ(scaler.start_step(), 65536.0);
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::overflowed);
  EXPECT_EQ(scaler.scale(), 32768.0);
  // Two steps queued at 32768, both dropped: the first halves, the second ran at the old scale.
  EXPECT_EQ(scaler.start_step(), 32768.0);
  EXPECT_EQ(scaler.start_step(), 32768.0);
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::overflowed);
  EXPECT_EQ(scaler.start_step(), 16384.0);
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::overflowed);
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_EQ(scaler.end_step(false), LossScaler::StepEnd::applied);
  EXPECT_EQ(scaler.scale(), 16384.0);
  // A non-finite loss is not the scale's doing.
  scaler.start_step();
  EXPECT_EQ(scaler.end_step(true, false), LossScaler::StepEnd::non_finite);
  EXPECT_EQ(scaler.scale(), 16384.0);
}

TEST(LossScaler, DoublesAfterTheGrowthIntervalOfAppliedSteps) {
  LossScaler scaler(1024.0);
  const auto applied_steps = [&](int64_t count) {
    for (int64_t k = 0; k < count; ++k) {
      scaler.start_step();
      scaler.end_step(false);
    }
  };
  applied_steps(LossScaler::kGrowthInterval - 1);
  // Two steps queued at 1024: the first is dropped (which restarts the count), the second is
  // applied at the old scale and does not count for the new one.
  scaler.start_step();
  scaler.start_step();
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::overflowed);
  EXPECT_EQ(scaler.end_step(false), LossScaler::StepEnd::applied);
  EXPECT_EQ(scaler.scale(), 512.0);
  applied_steps(LossScaler::kGrowthInterval - 1);
  EXPECT_EQ(scaler.scale(), 512.0);
  applied_steps(1);
  EXPECT_EQ(scaler.scale(), 1024.0);
  applied_steps(LossScaler::kGrowthInterval);
  EXPECT_EQ(scaler.scale(), 2048.0);
}

TEST(LossScaler, NeverGoesBelowOne) {
  LossScaler scaler(2.0);
  scaler.start_step();
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::overflowed);
  EXPECT_EQ(scaler.scale(), 1.0);
  // Dropped unscaled: the gradients are non-finite on their own.
  scaler.start_step();
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::non_finite);
  EXPECT_EQ(scaler.scale(), 1.0);
  for (double bad : {0.5, 0.0, -4.0, double(INFINITY), double(NAN)})
    EXPECT_THROW(LossScaler{bad}, Error) << bad;
  EXPECT_THROW(scaler.end_step(false), Error);  // no step started
}

TEST(LossScaler, FixedScaleNeverChanges) {
  LossScaler scaler(1024.0, false);
  for (int64_t k = 0; k < LossScaler::kGrowthInterval; ++k) {
    EXPECT_EQ(scaler.start_step(), 1024.0);
    scaler.end_step(false);
  }
  scaler.start_step();
  EXPECT_EQ(scaler.end_step(true), LossScaler::StepEnd::non_finite);
  EXPECT_EQ(scaler.scale(), 1024.0);
}

}  // namespace
}  // namespace mg
