// Optimizers as graph ops, checked against hand computations, and small models that learn
// with the f64 reference interpreter.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "meganeura/ops.hpp"
#include "meganeura/train.hpp"
#include "ops/interpreter.hpp"

namespace mg {
namespace {

// One scalar-ish parameter vector p with loss = sum(0.5 * (p - target)^2), so the gradient is
// p - target and every optimizer step can be written out by hand.
struct Quadratic {
  Graph graph;
  Environment environment;
  std::vector<double> target{0.5, -1.5, 2.0};

  explicit Quadratic(const OptimizerConfig& config) {
    const Tensor p = parameter(graph, "p", {3}, Init::zeros());
    const Tensor t = input(graph, "target", {3});
    const Tensor loss = sum_all(square(p - t) * 0.5);
    add_training(graph, loss.id(), config);
    environment.leaves["p"] = HostTensor({3}, {1.0, 2.0, -3.0});
    environment.leaves["target"] = HostTensor({3}, target);
    initialise_leaves(graph, environment, 0);
  }

  std::vector<double> step(const OptimizerConfig& config, int64_t index) {
    for (const auto& [name, value] : optimizer_inputs(config, index)) {
      if (graph.find_leaf(name) != kNoValue) environment.leaves[name] = HostTensor({}, value);
    }
    mg::step(graph, environment);
    return environment.leaves["p"].data;
  }
};

TEST(Optimizer, AdamMatchesHandComputation) {
  OptimizerConfig config;
  config.learning_rate = 0.1;
  Quadratic problem(config);
  std::vector<double> p{1.0, 2.0, -3.0}, m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 4; ++t) {
    const std::vector<double> got = problem.step(config, t - 1);
    for (int i = 0; i < 3; ++i) {
      const double g = p[i] - problem.target[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, t));
      const double v_hat = v[i] / (1 - std::pow(0.999, t));
      p[i] -= 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
      EXPECT_NEAR(got[i], p[i], 1e-12) << "step " << t << " element " << i;
    }
  }
}

TEST(Optimizer, AdamWDecaysWeightsDecoupled) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::adamw;
  config.learning_rate = 0.05;
  config.weight_decay = 0.1;
  Quadratic problem(config);
  std::vector<double> p{1.0, 2.0, -3.0}, m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 4; ++t) {
    const std::vector<double> got = problem.step(config, t - 1);
    for (int i = 0; i < 3; ++i) {
      const double g = p[i] - problem.target[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double update =
          (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
      p[i] = p[i] - 0.05 * 0.1 * p[i] - 0.05 * update;
      EXPECT_NEAR(got[i], p[i], 1e-12) << "step " << t << " element " << i;
    }
  }
}

TEST(Optimizer, SgdNesterovMomentumMatchesHandComputation) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::sgd;
  config.learning_rate = 0.1;
  config.momentum = 0.9;
  config.nesterov = true;
  Quadratic problem(config);
  std::vector<double> p{1.0, 2.0, -3.0}, buffer(3, 0.0);
  for (int t = 1; t <= 4; ++t) {
    const std::vector<double> got = problem.step(config, t - 1);
    for (int i = 0; i < 3; ++i) {
      const double g = p[i] - problem.target[i];
      buffer[i] = 0.9 * buffer[i] + g;
      p[i] -= 0.1 * (g + 0.9 * buffer[i]);
      EXPECT_NEAR(got[i], p[i], 1e-12) << "step " << t << " element " << i;
    }
  }
}

TEST(Optimizer, GlobalNormClippingScalesTheGradient) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::sgd;
  config.learning_rate = 1.0;
  config.clip_norm = 1.0;
  Quadratic problem(config);
  // Gradient (0.5, 3.5, -5) has norm sqrt(37.5); the step is the gradient scaled to norm 1.
  const std::vector<double> got = problem.step(config, 0);
  const std::vector<double> gradient{0.5, 3.5, -5.0};
  const double scale = 1.0 / (std::sqrt(37.5) + 1e-6);
  const std::vector<double> start{1.0, 2.0, -3.0};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], start[i] - scale * gradient[i], 1e-12);
}

TEST(Optimizer, LearningRateSchedules) {
  OptimizerConfig config;
  config.learning_rate = 1.0;
  config.schedule = OptimizerConfig::Schedule::linear_warmup;
  config.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(config, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate_at(config, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(config, 10), 1.0);
  config.schedule = OptimizerConfig::Schedule::cosine;
  config.total_steps = 14;
  config.min_learning_rate = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate_at(config, 4), 1.0);
  EXPECT_NEAR(learning_rate_at(config, 9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_NEAR(learning_rate_at(config, 14), 0.1, 1e-12);
  EXPECT_THROW(parse_optimizer("adagrad"), Error);
}

// Gradient accumulation: micro-step k of the quadratic problem uses its own target, as if each
// were a different micro-batch; the hand computation applies the mean gradient of each group of
// three micro-steps once, on the group's last micro-step, and leaves p alone on the others.
const std::vector<std::vector<double>> kMicroTargets{
    {0.5, -1.5, 2.0}, {1.5, 0.5, -1.0}, {-2.0, 1.0, 0.25},
    {0.0, 3.0, -0.5}, {2.5, -0.5, 1.0}, {-1.0, 0.0, 4.0},
};

std::vector<double> mean_gradient(const std::vector<double>& p, size_t first) {
  std::vector<double> mean(3, 0.0);
  for (size_t k = first; k < first + 3; ++k) {
    for (int i = 0; i < 3; ++i) mean[i] += (p[i] - kMicroTargets[k][i]) / 3.0;
  }
  return mean;
}

std::vector<double> micro_step(Quadratic& problem, const OptimizerConfig& config, int64_t index) {
  problem.environment.leaves["target"] = HostTensor({3}, kMicroTargets[index]);
  return problem.step(config, index);
}

TEST(Optimizer, SgdAccumulatesClippedMeanGradient) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::sgd;
  config.learning_rate = 0.1;
  config.momentum = 0.9;
  config.clip_norm = 1.0;  // the mean gradients have norms above 1, so clipping acts on them
  config.accumulation_steps = 3;
  Quadratic problem(config);
  std::vector<double> p{1.0, 2.0, -3.0}, buffer(3, 0.0);
  for (int64_t k = 0; k < 6; ++k) {
    const std::vector<double> got = micro_step(problem, config, k);
    if (k % 3 == 2) {
      const std::vector<double> g = mean_gradient(p, k - 2);
      const double norm = std::sqrt(g[0] * g[0] + g[1] * g[1] + g[2] * g[2]);
      ASSERT_GT(norm, 1.0);
      const double scale = 1.0 / (norm + 1e-6);
      for (int i = 0; i < 3; ++i) {
        buffer[i] = 0.9 * buffer[i] + g[i] * scale;
        p[i] -= 0.1 * buffer[i];
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(got[i], p[i], 1e-12) << "micro-step " << k << " element " << i;
    }
  }
}

TEST(Optimizer, AdamAccumulatesMeanGradient) {
  OptimizerConfig config;
  config.learning_rate = 0.1;
  config.accumulation_steps = 3;
  Quadratic problem(config);
  std::vector<double> p{1.0, 2.0, -3.0}, m(3, 0.0), v(3, 0.0);
  for (int64_t k = 0; k < 6; ++k) {
    const std::vector<double> got = micro_step(problem, config, k);
    if (k % 3 == 2) {
      const std::vector<double> g = mean_gradient(p, k - 2);
      const int t = static_cast<int>(k / 3) + 1;  // updates, not micro-steps
      for (int i = 0; i < 3; ++i) {
        m[i] = 0.9 * m[i] + 0.1 * g[i];
        v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
        const double m_hat = m[i] / (1 - std::pow(0.9, t));
        const double v_hat = v[i] / (1 - std::pow(0.999, t));
        p[i] -= 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(got[i], p[i], 1e-12) << "micro-step " << k << " element " << i;
    }
  }
}

TEST(Optimizer, NonApplyingMicroStepKeepsStateExactly) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::adamw;
  config.weight_decay = 0.1;
  config.accumulation_steps = 3;
  Quadratic problem(config);
  // One full group first, so the moments are non-zero, then one micro-step that only
  // accumulates: parameters and moments must keep every bit.
  for (int64_t k = 0; k < 3; ++k) micro_step(problem, config, k);
  const Environment before = problem.environment;
  micro_step(problem, config, 3);
  for (const char* name : {"p", "optimizer.p.m", "optimizer.p.v"}) {
    ASSERT_TRUE(before.leaves.contains(name)) << name;
    EXPECT_EQ(problem.environment.leaves.at(name).data, before.leaves.at(name).data) << name;
  }
  // The accumulator was reset by the applying micro-step and now holds one gradient.
  const std::vector<double> p = before.leaves.at("p").data;
  const std::vector<double>& accumulated =
      problem.environment.leaves.at("optimizer.p.accumulated_gradient").data;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(accumulated[i], p[i] - kMicroTargets[3][i], 1e-12);
}

// skip_non_finite: a step whose loss or gradient holds infinity or NaN keeps the parameters
// and moments bit for bit and says so; the next finite step applies as if it never happened
// (its update uses the moments of the last applied step and its own bias corrections).
TEST(Optimizer, NonFiniteStepKeepsStateAndTheNextOneApplies) {
  OptimizerConfig config;
  config.learning_rate = 0.1;
  config.skip_non_finite = true;
  Quadratic problem(config);
  const auto run = [&](int64_t index) {
    for (const auto& [name, value] : optimizer_inputs(config, index)) {
      if (problem.graph.find_leaf(name) != kNoValue)
        problem.environment.leaves[name] = HostTensor({}, value);
    }
    return mg::step(problem.graph, problem.environment)[problem.graph.output(kNonFiniteOutput)]
        .data[0];
  };
  std::vector<double> p{1.0, 2.0, -3.0}, m(3, 0.0), v(3, 0.0);
  const auto hand_step = [&](int t) {
    for (int i = 0; i < 3; ++i) {
      const double g = p[i] - problem.target[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      p[i] -= 0.1 * (m[i] / (1 - std::pow(0.9, t))) /
              (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
    }
  };
  EXPECT_EQ(run(0), 0.0);
  hand_step(1);
  const Environment before = problem.environment;
  // An infinite target makes the loss and one gradient infinite; NaN makes both NaN.
  for (double bad : {INFINITY, -INFINITY, NAN}) {
    problem.environment.leaves["target"] = HostTensor({3}, {0.5, bad, 2.0});
    EXPECT_EQ(run(1), 1.0) << bad;
    for (const char* name : {"p", "optimizer.p.m", "optimizer.p.v"}) {
      EXPECT_EQ(problem.environment.leaves.at(name).data, before.leaves.at(name).data) << name;
    }
  }
  problem.environment.leaves["target"] = HostTensor({3}, problem.target);
  EXPECT_EQ(run(2), 0.0);
  hand_step(3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(problem.environment.leaves["p"].data[i], p[i], 1e-12);
}

// With accumulation a non-finite micro-step adds nothing to the group's sum.
TEST(Optimizer, NonFiniteMicroStepLeavesTheAccumulatorAlone) {
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::sgd;
  config.accumulation_steps = 3;
  config.skip_non_finite = true;
  Quadratic problem(config);
  micro_step(problem, config, 0);
  const Environment before = problem.environment;
  problem.environment.leaves["target"] = HostTensor({3}, {NAN, 0.0, 0.0});
  problem.step(config, 1);
  for (const char* name : {"p", "optimizer.p.accumulated_gradient"}) {
    EXPECT_EQ(problem.environment.leaves.at(name).data, before.leaves.at(name).data) << name;
  }
}

TEST(Optimizer, AccumulationInputsCountUpdates) {
  OptimizerConfig config;
  config.learning_rate = 1.0;
  config.schedule = OptimizerConfig::Schedule::linear_warmup;
  config.warmup_steps = 4;
  config.accumulation_steps = 3;
  for (int64_t k = 0; k < 6; ++k) {
    const auto values = optimizer_inputs(config, k);
    EXPECT_EQ(values.at(kApplyUpdateInput), k % 3 == 2 ? 1.0 : 0.0) << k;
    EXPECT_DOUBLE_EQ(values.at(kLearningRateInput), learning_rate_at(config, k / 3)) << k;
    EXPECT_DOUBLE_EQ(values.at(kBiasCorrection1Input), 1.0 / (1.0 - std::pow(0.9, k / 3 + 1)));
  }
  config.accumulation_steps = 1;
  EXPECT_FALSE(optimizer_inputs(config, 0).contains(kApplyUpdateInput));
  config.accumulation_steps = 0;
  EXPECT_THROW(optimizer_inputs(config, 0), Error);
}

TEST(Optimizer, NoAccumulationBuildsTheSameGraph) {
  const auto build = [](const OptimizerConfig& config) {
    Graph graph;
    const Tensor p = parameter(graph, "p", {3}, Init::zeros());
    const Tensor t = input(graph, "target", {3});
    add_training(graph, sum_all(square(p - t) * 0.5).id(), config);
    return graph;
  };
  OptimizerConfig plain;
  plain.clip_norm = 1.0;
  OptimizerConfig one = plain;
  one.accumulation_steps = 1;
  const Graph a = build(plain), b = build(one);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.to_string(), b.to_string());
  EXPECT_EQ(b.find_leaf(kApplyUpdateInput), kNoValue);
  OptimizerConfig three = plain;
  three.accumulation_steps = 3;
  const Graph c = build(three);
  EXPECT_GT(c.size(), a.size());
  EXPECT_NE(c.find_leaf(kApplyUpdateInput), kNoValue);
  EXPECT_NE(c.find_leaf("optimizer.p.accumulated_gradient"), kNoValue);
}

// Synthetic two-class data a small model can separate.
double train_and_report(Graph& graph, int64_t rows, const Shape& image_shape, int steps) {
  OptimizerConfig config;
  config.learning_rate = 0.01;
  Environment environment;
  initialise_leaves(graph, environment, 1);
  std::mt19937_64 generator(3);
  std::normal_distribution<double> noise(0.0, 0.3);
  Shape batch_shape{rows};
  batch_shape.insert(batch_shape.end(), image_shape.begin(), image_shape.end());
  const int64_t features = element_count(image_shape);
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    HostTensor x(batch_shape), labels(Shape{rows});
    for (int64_t r = 0; r < rows; ++r) {
      labels.data[r] = static_cast<double>(r % 2);
      for (int64_t f = 0; f < features; ++f) {
        x.data[r * features + f] =
            (r % 2 ? 0.5 : -0.5) * (f % 3 == 0 ? 1.0 : 0.2) + noise(generator);
      }
    }
    environment.leaves["x"] = x;
    environment.leaves["labels"] = labels;
    for (const auto& [name, value] : optimizer_inputs(config, step)) {
      environment.leaves[name] = HostTensor({}, value);
    }
    const double loss = mg::step(graph, environment)[graph.output("loss")].data[0];
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first) << "loss went from " << first << " to " << last;
  return last;
}

TEST(Optimizer, SmallMlpLearnsWithTheReference) {
  Graph graph;
  const Tensor x = input(graph, "x", {16, 12});
  const Tensor labels = input(graph, "labels", {16}, DType::i32);
  const Tensor w1 = parameter(graph, "model.fc1.weight", {8, 12}, Init::uniform(-0.3, 0.3));
  const Tensor b1 = parameter(graph, "model.fc1.bias", {8}, Init::zeros());
  const Tensor w2 = parameter(graph, "model.fc2.weight", {2, 8}, Init::uniform(-0.3, 0.3));
  const Tensor loss = cross_entropy(linear(relu(linear(x, w1, b1)), w2), labels);
  add_training(graph, loss.id(), [] {
    OptimizerConfig config;
    config.learning_rate = 0.01;
    return config;
  }());
  train_and_report(graph, 16, {12}, 40);
}

TEST(Optimizer, SmallCnnLearnsWithTheReference) {
  Graph graph;
  const Tensor x = input(graph, "x", {8, 1, 6, 6});
  const Tensor labels = input(graph, "labels", {8}, DType::i32);
  const Tensor w = parameter(graph, "model.conv.weight", {3, 1, 3, 3}, Init::uniform(-0.3, 0.3));
  const Tensor head = parameter(graph, "model.head.weight", {2, 27}, Init::uniform(-0.2, 0.2));
  Tensor features = max_pool2d(relu(conv2d(x, w)), {2, 2}, {1, 1});
  const Tensor loss = cross_entropy(linear(flatten(features), head), labels);
  add_training(graph, loss.id(), [] {
    OptimizerConfig config;
    config.learning_rate = 0.01;
    return config;
  }());
  train_and_report(graph, 8, {1, 6, 6}, 40);
}

}  // namespace
}  // namespace mg
