// Attention ops: hand-derived values, PyTorch fixtures, VJPs against finite differences (the
// flash-style backward ops), rotary embeddings, misuse errors.
#include <cmath>

#include "gradient_check.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

HostTensor generated(Shape shape, double (*value)(double)) {
  HostTensor tensor(std::move(shape));
  for (int64_t i = 0; i < tensor.elements(); ++i) tensor.data[i] = value(static_cast<double>(i));
  return tensor;
}

TEST(Attention, SoftmaxWeightsValues) {
  // Scores [0, ln 2] give probabilities [1/3, 2/3]: 3/3 + 12/3 = 5.
  const HostTensor q({1, 1, 1, 1}, {1});
  const HostTensor k({1, 1, 2, 1}, {0, std::log(2.0)});
  const HostTensor v({1, 1, 2, 1}, {3, 6});
  expect_values(evaluate_op({q, k, v},
                            [](std::vector<Tensor>& x) {
                              return scaled_dot_product_attention(x[0], x[1], x[2], {.scale = 1.0});
                            }),
                {1, 1, 1, 1}, {5});
  expect_values(evaluate_op({q, k},
                            [](std::vector<Tensor>& x) {
                              Graph& graph = x[0].graph();
                              return Tensor{&graph,
                                            graph.add("attention_lse", {x[0].id(), x[1].id()},
                                                      {{"scale", 1.0}})};
                            }),
                {1, 1, 1}, {std::log(3.0)});
}

TEST(Attention, CausalMaskIsTopLeftAligned) {
  // Equal scores: query 0 sees key 0 only, query 1 averages keys 0 and 1 (Sq = 2, Sk = 3).
  const HostTensor q({1, 1, 2, 1}, {0, 0});
  const HostTensor k({1, 1, 3, 1}, {0, 0, 0});
  const HostTensor v({1, 1, 3, 1}, {1, 3, 8});
  expect_values(evaluate_op({q, k, v},
                            [](std::vector<Tensor>& x) {
                              return scaled_dot_product_attention(x[0], x[1], x[2],
                                                                  {.causal = true});
                            }),
                {1, 1, 2, 1}, {1, 2});
}

// Inputs of the PyTorch fixtures, generated the same way there (see below).
struct Fixture {
  HostTensor q = generated({1, 2, 3, 2}, [](double i) { return std::sin(0.37 * i + 0.1); });
  HostTensor k = generated({1, 1, 4, 2}, [](double i) { return std::cos(0.23 * i - 0.4); });
  HostTensor v = generated({1, 1, 4, 3}, [](double i) { return std::sin(0.11 * i * i + 0.5); });
  HostTensor mask = HostTensor({1, 1, 1, 4}, {0, 0, 0, -1e9});
};

// Expected values from PyTorch 1.13 (float64), which lacks F.scaled_dot_product_attention, so
// its documented reference computation was run instead (python3, torch imported):
//   def gen(shape, f): return torch.tensor([f(i) for i in range(math.prod(shape))],
//                                          dtype=torch.float64).reshape(shape)
//   def sdpa(q, k, v, mask=None, causal=False):
//       rep = q.shape[1] // k.shape[1]
//       k = k.repeat_interleave(rep, 1); v = v.repeat_interleave(rep, 1)
//       s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
//       if causal: s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2]).tril().bool(),
//                                    float('-inf'))
//       if mask is not None: s = s + mask
//       return torch.softmax(s, -1) @ v
//   q = gen((1, 2, 3, 2), lambda i: math.sin(0.37 * i + 0.1))
//   k = gen((1, 1, 4, 2), lambda i: math.cos(0.23 * i - 0.4))
//   v = gen((1, 1, 4, 3), lambda i: math.sin(0.11 * i * i + 0.5))
//   mask = torch.tensor([0, 0, 0, -1e9], dtype=torch.float64).reshape(1, 1, 1, 4)
TEST(Attention, GroupedQueryCrossAttentionMatchesPyTorch) {
  const Fixture f;
  const auto run = [&](bool causal, bool masked) {
    std::vector<HostTensor> inputs{f.q, f.k, f.v};
    if (masked) inputs.push_back(f.mask);
    return evaluate_op(inputs, [&](std::vector<Tensor>& x) {
      AttentionOptions options{.causal = causal};
      if (masked) options.mask = x[3];
      return scaled_dot_product_attention(x[0], x[1], x[2], options);
    });
  };
  expect_values(run(false, false), {1, 2, 3, 3},
                {0.160406346196, 0.0790612665874, 0.627034893002, 0.209836818023, 0.168731977909,
                 0.588290943158, 0.217555129659, 0.182718397382, 0.581024969368, 0.179118230492,
                 0.118522693943, 0.608004843949, 0.116663385393, -0.00556626259358, 0.659096491177,
                 0.067296422828, -0.1284607111, 0.707467938182},
                1e-10);
  expect_values(run(true, false), {1, 2, 3, 3},
                {0.479425538604, 0.5728674601, 0.807558100405, 0.740995157404, 0.673430186244,
                 0.344523943558, 0.253826850915, 0.371997922451, 0.515569207273, 0.479425538604,
                 0.5728674601, 0.807558100405, 0.739367723352, 0.672804504999, 0.347404849824,
                 0.0956831811469, 0.275291572205, 0.578023238816},
                1e-10);
  expect_values(run(false, true), {1, 2, 3, 3},
                {0.200166723145, 0.339667562136, 0.539688186534, 0.247086367606, 0.368134776932,
                 0.519798300876, 0.253826850915, 0.371997922451, 0.515569207273, 0.21731464665,
                 0.349544302547, 0.5292250101, 0.153701789714, 0.310661658628, 0.554451277577,
                 0.0956831811469, 0.275291572205, 0.578023238816},
                1e-10);
}

TEST(Attention, Gradients) {
  expect_gradients_match(
      {.shapes = {{1, 2, 3, 2}, {1, 2, 3, 2}, {1, 2, 3, 3}}},
      [](std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); });
}

TEST(Attention, GroupedQueryCausalCrossGradients) {
  expect_gradients_match(
      {.shapes = {{2, 4, 3, 2}, {2, 2, 4, 2}, {2, 2, 4, 3}}}, [](std::vector<Tensor>& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true, .scale = 0.7});
      });
}

TEST(Attention, PaddingMaskGradientsUsedTwice) {
  // Key 2 of batch 1 is padding; the mask takes no gradient. The result fans out.
  HostTensor mask({2, 1, 1, 3}, {0, 0, 0, 0, 0, -1e9});
  expect_gradients_match({.shapes = {{2, 2, 2, 2}, {2, 1, 3, 2}, {2, 1, 3, 2}, {2, 1, 1, 3}},
                          .differentiable = {true, true, true, false},
                          .values = {{}, {}, {}, mask}},
                         [](std::vector<Tensor>& x) {
                           const Tensor y =
                               scaled_dot_product_attention(x[0], x[1], x[2], {.mask = x[3]});
                           return y * y + y;
                         });
}

TEST(Attention, RopeRotatesPairs) {
  // D = 4, theta = 100: pair 0 turns by position * 1 rad, pair 1 by position * 0.1 rad.
  const HostTensor x({1, 1, 2, 4}, {1, 2, 3, 4, 1, 2, 3, 4});
  const auto expected = [](double position) {
    const double a = position, b = 0.1 * position;
    return std::vector<double>{1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                               3 * std::cos(a) + 1 * std::sin(a),
                               4 * std::cos(b) + 2 * std::sin(b)};
  };
  std::vector<double> positions_5_and_6 = expected(5);
  for (double value : expected(6)) positions_5_and_6.push_back(value);
  expect_values(evaluate_op({x}, [](std::vector<Tensor>& t) { return rope(t[0], 100.0, 5); }),
                {1, 1, 2, 4}, positions_5_and_6, 1e-12);
  std::vector<double> positions_0_and_1{1, 2, 3, 4};
  for (double value : expected(1)) positions_0_and_1.push_back(value);
  expect_values(evaluate_op({x}, [](std::vector<Tensor>& t) { return rope(t[0], 100.0); }),
                {1, 1, 2, 4}, positions_0_and_1, 1e-12);
}

TEST(Attention, RopeGradient) {
  expect_gradients_match({.shapes = {{1, 2, 3, 4}}}, [](std::vector<Tensor>& x) {
    const Tensor y = rope(x[0], 10.0, 2);
    return y * y + y;
  });
}

// With positions (D = 4, theta = 100 as above), each sample's rows turn by that sample's own
// positions plus the offset, every head alike: x [2 samples, 2 heads, 2 rows, 4], positions
// [[5, 6], [0, 9]].
TEST(Attention, RopeAtEachSamplesPositions) {
  const auto expected = [](double position) {
    const double a = position, b = 0.1 * position;
    return std::vector<double>{1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                               3 * std::cos(a) + 1 * std::sin(a),
                               4 * std::cos(b) + 2 * std::sin(b)};
  };
  std::vector<double> rows;
  for (int copy = 0; copy < 8; ++copy) rows.insert(rows.end(), {1, 2, 3, 4});
  const HostTensor x({2, 2, 2, 4}, rows);
  const HostTensor positions({2, 2}, {5, 6, 0, 9});
  for (const int64_t offset : {0, 1}) {
    std::vector<double> want;
    for (int64_t sample = 0; sample < 2; ++sample) {
      for (int64_t head = 0; head < 2; ++head) {
        for (int64_t row = 0; row < 2; ++row) {
          for (double value : expected(positions.data[sample * 2 + row] + offset))
            want.push_back(value);
        }
      }
    }
    expect_values(
        evaluate_op({x, positions},
                    [offset](std::vector<Tensor>& t) { return rope(t[0], t[1], 100.0, offset); },
                    {DType::f32, DType::i32}),
        {2, 2, 2, 4}, want, 1e-12);
  }
}

TEST(Attention, RopeAtPositionsGradient) {
  expect_gradients_match({.shapes = {{2, 2, 3, 4}, {2, 3}},
                          .differentiable = {true, false},
                          .values = {HostTensor{}, HostTensor({2, 3}, {4, 1, 7, 0, 2, 30})},
                          .dtypes = {DType::f32, DType::i32}},
                         [](std::vector<Tensor>& x) {
                           const Tensor y = rope(x[0], x[1], 10.0, 2);
                           return y * y + y;
                         });
}

TEST(Attention, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor q = input(graph, "q", {1, 3, 4, 8});
  const Tensor k = input(graph, "k", {1, 2, 5, 8});
  const Tensor v = input(graph, "v", {1, 2, 5, 6});
  expect_error([&] { scaled_dot_product_attention(q, k, v); },
               {"scaled_dot_product_attention", "f32[1, 3, 4, 8]", "multiple of k/v heads 2"});
  const Tensor q2 = input(graph, "q2", {1, 2, 4, 7});
  expect_error([&] { scaled_dot_product_attention(q2, k, v); },
               {"scaled_dot_product_attention", "f32[1, 2, 4, 7]", "head_dim"});
  const Tensor q4 = input(graph, "q4", {1, 4, 4, 8});
  expect_error(
      [&] {
        scaled_dot_product_attention(q4, k, input(graph, "v2", {1, 2, 3, 6}));
      },
      {"scaled_dot_product_attention", "v [1, 2, 3, 6]", "k [1, 2, 5, 8]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(q4, k, v, {.mask = input(graph, "m", {4, 4})});
      },
      {"scaled_dot_product_attention", "mask [4, 4]", "[1, 4, 4, 5]"});
  expect_error(
      [&] {
        scaled_dot_product_attention(input(graph, "q3", {4, 8}), k, v);
      },
      {"scaled_dot_product_attention", "f32[4, 8]", "rank 4"});
  // Key slices (passes/split_attention.cpp) of 64: three would leave the third of 100 keys empty.
  const Tensor long_k = input(graph, "long_k", {1, 2, 100, 8});
  const Tensor long_v = input(graph, "long_v", {1, 2, 100, 6});
  const Attrs split_attrs{
      {"causal", int64_t{0}}, {"has_mask", int64_t{0}}, {"kv_splits", int64_t{3}}};
  expect_error(
      [&] {
        graph.add("scaled_dot_product_attention", {q4.id(), long_k.id(), long_v.id()}, split_attrs);
      },
      {"scaled_dot_product_attention", "kv_splits 3", "100 keys"});
  Attrs two_slices = split_attrs;
  two_slices.set("kv_splits", int64_t{2});
  const ValueId partials =
      graph.add("scaled_dot_product_attention", {q4.id(), long_k.id(), long_v.id()}, two_slices);
  EXPECT_EQ(graph.type(partials).shape, (Shape{2, 1, 4, 4, 7}));
  const ValueId combined = graph.add("attention_combine", {partials});
  EXPECT_EQ(graph.type(combined).shape, (Shape{1, 4, 4, 6}));
  expect_error([&] { gradients(graph, sum_all(Tensor(&graph, partials)).id(), {q4.id()}); },
               {"scaled_dot_product_attention", "kv_splits", "no gradient"});
  // dK over parts of each group's query heads (groups of 2 here): a part count that does not
  // divide the group, or head splits of dQ, are refused; 2 parts give [2, ...] partials.
  const Tensor out = input(graph, "out", {1, 4, 4, 6});
  const Tensor grad_out = input(graph, "grad_out", {1, 4, 4, 6});
  const Tensor lse = input(graph, "lse", {1, 4, 4});
  const std::vector<ValueId> backward_inputs{q4.id(),  k.id(),        v.id(),
                                             out.id(), grad_out.id(), lse.id()};
  const auto with_head_splits = [](int64_t parts) {
    return Attrs{{"causal", int64_t{0}}, {"has_mask", int64_t{0}}, {"head_splits", parts}};
  };
  expect_error([&] { graph.add("attention_grad_k", backward_inputs, with_head_splits(3)); },
               {"attention_grad_k", "head_splits 3", "divide the 2 query heads"});
  expect_error([&] { graph.add("attention_grad_q", backward_inputs, with_head_splits(2)); },
               {"attention_grad_q", "head_splits", "dK and dV only"});
  EXPECT_EQ(graph.type(graph.add("attention_grad_k", backward_inputs, with_head_splits(2))).shape,
            (Shape{2, 1, 2, 5, 8}));
  // max |dO| (passes/scale_attention_gradients.cpp): one per batch entry or per kv head (2 here),
  // not per query head.
  const Attrs with_largest{
      {"causal", int64_t{0}}, {"has_mask", int64_t{0}}, {"has_grad_out_max", int64_t{1}}};
  std::vector<ValueId> with_max = backward_inputs;
  with_max.push_back(input(graph, "grad_out_max", {1, 4, 1, 1}).id());
  expect_error([&] { graph.add("attention_grad_q", with_max, with_largest); },
               {"attention_grad_q", "grad_out_max [1, 4, 1, 1]", "[1, 2, 1, 1]"});
  expect_error([&] { graph.add("attention_grad_v", backward_inputs, with_largest); },
               {"attention_grad_v", "7 inputs"});
  for (const Shape& largest : {Shape{1, 1, 1, 1}, Shape{1, 2, 1, 1}}) {
    with_max.back() = input(graph, "largest " + shape_string(largest), largest).id();
    EXPECT_EQ(graph.type(graph.add("attention_grad_k", with_max, with_largest)).shape,
              (Shape{1, 2, 5, 8}));
  }
  // attention_combine with the heads after the queries: [S, B, H, Sq, Dv + 1] partials give
  // [B, Sq, H, Dv]; other partials are an error that names them.
  const Attrs heads_last{{"heads_last", int64_t{1}}};
  EXPECT_EQ(graph
                .type(graph.add("attention_combine",
                                {input(graph, "head partials", {3, 2, 4, 5, 7}).id()}, heads_last))
                .shape,
            (Shape{2, 5, 4, 6}));
  expect_error(
      [&] {
        graph.add("attention_combine", {input(graph, "flat partials", {3, 20, 7}).id()},
                  heads_last);
      },
      {"attention_combine", "heads_last", "[3, 20, 7]"});
  // Kernels that find the largest |dO| themselves read no max: the two ways exclude each other.
  Attrs own_scale{
      {"causal", int64_t{0}}, {"has_mask", int64_t{0}}, {"own_grad_out_scale", int64_t{1}}};
  EXPECT_EQ(graph.type(graph.add("attention_grad_q", backward_inputs, own_scale)).shape,
            (Shape{1, 4, 4, 8}));
  own_scale.set("has_grad_out_max", int64_t{1});
  expect_error([&] { graph.add("attention_grad_q", with_max, own_scale); },
               {"attention_grad_q", "has_grad_out_max and own_grad_out_scale"});
  expect_error(
      [&] {
        rope(input(graph, "x", {1, 1, 2, 5}));
      },
      {"rope", "f32[1, 1, 2, 5]", "even D"});
  expect_error(
      [&] {
        rope(input(graph, "xi", {1, 1, 2, 4}, DType::i32));
      },
      {"rope", "i32[1, 1, 2, 4]", "floating"});
  expect_error(
      [&] {
        rope(input(graph, "xp", {2, 3, 5, 4}), input(graph, "p", {2, 4}, DType::i32));
      },
      {"rope", "positions must be i32 [2, 5]"});
  expect_error(
      [&] {
        rope(input(graph, "xq", {2, 3, 5, 4}), input(graph, "pf", {2, 5}));
      },
      {"rope", "positions must be i32"});
}

}  // namespace
}  // namespace mg
