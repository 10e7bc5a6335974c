// Elementwise ops: hand-derived values, VJPs against finite differences, misuse errors.
#include <cmath>
#include <numbers>

#include "gradient_check.hpp"
#include "ir/half.hpp"
#include "meganeura/autodiff.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

using Build = std::function<Tensor(std::vector<Tensor>&)>;

HostTensor values(Shape shape, std::vector<double> data) {
  return {std::move(shape), data};
}

// Random values in [-1, 1] at least 0.1 away from 0, for ops with a kink there.
HostTensor away_from_zero(const Shape& shape, uint64_t seed) {
  std::mt19937_64 generator(seed);
  HostTensor tensor = testing::random_tensor(shape, generator, 0.1, 1.0);
  std::bernoulli_distribution negative(0.5);
  for (double& value : tensor.data) value = negative(generator) ? -value : value;
  return tensor;
}

TEST(Elementwise, BinaryArithmeticBroadcasts) {
  const HostTensor a = values({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor row = values({3}, {10, 20, 30});
  const HostTensor column = values({2, 1}, {2, 4});
  const auto run = [&](const HostTensor& b, Tensor (*op)(Tensor, Tensor)) {
    return evaluate_op({a, b}, [op](std::vector<Tensor>& x) { return op(x[0], x[1]); });
  };
  expect_values(run(row, add), {2, 3}, {11, 22, 33, 14, 25, 36});
  expect_values(run(row, sub), {2, 3}, {-9, -18, -27, -6, -15, -24});
  expect_values(run(column, mul), {2, 3}, {2, 4, 6, 16, 20, 24});
  expect_values(run(column, div), {2, 3}, {0.5, 1, 1.5, 1, 1.25, 1.5});
  expect_values(evaluate_op({values({3}, {2, 9, 4}), values({3}, {3, 0.5, -1})},
                            [](std::vector<Tensor>& x) { return pow(x[0], x[1]); }),
                {3}, {8, 3, 0.25});
}

TEST(Elementwise, IntegerDivisionTruncatesTowardZero) {
  const HostTensor result =
      evaluate_op({values({2}, {7, -7}), values({2}, {2, 2})},
                  [](std::vector<Tensor>& x) { return div(x[0], x[1]); }, {DType::i32, DType::i32});
  expect_values(result, {2}, {3, -3});
}

TEST(Elementwise, SelectionAndComparisons) {
  const HostTensor a = values({3}, {1, 2, 3});
  const HostTensor b = values({3}, {2, 2, 2});
  const auto run = [&](Tensor (*op)(Tensor, Tensor)) {
    return evaluate_op({a, b}, [op](std::vector<Tensor>& x) { return op(x[0], x[1]); });
  };
  expect_values(run(maximum), {3}, {2, 2, 3});
  expect_values(run(minimum), {3}, {1, 2, 2});
  expect_values(run(equal), {3}, {0, 1, 0});
  expect_values(run(less), {3}, {1, 0, 0});
  expect_values(run(less_equal), {3}, {1, 1, 0});
  expect_values(run(greater), {3}, {0, 0, 1});
  expect_values(run(greater_equal), {3}, {0, 1, 1});
}

TEST(Elementwise, ComparisonKeepsInputDtype) {
  Graph graph;
  const Tensor a = input(graph, "a", {2}, DType::i32);
  EXPECT_EQ(less(a, a).dtype(), DType::i32);
}

TEST(Elementwise, WhereBroadcastsAllThree) {
  const HostTensor result =
      evaluate_op({values({2, 1}, {1, 0}), values({3}, {1, 2, 3}), values({}, {9})},
                  [](std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); });
  expect_values(result, {2, 3}, {1, 2, 3, 9, 9, 9});
}

TEST(Elementwise, UnaryValues) {
  const double ln3 = std::log(3.0);
  const auto run = [](std::vector<double> data, Tensor (*op)(Tensor)) {
    const Shape shape{static_cast<int64_t>(data.size())};
    return evaluate_op({values(shape, data)}, [op](std::vector<Tensor>& x) { return op(x[0]); });
  };
  expect_values(run({1, -2}, neg), {2}, {-1, 2});
  expect_values(run({1.5, -2}, abs), {2}, {1.5, 2});
  expect_values(run({0, 1}, exp), {2}, {1, std::numbers::e});
  expect_values(run({1, std::numbers::e}, log), {2}, {0, 1});
  expect_values(run({4, 9}, sqrt), {2}, {2, 3});
  expect_values(run({4, 0.25}, rsqrt), {2}, {0.5, 2});
  expect_values(run({4, -0.5}, recip), {2}, {0.25, -2});
  expect_values(run({-3, 0.5}, square), {2}, {9, 0.25});
  expect_values(run({0, std::numbers::pi / 2}, sin), {2}, {0, 1});
  expect_values(run({0, std::numbers::pi}, cos), {2}, {1, -1});
  expect_values(run({-1, 2}, relu), {2}, {0, 2});
  // sigmoid(ln 3) = 1 / (1 + 1/3) = 3/4; tanh(ln 2) = (2 - 1/2) / (2 + 1/2) = 3/5.
  expect_values(run({0, ln3}, sigmoid), {2}, {0.5, 0.75});
  expect_values(run({0, std::log(2.0)}, tanh), {2}, {0, 0.6});
  expect_values(run({0, ln3}, silu), {2}, {0, 0.75 * ln3});
}

TEST(Elementwise, GeluMatchesTorch) {
  // /usr/bin/python3: torch.nn.functional.gelu(torch.tensor([1.0, -1.0, 0.5],
  // dtype=torch.float64)) and the same with approximate='tanh'.
  const HostTensor x = values({3}, {1.0, -1.0, 0.5});
  expect_values(evaluate_op({x}, [](std::vector<Tensor>& in) { return gelu(in[0]); }), {3},
                {0.841344746068543, -0.15865525393145702, 0.34573123063700656}, 1e-15);
  expect_values(
      evaluate_op({x},
                  [](std::vector<Tensor>& in) { return gelu(in[0], GeluApproximation::tanh); }),
      {3}, {0.8411919906082768, -0.15880800939172324, 0.34571400982514394}, 1e-15);
}

TEST(Elementwise, GeluGradMatchesTorch) {
  // /usr/bin/python3: x = torch.tensor([0.0, 1.0, -1.5], dtype=torch.float64,
  // requires_grad=True); F.gelu(x, approximate=a).sum().backward(); x.grad for a = 'none', 'tanh'.
  const HostTensor x = values({3}, {0.0, 1.0, -1.5});
  const HostTensor g = values({3}, {1.0, 1.0, 2.0});
  const auto run = [&](const char* form) {
    return evaluate_op({x, g}, [form](std::vector<Tensor>& in) {
      Graph& graph = in[0].graph();
      return Tensor(&graph, graph.add("gelu_grad", {in[0].id(), in[1].id()},
                                      {{"approximate", std::string(form)}}));
    });
  };
  expect_values(run("none"), {3}, {0.5, 1.0833154705876864, 2 * -0.1274691922299796}, 1e-15);
  expect_values(run("tanh"), {3}, {0.5, 1.0829640838457826, 2 * -0.12771079315143308}, 1e-15);
}

TEST(Elementwise, CastTruncatesIntoIntegers) {
  Graph graph;
  const Tensor x = input(graph, "x", {3});
  const Tensor y = cast(x, DType::i32);
  EXPECT_EQ(y.dtype(), DType::i32);
  Environment environment;
  environment.leaves["x"] = values({3}, {1.7, -1.7, 2.0});
  expect_values(evaluate(graph, environment)[y.id()], {3}, {1, -1, 2});
}

TEST(Elementwise, StopGradientBlocksOnlyItsPath) {
  // d/dx [x * stop_gradient(x)] = stop_gradient(x) = x, not 2x.
  Graph graph;
  const Tensor x = input(graph, "x", {2});
  const Tensor loss = sum_all(x * stop_gradient(x));
  const ValueId grad = gradients(graph, loss.id(), {x.id()}).at(x.id());
  Environment environment;
  environment.leaves["x"] = values({2}, {3, -0.5});
  expect_values(evaluate(graph, environment)[grad], {2}, {3, -0.5});
}

TEST(Elementwise, BinaryGradientsWithBroadcasting) {
  const std::vector<std::pair<const char*, Tensor (*)(Tensor, Tensor)>> ops = {
      {"add", add}, {"sub", sub},         {"mul", mul},        {"div", div},
      {"pow", pow}, {"maximum", maximum}, {"minimum", minimum}};
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    GradientCase spec{.shapes = {{2, 3}, {3}}, .low = 0.5, .high = 2.0};
    expect_gradients_match(spec, [op](std::vector<Tensor>& x) { return op(x[0], x[1]); });
    spec.shapes = {{2, 1}, {1, 3}};
    expect_gradients_match(spec, [op](std::vector<Tensor>& x) { return op(x[1], x[0]); });
  }
}

TEST(Elementwise, MaximumSplitsTiesEvenly) {
  // max(x, x) = x: each operand's half adds up to the derivative 1.
  expect_gradients_match({.shapes = {{4}}},
                         [](std::vector<Tensor>& x) { return maximum(x[0], x[0]); });
  expect_gradients_match({.shapes = {{4}}},
                         [](std::vector<Tensor>& x) { return minimum(x[0], x[0]); });
}

TEST(Elementwise, WhereGradientsSkipCondition) {
  const GradientCase spec{.shapes = {{2, 1}, {2, 3}, {3}},
                          .differentiable = {false, true, true},
                          .values = {values({2, 1}, {1, 0})}};
  expect_gradients_match(spec, [](std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); });
}

TEST(Elementwise, UnaryGradients) {
  const std::vector<std::pair<const char*, Tensor (*)(Tensor)>> smooth = {
      {"neg", neg}, {"exp", exp},   {"square", square},   {"sin", sin},
      {"cos", cos}, {"silu", silu}, {"sigmoid", sigmoid}, {"tanh", tanh},
      {"log", log}, {"sqrt", sqrt}, {"rsqrt", rsqrt},     {"recip", recip}};
  for (const auto& [name, op] : smooth) {
    SCOPED_TRACE(name);
    expect_gradients_match({.shapes = {{2, 3}}, .low = 0.3, .high = 1.5},
                           [op](std::vector<Tensor>& x) { return op(x[0]); });
  }
  for (const auto& [name, op] : std::vector<std::pair<const char*, Tensor (*)(Tensor)>>{
           {"abs", abs}, {"relu", relu}, {"tanh", tanh}, {"silu", silu}}) {
    SCOPED_TRACE(name);
    expect_gradients_match({.shapes = {{2, 3}}, .values = {away_from_zero({2, 3}, 7)}},
                           [op](std::vector<Tensor>& x) { return op(x[0]); });
  }
}

// ReLU's gradient masks the cotangent by its output, which is positive exactly where the input
// is (PyTorch's gradient at 0 is 0 too), so that a backward needs the output the next layer reads
// and not the input as well.
TEST(Elementwise, ReluGradientMasksByTheOutput) {
  Graph graph;
  Environment environment;
  const Tensor x = input(graph, "x", {4});
  const Tensor seed = input(graph, "seed", {4});
  const Tensor y = relu(x);
  const ValueId gradient = gradients(graph, y.id(), {x.id()}, seed.id()).at(x.id());
  size_t masks = 0;
  for (const Node& node : graph.nodes()) {
    if (node.op != "greater") continue;
    ++masks;
    EXPECT_EQ(node.inputs[0], y.id());
  }
  EXPECT_EQ(masks, 1u);
  environment.leaves["x"] = HostTensor({4}, {-1.5, 0.0, 2.0, 1e-30});
  environment.leaves["seed"] = HostTensor({4}, {0.7, -0.3, 1.25, -4.0});
  EXPECT_EQ(evaluate(graph, environment)[gradient].data,
            (std::vector<double>{0.0, 0.0, 1.25, -4.0}));
}

TEST(Elementwise, GeluGradientIsExactForBothForms) {
  for (GeluApproximation form : {GeluApproximation::none, GeluApproximation::tanh}) {
    expect_gradients_match({.shapes = {{3, 4}}, .low = -3.0, .high = 3.0},
                           [form](std::vector<Tensor>& x) { return gelu(x[0], form); });
  }
}

// A cast's gradient is the incoming gradient cast back (the straight-through rule PyTorch's
// casts follow; finite differences of a rounding are zero almost everywhere). Through an f16
// value the gradient is itself an f16 value: d/dx of cast(cast(x, f16), f32) * 3 under seed s is
// round_to_f16(3 s). Between floating dtypes that hold x exactly, finite differences agree.
TEST(Elementwise, CastGradientCastsBack) {
  Graph graph;
  Environment environment;
  const Tensor x = input(graph, "x", {5});
  const Tensor seed = input(graph, "seed", {5});
  const Tensor y = cast(cast(x, DType::f16), DType::f32) * 3.0;
  const ValueId gradient = gradients(graph, y.id(), {x.id()}, seed.id()).at(x.id());
  const std::vector<double> seeds = {0.1, -1.0 / 3, 2.5, 1e-3, 700.7};
  environment.leaves["x"] = HostTensor({5}, {0.3, -1.2, 5.5, 0.01, -2.0});
  environment.leaves["seed"] = HostTensor({5}, seeds);
  const std::vector<HostTensor> values = evaluate(graph, environment);
  for (size_t i = 0; i < seeds.size(); ++i)
    EXPECT_EQ(values[gradient].data[i], round_to_f16(3 * seeds[i])) << i;
  expect_gradients_match({.shapes = {{5}}}, [](std::vector<Tensor>& in) {
    return cast(cast(in[0], DType::f32), DType::f32) * 3.0;
  });
}

TEST(Elementwise, GradientsThroughFanOut) {
  // y = sigmoid(x) feeds three consumers; their gradients must add up.
  expect_gradients_match({.shapes = {{2, 3}, {3}}}, [](std::vector<Tensor>& x) {
    const Tensor y = sigmoid(x[0] * x[1]);
    return y * y + exp(y) - gelu(y, GeluApproximation::tanh);
  });
}

TEST(Elementwise, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 3});
  const Tensor b = input(graph, "b", {4});
  const Tensor indices = input(graph, "i", {2, 3}, DType::i32);
  expect_error([&] { add(a, b); }, {"add(f32[2, 3], f32[4])", "[2, 3] and [4] do not broadcast"});
  expect_error([&] { mul(a, indices); }, {"mul(f32[2, 3], i32[2, 3])", "different dtypes"});
  expect_error([&] { exp(indices); }, {"exp(i32[2, 3])", "floating-point"});
  expect_error([&] { where(a, a, indices); }, {"where(", "different dtypes"});
  expect_error([&] { where(b, a, a); }, {"where(f32[4], f32[2, 3], f32[2, 3])", "broadcast"});
  expect_error(
      [&] {
        graph.add("gelu", {a.id()}, {{"approximate", "fast"}});
      },
      {"gelu(f32[2, 3])", "\"fast\""});
  expect_error(
      [&] {
        graph.add("gelu_grad", {a.id(), b.id()}, {});
      },
      {"gelu_grad(f32[2, 3], f32[4])", "one type"});
  expect_error(
      [&] {
        graph.add("cast", {a.id()}, {{"dtype", "f64"}});
      },
      {"cast(f32[2, 3])", "unknown dtype 'f64'"});
  Graph other;
  const Tensor foreign = input(other, "c", {2, 3});
  expect_error([&] { add(a, foreign); }, {"add", "different graphs"});
}

}  // namespace
}  // namespace mg
