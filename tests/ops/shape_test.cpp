// Shape ops: hand-derived layouts, VJPs, index checks, misuse errors; and the graph's updates.
#include "gradient_check.hpp"
#include "ir/op_names.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::evaluate_unary;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

const HostTensor kMatrix({2, 3}, {1, 2, 3, 4, 5, 6});

// Graph::assign: one update per parameter or state leaf, in the order given, also in a copy of
// the graph and for a leaf added after the first updates; a second update of a leaf, an update
// of an input and one of another type are refused naming the leaf or the value; reassign
// replaces an update in place.
TEST(Graph, UpdatesOneAPersistentLeafEach) {
  Graph graph;
  const ValueId first = graph.parameter("first", {DType::f32, {3}}, Init::zeros());
  const ValueId data = graph.input("data", {DType::f32, {3}});
  const ValueId doubled = graph.add("add", {first, first});
  graph.assign(first, doubled);
  const ValueId later = graph.state("later", {DType::f32, {3}}, Init::ones());
  const ValueId sum = graph.add("add", {later, data});
  graph.assign(later, sum);
  EXPECT_EQ(graph.updates(),
            (std::vector<std::pair<ValueId, ValueId>>{{first, doubled}, {later, sum}}));
  expect_error([&] { graph.assign(first, sum); }, {"assign: 'first' is already updated"});
  Graph copy = graph;
  expect_error([&] { copy.assign(later, doubled); }, {"assign: 'later' is already updated"});
  expect_error([&] { graph.assign(data, sum); }, {"is a input", "only parameters and state"});
  const ValueId wide = graph.state("wide", {DType::f32, {4}}, Init::zeros());
  expect_error([&] { graph.assign(wide, sum); }, {"assign to 'wide'", "differs from"});
  graph.reassign(first, sum);
  EXPECT_EQ(graph.updates().front(), (std::pair<ValueId, ValueId>{first, sum}));
  EXPECT_EQ(graph.updates().size(), 2u);
}

TEST(Shape, ReshapeKeepsRowMajorOrderAndResolvesMinusOne) {
  expect_values(evaluate_unary(kMatrix,
                               [](Tensor x) {
                                 return reshape(x, {3, -1});
                               }),
                {3, 2}, {1, 2, 3, 4, 5, 6});
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3, 4});
  EXPECT_EQ(shape_string(unsqueeze(x, -1).shape()), "[2, 3, 4, 1]");
  EXPECT_EQ(shape_string(unsqueeze(x, 0).shape()), "[1, 2, 3, 4]");
  EXPECT_EQ(shape_string(squeeze(unsqueeze(x, 1), 1).shape()), "[2, 3, 4]");
  EXPECT_EQ(shape_string(flatten(x).shape()), "[2, 12]");
  EXPECT_EQ(shape_string(flatten(x, 0).shape()), "[24]");
  EXPECT_EQ(graph.node(reshape(x, {-1}).id()).attrs.get_ints("shape"), (Shape{24}));
}

TEST(Shape, TransposeMovesAxes) {
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return transpose(x, 0, 1); }), {3, 2},
                {1, 4, 2, 5, 3, 6});
  // Result axis i is input axis permutation[i]: out[c][a][b] = x[a][b][c] with x [2, 2, 2]
  // holding 0..7, i.e. x[a][b][c] = 4a + 2b + c.
  const HostTensor cube({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  expect_values(evaluate_unary(cube,
                               [](Tensor x) {
                                 return transpose(x, {2, 0, 1});
                               }),
                {2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7});
}

TEST(Shape, SliceConcatAndSplit) {
  expect_values(evaluate_unary(kMatrix, [](Tensor x) { return slice(x, -1, 1, 3); }), {2, 2},
                {2, 3, 5, 6});
  const HostTensor column({2, 1}, {7, 8});
  expect_values(evaluate_op({kMatrix, column},
                            [](std::vector<Tensor>& x) {
                              return concat({x[1], x[0]}, 1);
                            }),
                {2, 4}, {7, 1, 2, 3, 8, 4, 5, 6});
  expect_values(evaluate_unary(kMatrix,
                               [](Tensor x) {
                                 return split(x, {1, 2}, 1)[1];
                               }),
                {2, 2}, {2, 3, 5, 6});
}

TEST(Shape, BroadcastToAndPad) {
  expect_values(evaluate_unary(HostTensor({3}, {1, 2, 3}),
                               [](Tensor x) {
                                 return broadcast_to(x, {2, 3});
                               }),
                {2, 3}, {1, 2, 3, 1, 2, 3});
  expect_values(evaluate_unary(HostTensor({2, 1}, {1, 2}),
                               [](Tensor x) {
                                 return broadcast_to(x, {2, 3});
                               }),
                {2, 3}, {1, 1, 1, 2, 2, 2});
  const HostTensor square({2, 2}, {1, 2, 3, 4});
  expect_values(evaluate_unary(square,
                               [](Tensor x) {
                                 return pad(x, {{1, 0}, {0, 2}}, 9);
                               }),
                {3, 4}, {9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9});
}

TEST(Shape, GatherAndScatterAddRows) {
  const HostTensor table({3, 2}, {1, 2, 3, 4, 5, 6});
  const HostTensor indices({2, 2}, {2, 0, 1, 2});
  expect_values(
      evaluate_op({table, indices}, [](std::vector<Tensor>& x) { return gather(x[0], x[1]); },
                  {DType::f32, DType::i32}),
      {2, 2, 2}, {5, 6, 1, 2, 3, 4, 5, 6});
  // Rows 0 and 2 of the updates both land on row 0.
  const HostTensor updates({3, 2}, {10, 20, 30, 40, 50, 60});
  expect_values(evaluate_op({table, HostTensor({3}, {0, 2, 0}), updates},
                            [](std::vector<Tensor>& x) { return scatter_add(x[0], x[1], x[2]); },
                            {DType::f32, DType::i32, DType::f32}),
                {3, 2}, {61, 82, 3, 4, 35, 46});
}

TEST(Shape, IndexOutOfRangeNamesIndexAndRows) {
  expect_error(
      [] {
        evaluate_op({HostTensor({3, 2}, {1, 2, 3, 4, 5, 6}), HostTensor({2}, {1, 5})},
                    [](std::vector<Tensor>& x) { return gather(x[0], x[1]); },
                    {DType::f32, DType::i32});
      },
      {"gather", "index 5", "V = 3"});
  expect_error(
      [] {
        evaluate_op({HostTensor({3, 1}, {1, 2, 3}), HostTensor({1}, {-1}), HostTensor({1, 1}, {1})},
                    [](std::vector<Tensor>& x) { return scatter_add(x[0], x[1], x[2]); },
                    {DType::f32, DType::i32, DType::f32});
      },
      {"scatter_add", "index -1", "V = 3"});
}

TEST(Shape, LayoutGradients) {
  expect_gradients_match({.shapes = {{2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return reshape(x[0], {3, 4});
  });
  expect_gradients_match({.shapes = {{2, 3, 2}}}, [](std::vector<Tensor>& x) {
    return transpose(x[0], {1, 2, 0});
  });
  expect_gradients_match({.shapes = {{2, 5}}},
                         [](std::vector<Tensor>& x) { return slice(x[0], 1, 1, 4); });
  expect_gradients_match({.shapes = {{2, 1}, {2, 3}, {2, 2}}}, [](std::vector<Tensor>& x) {
    return concat({x[0], x[1], x[2]}, -1);
  });
  expect_gradients_match({.shapes = {{2, 1, 3}}}, [](std::vector<Tensor>& x) {
    return broadcast_to(x[0], {4, 2, 2, 3});
  });
  expect_gradients_match({.shapes = {{2, 3}}}, [](std::vector<Tensor>& x) {
    return pad(x[0], {{1, 2}, {0, 1}}, 0.5);
  });
}

TEST(Shape, GatherAndScatterGradients) {
  // Index 1 repeats, so the table gradient must accumulate; indices take no gradient.
  const HostTensor indices({2, 2}, {1, 3, 1, 0});
  expect_gradients_match({.shapes = {{4, 3}, {2, 2}},
                          .differentiable = {true, false},
                          .values = {{}, indices},
                          .dtypes = {DType::f32, DType::i32}},
                         [](std::vector<Tensor>& x) { return gather(x[0], x[1]); });
  expect_gradients_match({.shapes = {{4, 3}, {2, 2}, {2, 2, 3}},
                          .differentiable = {true, false, true},
                          .values = {{}, indices},
                          .dtypes = {DType::f32, DType::i32, DType::f32}},
                         [](std::vector<Tensor>& x) { return scatter_add(x[0], x[1], x[2]); });
}

// A table that a gather reads and a product multiplies (an embedding tied to the output
// projection): its gradient scatters the gather's rows into the product's gradient, whichever
// of the two autodiff reaches first, with no sum of a table of zeros; the values match finite
// differences.
TEST(Shape, TiedTableGradientScattersIntoTheProductGradient) {
  const HostTensor indices({2, 2}, {1, 3, 1, 0});
  const GradientCase spec{.shapes = {{4, 3}, {2, 2}, {2, 4}},
                          .differentiable = {true, false, true},
                          .values = {{}, indices},
                          .dtypes = {DType::f32, DType::i32, DType::f32}};
  // The product after the gather (autodiff meets its gradient first), then before it.
  const auto product_last = [](std::vector<Tensor>& x) {
    return concat({reshape(gather(x[0], x[1]), {4, 3}), matmul(x[2], x[0])}, 0);
  };
  const auto product_first = [](std::vector<Tensor>& x) {
    const Tensor product = matmul(x[2], x[0]);
    return concat({product, reshape(gather(x[0], x[1]), {4, 3})}, 0);
  };
  for (const auto& build : {std::function<Tensor(std::vector<Tensor>&)>(product_last),
                            std::function<Tensor(std::vector<Tensor>&)>(product_first)}) {
    expect_gradients_match(spec, build);
    Graph graph;
    std::vector<Tensor> x{input(graph, "x0", {4, 3}), input(graph, "x1", {2, 2}, DType::i32),
                          input(graph, "x2", {2, 4})};
    const Tensor loss = sum_all(build(x) * input(graph, "r", {6, 3}));
    const ValueId table_gradient = gradients(graph, loss.id(), {x[0].id()}).at(x[0].id());
    const Node& scatter = graph.node(table_gradient);
    ASSERT_EQ(scatter.op, op::scatter_add);
    EXPECT_FALSE(graph.node(scatter.inputs[0]).is_leaf());
    EXPECT_EQ(graph.node(scatter.inputs[0]).op, op::matmul);
  }
}

TEST(Shape, GradientsThroughFanOut) {
  // t is used by a slice, a concat and a pad.
  expect_gradients_match({.shapes = {{2, 3}}}, [](std::vector<Tensor>& x) {
    const Tensor t = transpose(x[0] * x[0], 0, 1);
    const Tensor joined = concat({slice(t, 0, 0, 2), t}, 0);
    return joined * pad(slice(t, 0, 1, 3), {{2, 1}, {0, 0}});
  });
}

TEST(Shape, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3});
  expect_error(
      [&] {
        reshape(x, {4, 2});
      },
      {"reshape(f32[2, 3])", "cannot reshape 6 elements into [4, 2]"});
  expect_error([&] { reshape(x, {-1, -1}); }, {"reshape(f32[2, 3])", "at most one -1"});
  expect_error([&] { reshape(x, {4, -1}); }, {"reshape(f32[2, 3])", "6 elements into [4, -1]"});
  expect_error([&] { transpose(x, {0, 0}); }, {"transpose(f32[2, 3])", "listed twice"});
  expect_error([&] { transpose(x, {1, 0, 2}); }, {"transpose(f32[2, 3])", "permutation"});
  expect_error([&] { transpose(x, 0, 2); }, {"transpose(f32[2, 3])", "axis 2"});
  expect_error([&] { slice(x, 1, 2, 4); }, {"slice(f32[2, 3])", "[2, 4)", "extent 3"});
  expect_error(
      [&] {
        concat({x, input(graph, "y", {3, 3})}, 1);
      },
      {"concat(f32[2, 3], f32[3, 3])", "off axis 1"});
  expect_error([&] { split(x, {1, 1}, 1); }, {"split(f32[2, 3])", "add up to 3"});
  expect_error(
      [&] {
        broadcast_to(x, {2, 4});
      },
      {"broadcast_to(f32[2, 3])", "cannot broadcast [2, 3] to [2, 4]"});
  expect_error([&] { pad(x, {{1, 1}}); }, {"pad(f32[2, 3])", "2 axes"});
  expect_error([&] { pad(x, {{1, 1}, {-1, 0}}); }, {"pad(f32[2, 3])", "non-negative"});
  expect_error([&] { squeeze(x, 0); }, {"squeeze(f32[2, 3])", "extent 2, not 1"});
  const Tensor float_indices = input(graph, "f", {4});
  expect_error([&] { gather(x, float_indices); }, {"gather(f32[2, 3], f32[4])", "i32"});
  const Tensor indices = input(graph, "i", {4}, DType::i32);
  const Tensor integer_table = input(graph, "t", {2, 3}, DType::i32);
  expect_error([&] { gather(integer_table, indices); },
               {"gather(i32[2, 3], i32[4])", "the table must hold f32, f16 or bf16"});
  expect_error(
      [&] {
        scatter_add(x, indices, input(graph, "u", {4, 2}));
      },
      {"scatter_add(f32[2, 3], i32[4], f32[4, 2])", "updates must be f32[4, 3]"});
}

}  // namespace
}  // namespace mg
