// Reductions and the softmax family: hand-derived values, VJPs, ties, misuse errors.
#include <cmath>

#include "gradient_check.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_unary;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;

const HostTensor kMatrix({2, 3}, {1, 2, 3, 4, 5, 6});

TEST(Reduce, SumAndMeanOverAxes) {
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return sum(x, {0}); }), {3}, {5, 7, 9});
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return sum(x, {-1}, true); }), {2, 1},
                {6, 15});
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return sum_all(x); }), {}, {21});
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return mean(x, {1}); }), {2}, {2, 5});
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return mean_all(x); }), {}, {3.5});
  const HostTensor cube({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_values(evaluate_unary(cube,
                               [](Tensor x) {
                                 return sum(x, {0, 2}, true);
                               }),
                {1, 2, 1}, {14, 22});
}

TEST(Reduce, MaxAndArgmaxPickTheFirstMaximum) {
  const HostTensor x({2, 3}, {1, 7, 7, 9, 2, 9});
  expect_values(evaluate_unary(x, [](Tensor t) { return max(t, {1}); }), {2}, {7, 9});
  expect_values(evaluate_unary(x, [](Tensor t) { return max(t, {0}, true); }), {1, 3}, {9, 7, 9});
  expect_values(evaluate_unary(x, [](Tensor t) { return argmax(t, 1); }), {2}, {1, 0});
  expect_values(evaluate_unary(x, [](Tensor t) { return argmax(t, 0, true); }), {1, 3}, {1, 0, 1});
  Graph graph;
  EXPECT_EQ(argmax(input(graph, "x", {2, 3}), 1).dtype(), DType::i32);
}

TEST(Reduce, MaxGradientGoesToTheFirstTiedElementOnly) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3});
  const Tensor loss = sum_all(max(x, {1}) * 2.0);
  const ValueId grad = gradients(graph, loss.id(), {x.id()}).at(x.id());
  Environment environment;
  environment.leaves["x"] = HostTensor({2, 3}, {1, 7, 7, 9, 2, 9});
  expect_values(evaluate(graph, environment)[grad], {2, 3}, {0, 2, 0, 2, 0, 0});
}

TEST(Reduce, SoftmaxValues) {
  // Row [0, ln 3]: exp gives [1, 3], so softmax = [1/4, 3/4].
  const HostTensor x({2, 2}, {0, std::log(3.0), 5, 5});
  expect_values(evaluate_unary(x, [](Tensor t) { return softmax(t); }), {2, 2},
                {0.25, 0.75, 0.5, 0.5});
  expect_values(evaluate_unary(x, [](Tensor t) { return log_softmax(t, 1); }), {2, 2},
                {std::log(0.25), std::log(0.75), std::log(0.5), std::log(0.5)});
  // Along axis 0 the columns are [0, 5] and [ln 3, 5]; large inputs must not overflow.
  const HostTensor big({2}, {1000, 1000 + std::log(3.0)});
  expect_values(evaluate_unary(big, [](Tensor t) { return softmax(t, 0); }), {2}, {0.25, 0.75});
}

TEST(Reduce, SumAndMeanGradients) {
  expect_gradients_match({.shapes = {{2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return sum(x[0], {0, 2});
  });
  expect_gradients_match({.shapes = {{2, 3, 2}}},
                         [](std::vector<Tensor>& x) { return sum(x[0], {1}, true); });
  expect_gradients_match({.shapes = {{2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return mean(x[0], {-1, 0});
  });
  expect_gradients_match({.shapes = {{2, 3}}},
                         [](std::vector<Tensor>& x) { return mean_all(x[0]); });
}

TEST(Reduce, MaxGradients) {
  expect_gradients_match({.shapes = {{3, 4}}},
                         [](std::vector<Tensor>& x) { return max(x[0], {1}); });
  expect_gradients_match({.shapes = {{2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return max(x[0], {0, 2}, true);
  });
}

TEST(Reduce, SoftmaxGradients) {
  for (int64_t axis : {0, 1, -1}) {
    SCOPED_TRACE(axis);
    expect_gradients_match({.shapes = {{3, 4}}, .low = -2, .high = 2},
                           [axis](std::vector<Tensor>& x) { return softmax(x[0], axis); });
    expect_gradients_match({.shapes = {{3, 4}}, .low = -2, .high = 2},
                           [axis](std::vector<Tensor>& x) { return log_softmax(x[0], axis); });
  }
}

TEST(Reduce, GradientsThroughFanOut) {
  // s feeds a sum, a product with itself and a max.
  expect_gradients_match({.shapes = {{3, 4}}}, [](std::vector<Tensor>& x) {
    const Tensor s = softmax(x[0] * 2.0);
    return s * sum(s, {0}, true) + max(s, {1}, true) + log_softmax(s);
  });
}

TEST(Reduce, ArgmaxPassesNoGradient) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3});
  const Tensor loss = sum_all(x) + sum_all(cast(argmax(x, 1), DType::f32));
  const ValueId grad = gradients(graph, loss.id(), {x.id()}).at(x.id());
  Environment environment;
  environment.leaves["x"] = kMatrix;
  expect_values(evaluate(graph, environment)[grad], {2, 3}, {1, 1, 1, 1, 1, 1});
}

TEST(Reduce, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3});
  expect_error([&] { sum(x, {2}); }, {"sum(f32[2, 3])", "axis 2 is out of range for rank 2"});
  expect_error([&] { max(x, {0, -2}); }, {"max(f32[2, 3])", "listed twice"});
  expect_error([&] { mean(input(graph, "i", {2}, DType::i32), {0}); },
               {"mean(i32[2])", "floating-point"});
  expect_error([&] { softmax(x, -3); }, {"softmax(f32[2, 3])", "axis -3"});
  expect_error([&] { argmax(x, 5); }, {"argmax(f32[2, 3])", "axis 5"});
  expect_error(
      [&] {
        graph.add("max_grad", {x.id(), x.id()}, {{"axes", std::vector<int64_t>{1}}});
      },
      {"max_grad(f32[2, 3], f32[2, 3])", "f32[2]"});
  expect_error(
      [&] {
        graph.add("sum", {x.id()}, {{"keepdims", int64_t{3}}});
      },
      {"sum(f32[2, 3])", "keepdims must be 0 or 1"});
}

}  // namespace
}  // namespace mg
