// matmul and linear: hand-derived products, VJPs for every transpose combination and for
// broadcast batches, misuse errors.
#include "gradient_check.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;

// [[1, 2, 3], [4, 5, 6]] x [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]].
const std::vector<double> kProduct = {58, 64, 139, 154};

TEST(Matmul, HandComputedProduct) {
  const HostTensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor b({3, 2}, {7, 8, 9, 10, 11, 12});
  expect_values(evaluate_op({a, b}, [](std::vector<Tensor>& x) { return matmul(x[0], x[1]); }),
                {2, 2}, kProduct);
}

TEST(Matmul, TransposeFlagsReadOperandsTransposed) {
  const HostTensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor a_t({3, 2}, {1, 4, 2, 5, 3, 6});
  const HostTensor b({3, 2}, {7, 8, 9, 10, 11, 12});
  const HostTensor b_t({2, 3}, {7, 9, 11, 8, 10, 12});
  for (int flags = 0; flags < 4; ++flags) {
    const bool transpose_a = flags & 1;
    const bool transpose_b = flags & 2;
    const HostTensor result = evaluate_op(
        {transpose_a ? a_t : a, transpose_b ? b_t : b},
        [&](std::vector<Tensor>& x) { return matmul(x[0], x[1], transpose_a, transpose_b); });
    expect_values(result, {2, 2}, kProduct);
  }
}

TEST(Matmul, BatchDimensionsBroadcast) {
  // Batch 0 multiplies by the identity, batch 1 by twice the identity; b is shared.
  const HostTensor a({2, 2, 2}, {1, 0, 0, 1, 2, 0, 0, 2});
  const HostTensor b({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_values(evaluate_op({a, b}, [](std::vector<Tensor>& x) { return matmul(x[0], x[1]); }),
                {2, 2, 3}, {1, 2, 3, 4, 5, 6, 2, 4, 6, 8, 10, 12});
}

TEST(Matmul, LinearUsesPyTorchWeightLayout) {
  // x [1, 2] = [1, 2]; weight [3, 2]; bias [3]: y_o = sum_i w[o, i] x_i + b_o.
  const HostTensor x({1, 2}, {1, 2});
  const HostTensor weight({3, 2}, {1, 0, 0, 1, 1, 1});
  const HostTensor bias({3}, {10, 20, 30});
  expect_values(evaluate_op({x, weight, bias},
                            [](std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }),
                {1, 3}, {11, 22, 33});
}

TEST(Matmul, GradientsForEveryTransposeCombination) {
  for (int flags = 0; flags < 4; ++flags) {
    const bool transpose_a = flags & 1;
    const bool transpose_b = flags & 2;
    SCOPED_TRACE(flags);
    const Shape a = transpose_a ? Shape{4, 3} : Shape{3, 4};
    const Shape b = transpose_b ? Shape{2, 4} : Shape{4, 2};
    expect_gradients_match({.shapes = {a, b}}, [&](std::vector<Tensor>& x) {
      return matmul(x[0], x[1], transpose_a, transpose_b);
    });
  }
}

TEST(Matmul, GradientsReduceBroadcastBatches) {
  expect_gradients_match({.shapes = {{2, 3, 4}, {4, 2}}},
                         [](std::vector<Tensor>& x) { return matmul(x[0], x[1]); });
  expect_gradients_match({.shapes = {{1, 3, 4}, {2, 2, 4}}},
                         [](std::vector<Tensor>& x) { return matmul(x[0], x[1], false, true); });
  expect_gradients_match({.shapes = {{2, 1, 4, 3}, {3, 4, 2}}},
                         [](std::vector<Tensor>& x) { return matmul(x[0], x[1], true, false); });
}

TEST(Matmul, LinearGradientsOnRank3Input) {
  expect_gradients_match({.shapes = {{2, 3, 4}, {5, 4}, {5}}},
                         [](std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); });
}

TEST(Matmul, GradientsThroughFanOut) {
  // h is used twice by the second product (h h^T).
  expect_gradients_match({.shapes = {{3, 4}, {4, 2}}}, [](std::vector<Tensor>& x) {
    const Tensor h = matmul(x[0], x[1]);
    return matmul(h, h, false, true);
  });
}

// A split-K partial product (k_begin / k_end) sums only its K range: k in [1, 3) of kProduct.
TEST(Matmul, KRangeSumsOnlyThatRange) {
  const HostTensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor b({3, 2}, {7, 8, 9, 10, 11, 12});
  const HostTensor partial = evaluate_op({a, b}, [](std::vector<Tensor>& x) {
    Graph& graph = x[0].graph();
    return Tensor(&graph, graph.add("matmul", {x[0].id(), x[1].id()},
                                    {{"k_begin", int64_t{1}}, {"k_end", int64_t{3}}}));
  });
  expect_values(partial, {2, 2}, {51, 56, 111, 122});
}

TEST(Matmul, KRangeMisuseAndGradient) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 3});
  const Tensor b = input(graph, "b", {3, 2});
  const auto ranged = [&](Attrs attrs) { return graph.add("matmul", {a.id(), b.id()}, attrs); };
  expect_error([&] { ranged({{"k_begin", int64_t{1}}}); }, {"matmul(", "both k_begin and k_end"});
  expect_error(
      [&] {
        ranged({{"k_begin", int64_t{2}}, {"k_end", int64_t{2}}});
      },
      {"matmul(", "K range [2, 2)", "K = 3"});
  expect_error(
      [&] {
        ranged({{"k_begin", int64_t{0}}, {"k_end", int64_t{4}}});
      },
      {"K range [0, 4)"});
  const Tensor partial(&graph, ranged({{"k_begin", int64_t{0}}, {"k_end", int64_t{2}}}));
  expect_error([&] { gradients(graph, sum_all(partial).id(), {a.id()}); },
               {"K range (k_begin / k_end)", "after differentiation"});
}

TEST(Matmul, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 3});
  const Tensor b = input(graph, "b", {4, 5});
  expect_error([&] { matmul(a, b); },
               {"matmul(f32[2, 3], f32[4, 5])", "inner dimensions differ (3 vs 4)"});
  expect_error([&] { matmul(input(graph, "v", {3}), a); }, {"matmul(f32[3], f32[2, 3])", "rank"});
  expect_error(
      [&] {
        matmul(a, input(graph, "i", {3, 2}, DType::i32));
      },
      {"matmul(f32[2, 3], i32[3, 2])", "different dtypes"});
  expect_error(
      [&] {
        matmul(input(graph, "p", {2, 2, 3}), input(graph, "q", {3, 3, 4}));
      },
      {"matmul(f32[2, 2, 3], f32[3, 3, 4])", "[2] and [3] do not broadcast"});
  expect_error(
      [&] {
        linear(a, input(graph, "w", {5, 4}));
      },
      {"linear(f32[2, 3], f32[5, 4])", "weight [out, in]"});
  expect_error(
      [&] {
        linear(a, input(graph, "w2", {5, 3}), input(graph, "bias", {4}));
      },
      {"linear(", "bias must have shape [5]"});
}

}  // namespace
}  // namespace mg
