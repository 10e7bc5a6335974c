// bfloat16 values in kernels that need only 16-bit storage (no bfloat16 arithmetic): the roundings
// and widenings of passes::half_activations in bf16 precision, fused into pointwise kernels, and
// transposes that move the bit patterns. Built from the pass's ops directly, so they run on any
// device with 16-bit storage, and compared bit for bit with ir/half.hpp's round_to_bf16.
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "harness.hpp"
#include "ir/half.hpp"
#include "ir/op_names.hpp"

namespace mg {
namespace {

Tensor pass_op(Graph& graph, std::string_view op, const Tensor& x) {
  return Tensor(&graph, graph.add(op, {x.id()}));
}

void expect_same_bits(float actual, double expected, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << what << ": " << actual;
    return;
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(actual), std::bit_cast<uint32_t>(static_cast<float>(expected)))
      << what << ": " << actual << " against " << expected;
}

// Values whose doubles round by hand: ties to even (1 + 2^-8 down to 1, 1 + 3 2^-8 up to 1 + 2^-6,
// -(2 + 3 2^-8) up in magnitude), 70000 to 70144, the largest bfloat16 and past it infinity, zero
// of either sign, infinity and NaN; then seeded random values over many magnitudes.
std::vector<float> rounding_inputs(int64_t count) {
  const float p = std::ldexp(1.0f, -8);
  std::vector<float> values = {(1 + p) / 2,
                               (1 + 3 * p) / 2,
                               -(2 + 3 * p) / 2,
                               35000.0f,
                               std::ldexp(254.0f, 119),
                               std::ldexp(255.75f, 119),
                               -0.0f,
                               0.0f,
                               0.05f,
                               1.0f / 6,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               -3.0e-20f};
  std::mt19937_64 generator(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  while (static_cast<int64_t>(values.size()) < count)
    values.push_back(std::ldexp(normal(generator), exponent(generator)));
  values.resize(static_cast<size_t>(count));
  return values;
}

// A product rounded to bfloat16 in the kernel that computes it (the multiply and the rounding
// fused, bit patterns stored in fours and a scalar tail) and widened by the kernel that reads it
// (four bit patterns a load): every value equals the host's rounding of the exact product, NaN
// and infinity included, over 13 values (three vectors and one scalar) and 4099.
TEST(GpuBf16, RoundingAndWideningInKernelsAreExact) {
  for (const int64_t count : {int64_t{13}, int64_t{4099}}) {
    SCOPED_TRACE(count);
    Graph graph;
    const Tensor x = input(graph, "x", {count});
    const Tensor rounded = pass_op(graph, op::round_to_bf16, x * 2.0);
    graph.set_output("rounded", rounded.id());
    graph.set_output("halved", (pass_op(graph, op::widen_bf16, rounded) * 0.5).id());
    SessionOptions options;
    options.validation = true;
    Session session(graph, options);
    const std::vector<float> given = rounding_inputs(count);
    session.set_input("x", given);
    session.run();
    const std::vector<float> stored = session.output("rounded");
    const std::vector<float> halved = session.output("halved");
    ASSERT_EQ(stored.size(), given.size());
    for (size_t i = 0; i < given.size(); ++i) {
      const double expected = round_to_bf16(2.0 * given[i]);
      expect_same_bits(stored[i], expected, "rounded " + std::to_string(given[i]));
      expect_same_bits(halved[i], expected * 0.5, "halved " + std::to_string(given[i]));
    }
    EXPECT_EQ(session.validation_messages(), 0u);
  }
}

// Scalar accesses: a rounded sum over rows of 7 (a broadcast bias, so no vectors of four) and a
// bias rounded to bfloat16 that its widening reads at broadcast indices, bit for bit.
TEST(GpuBf16, BroadcastRoundingAndWideningAreExact) {
  Graph graph;
  const Tensor rows = input(graph, "rows", {5, 7});
  const Tensor bias = input(graph, "bias", {7});
  const Tensor rounded_bias = pass_op(graph, op::round_to_bf16, bias * 3.0);
  graph.set_output("rounded_sum", pass_op(graph, op::round_to_bf16, rows + bias).id());
  graph.set_output("rounded_bias", rounded_bias.id());
  graph.set_output("biased", (rows + pass_op(graph, op::widen_bf16, rounded_bias)).id());
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  const std::vector<float> row_values = rounding_inputs(35);
  std::vector<float> bias_values(7);
  std::mt19937_64 generator(43);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (float& value : bias_values) value = normal(generator);
  session.set_input("rows", row_values);
  session.set_input("bias", bias_values);
  session.run();
  const std::vector<float> rounded_sum = session.output("rounded_sum");
  const std::vector<float> biased = session.output("biased");
  const std::vector<float> stored_bias = session.output("rounded_bias");
  for (size_t c = 0; c < 7; ++c)
    expect_same_bits(stored_bias[c], round_to_bf16(3.0 * bias_values[c]), "bias");
  for (size_t i = 0; i < 35; ++i) {
    const float sum = row_values[i] + bias_values[i % 7];
    expect_same_bits(rounded_sum[i], round_to_bf16(sum), "sum " + std::to_string(i));
    const double widened = round_to_bf16(3.0 * bias_values[i % 7]);
    expect_same_bits(biased[i], static_cast<float>(row_values[i] + static_cast<float>(widened)),
                     "biased " + std::to_string(i));
  }
  EXPECT_EQ(session.validation_messages(), 0u);
}

// Transposes move bfloat16 bit patterns as they are: eight a thread (innermost axis kept, a
// multiple of 8), four (a multiple of 4), one (odd), and one that moves the innermost axis; each
// widened value is the host's rounding at its transposed place.
TEST(GpuBf16, TransposesMoveBitPatterns) {
  struct Case {
    Shape shape;
    std::vector<int64_t> permutation;
  };
  for (const Case& moved : {Case{{3, 5, 16}, {1, 0, 2}}, Case{{2, 3, 12}, {1, 0, 2}},
                            Case{{3, 2, 5}, {1, 0, 2}}, Case{{4, 3, 7}, {2, 0, 1}}}) {
    SCOPED_TRACE(shape_string(moved.shape));
    Graph graph;
    const Tensor x = input(graph, "x", moved.shape);
    const Tensor rounded = pass_op(graph, op::round_to_bf16, x * 2.0);
    graph.set_output("rounded", rounded.id());
    const Tensor transposed = transpose(rounded, moved.permutation);
    graph.set_output("moved", pass_op(graph, op::widen_bf16, transposed).id());
    SessionOptions options;
    options.validation = true;
    Session session(graph, options);
    const int64_t count = element_count(moved.shape);
    const std::vector<float> given = rounding_inputs(count);
    session.set_input("x", given);
    session.run();
    const std::vector<float> result = session.output("moved");
    const Shape& in = moved.shape;
    Shape out(in.size());
    for (size_t k = 0; k < in.size(); ++k) out[k] = in[moved.permutation[k]];
    ASSERT_EQ(static_cast<int64_t>(result.size()), count);
    for (int64_t i = 0; i < count; ++i) {
      // Element i of the result at coordinates c (of `out`) is element c' of the input, where
      // c'[permutation[k]] = c[k].
      std::vector<int64_t> coordinates(out.size()), source(in.size());
      int64_t rest = i;
      for (size_t k = out.size(); k-- > 0;) {
        coordinates[k] = rest % out[k];
        rest /= out[k];
      }
      for (size_t k = 0; k < out.size(); ++k) source[moved.permutation[k]] = coordinates[k];
      int64_t flat = 0;
      for (size_t k = 0; k < in.size(); ++k) flat = flat * in[k] + source[k];
      expect_same_bits(result[i], round_to_bf16(2.0 * given[flat]), "element " + std::to_string(i));
    }
    EXPECT_EQ(session.validation_messages(), 0u);
  }
}

// bf16 tensors end to end (passes/half_storage.cpp): inputs stored in bfloat16 (the session
// rounds the floats it is given), every op computed in f32 between a widening and a rounding, a
// transpose moving the bit patterns, bf16 and f32 outputs, against the f64 reference, which holds
// every bf16 value in bfloat16; in strict and in bf16 precision (strict where the device lacks
// bfloat16 matrices). Each bf16 result is rounded from an f32 result that may sit on the other
// side of a rounding boundary from the f64 one (one bfloat16 step, 2^-8 relative), which the
// softmax after it can widen.
TEST(GpuBf16, OpsOfBf16TensorsMatchTheReference) {
  for (const Precision precision : {Precision::strict, Precision::bf16}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    SessionOptions options;
    options.precision = precision;
    testing::check_on_gpu(
        testing::half_block_inputs(DType::bf16),
        [](Graph& graph, std::vector<Tensor>& in) {
          testing::half_block(graph, in);
          graph.set_output("moved", transpose(in[0], {1, 0, 2}).id());
        },
        1e-2, 11, options);
  }
}

// Winograd's transforms store bfloat16 points in bf16 precision (bf16_result, the operands of
// its products there): input tiles of an image with odd extents and padding 1 (tiles half past
// its edge), grad_out's blocks, and the filter both ways round, one launch each, against the
// reference's points rounded to bfloat16. The f32 transform may round to the bfloat16 neighbour
// of the f64 one: one bfloat16 step, 2^-8 relative at most.
TEST(GpuBf16, WinogradTransformsStoreBfloat16Points) {
  size_t dispatches = 0;
  const Attrs bf16_points{{"bf16_result", int64_t{1}}};
  testing::check_on_gpu(
      {{"x", {2, 3, 7, 9}}, {"grad", {2, 5, 6, 8}}, {"w", {5, 3, 3, 3}}},
      [&](Graph& graph, std::vector<Tensor>& in) {
        Attrs tiles = bf16_points, grad_tiles = bf16_points, turned = bf16_points;
        tiles.set("tiles", std::vector<int64_t>{4, 5});
        tiles.set("padding", std::vector<int64_t>{1, 1});
        grad_tiles.set("tiles", std::vector<int64_t>{3, 4});
        turned.set("transposed", int64_t{1});
        graph.set_output("tiles", graph.add("winograd_tiles", {in[0].id()}, tiles));
        graph.set_output("grad_tiles", graph.add("winograd_grad_tiles", {in[1].id()}, grad_tiles));
        graph.set_output("filter", graph.add("winograd_filter", {in[2].id()}, bf16_points));
        graph.set_output("turned", graph.add("winograd_filter", {in[2].id()}, turned));
      },
      8e-3, 43, {}, &dispatches);
  EXPECT_EQ(dispatches, 4u);
}

// Winograd's transforms read bfloat16 values where half activations store them in bf16
// precision: input tiles of a bfloat16 image (odd extents, padding 1) and grad_out's blocks into
// bfloat16 points (their input's dtype), and the output transform of bfloat16 products into a
// bfloat16 image, each widening the bit patterns as it loads them, against the reference.
TEST(GpuBf16, WinogradTransformsReadBfloat16Values) {
  size_t dispatches = 0;
  testing::check_on_gpu(
      {{"x", {2, 3, 7, 9}}, {"grad", {2, 5, 6, 8}}, {"products", {16, 4, 12}}},
      [&](Graph& graph, std::vector<Tensor>& in) {
        const auto bfloat16 = [&](const Tensor& value) {
          return graph.add("round_to_bf16", {value.id()});
        };
        graph.set_output("tiles", graph.add("winograd_tiles", {bfloat16(in[0])},
                                            {{"tiles", std::vector<int64_t>{4, 5}},
                                             {"padding", std::vector<int64_t>{1, 1}}}));
        graph.set_output("grad_tiles", graph.add("winograd_grad_tiles", {bfloat16(in[1])},
                                                 {{"tiles", std::vector<int64_t>{3, 4}}}));
        graph.set_output("image", graph.add("winograd_output", {bfloat16(in[2])},
                                            {{"tiles", std::vector<int64_t>{3, 4}},
                                             {"output_size", std::vector<int64_t>{5, 7}}}));
      },
      8e-3, 47, {}, &dispatches);
  // Three roundings and three transforms.
  EXPECT_EQ(dispatches, 6u);
}

}  // namespace
}  // namespace mg
