// Pooling and resampling ops: hand-derived values, VJPs against finite differences, misuse.
#include <algorithm>

#include "gradient_check.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::counting;
using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

// Distinct values at least 0.05 apart in random order: max pooling has no ties to flip
// under finite-difference steps.
HostTensor distinct(Shape shape, uint64_t seed) {
  HostTensor tensor = counting(std::move(shape), -1, 0.05);
  std::mt19937_64 generator(seed);
  std::shuffle(tensor.data.begin(), tensor.data.end(), generator);
  return tensor;
}

Tensor raw(Graph& graph, const std::string& op, std::vector<ValueId> inputs, Attrs attrs) {
  return {&graph, graph.add(op, std::move(inputs), std::move(attrs))};
}

TEST(Pool, MaxPool2dBlocksAndPadding) {
  expect_values(evaluate_op({counting({1, 1, 4, 4})},
                            [](std::vector<Tensor>& x) {
                              return max_pool2d(x[0], {2, 2});
                            }),
                {1, 1, 2, 2}, {6, 8, 14, 16});
  // All values negative: padding must act as -inf, not 0. Window (rows -1..1, cols -1..1)
  // holds -1, -2, -5, -6, so its max is -1; and so on.
  expect_values(evaluate_op({counting({1, 1, 4, 4}, -1, -1)},
                            [](std::vector<Tensor>& x) {
                              return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});
                            }),
                {1, 1, 2, 2}, {-1, -2, -5, -6});
}

TEST(Pool, MaxPool2dGradGoesToFirstMaximum) {
  // A window of four equal values sends everything to its first element; overlapping windows
  // (kernel 2, stride 1) that share one maximum add up there.
  Graph graph;
  const Tensor x = input(graph, "x", {1, 1, 2, 3});
  const Tensor grad_out = input(graph, "g", {1, 1, 1, 2});
  const Attrs attrs{{"kernel", std::vector<int64_t>{2, 2}},
                    {"stride", std::vector<int64_t>{1, 1}},
                    {"padding", std::vector<int64_t>{0, 0}}};
  const Tensor grad = raw(graph, "max_pool2d_grad", {x.id(), grad_out.id()}, attrs);
  Environment environment;
  environment.leaves["g"] = HostTensor({1, 1, 1, 2}, {10, 100});
  environment.leaves["x"] = HostTensor({1, 1, 2, 3}, {7, 7, 7, 7, 7, 7});
  expect_values(evaluate(graph, environment)[grad.id()], {1, 1, 2, 3}, {10, 100, 0, 0, 0, 0});
  environment.leaves["x"] = HostTensor({1, 1, 2, 3}, {0, 5, 0, 0, 0, 0});
  expect_values(evaluate(graph, environment)[grad.id()], {1, 1, 2, 3}, {0, 110, 0, 0, 0, 0});
}

TEST(Pool, AvgPool2dDividesByKernelArea) {
  expect_values(evaluate_op({counting({1, 1, 4, 4})},
                            [](std::vector<Tensor>& x) {
                              return avg_pool2d(x[0], {2, 2});
                            }),
                {1, 1, 2, 2}, {3.5, 5.5, 11.5, 13.5});
  // Padding counts in the average: the corner window sums 1 + 2 + 5 + 6 over 9 taps.
  expect_values(evaluate_op({counting({1, 1, 4, 4})},
                            [](std::vector<Tensor>& x) {
                              return avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});
                            }),
                {1, 1, 2, 2}, {14.0 / 9, 30.0 / 9, 57.0 / 9, 99.0 / 9});
}

TEST(Pool, GlobalAvgPool2d) {
  expect_values(evaluate_op({counting({1, 2, 2, 2})},
                            [](std::vector<Tensor>& x) { return global_avg_pool2d(x[0]); }),
                {1, 2, 1, 1}, {2.5, 6.5});
}

TEST(Pool, UpsampleNearest2dAndItsGradient) {
  expect_values(evaluate_op({counting({1, 1, 2, 2})},
                            [](std::vector<Tensor>& x) { return upsample_nearest2d(x[0], 2); }),
                {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  // The backward op sums each 2x2 block: 1 + 2 + 5 + 6 = 14, etc.
  expect_values(evaluate_op({counting({1, 1, 4, 4})},
                            [](std::vector<Tensor>& x) {
                              return raw(x[0].graph(), "upsample_nearest2d_grad", {x[0].id()},
                                         {{"scale", int64_t{2}}});
                            }),
                {1, 1, 2, 2}, {14, 22, 46, 54});
}

TEST(Pool, UpsampleBilinear2dHalfPixelCentres) {
  // 2 -> 4 along an axis: source coordinates -0.25 (clamped to 0), 0.25, 0.75, 1.25 (the
  // upper neighbour clamped to the last row), so row weights (1, 0), (.75, .25), (.25, .75),
  // (0, 1); the columns of [[1, 2], [3, 4]] interpolate to [1, 1.25, 1.75, 2] and
  // [3, 3.25, 3.75, 4].
  expect_values(evaluate_op({HostTensor({1, 1, 2, 2}, {1, 2, 3, 4})},
                            [](std::vector<Tensor>& x) { return upsample_bilinear2d(x[0], 4, 4); }),
                {1, 1, 4, 4},
                {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4});
}

TEST(Pool, UpsampleBilinear2dMatchesPyTorch) {
  // Mixed down- and up-sampling, 3x5 -> 2x7. Expected values from PyTorch 1.13:
  //   x = torch.arange(1, 16, dtype=torch.float64).reshape(1, 1, 3, 5) ** 2 / 10
  //   F.interpolate(x, size=(2, 7), mode="bilinear", align_corners=False)
  HostTensor x = counting({1, 1, 3, 5});
  for (double& value : x.data) value = value * value / 10;
  expect_values(
      evaluate_op({x}, [](std::vector<Tensor>& t) { return upsample_bilinear2d(t[0], 2, 7); }),
      {1, 1, 2, 7},
      {0.975, 1.28928571429, 1.73928571429, 2.275, 2.95357142857, 3.71785714286, 4.375, 9.975,
       11.1464285714, 12.6678571429, 14.275, 16.025, 17.8607142857, 19.375},
      1e-10);
}

TEST(Pool, MaxPool2dGradient) {
  expect_gradients_match({.shapes = {{1, 2, 5, 5}}, .values = {distinct({1, 2, 5, 5}, 7)}},
                         [](std::vector<Tensor>& x) {
                           return max_pool2d(x[0], {3, 3}, {2, 1}, {1, 1});
                         });
}

TEST(Pool, AvgPool2dGradientUsedTwice) {
  expect_gradients_match({.shapes = {{2, 1, 5, 4}}}, [](std::vector<Tensor>& x) {
    const Tensor y = avg_pool2d(x[0], {3, 2}, {2, 1}, {1, 1});
    return y * y + y;
  });
}

TEST(Pool, UpsampleGradients) {
  expect_gradients_match({.shapes = {{1, 2, 2, 3}}},
                         [](std::vector<Tensor>& x) { return upsample_nearest2d(x[0], 3); });
  expect_gradients_match({.shapes = {{1, 2, 3, 5}}},
                         [](std::vector<Tensor>& x) { return upsample_bilinear2d(x[0], 4, 3); });
  expect_gradients_match({.shapes = {{2, 1, 2, 3}}},
                         [](std::vector<Tensor>& x) { return global_avg_pool2d(x[0]); });
}

TEST(Pool, LinearBackwardOpsGradients) {
  // avg_pool2d_grad and the upsample gradients are linear; their VJPs are the forward ops.
  expect_gradients_match({.shapes = {{1, 2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return raw(x[0].graph(), "avg_pool2d_grad", {x[0].id()},
               {{"kernel", std::vector<int64_t>{3, 3}},
                {"stride", std::vector<int64_t>{2, 2}},
                {"padding", std::vector<int64_t>{1, 1}},
                {"input_shape", std::vector<int64_t>{1, 2, 5, 4}}});
  });
  expect_gradients_match({.shapes = {{1, 2, 4, 6}}}, [](std::vector<Tensor>& x) {
    return raw(x[0].graph(), "upsample_nearest2d_grad", {x[0].id()}, {{"scale", int64_t{2}}});
  });
  expect_gradients_match({.shapes = {{1, 2, 4, 3}}}, [](std::vector<Tensor>& x) {
    return raw(x[0].graph(), "upsample_bilinear2d_grad", {x[0].id()},
               {{"input_shape", std::vector<int64_t>{1, 2, 3, 5}}});
  });
}

TEST(Pool, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 2, 4, 4});
  expect_error(
      [&] {
        max_pool2d(x, {5, 5});
      },
      {"max_pool2d", "f32[1, 2, 4, 4]", "output size would be <= 0"});
  expect_error(
      [&] {
        avg_pool2d(x, {2, 2}, {2, 2}, {2, 2});
      },
      {"avg_pool2d", "padding must be at most half the kernel"});
  expect_error(
      [&] {
        max_pool2d(input(graph, "x3", {2, 4, 4}), {2, 2});
      },
      {"max_pool2d", "f32[2, 4, 4]", "rank 4"});
  expect_error([&] { max_pool2d(x, {2}); }, {"max_pool2d", "kernel [2]", "2 entries"});
  expect_error(
      [&] {
        avg_pool2d(input(graph, "xi", {1, 1, 2, 2}, DType::i32), {2, 2});
      },
      {"avg_pool2d", "i32[1, 1, 2, 2]", "floating"});
  expect_error([&] { upsample_bilinear2d(x, 0, 3); }, {"upsample_bilinear2d", "out_height 0"});
  expect_error([&] { upsample_nearest2d(x, 0); }, {"upsample_nearest2d", "scale 0"});
  expect_error(
      [&] {
        raw(graph, "upsample_nearest2d_grad", {x.id()}, {{"scale", int64_t{3}}});
      },
      {"upsample_nearest2d_grad", "[1, 2, 4, 4]", "multiple of scale 3"});
  expect_error(
      [&] {
        raw(graph, "max_pool2d_grad", {x.id(), input(graph, "g", {1, 2, 3, 3}).id()},
            {{"kernel", std::vector<int64_t>{2, 2}}});
      },
      {"max_pool2d_grad", "grad_out [1, 2, 3, 3]", "[1, 2, 2, 2]"});
  expect_error(
      [&] {
        raw(graph, "max_pool2d_grad",
            {x.id(), input(graph, "g2", {1, 2, 2, 2}).id(), input(graph, "p", {1, 2, 2, 3}).id()},
            {{"kernel", std::vector<int64_t>{2, 2}}});
      },
      {"max_pool2d_grad", "pooled [1, 2, 2, 3]", "max_pool2d's result [1, 2, 2, 2]"});
}

}  // namespace
}  // namespace mg
