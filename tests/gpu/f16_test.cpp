// f16 tensors end to end (passes/half_storage.cpp): inputs, parameters and outputs stored in f16,
// every op computed in f32 between a widening of its f16 inputs and a rounding of its f16
// result, against the f64 reference interpreter, which holds every f16 value in f16.
#include <bit>
#include <random>

#include "harness.hpp"
#include "ir/half.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/nn.hpp"
#include "meganeura/train.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;

// An f16 block of ops of every kernel family (a matmul batched and not, a broadcast add,
// relu, softmax, a sum, a layer norm) on f16 inputs with ragged extents (no multiple of 4, so
// the conversions' tails run too), with f16 and f32 outputs. Each f16 result is rounded from an
// f32 result that may sit on the other side of a rounding boundary from the f64 one: one f16
// step, 2^-10 relative at most.
TEST(GpuF16, OpsOfF16TensorsMatchTheReference) {
  for (const Precision precision : {Precision::strict, Precision::fast}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    SessionOptions options;
    options.precision = precision;
    check_on_gpu(
        testing::half_block_inputs(DType::f16),
        [](Graph& graph, std::vector<Tensor>& in) {
          const Tensor hidden = testing::half_block(graph, in);
          graph.set_output("normed",
                           layer_norm(cast(hidden, DType::f32), std::nullopt, std::nullopt).id());
        },
        2e-3, 11, options);
  }
}

// Transposes of f16 tensors move the f16 values as they are, in one launch each with no
// conversion: three that keep their innermost axis (8 values a thread where that axis is a
// multiple of 8, 4 where it is a multiple of 4 only, one where it is odd) and one that moves it.
// The values equal the reference's (a normalised error under 1e-12).
TEST(GpuF16, TransposesMoveF16ValuesAsTheyAre) {
  size_t dispatches = 0;
  check_on_gpu(
      {{"eights", {3, 5, 16}, DType::f16},
       {"fours", {2, 3, 12}, DType::f16},
       {"odd", {3, 2, 5}, DType::f16},
       {"ragged", {4, 3, 7}, DType::f16}},
      [](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("eights_moved", transpose(in[0], {1, 0, 2}).id());
        graph.set_output("fours_moved", transpose(in[1], {1, 0, 2}).id());
        graph.set_output("odd_moved", transpose(in[2], {1, 0, 2}).id());
        graph.set_output("ragged_moved", transpose(in[3], {2, 0, 1}).id());
      },
      1e-12, 7, {}, &dispatches);
  EXPECT_EQ(dispatches, 4u);
}

// sum_to_f16, the rounded sum of an f16 product's split-K partial results, in one launch each:
// 48 outputs (a vec4 a thread, f16vec4 stores), 21 (a scalar a thread) and 15 over 20 partials
// (a workgroup an output). The GPU's f32 sum can round to the f16 neighbour of the reference's
// f64 one: one f16 step, 2^-10 relative at most.
TEST(GpuF16, SplitSumsRoundToF16InOneLaunch) {
  size_t dispatches = 0;
  check_on_gpu(
      {{"vectors", {3, 6, 8}}, {"scalars", {5, 7, 3}}, {"rows", {20, 3, 5}}},
      [](Graph& graph, std::vector<Tensor>& in) {
        for (const Tensor& partials : in) {
          const ValueId sum = graph.add("sum_to_f16", {partials.id()});
          graph.set_output("sum_" + graph.node(partials.id()).name, sum);
        }
      },
      1e-3, 5, {}, &dispatches);
  EXPECT_EQ(dispatches, 3u);
}

// Chains of pointwise ops on f16 tensors fuse across the f16 storage pass's conversions: each
// op's f16 result is rounded in registers (as the reference rounds it) and the chain is one
// launch that reads f16 and writes f16, where without fusion every op takes three (widen, op,
// round). Elementwise over 4099 values (vectors and a scalar tail), an f16 input read by two
// chains (each widens it itself: two launches, no shared widening) and a broadcast bias over
// rows of 7 (scalar accesses) whose f16 result the f32 chain that widens it writes beside (one
// launch, an f16 value stored as an extra output), f16 and f32 outputs; add, multiply, subtract and
// relu of f16 values are exact in f32, so the results match the reference to the last bit, and exp
// within an f16 step.
TEST(GpuF16, PointwiseChainsFuseAcrossConversions) {
  const auto elementwise = [](Graph& graph, std::vector<Tensor>& in) {
    graph.set_output("y", (relu((in[0] + in[1]) * 1.5) - in[2]).id());
  };
  const auto shared = [](Graph& graph, std::vector<Tensor>& in) {
    graph.set_output("y", relu(in[0] + in[1]).id());
    graph.set_output("z", (in[0] * 1.5).id());
  };
  const auto broadcast = [](Graph& graph, std::vector<Tensor>& in) {
    const Tensor shifted = exp(in[0] + in[1]);
    graph.set_output("y", shifted.id());
    graph.set_output("wide", (cast(shifted, DType::f32) * 0.5).id());
  };
  struct Case {
    std::vector<testing::HarnessInput> inputs;
    std::function<void(Graph&, std::vector<Tensor>&)> build;
    double tolerance;
    size_t fused_dispatches;
  };
  const std::vector<Case> cases{
      {{{"x", {4099}, DType::f16}, {"d", {4099}, DType::f16}, {"e", {4099}, DType::f16}},
       elementwise,
       1e-12,
       1},
      {{{"x", {4099}, DType::f16}, {"d", {4099}, DType::f16}}, shared, 1e-12, 2},
      {{{"x", {6, 7}, DType::f16}, {"bias", {7}, DType::f16}}, broadcast, 2e-3, 1}};
  uint64_t seed = 31;
  for (const Case& c : cases) {
    size_t fused = 0, apart = 0;
    check_on_gpu(c.inputs, c.build, c.tolerance, seed, {}, &fused);
    {
      const testing::ScopedSwitch no_fusion("MEGANEURA_NO_FUSION", "1");
      check_on_gpu(c.inputs, c.build, c.tolerance, seed, {}, &apart);
    }
    ++seed;
    EXPECT_EQ(fused, c.fused_dispatches);
    EXPECT_GT(apart, fused + 2);
  }
}

// Conversions alone are exact: what the session uploads into an f16 input, widens, rounds and
// reads back is the value rounded to f16 on the host, bit for bit, in tensors of 4n + 1 values.
TEST(GpuF16, ConversionsAreExact) {
  Graph graph;
  const Tensor x = input(graph, "x", {9}, DType::f16);
  const Tensor wide = cast(x, DType::f32);
  const Tensor wide_input = input(graph, "wide", {9});
  graph.set_output("widened", (wide * 2.0).id());
  graph.set_output("rounded", cast(wide_input, DType::f16).id());
  graph.set_output("tripled", (x * 3.0).id());
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  const std::vector<float> given = {0.1f,  1.0f / 3, -2.0f,    65519.0f, 65520.0f,
                                    1e-7f, -3.0e-5f, 1000.25f, 0.0f};
  const std::vector<float> wide_values = {1.0f / 7, 2049.0f,   -0.3f, 1e5f,         5.9604645e-08f,
                                          3.0f,     -65504.0f, 0.5f,  1.0009765625f};
  session.set_input("x", given);
  session.set_input("wide", wide_values);
  session.run();
  const std::vector<float> widened = session.output("widened");
  const std::vector<float> rounded = session.output("rounded");
  const std::vector<float> tripled = session.output("tripled");
  for (size_t i = 0; i < given.size(); ++i) {
    const double held = round_to_f16(given[i]);
    EXPECT_EQ(widened[i], static_cast<float>(held * 2)) << i;
    EXPECT_EQ(tripled[i], static_cast<float>(round_to_f16(held * 3))) << i;
    EXPECT_EQ(rounded[i], static_cast<float>(round_to_f16(wide_values[i]))) << i;
  }
  EXPECT_EQ(session.validation_messages(), 0u);
}

// A rounding to f16 fused into the widening that reads it happens in registers, and there it
// rounds as the conversions do, bit for bit: ties to even among normals (2049 and 2051 between
// steps of 2) and subnormals (steps of 2^-24), the largest f16 (65504) and past it infinity
// (65520 on), signed zero and f32 values f16 cannot hold. The whole chain is one dispatch.
TEST(GpuF16, RoundingInRegistersIsExact) {
  Graph graph;
  const Tensor x = input(graph, "x", {13});
  const Tensor rounded = cast(cast(x * 2.0, DType::f16), DType::f32);
  graph.set_output("y", (rounded * 0.5).id());
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  constexpr float kStep = 5.9604644775390625e-08f;  // 2^-24, f16's smallest subnormal
  const std::vector<float> given = {
      1024.5f, 1025.5f, 32759.5f, 32760.0f, 0.75f * kStep, 0.25f * kStep, 1.25f * kStep,
      -0.0f,   1e38f,   -0.1f,    1.0f / 3, 3.0e-5f,       -16383.75f};
  session.set_input("x", given);
  session.run();
  const std::vector<float> y = session.output("y");
  for (size_t i = 0; i < given.size(); ++i) {
    const float expected = static_cast<float>(round_to_f16(given[i] * 2.0f)) * 0.5f;
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(expected))
        << given[i] << ": " << y[i] << " against " << expected;
  }
  EXPECT_EQ(session.report().dispatches, 1u);
  EXPECT_EQ(session.validation_messages(), 0u);
}

// An f16 parameter is drawn and stored in f16: read gives f16 values, and write rounds what it
// is given.
TEST(GpuF16, ParametersHoldF16Values) {
  Graph graph;
  const Tensor weight = parameter(graph, "weight", {7}, Init::uniform(-1, 1), DType::f16);
  graph.set_output("y", (weight * 2.0).id());
  Session session(graph, {});
  for (const float value : session.read("weight"))
    EXPECT_EQ(value, static_cast<float>(round_to_f16(value))) << value;
  const std::vector<float> written = {0.1f, -0.7f, 3.3f, 1e-6f, 7.0f, 1.0f / 3, 70000.0f};
  session.write("weight", written);
  const std::vector<float> held = session.read("weight");
  session.run();
  const std::vector<float> doubled = session.output("y");
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(held[i], static_cast<float>(round_to_f16(written[i]))) << i;
    EXPECT_EQ(doubled[i], static_cast<float>(round_to_f16(2 * round_to_f16(written[i])))) << i;
  }
}

// Mixed precision: f32 parameters cast to f16 for the products, the loss in f32. The gradients
// flow back through the casts and the f16 products, against the reference.
TEST(GpuF16, MixedPrecisionGradientsMatchTheReference) {
  check_on_gpu(
      {{"x", {6, 12}, DType::f16}, {"target", {6, 5}}},
      [](Graph& graph, std::vector<Tensor>& in) {
        const Tensor w1 = parameter(graph, "w1", {12, 8}, Init::uniform(-0.5, 0.5));
        const Tensor w2 = parameter(graph, "w2", {8, 5}, Init::uniform(-0.5, 0.5));
        const Tensor hidden = tanh(matmul(in[0], cast(w1, DType::f16)));
        const Tensor out = cast(matmul(hidden, cast(w2, DType::f16)), DType::f32);
        const Tensor loss = mean_all(square(out - in[1]));
        const std::map<ValueId, ValueId> grads = gradients(graph, loss.id(), {w1.id(), w2.id()});
        graph.set_output("loss", loss.id());
        graph.set_output("dw1", grads.at(w1.id()));
        graph.set_output("dw2", grads.at(w2.id()));
      },
      3e-3, 12);
}

// A product of f16 tensors far below the subgroup GEMM's size rule for f32 products still runs
// on cooperative matrices where the session has them (one dispatch, reading and writing f16),
// and in f32 between conversions where it has not (two widenings, the product, a rounding).
TEST(GpuF16, SmallProductsInFastPrecision) {
  Graph graph;
  const Tensor a = input(graph, "a", {24, 40}, DType::f16);
  const Tensor b = input(graph, "b", {40, 16}, DType::f16);
  graph.set_output("c", matmul(a, b).id());
  Environment environment;
  std::mt19937_64 generator(13);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  SessionOptions options;
  options.precision = Precision::fast;
  Session session(graph, options);
  for (const auto& [name, shape] : {std::pair{"a", Shape{24, 40}}, std::pair{"b", Shape{40, 16}}}) {
    HostTensor value(shape);
    for (double& element : value.data) element = uniform(generator);
    environment.leaves[name] = value;
    session.set_input(name, std::vector<float>(value.data.begin(), value.data.end()));
  }
  session.run();
  const HostTensor expected = evaluate(graph, environment)[graph.output("c")];
  EXPECT_LT(testing::normalized_error(session.output("c"), expected), 1e-3);
  const bool on_coop = session.report().coop_matrix_dispatches > 0;
  EXPECT_EQ(session.report().dispatches, on_coop ? 1u : 4u);
}

TEST(GpuF16, TrainingRefusesF16Parameters) {
  Graph graph;
  const Tensor weight =
      parameter(graph, "encoder.weight", {4, 3}, Init::uniform(-1, 1), DType::f16);
  const Tensor x = input(graph, "x", {2, 4}, DType::f16);
  const Tensor loss = sum_all(cast(matmul(x, weight), DType::f32));
  try {
    add_training(graph, loss.id(), OptimizerConfig{});
    ADD_FAILURE() << "training accepted an f16 parameter";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* fragment : {"encoder.weight", "f16[4, 3]", "f32", "cast"})
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

// The columns the im2col pass lays side by side for f16 products (passes/im2col.cpp): im2col of
// an f16 image writes f16 columns [C * KH * KW, N * plane] in one launch with no conversion
// (copies, so equal to the reference's), two a word where the output rows are even (4 wide
// here) and one at a time where they are odd (3 wide, stride 3 along them), and col2im sums f32
// column gradients side by side back onto the images, with stride 2, padding 1 and an odd image,
// against the f64 reference.
TEST(GpuF16, SideBySideColumnsOfF16ImagesAndTheirSum) {
  size_t dispatches = 0;
  Attrs attrs{{"kernel", std::vector<int64_t>{3, 3}},      {"stride", std::vector<int64_t>{2, 2}},
              {"padding", std::vector<int64_t>{1, 1}},     {"dilation", std::vector<int64_t>{1, 1}},
              {"output_size", std::vector<int64_t>{5, 4}}, {"images_side_by_side", int64_t{1}}};
  check_on_gpu(
      {{"x", {3, 4, 9, 7}, DType::f16}, {"column_grads", {36, 60}}},
      [&](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("columns", graph.add("im2col", {in[0].id()}, attrs));
        Attrs odd = attrs;
        odd.set("stride", std::vector<int64_t>{2, 3});
        odd.set("output_size", std::vector<int64_t>{5, 3});
        graph.set_output("odd_columns", graph.add("im2col", {in[0].id()}, std::move(odd)));
        Attrs back = attrs;
        back.set("image_size", std::vector<int64_t>{9, 7});
        graph.set_output("image", graph.add("col2im", {in[1].id()}, std::move(back)));
      },
      1e-6, 17, {}, &dispatches);
  EXPECT_EQ(dispatches, 3u);
}

// A reduction evaluates a pointwise chain over f16 values as it reads them: the rounded
// difference of two f16 inputs, its rounded square widened and summed along rows of an odd
// length, in one launch that reads the two inputs once (a reduction's prologue took f32 chains
// only: this one was a launch of its own, writing its widened result for the sum). The roundings
// are exact in f32, so the sums differ from the reference's by f32's rounding alone.
TEST(GpuF16, ReductionsEvaluateF16ChainsAsTheyRead) {
  size_t dispatches = 0;
  std::string listed;
  check_on_gpu(
      {{"x", {160, 515}, DType::f16}, {"y", {160, 515}, DType::f16}},
      [](Graph& graph, std::vector<Tensor>& in) {
        const Tensor difference = in[0] - in[1];
        graph.set_output("energy", sum(cast(difference * difference, DType::f32), {1}).id());
      },
      1e-6, 23, {}, &dispatches, true, &listed);
  EXPECT_EQ(dispatches, 1u) << listed;
}
// Winograd's transforms over f16 values (half activations): input tiles of an f16 image (odd
// extents, padding 1: tiles half past its edge) into f16 points, and the output transform of f16
// products into an f16 image, one launch each. The f32 transform of f16 values may round to the
// f16 neighbour of the f64 one: one f16 step, 2^-10 relative at most.
TEST(GpuF16, WinogradTransformsOfF16Values) {
  size_t dispatches = 0;
  check_on_gpu(
      {{"x", {2, 3, 7, 9}, DType::f16}, {"products", {16, 5, 2 * 3 * 4}, DType::f16}},
      [](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("tiles", graph.add("winograd_tiles", {in[0].id()},
                                            {{"tiles", std::vector<int64_t>{4, 5}},
                                             {"padding", std::vector<int64_t>{1, 1}}}));
        graph.set_output("image", graph.add("winograd_output", {in[1].id()},
                                            {{"tiles", std::vector<int64_t>{3, 4}},
                                             {"output_size", std::vector<int64_t>{5, 7}}}));
      },
      2e-3, 41, {}, &dispatches);
  EXPECT_EQ(dispatches, 2u);
}

}  // namespace
}  // namespace mg
