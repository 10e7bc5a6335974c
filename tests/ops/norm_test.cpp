// Normalisation ops: hand-derived values, VJPs against finite differences, running statistics,
// misuse errors.
#include <cmath>

#include "gradient_check.hpp"
#include "op_expectations.hpp"
#include "ops/apply.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

Attrs batch_norm_attrs(bool training, bool weight, bool bias) {
  return {{"training", int64_t{training}},
          {"eps", 1e-5},
          {"has_weight", int64_t{weight}},
          {"has_bias", int64_t{bias}}};
}

TEST(Norm, LayerNormOverLastAxis) {
  // Row [1, 2, 3, 4]: mean 2.5, variance 1.25; row [2, 2, 2, 6]: mean 3, variance 3.
  const HostTensor x({2, 4}, {1, 2, 3, 4, 2, 2, 2, 6});
  const HostTensor weight({4}, {1, 2, 3, 4});
  const HostTensor bias({4}, {0, 0, 0, 1});
  const double a = 1 / std::sqrt(1.25), b = 1 / std::sqrt(3.0);
  expect_values(
      evaluate_op({x, weight, bias},
                  [](std::vector<Tensor>& t) { return layer_norm(t[0], t[1], t[2], 0.0); }),
      {2, 4},
      {-1.5 * a, -0.5 * 2 * a, 0.5 * 3 * a, 1.5 * 4 * a + 1, -b, -2 * b, -3 * b, 12 * b + 1});
  expect_values(evaluate_op({x},
                            [](std::vector<Tensor>& t) {
                              return layer_norm(t[0], std::nullopt, std::nullopt, 0.0);
                            }),
                {2, 4}, {-1.5 * a, -0.5 * a, 0.5 * a, 1.5 * a, -b, -b, -b, 3 * b});
}

TEST(Norm, RmsNormScalesByRootMeanSquare) {
  // [3, 4]: mean square 12.5; eps 0.5 makes it 13.
  const HostTensor out =
      evaluate_op({HostTensor({1, 2}, {3, 4}), HostTensor({2}, {1, -2})},
                  [](std::vector<Tensor>& t) { return rms_norm(t[0], t[1], 0.5); });
  expect_values(out, {1, 2}, {3 / std::sqrt(13.0), -8 / std::sqrt(13.0)});
}

TEST(Norm, GroupNormPerSampleAndGroup) {
  // Channels [1, 3 | 10, 14]: group 0 mean 2 variance 1, group 1 mean 12 variance 4, both
  // normalise to [-1, 1]; weight [1, 1, 2, 2] and bias [0, 0, 0, 1] then give [-1, 1, -2, 3].
  const HostTensor out =
      evaluate_op({HostTensor({1, 4, 1, 1}, {1, 3, 10, 14}), HostTensor({4}, {1, 1, 2, 2}),
                   HostTensor({4}, {0, 0, 0, 1})},
                  [](std::vector<Tensor>& t) { return group_norm(t[0], 2, t[1], t[2], 0.0); });
  expect_values(out, {1, 4, 1, 1}, {-1, 1, -2, 3});
}

TEST(Norm, BatchNormTrainingUpdatesRunningStatistics) {
  // x [N=2, C=2, L=1]: channel 0 holds [1, 3] (mean 2, biased variance 1, unbiased 2), channel
  // 1 holds [2, 6] (mean 4, biased variance 4, unbiased 8).
  Graph graph;
  const Tensor x = input(graph, "x", {2, 2, 1});
  const Tensor running_mean{&graph, graph.state("rm", {DType::f32, {2}})};
  const Tensor running_var{&graph, graph.state("rv", {DType::f32, {2}}, Init::ones())};
  const Tensor out = batch_norm(x, std::nullopt, std::nullopt, running_mean, running_var,
                                /*training=*/true, /*momentum=*/0.1, /*eps=*/0.0);
  verify(graph);
  Environment environment;
  environment.leaves["x"] = HostTensor({2, 2, 1}, {1, 2, 3, 6});
  initialise_leaves(graph, environment, 1);
  const std::vector<HostTensor> values = step(graph, environment);
  expect_values(values[out.id()], {2, 2, 1}, {-1, -1, 1, 1});
  expect_values(environment.leaves["rm"], {2}, {0.1 * 2, 0.1 * 4});
  expect_values(environment.leaves["rv"], {2}, {0.9 + 0.1 * 2, 0.9 + 0.1 * 8});
}

TEST(Norm, BatchNormEvalUsesRunningStatistics) {
  // (x - running_mean) / sqrt(running_var) * weight + bias, per channel.
  Graph graph;
  const Tensor x = input(graph, "x", {2, 2});
  const Tensor out = batch_norm(x, input(graph, "w", {2}), input(graph, "b", {2}),
                                input(graph, "rm", {2}), input(graph, "rv", {2}), false, 0.1, 0.0);
  Environment environment;
  environment.leaves["x"] = HostTensor({2, 2}, {3, 8, 5, 5});
  environment.leaves["w"] = HostTensor({2}, {1, 3});
  environment.leaves["b"] = HostTensor({2}, {0, 1});
  environment.leaves["rm"] = HostTensor({2}, {1, 2});
  environment.leaves["rv"] = HostTensor({2}, {4, 9});
  expect_values(evaluate(graph, environment)[out.id()], {2, 2}, {1, 7, 2, 4});
  EXPECT_TRUE(graph.updates().empty());
}

TEST(Norm, LayerNormGradients) {
  expect_gradients_match({.shapes = {{2, 3, 4}, {4}, {4}}},
                         [](std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); });
  expect_gradients_match({.shapes = {{5}}}, [](std::vector<Tensor>& x) {
    return layer_norm(x[0], std::nullopt, std::nullopt);
  });
}

TEST(Norm, LayerNormUsedTwice) {
  expect_gradients_match({.shapes = {{3, 4}, {4}}}, [](std::vector<Tensor>& x) {
    const Tensor y = layer_norm(x[0], x[1], std::nullopt);
    return y * y + layer_norm(y, std::nullopt, std::nullopt);
  });
}

TEST(Norm, RmsNormGradients) {
  expect_gradients_match({.shapes = {{2, 2, 5}, {5}}},
                         [](std::vector<Tensor>& x) { return rms_norm(x[0], x[1]); });
  expect_gradients_match({.shapes = {{3, 4}}},
                         [](std::vector<Tensor>& x) { return rms_norm(x[0], std::nullopt); });
}

TEST(Norm, GroupNormGradients) {
  expect_gradients_match({.shapes = {{2, 4, 2, 3}, {4}, {4}}},
                         [](std::vector<Tensor>& x) { return group_norm(x[0], 2, x[1], x[2]); });
  expect_gradients_match({.shapes = {{2, 6, 3}, {6}}}, [](std::vector<Tensor>& x) {
    return group_norm(x[0], 3, x[1], std::nullopt);
  });
}

TEST(Norm, BatchNormTrainingGradients) {
  // The op itself (the builder also needs state leaves for the running statistics).
  expect_gradients_match({.shapes = {{3, 2, 2, 2}, {2}, {2}}}, [](std::vector<Tensor>& x) {
    return apply("batch_norm", {x[0], x[1], x[2]}, batch_norm_attrs(true, true, true));
  });
  expect_gradients_match({.shapes = {{4, 3}}}, [](std::vector<Tensor>& x) {
    const Tensor y = apply("batch_norm", {x[0]}, batch_norm_attrs(true, false, false));
    return y * x[0] + y;
  });
}

TEST(Norm, BatchNormEvalGradients) {
  HostTensor running_var({3}, {0.5, 1.5, 2.0});
  expect_gradients_match({.shapes = {{2, 3, 2}, {3}, {3}, {3}, {3}},
                          .differentiable = {true, true, true, false, false},
                          .values = {{}, {}, {}, {}, running_var}},
                         [](std::vector<Tensor>& x) {
                           return batch_norm(x[0], x[1], x[2], x[3], x[4], /*training=*/false);
                         });
}

TEST(Norm, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 4, 3});
  expect_error([&] { layer_norm(x, input(graph, "w", {4}), std::nullopt); },
               {"layer_norm", "f32[2, 4, 3]", "weight [4] should have shape [3]"});
  expect_error([&] { group_norm(x, 3, std::nullopt, std::nullopt); },
               {"group_norm", "groups 3", "4 channels"});
  expect_error([&] { group_norm(input(graph, "x1", {4}), 2, std::nullopt, std::nullopt); },
               {"group_norm", "f32[4]", "rank >= 2"});
  expect_error(
      [&] {
        rms_norm(input(graph, "xi", {2, 3}, DType::i32), std::nullopt);
      },
      {"rms_norm", "i32[2, 3]", "floating"});
  expect_error(
      [&] {
        batch_norm(x, std::nullopt, std::nullopt, input(graph, "rm", {3}), input(graph, "rv", {4}),
                   false);
      },
      {"batch_norm", "running_mean [3] should have shape [4]"});
  expect_error(
      [&] {
        batch_norm(input(graph, "x2", {1, 4}), std::nullopt, std::nullopt, input(graph, "rm2", {4}),
                   input(graph, "rv2", {4}), true);
      },
      {"batch_norm", "one value per channel"});
}

}  // namespace
}  // namespace mg
