// Convolution ops: hand-derived values, VJPs against finite differences, misuse errors.
#include <algorithm>
#include <array>
#include <random>
#include <tuple>

#include "gradient_check.hpp"
#include "ir/half.hpp"
#include "op_expectations.hpp"

namespace mg {
namespace {

using testing::counting;
using testing::evaluate_op;
using testing::expect_error;
using testing::expect_gradients_match;
using testing::expect_values;
using testing::GradientCase;

Tensor raw(Graph& graph, const std::string& op, std::vector<ValueId> inputs, Attrs attrs) {
  return {&graph, graph.add(op, std::move(inputs), std::move(attrs))};
}

TEST(Conv, Conv2dValidWindow) {
  // x = 1..9 as 3x3, w = [[1, 2], [3, 4]]: out[0][0] = 1*1 + 2*2 + 3*4 + 4*5 = 37, etc.
  const HostTensor out = evaluate_op({counting({1, 1, 3, 3}), counting({1, 1, 2, 2})},
                                     [](std::vector<Tensor>& x) { return conv2d(x[0], x[1]); });
  expect_values(out, {1, 1, 2, 2}, {37, 47, 67, 77});
}

TEST(Conv, Conv2dStridePaddingBias) {
  // Stride 2, padding 1: the corner window sees only x[0][0] * w[1][1] = 4; the others
  // 3*2 + 4*3 = 18, 2*4 + 4*7 = 36 and the full window 5 + 12 + 24 + 36 = 77; bias adds 10.
  const HostTensor out =
      evaluate_op({counting({1, 1, 3, 3}), counting({1, 1, 2, 2}), HostTensor({1}, 10.0)},
                  [](std::vector<Tensor>& x) {
                    return conv2d(x[0], x[1], x[2], {.stride = {2, 2}, .padding = {1, 1}});
                  });
  expect_values(out, {1, 1, 2, 2}, {14, 28, 46, 87});
}

TEST(Conv, Conv2dGroupsAndDilation) {
  // Two groups of one channel, dilation 2 on 3x3: each output reads the four corners.
  // Channel 0 (1..9) with all-ones: 1 + 3 + 7 + 9 = 20; channel 1 (10..18) with [1, 0, 0, -1]:
  // 10 - 18 = -8.
  const HostTensor w({2, 1, 2, 2}, {1, 1, 1, 1, 1, 0, 0, -1});
  const HostTensor out = evaluate_op({counting({1, 2, 3, 3}), w}, [](std::vector<Tensor>& x) {
    return conv2d(x[0], x[1], std::nullopt, {.dilation = {2, 2}, .groups = 2});
  });
  expect_values(out, {1, 2, 1, 1}, {20, -8});
}

TEST(Conv, Conv1dThroughConv2d) {
  // x = 1..5, w = [2, 1], stride 2: [2*1 + 2, 2*3 + 4] = [4, 10], bias 0.5.
  const HostTensor out =
      evaluate_op({counting({1, 1, 5}), HostTensor({1, 1, 2}, {2, 1}), HostTensor({1}, 0.5)},
                  [](std::vector<Tensor>& x) { return conv1d(x[0], x[1], x[2], 2); });
  expect_values(out, {1, 1, 2}, {4.5, 10.5});
}

TEST(Conv, ConvTranspose2dScattersEachInput) {
  // Each x value adds its 2x2 all-ones kernel at its own offset (stride 1): overlaps add up.
  const HostTensor x({1, 1, 2, 2}, {1, 2, 3, 4});
  const HostTensor ones({1, 1, 2, 2}, 1.0);
  expect_values(
      evaluate_op({x, ones}, [](std::vector<Tensor>& t) { return conv_transpose2d(t[0], t[1]); }),
      {1, 1, 3, 3}, {1, 3, 2, 4, 10, 6, 3, 7, 4});
  // Stride 2 gives disjoint blocks; output_padding 1 appends a zero row and column.
  const HostTensor out = evaluate_op({x, ones}, [](std::vector<Tensor>& t) {
    return conv_transpose2d(t[0], t[1], std::nullopt, {.stride = {2, 2}, .output_padding = {1, 1}});
  });
  expect_values(out, {1, 1, 5, 5},
                {1, 1, 2, 2, 0, 1, 1, 2, 2, 0, 3, 3, 4, 4, 0, 3, 3, 4, 4, 0, 0, 0, 0, 0, 0});
}

TEST(Conv, ConvTranspose2dMatchesPyTorch) {
  // Groups, stride, padding, output_padding and dilation together. Expected values from
  // PyTorch 1.13:
  //   x = torch.arange(1, 9, dtype=torch.float64).reshape(1, 2, 2, 2)
  //   w = torch.arange(1, 13, dtype=torch.float64).reshape(2, 1, 2, 3) / 4 - 1
  //   F.conv_transpose2d(x, w, stride=(2, 1), padding=(1, 0), output_padding=(1, 0),
  //                      groups=2, dilation=(1, 2))
  HostTensor w = counting({2, 1, 2, 3});
  for (double& value : w.data) value = value / 4 - 1;
  const HostTensor out = evaluate_op({counting({1, 2, 2, 2}), w}, [](std::vector<Tensor>& x) {
    return conv_transpose2d(x[0], x[1], std::nullopt,
                            {.stride = {2, 1},
                             .padding = {1, 0},
                             .output_padding = {1, 0},
                             .dilation = {1, 2},
                             .groups = 2});
  });
  expect_values(
      out, {1, 2, 3, 6},
      {0,   0, 0.25, 0.5,  0.5, 1,  -2.25, -3, -1.5, -2, -0.75, -1, 0,    0,  0.75,  1,  1.5, 2,
       7.5, 9, 8.75, 10.5, 10,  12, 5.25,  6,  7,    8,  8.75,  10, 10.5, 12, 12.25, 14, 14,  16});
}

TEST(Conv, Conv2dGradient) {
  expect_gradients_match({.shapes = {{1, 2, 4, 4}, {4, 1, 2, 2}}}, [](std::vector<Tensor>& x) {
    return conv2d(x[0], x[1], std::nullopt,
                  {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2});
  });
}

TEST(Conv, Conv2dWithBiasUsedTwice) {
  // The conv result fans out into a product with itself, so both gradient paths accumulate.
  expect_gradients_match({.shapes = {{2, 2, 3, 3}, {3, 2, 2, 2}, {3}}}, [](std::vector<Tensor>& x) {
    const Tensor y = conv2d(x[0], x[1], x[2], {.padding = {1, 1}});
    return y * y + y;
  });
}

TEST(Conv, Conv1dGradient) {
  expect_gradients_match({.shapes = {{2, 2, 6}, {2, 2, 3}, {2}}}, [](std::vector<Tensor>& x) {
    return conv1d(x[0], x[1], x[2], 2, 1, 1, 1);
  });
}

TEST(Conv, ConvTranspose2dGradient) {
  expect_gradients_match({.shapes = {{1, 4, 3, 2}, {4, 1, 2, 3}, {2}}}, [](std::vector<Tensor>& x) {
    return conv_transpose2d(x[0], x[1], x[2],
                            {.stride = {2, 2},
                             .padding = {1, 0},
                             .output_padding = {1, 0},
                             .dilation = {1, 2},
                             .groups = 2});
  });
}

TEST(Conv, BackwardOpsGradients) {
  // Second order: the data- and weight-gradient ops have VJPs of their own.
  const Attrs attrs{{"stride", std::vector<int64_t>{2, 1}},
                    {"padding", std::vector<int64_t>{1, 1}},
                    {"dilation", std::vector<int64_t>{1, 1}},
                    {"groups", int64_t{1}}};
  expect_gradients_match({.shapes = {{1, 3, 2, 5}, {3, 2, 2, 2}}}, [&](std::vector<Tensor>& x) {
    Attrs with_shape = attrs;
    with_shape.set("input_shape", std::vector<int64_t>{1, 2, 3, 4});
    return raw(x[0].graph(), "conv2d_grad_input", {x[0].id(), x[1].id()}, with_shape);
  });
  expect_gradients_match({.shapes = {{1, 2, 3, 4}, {1, 3, 2, 5}}}, [&](std::vector<Tensor>& x) {
    Attrs with_shape = attrs;
    with_shape.set("weight_shape", std::vector<int64_t>{3, 2, 2, 2});
    return raw(x[0].graph(), "conv2d_grad_weight", {x[0].id(), x[1].id()}, with_shape);
  });
}

HostTensor random_tensor(Shape shape, std::mt19937_64& generator) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  HostTensor tensor(std::move(shape));
  for (double& element : tensor.data) element = uniform(generator);
  return tensor;
}

// Images [first, last) of an NCHW tensor.
HostTensor images(const HostTensor& tensor, int64_t first, int64_t last) {
  Shape shape = tensor.shape;
  shape[0] = last - first;
  HostTensor part(shape);
  const int64_t image = tensor.elements() / tensor.shape[0];
  std::copy(tensor.data.begin() + first * image, tensor.data.begin() + last * image,
            part.data.begin());
  return part;
}

Tensor weight_grad(std::vector<Tensor>& x, Attrs attrs) {
  return raw(x[0].graph(), "conv2d_grad_weight", {x[0].id(), x[1].id()}, std::move(attrs));
}

// conv2d_grad_weight with k_splits = S: partial s sums slice s of K = N * OH * OW, slices being
// multiples of 16 long. With 4 x 4 outputs a slice is whole images: batch 5 in three slices is
// images {0, 1}, {2, 3} and {4}, whose own weight gradients the partials must be.
TEST(Conv, WeightGradientKSplitsAreImageSlices) {
  std::mt19937_64 generator(11);
  const HostTensor x = random_tensor({5, 4, 6, 6}, generator);
  const HostTensor dy = random_tensor({5, 4, 4, 4}, generator);
  const Attrs attrs{{"groups", int64_t{2}}, {"weight_shape", std::vector<int64_t>{4, 2, 3, 3}}};
  Attrs split = attrs;
  split.set("k_splits", int64_t{3});
  const HostTensor partials =
      evaluate_op({x, dy}, [&](std::vector<Tensor>& in) { return weight_grad(in, split); });
  ASSERT_EQ(shape_string(partials.shape), shape_string({3, 4, 2, 3, 3}));
  const std::array<int64_t, 4> first_image{0, 2, 4, 5};
  for (int64_t s = 0; s < 3; ++s) {
    const HostTensor whole =
        evaluate_op({images(x, first_image[s], first_image[s + 1]),
                     images(dy, first_image[s], first_image[s + 1])},
                    [&](std::vector<Tensor>& in) { return weight_grad(in, attrs); });
    for (int64_t e = 0; e < whole.elements(); ++e)
      EXPECT_NEAR(partials.data[s * whole.elements() + e], whole.data[e], 1e-12) << s << " " << e;
  }
}

// Slices that cut images (3 x 3 outputs, K = 27 in [0, 16) and [16, 27)) still add up to the
// whole gradient; misuse and differentiation of partials are errors.
TEST(Conv, WeightGradientKSplitsSumToTheGradient) {
  std::mt19937_64 generator(12);
  const HostTensor x = random_tensor({3, 2, 5, 5}, generator);
  const HostTensor dy = random_tensor({3, 3, 3, 3}, generator);
  const Attrs attrs{{"stride", std::vector<int64_t>{2, 2}},
                    {"padding", std::vector<int64_t>{1, 1}},
                    {"weight_shape", std::vector<int64_t>{3, 2, 3, 3}}};
  Attrs split = attrs;
  split.set("k_splits", int64_t{2});
  const HostTensor partials =
      evaluate_op({x, dy}, [&](std::vector<Tensor>& in) { return weight_grad(in, split); });
  const HostTensor whole =
      evaluate_op({x, dy}, [&](std::vector<Tensor>& in) { return weight_grad(in, attrs); });
  ASSERT_EQ(partials.elements(), 2 * whole.elements());
  for (int64_t e = 0; e < whole.elements(); ++e) {
    EXPECT_NEAR(partials.data[e] + partials.data[whole.elements() + e], whole.data[e], 1e-12);
    EXPECT_NE(partials.data[e], whole.data[e]) << e;
  }

  Graph graph;
  std::vector<Tensor> in{input(graph, "x", x.shape), input(graph, "dy", dy.shape)};
  split.set("k_splits", int64_t{3});  // a third slice of K = 27 would start at 32
  expect_error([&] { weight_grad(in, split); }, {"conv2d_grad_weight", "k_splits 3", "K = 27"});
  split.set("k_splits", int64_t{2});
  const Tensor partial_grads = weight_grad(in, split);
  expect_error([&] { gradients(graph, sum_all(partial_grads).id(), {in[0].id()}); },
               {"conv2d_grad_weight %", "k_splits", "after differentiation"});
}

TEST(Conv, MisuseNamesOpAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 3, 4, 4});
  expect_error(
      [&] {
        conv2d(x, input(graph, "w1", {2, 2, 3, 3}));
      },
      {"conv2d", "f32[1, 3, 4, 4]", "f32[2, 2, 3, 3]", "input channels"});
  expect_error(
      [&] {
        conv2d(x, input(graph, "w2", {2, 1, 3, 3}), std::nullopt, {.groups = 3});
      },
      {"conv2d", "groups 3", "2 output channels"});
  expect_error(
      [&] {
        conv2d(x, input(graph, "w3", {2, 3, 5, 5}));
      },
      {"conv2d", "[1, 3, 4, 4]", "output size would be <= 0"});
  expect_error(
      [&] {
        conv2d(x, input(graph, "w4", {2, 3, 1, 1}), input(graph, "b", {3}));
      },
      {"conv2d", "bias f32[3]", "[2]"});
  expect_error(
      [&] {
        conv2d(input(graph, "xi", {1, 3, 4, 4}, DType::i32), input(graph, "w5", {2, 3, 1, 1}));
      },
      {"conv2d", "i32[1, 3, 4, 4]", "floating"});
  expect_error(
      [&] {
        conv2d(x, input(graph, "w6", {2, 3, 1, 1}), std::nullopt, {.stride = {0, 1}});
      },
      {"conv2d", "stride [0, 1]"});
  expect_error(
      [&] {
        conv_transpose2d(x, input(graph, "w7", {2, 2, 3, 3}));
      },
      {"conv_transpose2d", "f32[2, 2, 3, 3]", "input channels"});
  expect_error(
      [&] {
        conv_transpose2d(x, input(graph, "w8", {3, 2, 3, 3}), std::nullopt,
                         {.output_padding = {1, 1}});
      },
      {"conv_transpose2d", "output_padding"});
  expect_error([&] { conv1d(x, input(graph, "w9", {2, 3, 3})); }, {"conv1d", "rank 3"});
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

Attrs column_attrs(std::vector<int64_t> kernel, std::vector<int64_t> stride,
                   std::vector<int64_t> padding, std::vector<int64_t> dilation,
                   std::vector<int64_t> output_size) {
  return {{"kernel", std::move(kernel)},
          {"stride", std::move(stride)},
          {"padding", std::move(padding)},
          {"dilation", std::move(dilation)},
          {"output_size", std::move(output_size)}};
}

// im2col of a 1 x 1 x 3 x 3 image counting 1..9 with a 2 x 2 kernel, padding 1 and stride 2:
// output positions (0, 0), (0, 1), (1, 0), (1, 1) read rows and columns -1 and 1 shifted by the
// tap; col2im puts each column element back, summing the ones that meet.
TEST(Conv, Im2colAndCol2imByHand) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 1, 3, 3});
  const Attrs attrs = column_attrs({2, 2}, {2, 2}, {1, 1}, {1, 1}, {2, 2});
  const Tensor columns = raw(graph, "im2col", {x.id()}, attrs);
  EXPECT_EQ(columns.shape(), (Shape{1, 4, 4}));
  HostTensor image({1, 1, 3, 3});
  for (int64_t i = 0; i < 9; ++i) image.data[static_cast<size_t>(i)] = static_cast<double>(i + 1);
  // Tap (kh, kw) at output (oy, ox) reads x[2 oy - 1 + kh, 2 ox - 1 + kw].
  const std::vector<double> expected = {0, 0, 0, 5,   // tap (0, 0)
                                        0, 0, 4, 6,   // tap (0, 1)
                                        0, 2, 0, 8,   // tap (1, 0)
                                        1, 3, 7, 9};  // tap (1, 1)
  Environment environment;
  environment.leaves["x"] = image;
  EXPECT_EQ(evaluate(graph, environment).at(columns.id()).data, expected);
  Attrs back = attrs;
  back.set("image_size", std::vector<int64_t>{3, 3});
  const Tensor restored = raw(graph, "col2im", {columns.id()}, back);
  // Every pixel is read by exactly one tap here, so col2im restores the image.
  EXPECT_EQ(evaluate(graph, environment).at(restored.id()).data, image.data);
}

// The two are each other's adjoint, so each one's VJP is the other: against finite differences,
// with stride, padding and dilation, and with the negative padding and dilation of the stride-1
// data gradient.
// Side by side, image n's column p of row r lands at column n * plane + p of row r: two
// images against the per-image columns, and the VJP (through col2im) against finite
// differences.
TEST(Conv, Im2colSideBySide) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 2, 3, 3});
  Attrs attrs = column_attrs({2, 2}, {1, 1}, {1, 1}, {1, 1}, {3, 3});
  const Tensor apart = raw(graph, "im2col", {x.id()}, attrs);
  attrs.set("images_side_by_side", int64_t{1});
  const Tensor together = raw(graph, "im2col", {x.id()}, attrs);
  EXPECT_EQ(apart.shape(), (Shape{2, 8, 9}));
  EXPECT_EQ(together.shape(), (Shape{8, 18}));
  HostTensor image({2, 2, 3, 3});
  for (size_t i = 0; i < image.data.size(); ++i) image.data[i] = static_cast<double>(i + 1);
  Environment environment;
  environment.leaves["x"] = image;
  const auto values = evaluate(graph, environment);
  const std::vector<double>& per_image = values.at(apart.id()).data;
  const std::vector<double>& side_by_side = values.at(together.id()).data;
  for (size_t n = 0; n < 2; ++n)
    for (size_t row = 0; row < 8; ++row)
      for (size_t p = 0; p < 9; ++p)
        EXPECT_EQ(side_by_side[row * 18 + n * 9 + p], per_image[(n * 8 + row) * 9 + p])
            << "image " << n << ", row " << row << ", column " << p;
  expect_gradients_match({.shapes = {{2, 2, 5, 6}}}, [&](std::vector<Tensor>& in) {
    return raw(in[0].graph(), "im2col", {in[0].id()}, attrs);
  });
  attrs.set("images_side_by_side", int64_t{2});
  expect_error([&] { raw(graph, "im2col", {x.id()}, attrs); },
               {"im2col", "images_side_by_side must be 0 or 1"});
}

// Side-by-side columns [C KH KW, N plane] sum back onto the images as the per-image columns
// holding the same elements do: seeded random columns rearranged by hand against col2im of the
// per-image layout, the VJP (im2col side by side) against finite differences, and a wrong
// shape named.
TEST(Conv, Col2imSideBySide) {
  Graph graph;
  Attrs apart = column_attrs({3, 3}, {2, 2}, {1, 1}, {1, 1}, {3, 3});
  apart.set("image_size", std::vector<int64_t>{5, 6});
  Attrs together = apart;
  together.set("images_side_by_side", int64_t{1});
  const Tensor per_image = input(graph, "per_image", {2, 18, 9});
  const Tensor side_by_side = input(graph, "side_by_side", {18, 18});
  const Tensor from_apart = raw(graph, "col2im", {per_image.id()}, apart);
  const Tensor from_together = raw(graph, "col2im", {side_by_side.id()}, together);
  EXPECT_EQ(from_together.shape(), (Shape{2, 2, 5, 6}));
  std::mt19937 random(11);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  HostTensor columns({2, 18, 9}), moved({18, 18});
  for (double& value : columns.data) value = uniform(random);
  for (size_t n = 0; n < 2; ++n)
    for (size_t row = 0; row < 18; ++row)
      for (size_t p = 0; p < 9; ++p)
        moved.data[row * 18 + n * 9 + p] = columns.data[(n * 18 + row) * 9 + p];
  Environment environment;
  environment.leaves["per_image"] = columns;
  environment.leaves["side_by_side"] = moved;
  const auto values = evaluate(graph, environment);
  EXPECT_EQ(values.at(from_together.id()).data, values.at(from_apart.id()).data);
  expect_gradients_match({.shapes = {{18, 18}}}, [&](std::vector<Tensor>& in) {
    return raw(in[0].graph(), "col2im", {in[0].id()}, together);
  });
  const Tensor wrong = input(graph, "wrong", {18, 17});
  expect_error([&] { raw(graph, "col2im", {wrong.id()}, together); },
               {"col2im", "side-by-side columns must be [C * 9, N * 9]"});
}

TEST(Conv, Im2colAndCol2imGradients) {
  for (const Attrs& attrs : {column_attrs({3, 2}, {2, 1}, {1, 0}, {1, 2}, {3, 4}),
                             column_attrs({3, 3}, {1, 1}, {-1, -1}, {-1, -1}, {5, 6})}) {
    SCOPED_TRACE(attrs.to_string());
    expect_gradients_match({.shapes = {{2, 2, 5, 6}}}, [&](std::vector<Tensor>& in) {
      return raw(in[0].graph(), "im2col", {in[0].id()}, attrs);
    });
    const std::vector<int64_t>& kernel = attrs.get_ints("kernel");
    const std::vector<int64_t>& size = attrs.get_ints("output_size");
    Attrs back = attrs;
    back.set("image_size", std::vector<int64_t>{5, 6});
    expect_gradients_match(
        {.shapes = {{2, 2 * kernel[0] * kernel[1], size[0] * size[1]}}},
        [&](std::vector<Tensor>& in) { return raw(in[0].graph(), "col2im", {in[0].id()}, back); });
  }
}

TEST(Conv, Im2colAndCol2imMisuse) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 2, 4, 4});
  expect_error(
      [&] {
        raw(graph, "im2col", {x.id()}, column_attrs({3, 3}, {1, 1}, {1, 1}, {0, 1}, {4, 4}));
      },
      {"im2col", "dilation must not be 0"});
  expect_error(
      [&] {
        raw(graph, "im2col", {x.id()}, column_attrs({3, 3}, {0, 1}, {1, 1}, {1, 1}, {4, 4}));
      },
      {"im2col", "stride"});
  Attrs back = column_attrs({3, 3}, {1, 1}, {1, 1}, {1, 1}, {4, 4});
  back.set("image_size", std::vector<int64_t>{4, 4});
  const Tensor wrong = input(graph, "columns", {1, 17, 16});
  expect_error([&] { raw(graph, "col2im", {wrong.id()}, back); },
               {"col2im", "columns must be [N, C * 9, 16]"});
}

// The Winograd transforms by hand: a 4 x 4 input patch d is B^T d B (row i of B^T is (1, 0,
// -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)), so point (0, 0) is d00 - d02 - d20 +
// d22; a 2 x 2 grad_out block e is A e A^T (rows of A (1, 0), (1, 1), (1, -1), (0, -1)), so
// point (1, 1) is the block's sum; and the filter transform of M = 1 at point (1, 1) alone is
// the outer product of G's row 1, (0.5, 0.5, 0.5), with itself. (Passes.Winograd* checks the
// whole weight gradient against the convolution's.)
TEST(Conv, WinogradTransformsByHand) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 1, 4, 4});
  const Tensor patches =
      raw(graph, "winograd_tiles", {x.id()}, {{"tiles", std::vector<int64_t>{1, 1}}});
  const Tensor blocks =
      raw(graph, "winograd_grad_tiles", {x.id()}, {{"tiles", std::vector<int64_t>{2, 2}}});
  const Tensor points = input(graph, "points", {16, 1, 1});
  const Tensor taps = raw(graph, "winograd_weight_grad", {points.id()}, {});
  EXPECT_EQ(patches.shape(), (Shape{16, 1, 1}));
  EXPECT_EQ(blocks.shape(), (Shape{16, 1, 4}));
  EXPECT_EQ(taps.shape(), (Shape{1, 1, 3, 3}));
  HostTensor image({1, 1, 4, 4});
  for (size_t i = 0; i < 16; ++i) image.data[i] = static_cast<double>((i * 7) % 11) - 3.0;
  HostTensor unit({16, 1, 1});
  unit.data[5] = 1.0;
  Environment environment;
  environment.leaves["x"] = image;
  environment.leaves["points"] = unit;
  const auto values = evaluate(graph, environment);
  const std::vector<double>& d = image.data;
  EXPECT_EQ(values.at(patches.id()).data[0], d[0] - d[2] - d[8] + d[10]);
  // Point (1, 1) of the block at tile (1, 0): rows 2-3, columns 0-1.
  EXPECT_EQ(values.at(blocks.id()).data[5 * 4 + 2], d[8] + d[9] + d[12] + d[13]);
  EXPECT_EQ(values.at(taps.id()).data, std::vector<double>(9, 0.25));
}

// F(4 x 4, 3 x 3)'s transforms by hand (outputs = 4): a 6 x 6 input patch d is B^T d B with
// row 0 of B^T (4, 0, -5, 0, 1, 0), so point (0, 0) is 16 d00 - 20 d02 + 4 d04 - 20 d20 +
// 25 d22 - 5 d24 + 4 d40 - 5 d42 + d44; a 4 x 4 grad_out block e is A e A^T with row 1 of A
// (1, 1, 1, 1), so point (1, 1) is the block's sum, and row 3 (1, 2, 4, 8), so point (3, 1)
// is the sum of the block's rows weighed by 1, 2, 4, 8; the filter transform of M = 1 at point (1,
// 1) alone is the outer product of G's row 1, (-1/6, -1/6, -1/6), with itself.
TEST(Conv, Winograd4TransformsByHand) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 1, 6, 6});
  const Attrs four{{"outputs", int64_t{4}}};
  Attrs one_tile = four, two_tiles = four;
  one_tile.set("tiles", std::vector<int64_t>{1, 1});
  two_tiles.set("tiles", std::vector<int64_t>{2, 2});
  const Tensor patches = raw(graph, "winograd_tiles", {x.id()}, one_tile);
  const Tensor blocks = raw(graph, "winograd_grad_tiles", {x.id()}, two_tiles);
  const Tensor points = input(graph, "points", {36, 1, 1});
  const Tensor taps = raw(graph, "winograd_weight_grad", {points.id()}, four);
  EXPECT_EQ(patches.shape(), (Shape{36, 1, 1}));
  EXPECT_EQ(blocks.shape(), (Shape{36, 1, 4}));
  EXPECT_EQ(taps.shape(), (Shape{1, 1, 3, 3}));
  HostTensor image({1, 1, 6, 6});
  for (size_t i = 0; i < 36; ++i) image.data[i] = static_cast<double>((i * 7) % 11) - 3.0;
  HostTensor unit({36, 1, 1});
  unit.data[7] = 1.0;  // point (1, 1)
  Environment environment;
  environment.leaves["x"] = image;
  environment.leaves["points"] = unit;
  const auto values = evaluate(graph, environment);
  const auto d = [&](int row, int column) { return image.data[row * 6 + column]; };
  EXPECT_EQ(values.at(patches.id()).data[0], 16 * d(0, 0) - 20 * d(0, 2) + 4 * d(0, 4) -
                                                 20 * d(2, 0) + 25 * d(2, 2) - 5 * d(2, 4) +
                                                 4 * d(4, 0) - 5 * d(4, 2) + d(4, 4));
  // The block at tile (0, 0): rows 0-3, columns 0-3 (the other tiles lie past the image's 6).
  double block_sum = 0, weighted_rows = 0;
  for (int row = 0; row < 4; ++row)
    for (int column = 0; column < 4; ++column) {
      block_sum += d(row, column);
      weighted_rows += (1 << row) * d(row, column);
    }
  EXPECT_EQ(values.at(blocks.id()).data[7 * 4], block_sum);
  EXPECT_EQ(values.at(blocks.id()).data[19 * 4], weighted_rows);
  for (double tap : values.at(taps.id()).data) EXPECT_NEAR(tap, 1.0 / 36, 1e-15);
  expect_error(
      [&] {
        raw(graph, "winograd_tiles", {x.id()}, {{"outputs", int64_t{3}}});
      },
      {"winograd_tiles", "outputs must be 2 or 4"});
  expect_error([&] { raw(graph, "winograd_weight_grad", {points.id()}, {}); },
               {"winograd_weight_grad", "input must be [16, O, C] or [S, 16, O, C]"});
}

// The forward's transforms by hand: a filter g is G g G^T (rows of G (1, 0, 0), (0.5, 0.5,
// 0.5), (0.5, -0.5, 0.5), (0, 0, 1)), so point (0, 0) is g00, point (3, 3) is g22 and point
// (1, 1) a quarter of the taps' sum; turned and transposed, [16, C, O] holds point (0, 0) of
// pair (c, o) as w[o, c, 2, 2]. The output transform A^T M A (columns of A (1, 1, 1, 0) and
// (0, 1, -1, -1)) of M = 1 at point (1, 2) alone puts 1 * -1 = -1 at output (0, 1), 1 * 1 at
// (0, 0), -1 at (1, 1) and 1 at (1, 0), cropped to a 3 x 3 image over two tiles a side.
TEST(Conv, WinogradForwardTransformsByHand) {
  Graph graph;
  const Tensor w = input(graph, "w", {2, 1, 3, 3});
  const Tensor filter = raw(graph, "winograd_filter", {w.id()}, {});
  const Tensor turned = raw(graph, "winograd_filter", {w.id()}, {{"transposed", int64_t{1}}});
  const Tensor points = input(graph, "points", {16, 1, 4});
  const Tensor image =
      raw(graph, "winograd_output", {points.id()},
          {{"tiles", std::vector<int64_t>{2, 2}}, {"output_size", std::vector<int64_t>{3, 3}}});
  EXPECT_EQ(filter.shape(), (Shape{16, 2, 1}));
  EXPECT_EQ(turned.shape(), (Shape{16, 1, 2}));
  EXPECT_EQ(image.shape(), (Shape{1, 1, 3, 3}));
  HostTensor taps({2, 1, 3, 3});
  for (size_t i = 0; i < 18; ++i) taps.data[i] = static_cast<double>((i * 5) % 7) - 2.0;
  HostTensor unit({16, 1, 4});
  unit.data[6 * 4 + 0] = 1.0;  // point (1, 2) of tile 0 (outputs 0-1 of rows 0-1)
  unit.data[6 * 4 + 3] = 2.0;  // and twice that of tile 3, of which only output (2, 2) lies inside
  Environment environment;
  environment.leaves["w"] = taps;
  environment.leaves["points"] = unit;
  const auto values = evaluate(graph, environment);
  const std::vector<double>& g = taps.data;
  // Filter o = 1: taps 9-17. Point p of pair o lies at [p, o, 0] = p * 2 + o.
  EXPECT_EQ(values.at(filter.id()).data[0 * 2 + 1], g[9]);
  EXPECT_EQ(values.at(filter.id()).data[15 * 2 + 1], g[17]);
  double sum = 0;
  for (size_t i = 9; i < 18; ++i) sum += g[i];
  EXPECT_DOUBLE_EQ(values.at(filter.id()).data[5 * 2 + 1], sum / 4);
  EXPECT_EQ(values.at(turned.id()).data[0 * 2 + 1], g[17]);
  EXPECT_EQ(values.at(turned.id()).data[15 * 2 + 0], g[0]);
  EXPECT_EQ(values.at(image.id()).data, (std::vector<double>{1, -1, 0, 1, -1, 0, 0, 0, 2}));
}

// With f16_result each transform stores its points rounded to f16 as f16: the points of x's
// tiles, grad_out's blocks and the filter are those of the plain transforms, each rounded to
// f16's nearest value (taps of thirds, whose points f16 cannot hold exactly).
TEST(Conv, WinogradPointsRoundedToF16) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 2, 4, 4});
  const Tensor w = input(graph, "w", {2, 2, 3, 3});
  const Attrs tiled{{"tiles", std::vector<int64_t>{2, 2}}};
  Attrs padded = tiled;
  padded.set("padding", std::vector<int64_t>{1, 1});
  const auto rounded = [](Attrs attrs) {
    attrs.set("f16_result", int64_t{1});
    return attrs;
  };
  const std::vector<std::tuple<std::string, ValueId, Attrs>> transforms = {
      {"winograd_tiles", x.id(), padded},
      {"winograd_grad_tiles", x.id(), tiled},
      {"winograd_filter", w.id(), Attrs{}}};
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (const auto& [op, source, attrs] : transforms) {
    pairs.emplace_back(raw(graph, op, {source}, attrs), raw(graph, op, {source}, rounded(attrs)));
    EXPECT_EQ(pairs.back().first.dtype(), DType::f32) << op;
    EXPECT_EQ(pairs.back().second.dtype(), DType::f16) << op;
  }
  Environment environment;
  for (const auto& [name, shape] : {std::pair{"x", Shape{1, 2, 4, 4}}, {"w", Shape{2, 2, 3, 3}}}) {
    HostTensor value(shape);
    for (size_t i = 0; i < value.data.size(); ++i) value.data[i] = (static_cast<double>(i) - 7) / 3;
    environment.leaves[name] = value;
  }
  const auto values = evaluate(graph, environment);
  for (const auto& [plain, f16] : pairs) {
    size_t inexact = 0;
    for (size_t i = 0; i < values[plain.id()].data.size(); ++i) {
      const double point = values[plain.id()].data[i];
      EXPECT_EQ(values[f16.id()].data[i], round_to_f16(point));
      inexact += round_to_f16(point) != point;
    }
    EXPECT_GT(inexact, 0u);
  }
  const Tensor f16_x = input(graph, "f16_x", {1, 2, 4, 4}, DType::f16);
  expect_error([&] { raw(graph, "winograd_tiles", {f16_x.id()}, rounded(padded)); },
               {"winograd_tiles", "f16_result rounds f32 values"});
  Attrs two = tiled;
  two.set("f16_result", int64_t{2});
  expect_error([&] { raw(graph, "winograd_grad_tiles", {x.id()}, two); },
               {"winograd_grad_tiles", "f16_result must be 0 or 1"});
}

TEST(Conv, WinogradMisuse) {
  Graph graph;
  const Tensor x = input(graph, "x", {1, 2, 4, 4});
  const std::vector<int64_t> one{1, 1};
  expect_error([&] { raw(graph, "winograd_tiles", {x.id()}, {}); }, {"winograd_tiles", "tiles"});
  expect_error(
      [&] {
        raw(graph, "winograd_grad_tiles", {x.id()}, {{"tiles", std::vector<int64_t>{0, 1}}});
      },
      {"winograd_grad_tiles", "tiles"});
  const Tensor flat = input(graph, "flat", {2, 4, 4});
  expect_error(
      [&] {
        raw(graph, "winograd_tiles", {flat.id()}, {{"tiles", one}});
      },
      {"winograd_tiles", "rank"});
  const Tensor points = input(graph, "points", {9, 2, 2});
  expect_error([&] { raw(graph, "winograd_weight_grad", {points.id()}, {}); },
               {"winograd_weight_grad", "input must be [16, O, C] or [S, 16, O, C]"});
  const Tensor tiles = raw(graph, "winograd_grad_tiles", {x.id()}, {{"tiles", one}});
  expect_error([&] { gradients(graph, sum_all(tiles).id(), {x.id()}); },
               {"winograd_grad_tiles", "after differentiation", "differentiate the conv2d"});
  expect_error(
      [&] {
        raw(graph, "winograd_grad_tiles", {x.id()},
            {{"tiles", one}, {"padding", std::vector<int64_t>{1, 1}}});
      },
      {"winograd_grad_tiles", "takes no padding"});
  const Tensor five = input(graph, "five", {2, 2, 5, 5});
  expect_error([&] { raw(graph, "winograd_filter", {five.id()}, {}); },
               {"winograd_filter", "the filter must be 3 x 3"});
  const Tensor w = input(graph, "w", {2, 2, 3, 3});
  expect_error(
      [&] {
        raw(graph, "winograd_filter", {w.id()}, {{"transposed", int64_t{2}}});
      },
      {"winograd_filter", "transposed must be 0 or 1"});
  const Tensor products = input(graph, "products", {16, 2, 8});
  const auto output = [&](std::vector<int64_t> grid, std::vector<int64_t> size) {
    raw(graph, "winograd_output", {products.id()},
        {{"tiles", std::move(grid)}, {"output_size", std::move(size)}});
  };
  expect_error(
      [&] {
        output({2, 2}, {5, 4});
      },
      {"winograd_output", "tiles must cover output_size in 2 x 2 blocks"});
  expect_error(
      [&] {
        output({1, 3}, {2, 6});
      },
      {"winograd_output", "T must be a whole number of images' tiles"});
  const Tensor nine = input(graph, "nine", {9, 2, 8});
  expect_error(
      [&] {
        raw(graph, "winograd_output", {nine.id()},
            {{"tiles", std::vector<int64_t>{2, 2}}, {"output_size", std::vector<int64_t>{4, 4}}});
      },
      {"winograd_output", "[16, P, T]"});
}

}  // namespace
}  // namespace mg
