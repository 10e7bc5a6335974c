// matmul and linear: hand-derived products, VJPs for every transpose combination and for
// broadcast batches, misuse errors.
#include <array>
#include <cmath>
#include <limits>
#include <random>

#include "gradient_check.hpp"
#include "ir/half.hpp"
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

// k_splits = S (made by the split-K pass): partial s sums only K slice s, the slices being
// multiples of 16 long. K = 40 in three: [0, 16), [16, 32), [32, 40); A transposed, batched, B
// broadcast.
TEST(Matmul, KSplitsSumEachSlice) {
  std::mt19937_64 generator(3);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  HostTensor a({2, 40, 3}), b({40, 4});
  for (double& element : a.data) element = uniform(generator);
  for (double& element : b.data) element = uniform(generator);
  const HostTensor partials = evaluate_op({a, b}, [](std::vector<Tensor>& x) {
    Graph& graph = x[0].graph();
    return Tensor(&graph, graph.add("matmul", {x[0].id(), x[1].id()},
                                    {{"transpose_a", int64_t{1}}, {"k_splits", int64_t{3}}}));
  });
  ASSERT_EQ(shape_string(partials.shape), shape_string({3, 2, 3, 4}));
  const std::array<int64_t, 4> bounds{0, 16, 32, 40};
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t batch = 0; batch < 2; ++batch) {
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t j = 0; j < 4; ++j) {
          double expected = 0;
          for (int64_t k = bounds[s]; k < bounds[s + 1]; ++k)
            expected += a.data[(batch * 40 + k) * 3 + i] * b.data[k * 4 + j];
          EXPECT_NEAR(partials.data[((s * 2 + batch) * 3 + i) * 4 + j], expected, 1e-12)
              << "slice " << s << " batch " << batch << " (" << i << ", " << j << ")";
        }
      }
    }
  }
}

TEST(Matmul, KSplitsMisuseAndGradient) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 40});
  const Tensor b = input(graph, "b", {40, 2});
  const auto split = [&](int64_t splits) {
    return graph.add("matmul", {a.id(), b.id()}, {{"k_splits", splits}});
  };
  expect_error([&] { split(0); }, {"matmul(", "k_splits 0", "K = 40"});
  // Slices of 16: a fourth slice of K = 40 would start at 48.
  expect_error([&] { split(4); }, {"matmul(", "k_splits 4", "non-empty"});
  const Tensor partials(&graph, split(3));
  expect_error([&] { gradients(graph, sum_all(partials).id(), {a.id()}); },
               {"matmul %", "k_splits", "after differentiation"});
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

Tensor raw(Graph& graph, const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {}) {
  return {&graph, graph.add(op, std::move(inputs), std::move(attrs))};
}

// round_to_f16 against values worked out by hand from f16's format: 11 significant bits, ties
// to the even neighbour, subnormal steps of 2^-24 below 2^-14, infinity from 65520 on.
TEST(HalfGemm, RoundToF16ByHand) {
  const double p = std::ldexp(1.0, -11);  // half of the step just above 1
  const std::vector<double> in = {1 + p,
                                  1 + 3 * p,
                                  1 + 1.5 * p,
                                  -(2 + 3 * p),
                                  65519.0,
                                  65520.0,
                                  -70000.0,
                                  std::ldexp(1.0, -25),
                                  3 * std::ldexp(1.0, -25),
                                  0.1,
                                  std::ldexp(1.0, -14) * 1.5 + std::ldexp(1.0, -26)};
  const std::vector<double> expected = {1.0,
                                        1 + 4 * p,
                                        1 + 2 * p,
                                        -(2 + 4 * p),  // the step above 2 is 4p: 2 + 3p rounds up
                                        65504.0,
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity(),
                                        0.0,
                                        std::ldexp(1.0, -23),
                                        0.0999755859375,  // 1638 / 16384
                                        std::ldexp(1.0, -14) * 1.5};
  const HostTensor x({static_cast<int64_t>(in.size())}, in);
  const HostTensor y = evaluate_op(
      {x}, [](std::vector<Tensor>& v) { return raw(v[0].graph(), "round_to_f16", {v[0].id()}); });
  ASSERT_EQ(y.data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(y.data[i], expected[i]) << "element " << i;
}

// round_to_bf16 against values worked out by hand from bfloat16's format: 8 significant bits,
// ties to the even neighbour, f32's exponent range (subnormal steps of 2^-133 below 2^-126),
// infinity from (2 - 2^-8) 2^127 on; and a bf16 tensor (a cast) holds the same values.
TEST(HalfGemm, RoundToBf16ByHand) {
  const double p = std::ldexp(1.0, -8);  // half of the step just above 1
  const double largest = 255 * std::ldexp(1.0, 120);
  const std::vector<double> in = {1 + p,
                                  1 + 3 * p,
                                  1 + 1.5 * p,
                                  -(2 + 3 * p),
                                  70000.0,
                                  255.4 * std::ldexp(1.0, 120),
                                  -255.5 * std::ldexp(1.0, 120),
                                  std::ldexp(1.0, -134),
                                  3 * std::ldexp(1.0, -134),
                                  1e-40,
                                  0.1};
  const std::vector<double> expected = {1.0,
                                        1 + 4 * p,
                                        1 + 2 * p,
                                        -(2 + 4 * p),  // the step above 2 is 4p: 2 + 3p rounds up
                                        70144.0,       // 137 steps of 512
                                        largest,
                                        -std::numeric_limits<double>::infinity(),
                                        0.0,
                                        std::ldexp(1.0, -132),
                                        std::ldexp(1.0, -133),  // 1.09 subnormal steps
                                        0.10009765625};         // 205 / 2048
  const HostTensor x({static_cast<int64_t>(in.size())}, in);
  const HostTensor y = evaluate_op(
      {x}, [](std::vector<Tensor>& v) { return raw(v[0].graph(), "round_to_bf16", {v[0].id()}); });
  const HostTensor held =
      evaluate_op({x}, [](std::vector<Tensor>& v) { return cast(v[0], DType::bf16); });
  ASSERT_EQ(y.data.size(), expected.size());
  ASSERT_EQ(held.data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(y.data[i], expected[i]) << "element " << i;
    EXPECT_EQ(held.data[i], expected[i]) << "element " << i << " of the cast";
  }
}

// half_matmul multiplies its f16 operands (or one f16 operand and one f32) as matmul does, in
// every transposition, into f32.
TEST(HalfGemm, HalfMatmulIsTheProductInF32) {
  const HostTensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor a_t({3, 2}, {1, 4, 2, 5, 3, 6});
  const HostTensor b({3, 2}, {7, 8, 9, 10, 11, 12});
  const HostTensor b_t({2, 3}, {7, 9, 11, 8, 10, 12});
  for (int flags = 0; flags < 16; ++flags) {
    const bool ta = flags & 1, tb = flags & 2, f32_a = flags & 4, f32_b = flags & 8;
    if (f32_a && f32_b) continue;
    Graph graph;
    Environment environment;
    const Tensor x = input(graph, "a", (ta ? a_t : a).shape, f32_a ? DType::f32 : DType::f16);
    const Tensor y = input(graph, "b", (tb ? b_t : b).shape, f32_b ? DType::f32 : DType::f16);
    environment.leaves["a"] = ta ? a_t : a;
    environment.leaves["b"] = tb ? b_t : b;
    const Tensor product = raw(graph, "half_matmul", {x.id(), y.id()},
                               {{"transpose_a", int64_t{ta}}, {"transpose_b", int64_t{tb}}});
    EXPECT_EQ(product.dtype(), DType::f32);
    expect_values(evaluate(graph, environment)[product.id()], {2, 2}, kProduct);
  }
  // bf16 operands (the GEMMs' in bf16 precision), which hold these values exactly: both, or one
  // beside an f32 operand (half products in bf16 precision).
  for (const auto& [a_dtype, b_dtype] :
       {std::pair{DType::bf16, DType::bf16}, std::pair{DType::bf16, DType::f32},
        std::pair{DType::f32, DType::bf16}}) {
    Graph graph;
    Environment environment;
    const Tensor x = input(graph, "a", a.shape, a_dtype);
    const Tensor y = input(graph, "b", b.shape, b_dtype);
    environment.leaves["a"] = a;
    environment.leaves["b"] = b;
    const Tensor product = raw(graph, "half_matmul", {x.id(), y.id()});
    EXPECT_EQ(product.dtype(), DType::f32);
    expect_values(evaluate(graph, environment)[product.id()], {2, 2}, kProduct);
  }
}

TEST(HalfGemm, Misuse) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 3});
  const Tensor h = input(graph, "h", {2, 3}, DType::f16);
  const Tensor g = input(graph, "g", {4, 2}, DType::f16);
  expect_error([&] { raw(graph, "round_to_f16", {h.id()}); }, {"round_to_f16", "rounds f32"});
  expect_error([&] { raw(graph, "round_to_bf16", {h.id()}); }, {"round_to_bf16", "rounds f32"});
  const Tensor bf = input(graph, "bf", {3, 2}, DType::bf16);
  expect_error(
      [&] {
        raw(graph, "half_matmul", {h.id(), bf.id()});
      },
      {"half_matmul", "f16 operands or bf16 ones"});
  const Tensor bf_a = input(graph, "bf_a", {2, 3}, DType::bf16);
  expect_error(
      [&] {
        raw(graph, "half_matmul", {bf_a.id(), bf.id()}, {{"f16_result", int64_t{1}}});
      },
      {"half_matmul", "bf16 operands into an f32 or bf16 result"});
  const Tensor f = input(graph, "f", {3, 2});
  expect_error(
      [&] {
        raw(graph, "half_matmul", {bf_a.id(), f.id()}, {{"f16_result", int64_t{1}}});
      },
      {"half_matmul", "bf16 operands into an f32 or bf16 result"});
  expect_error(
      [&] {
        raw(graph, "half_matmul", {bf_a.id(), f.id()}, {{"bf16_result", int64_t{1}}});
      },
      {"half_matmul", "bf16_result", "only for bf16 operands"});
  expect_error(
      [&] {
        raw(graph, "half_matmul", {h.id(), g.id()},
            {{"transpose_b", int64_t{1}}, {"bf16_result", int64_t{1}}});
      },
      {"half_matmul", "bf16_result", "only for bf16 operands"});
  expect_error(
      [&] {
        raw(graph, "half_matmul", {a.id(), a.id()}, {{"transpose_b", int64_t{1}}});
      },
      {"half_matmul", "f16 operands", "round_to_f16"});
  const Tensor indices = input(graph, "indices", {3, 2}, DType::i32);
  expect_error(
      [&] {
        raw(graph, "half_matmul", {h.id(), indices.id()});
      },
      {"half_matmul", "f16 operands", "an f32 operand"});
  expect_error(
      [&] {
        raw(graph, "half_matmul", {h.id(), g.id()});
      },
      {"half_matmul", "inner dimensions differ (3 vs 4)"});
  const Tensor row = input(graph, "row", {3}, DType::f16);
  expect_error(
      [&] {
        raw(graph, "half_matmul", {row.id(), g.id()});
      },
      {"half_matmul", "rank >= 2"});
  const Tensor two = input(graph, "two", {2, 3, 4}, DType::f16);
  const Tensor three = input(graph, "three", {3, 4, 2}, DType::f16);
  expect_error(
      [&] {
        raw(graph, "half_matmul", {two.id(), three.id()});
      },
      {"half_matmul", "[2] and [3] do not broadcast"});
  const Tensor rounded = raw(graph, "round_to_f16", {a.id()});
  expect_error(
      [&] {
        gradients(graph,
                  sum_all(raw(graph, "half_matmul", {rounded.id(), rounded.id()},
                              {{"transpose_b", int64_t{1}}}))
                      .id(),
                  {a.id()});
      },
      {"half_matmul", "after differentiation", "differentiate the graph"});
  expect_error([&] { raw(graph, "widen_f16", {a.id()}); }, {"widen_f16", "widens f16"});
  expect_error([&] { raw(graph, "widen_bf16", {rounded.id()}); }, {"widen_bf16", "widens bf16"});
}

// With f16_result (bf16_result, of bf16 operands) the product is rounded to f16 (bfloat16), and
// widen_f16 (widen_bf16) gives those values back exactly.
TEST(HalfGemm, HalfResultIsTheRoundedProduct) {
  for (const DType half : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(half)));
    const bool bfloat16 = half == DType::bf16;
    const auto rounded = [&](double value) {
      return bfloat16 ? round_to_bf16(value) : round_to_f16(value);
    };
    Graph graph;
    Environment environment;
    const HostTensor a_values({2, 2}, {0.1, 1.0 / 3, 2049, -7.25});
    const HostTensor b_values({2, 2}, {1.0 / 7, 3.5, 0.3, 1.0});
    const Tensor a = input(graph, "a", {2, 2}, half);
    const Tensor b = input(graph, "b", {2, 2}, half);
    environment.leaves["a"] = a_values;
    environment.leaves["b"] = b_values;
    const Tensor product = raw(graph, "half_matmul", {a.id(), b.id()},
                               {{bfloat16 ? "bf16_result" : "f16_result", int64_t{1}}});
    const Tensor widened = raw(graph, bfloat16 ? "widen_bf16" : "widen_f16", {product.id()});
    EXPECT_EQ(product.dtype(), half);
    EXPECT_EQ(widened.dtype(), DType::f32);
    const std::vector<HostTensor> values = evaluate(graph, environment);
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        double exact = 0;
        for (int k = 0; k < 2; ++k)
          exact += rounded(a_values.data[i * 2 + k]) * rounded(b_values.data[k * 2 + j]);
        EXPECT_EQ(values[product.id()].data[i * 2 + j], rounded(exact)) << i << ", " << j;
        EXPECT_EQ(values[widened.id()].data[i * 2 + j], rounded(exact)) << i << ", " << j;
      }
    }
  }
}

// Batched operands multiply entry by entry, and a rank-2 operand serves every entry, as matmul's
// batches do (Winograd's 16 point products, passes/workgroup_gemm.cpp): [2, 2, 3] x [3, 2] and
// [2, 2, 3] x [2, 3, 2] against the sums written out.
TEST(HalfGemm, BatchedOperandsMultiplyEntryByEntry) {
  Graph graph;
  Environment environment;
  std::mt19937_64 generator(23);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const auto leaf = [&](const std::string& name, const Shape& shape) {
    HostTensor value(shape);
    for (double& element : value.data) element = round_to_f16(uniform(generator));
    environment.leaves[name] = value;
    return input(graph, name, shape, DType::f16);
  };
  const Tensor a = leaf("a", {2, 2, 3});
  const Tensor shared = leaf("shared", {3, 2});
  const Tensor batched = leaf("batched", {2, 3, 2});
  const Tensor by_shared = raw(graph, "half_matmul", {a.id(), shared.id()});
  const Tensor by_batched = raw(graph, "half_matmul", {a.id(), batched.id()});
  EXPECT_EQ(by_shared.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(by_batched.dtype(), DType::f32);
  const std::vector<HostTensor> values = evaluate(graph, environment);
  const HostTensor& av = environment.leaves["a"];
  const HostTensor& sv = environment.leaves["shared"];
  const HostTensor& bv = environment.leaves["batched"];
  for (int z = 0; z < 2; ++z)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        double with_shared = 0, with_batched = 0;
        for (int k = 0; k < 3; ++k) {
          with_shared += av.data[(z * 2 + i) * 3 + k] * sv.data[k * 2 + j];
          with_batched += av.data[(z * 2 + i) * 3 + k] * bv.data[(z * 3 + k) * 2 + j];
        }
        EXPECT_NEAR(values[by_shared.id()].data[(z * 2 + i) * 2 + j], with_shared, 1e-12);
        EXPECT_NEAR(values[by_batched.id()].data[(z * 2 + i) * 2 + j], with_batched, 1e-12);
      }
}

// sum_to_f16 sums f32 partial results over their leading axis and rounds the sum (not each
// term) to f16: 1 + 2^-11 + 2^-12 lies three quarters of the way to f16's next value above 1,
// 0.875 and -3 are exact, 65504 + 16 rounds to infinity; misuse names the op.
TEST(HalfGemm, SumToF16RoundsTheSumOverTheLeadingAxis) {
  const double p = std::ldexp(1.0, -11);
  const HostTensor partials({3, 4}, {1, 0.5, -1, 65504, p, 0.25, -1, 8, p / 2, 0.125, -1, 8});
  const HostTensor y = evaluate_op({partials}, [](std::vector<Tensor>& v) {
    return raw(v[0].graph(), "sum_to_f16", {v[0].id()});
  });
  EXPECT_EQ(y.shape, Shape({4}));
  const std::vector<double> expected = {1 + 2 * p, 0.875, -3,
                                        std::numeric_limits<double>::infinity()};
  ASSERT_EQ(y.data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(y.data[i], expected[i]) << i;

  Graph graph;
  const Tensor x = input(graph, "x", {3, 4});
  EXPECT_EQ(raw(graph, "sum_to_f16", {x.id()}).dtype(), DType::f16);
  const Tensor h = input(graph, "h", {3, 4}, DType::f16);
  expect_error([&] { raw(graph, "sum_to_f16", {h.id()}); }, {"sum_to_f16", "sums f32"});
  const Tensor line = input(graph, "line", {4});
  expect_error([&] { raw(graph, "sum_to_f16", {line.id()}); }, {"sum_to_f16", "rank >= 2"});
}

// Every f16 bit pattern decodes to a value that encodes back to it (NaNs to the quiet NaN), and
// values between two neighbours encode to the nearer one, ties to the even pattern.
TEST(HalfGemm, F16BitsRoundTrip) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = f16_value(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_EQ((bits >> 10) & 0x1F, 0x1Fu) << bits;
      EXPECT_EQ(f16_bits(value), 0x7E00) << bits;
      continue;
    }
    ASSERT_EQ(f16_bits(value), bits) << "pattern " << bits << " (" << value << ")";
    EXPECT_EQ(round_to_f16(value), value) << bits;
  }
  EXPECT_EQ(f16_bits(1.0), 0x3C00);
  EXPECT_EQ(f16_bits(-2.0), 0xC000);
  EXPECT_EQ(f16_bits(65504.0), 0x7BFF);
  EXPECT_EQ(f16_bits(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(f16_bits(std::ldexp(1.0, -14)), 0x0400);
  EXPECT_EQ(f16_bits(-0.0), 0x8000);
  EXPECT_EQ(f16_bits(1e6), 0x7C00);
  EXPECT_EQ(f16_bits(1 + std::ldexp(1.0, -11)), 0x3C00);      // tie to even (down)
  EXPECT_EQ(f16_bits(1 + 3 * std::ldexp(1.0, -11)), 0x3C02);  // tie to even (up)
  EXPECT_EQ(f16_value(0x3555), 0.333251953125f);
}

// The interpreter holds f16 tensors in f16: leaves and results alike are rounded.
TEST(HalfGemm, InterpreterRoundsF16Values) {
  Graph graph;
  Environment environment;
  const Tensor x = input(graph, "x", {3}, DType::f16);
  environment.leaves["x"] = HostTensor({3}, {0.1, 1.0 / 3, 70000});
  const Tensor doubled = x * 3.0;
  const Tensor wide = cast(x, DType::f32) * 3.0;
  const std::vector<HostTensor> values = evaluate(graph, environment);
  const std::vector<double> held = {0.0999755859375, 0.333251953125,
                                    std::numeric_limits<double>::infinity()};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(values[x.id()].data[i], held[i]) << i;
    EXPECT_EQ(values[doubled.id()].data[i], round_to_f16(held[i] * 3)) << i;
    EXPECT_EQ(values[wide.id()].data[i], held[i] * 3) << i;
  }
}

}  // namespace
}  // namespace mg
