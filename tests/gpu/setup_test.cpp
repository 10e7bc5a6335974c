// The setup (SessionOptions::setup): work that reads only fixed values runs before the first
// run and again after a write to a leaf, and every run gives what computing everything each
// time gives.
#include <cmath>
#include <random>

#include "harness.hpp"

namespace mg {
namespace {

std::vector<float> drawn(std::mt19937_64& generator, size_t count) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(generator);
  return values;
}

// y = x (exp(w) / 2) for x [3, 5] and w [5, 4], in f64.
std::vector<double> expected_product(const std::vector<float>& x, const std::vector<float>& w) {
  std::vector<double> y(3 * 4, 0.0);
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < 4; ++j)
      for (size_t k = 0; k < 5; ++k) y[i * 4 + j] += x[i * 5 + k] * std::exp(w[k * 4 + j]) / 2;
  return y;
}

void expect_close(const std::vector<float>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * (1.0 + std::abs(expected[i]))) << i;
}

// exp(w) / 2 reads only the parameter w: one setup dispatch, the product alone in every run. A
// write to w makes the next run see the new weights; runs without a write keep the setup's
// results. With the setup off, both dispatches run every time and give the same values.
TEST(GpuSetup, FixedWorkRunsOnceAndAgainAfterAWrite) {
  Graph graph;
  const Tensor x = input(graph, "x", {3, 5});
  const Tensor w = parameter(graph, "w", {5, 4}, Init::uniform(-1.0, 1.0));
  graph.set_output("y", matmul(x, exp(w) * 0.5).id());
  std::mt19937_64 generator(71);
  const std::vector<float> x_values = drawn(generator, 15);
  const std::vector<float> first = drawn(generator, 20), second = drawn(generator, 20);
  for (const bool setup : {true, false}) {
    SCOPED_TRACE(setup ? "setup" : "every run");
    SessionOptions options;
    options.validation = true;
    options.setup = setup;
    Session session(graph, options);
    EXPECT_EQ(session.report().setup_dispatches, setup ? 1u : 0u);
    EXPECT_EQ(session.report().dispatches, setup ? 1u : 2u);
    session.set_input("x", x_values);
    session.write("w", first);
    session.run();
    expect_close(session.output("y"), expected_product(x_values, first));
    session.run();
    expect_close(session.output("y"), expected_product(x_values, first));
    session.write("w", second);
    session.run();
    expect_close(session.output("y"), expected_product(x_values, second));
    EXPECT_EQ(session.validation_messages(), 0u);
  }
}

// Three fixed weights, each with setup work of its own: a = exp(w1) / 2, b = sum over rows of a
// times tanh(w2) (a reduction that reads a, the setup's own result) and d = sigmoid(w3);
// y = x a + b + x dᵀ. A write to one weight reruns the part of the setup that reads it (w2: b, and
// a before it; w3: d's), and every run gives the f64 value of y over the weights as written,
// whichever part ran.
TEST(GpuSetup, AWriteRerunsThePartOfTheSetupThatReadsIt) {
  Graph graph;
  const Tensor x = input(graph, "x", {3, 5});
  const Tensor w1 = parameter(graph, "w1", {5, 4}, Init::uniform(-1.0, 1.0));
  const Tensor w2 = parameter(graph, "w2", {4}, Init::uniform(-1.0, 1.0));
  const Tensor w3 = parameter(graph, "w3", {4, 5}, Init::uniform(-1.0, 1.0));
  const Tensor a = exp(w1) * 0.5;
  const Tensor b = sum(a, {0}) * tanh(w2);
  const Tensor d = sigmoid(w3);
  graph.set_output("y", (matmul(x, a) + b + matmul(x, d, false, true)).id());
  std::mt19937_64 generator(73);
  const std::vector<float> x_values = drawn(generator, 15);
  std::vector<float> w[3] = {drawn(generator, 20), drawn(generator, 4), drawn(generator, 20)};
  const auto expected = [&] {
    std::vector<double> y(3 * 4, 0.0);
    for (size_t j = 0; j < 4; ++j) {
      double column = 0.0;
      for (size_t k = 0; k < 5; ++k) column += std::exp(double(w[0][k * 4 + j])) / 2;
      for (size_t i = 0; i < 3; ++i) {
        y[i * 4 + j] = column * std::tanh(double(w[1][j]));
        for (size_t k = 0; k < 5; ++k)
          y[i * 4 + j] += x_values[i * 5 + k] * (std::exp(double(w[0][k * 4 + j])) / 2 +
                                                 1.0 / (1.0 + std::exp(-double(w[2][j * 5 + k]))));
      }
    }
    return y;
  };
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  ASSERT_GE(session.report().setup_dispatches, 3u);
  session.set_input("x", x_values);
  for (size_t leaf = 0; leaf < 3; ++leaf) session.write("w" + std::to_string(leaf + 1), w[leaf]);
  session.run();
  expect_close(session.output("y"), expected());
  for (const size_t leaf : {2, 1, 2, 0, 1}) {
    SCOPED_TRACE("w" + std::to_string(leaf + 1) + " written");
    w[leaf] = drawn(generator, w[leaf].size());
    session.write("w" + std::to_string(leaf + 1), w[leaf]);
    session.run();
    expect_close(session.output("y"), expected());
    session.run();
    expect_close(session.output("y"), expected());
  }
  EXPECT_EQ(session.validation_messages(), 0u);
}

// Shared tensors: a training program updates w3 every run (w3 <- w3 / 2); an evaluation program
// sharing the weights has setup work over w1 and over w3. After each training run the evaluation
// sees the halved w3 and the w1 it had (or wrote itself after that run, which must not hide the
// training run's change), against the f64 value.
TEST(GpuSetup, ASharedTensorAnotherSessionUpdatesRerunsThePartThatReadsIt) {
  const auto weights = [](Graph& graph) {
    return std::pair{parameter(graph, "w1", {5, 4}, Init::uniform(-1.0, 1.0)),
                     parameter(graph, "w3", {5, 4}, Init::uniform(-1.0, 1.0))};
  };
  Graph training;
  {
    const auto [w1, w3] = weights(training);
    training.set_output("sum", sum_all(w1 + w3).id());
    training.assign(w3.id(), (w3 * 0.5).id());
  }
  Graph evaluation;
  const Tensor x = input(evaluation, "x", {3, 5});
  {
    const auto [w1, w3] = weights(evaluation);
    evaluation.set_output("y", (matmul(x, exp(w1) * 0.5) + matmul(x, sigmoid(w3))).id());
  }
  SessionOptions options;
  options.validation = true;
  options.shared_device = open_shared_device("");
  options.shared_tensors = make_shared_tensors(options.shared_device);
  Session trainer(training, options);
  Session evaluator(evaluation, options);
  ASSERT_GE(evaluator.report().setup_dispatches, 2u);
  std::mt19937_64 generator(79);
  const std::vector<float> x_values = drawn(generator, 15);
  evaluator.set_input("x", x_values);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("after " + std::to_string(step) + " training runs");
    if (step == 1) evaluator.write("w1", drawn(generator, 20));
    const std::vector<float> w1 = evaluator.read("w1"), w3 = evaluator.read("w3");
    evaluator.run();
    std::vector<double> y(3 * 4, 0.0);
    for (size_t i = 0; i < 3; ++i)
      for (size_t j = 0; j < 4; ++j)
        for (size_t k = 0; k < 5; ++k) {
          const size_t e = k * 4 + j;
          y[i * 4 + j] += x_values[i * 5 + k] *
                          (std::exp(double(w1[e])) / 2 + 1.0 / (1.0 + std::exp(-double(w3[e]))));
        }
    expect_close(evaluator.output("y"), y);
    trainer.run();
  }
  EXPECT_EQ(trainer.validation_messages() + evaluator.validation_messages(), 0u);
}

// A session with setup work built after another session changed a shared tensor, which declares
// a shared tensor of its own that no session had (so that building it tells the others what it
// created): it builds (its setup not yet traced when it takes in the other's change), and its
// first run reads the changed tensor, against the f64 value.
TEST(GpuSetup, ASessionBuiltAfterASharedChangeThatCreatesATensor) {
  Graph training;
  {
    const Tensor w = parameter(training, "w", {5, 4}, Init::uniform(-1.0, 1.0));
    training.set_output("sum", sum_all(w).id());
    training.assign(w.id(), (w * 0.5).id());
  }
  Graph evaluation;
  const Tensor x = input(evaluation, "x", {3, 5});
  {
    const Tensor w = parameter(evaluation, "w", {5, 4}, Init::uniform(-1.0, 1.0));
    const Tensor bias = parameter(evaluation, "bias", {4}, Init::uniform(-1.0, 1.0));
    evaluation.set_output("y", (matmul(x, exp(w) * 0.5) + bias).id());
  }
  SessionOptions options;
  options.validation = true;
  options.shared_device = open_shared_device("");
  options.shared_tensors = make_shared_tensors(options.shared_device);
  Session trainer(training, options);
  trainer.run();
  Session evaluator(evaluation, options);
  ASSERT_GE(evaluator.report().setup_dispatches, 1u);
  std::mt19937_64 generator(83);
  const std::vector<float> x_values = drawn(generator, 15);
  evaluator.set_input("x", x_values);
  const std::vector<float> w = trainer.read("w"), bias = evaluator.read("bias");
  evaluator.run();
  std::vector<double> y = expected_product(x_values, w);
  for (size_t i = 0; i < y.size(); ++i) y[i] += bias[i % 4];
  expect_close(evaluator.output("y"), y);
  EXPECT_EQ(trainer.validation_messages() + evaluator.validation_messages(), 0u);
}

}  // namespace
}  // namespace mg
