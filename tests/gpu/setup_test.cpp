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

}  // namespace
}  // namespace mg
