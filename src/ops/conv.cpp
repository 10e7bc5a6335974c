// Convolution family (NCHW): conv2d, its data and weight gradients, conv_transpose2d, and the
// conv1d builder. One loop (for_each_tap) enumerates the product terms of a convolution; the
// forward, data-gradient and weight-gradient references differ only in which operand they
// accumulate into, so they cannot drift apart. conv_transpose2d is the data gradient of the
// convolution that maps its output back to its input.
#include <array>
#include <limits>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"
#include "ops/op_checks.hpp"

namespace mg {
namespace {

// conv_geometry after rejecting bad attributes, channel mismatches and empty outputs.
ConvGeometry checked_geometry(const Graph& graph, const Node& node, const Shape& x,
                              const Shape& w) {
  pair_attr(graph, node, "stride", 1, {1, 1});
  pair_attr(graph, node, "padding", 0, {0, 0});
  pair_attr(graph, node, "dilation", 1, {1, 1});
  const ConvGeometry g = conv_geometry(node.attrs, x, w);
  if (g.groups < 1 || g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0) {
    op_error(graph, node,
             "groups " + std::to_string(g.groups) + " must divide both the " +
                 std::to_string(g.in_channels) + " input and " + std::to_string(g.out_channels) +
                 " output channels");
  }
  if (w[1] * g.groups != g.in_channels) {
    op_error(graph, node,
             "weight " + shape_string(w) + " expects " + std::to_string(w[1] * g.groups) +
                 " input channels but input " + shape_string(x) + " has " +
                 std::to_string(g.in_channels));
  }
  if (g.out_height <= 0 || g.out_width <= 0) {
    op_error(graph, node,
             "the (dilated) kernel " + shape_string({g.kernel_height, g.kernel_width}) +
                 " does not fit the padded input " + shape_string(x) +
                 ": output size would be <= 0");
  }
  return g;
}

// Calls visit(input_index, weight_index, output_index) once per product term
// output += input * weight of the convolution (padding taps are skipped).
template <class Visit>
void for_each_tap(const ConvGeometry& g, Visit visit) {
  const int64_t in_per_group = g.channels_per_group();
  const int64_t out_per_group = g.outs_per_group();
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t o = 0; o < g.out_channels; ++o) {
      const int64_t first_channel = (o / out_per_group) * in_per_group;
      for (int64_t ci = 0; ci < in_per_group; ++ci) {
        const int64_t c = first_channel + ci;
        for (int64_t oh = 0; oh < g.out_height; ++oh) {
          for (int64_t ow = 0; ow < g.out_width; ++ow) {
            const int64_t output_index =
                ((n * g.out_channels + o) * g.out_height + oh) * g.out_width + ow;
            for (int64_t kh = 0; kh < g.kernel_height; ++kh) {
              const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
              if (ih < 0 || ih >= g.in_height) continue;
              for (int64_t kw = 0; kw < g.kernel_width; ++kw) {
                const int64_t iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
                if (iw < 0 || iw >= g.in_width) continue;
                visit(((n * g.in_channels + c) * g.in_height + ih) * g.in_width + iw,
                      ((o * in_per_group + ci) * g.kernel_height + kh) * g.kernel_width + kw,
                      output_index);
              }
            }
          }
        }
      }
    }
  }
}

void expect_conv_operands(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 2);
  expect_floating(graph, node, 0, 4);
  expect_floating(graph, node, 1, 4);
  expect_same_dtype(graph, node);
}

void expect_shape(const Graph& graph, const Node& node, const std::string& what,
                  const Shape& actual, const Shape& expected) {
  if (actual != expected) {
    op_error(graph, node,
             what + " " + shape_string(actual) + " should be " + shape_string(expected) +
                 " for this convolution");
  }
}

// Attributes of a plain conv2d with the node's stride, padding, dilation and groups.
Attrs conv_attrs(const Node& node) {
  return {{"stride", node.attrs.get_ints("stride", {1, 1})},
          {"padding", node.attrs.get_ints("padding", {0, 0})},
          {"dilation", node.attrs.get_ints("dilation", {1, 1})},
          {"groups", node.attrs.get_int("groups", 1)}};
}

Attrs with_shape(Attrs attrs, const char* name, const Shape& shape) {
  attrs.set(name, shape);
  return attrs;
}

// Output shape of conv_transpose2d(x [N, C, H, W], w [C, O/groups, KH, KW]).
Shape transposed_output_shape(const Attrs& attrs, const Shape& x, const Shape& w) {
  const auto stride = attr_pair(attrs, "stride", 1);
  const auto padding = attr_pair(attrs, "padding", 0);
  const auto dilation = attr_pair(attrs, "dilation", 1);
  const auto output_padding = attr_pair(attrs, "output_padding", 0);
  Shape output{x[0], w[1] * attrs.get_int("groups", 1), 0, 0};
  for (size_t i = 0; i < 2; ++i) {
    output[2 + i] = (x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w[2 + i] - 1) +
                    output_padding[i] + 1;
  }
  return output;
}

// conv_transpose2d(x, w) is the data gradient of conv2d(output, w): returns that conv2d's
// geometry after checking that it maps the output back onto exactly x.
ConvGeometry checked_transposed_geometry(const Graph& graph, const Node& node) {
  const Shape& x = graph.type(node.inputs[0]).shape;
  const Shape& w = graph.type(node.inputs[1]).shape;
  const auto stride = pair_attr(graph, node, "stride", 1, {1, 1});
  const auto output_padding = pair_attr(graph, node, "output_padding", 0, {0, 0});
  const int64_t groups = node.attrs.get_int("groups", 1);
  if (w[0] != x[1]) {
    op_error(graph, node,
             "weight " + shape_string(w) + " expects " + std::to_string(w[0]) +
                 " input channels but input " + shape_string(x) + " has " + std::to_string(x[1]));
  }
  if (groups < 1 || x[1] % groups != 0) {
    op_error(graph, node,
             "groups " + std::to_string(groups) + " must divide the " + std::to_string(x[1]) +
                 " input channels");
  }
  if (output_padding[0] >= stride[0] || output_padding[1] >= stride[1]) {
    op_error(graph, node, "output_padding must be smaller than stride");
  }
  const Shape output = transposed_output_shape(node.attrs, x, w);
  if (output[2] <= 0 || output[3] <= 0) {
    op_error(graph, node, "output size " + shape_string(output) + " would be <= 0");
  }
  const ConvGeometry g = checked_geometry(graph, node, output, w);
  expect_shape(graph, node, "input", x, g.output_shape());
  return g;
}

HostTensor convolve(const ConvGeometry& g, const HostTensor& x, const HostTensor& w) {
  HostTensor out(g.output_shape());
  for_each_tap(
      g, [&](int64_t xi, int64_t wi, int64_t oi) { out.data[oi] += x.data[xi] * w.data[wi]; });
  return out;
}

HostTensor convolve_grad_input(const ConvGeometry& g, const HostTensor& grad_out,
                               const HostTensor& w) {
  HostTensor grad(g.input_shape());
  for_each_tap(g, [&](int64_t xi, int64_t wi, int64_t oi) {
    grad.data[xi] += grad_out.data[oi] * w.data[wi];
  });
  return grad;
}

// The weight gradient sums over K = N * OH * OW, k = (n * OH + oh) * OW + ow; with k_splits the
// result holds one partial gradient per K slice (ops/k_split.hpp).
HostTensor convolve_grad_weight(const Node& node, const ConvGeometry& g, const HostTensor& x,
                                const HostTensor& grad_out) {
  const int64_t out_plane = g.out_height * g.out_width;
  const int64_t k = g.batch * out_plane;
  const int64_t slice =
      node.attrs.has("k_splits") ? k_slice_length(k, node.attrs.get_int("k_splits")) : k;
  const int64_t weights = element_count(g.weight_shape());
  HostTensor grad(node.type.shape);
  for_each_tap(g, [&](int64_t xi, int64_t wi, int64_t oi) {
    const int64_t product = oi / (g.out_channels * out_plane) * out_plane + oi % out_plane;
    grad.data[product / slice * weights + wi] += x.data[xi] * grad_out.data[oi];
  });
  return grad;
}

// VJP shared by conv2d_grad_input and conv_transpose2d: result = grad_input(a, w) is linear in
// a and in w, with adjoints conv2d(grad, w) and grad_weight(grad, a).
std::vector<ValueId> data_gradient_vjp(Graph& graph, ValueId self, ValueId grad) {
  const Node node = graph.node(self);
  const ValueId a = node.inputs[0];
  const ValueId w = node.inputs[1];
  const Attrs attrs = conv_attrs(node);
  return {graph.add(op::conv2d, {grad, w}, attrs),
          graph.add(op::conv2d_grad_weight, {grad, a},
                    with_shape(attrs, "weight_shape", graph.type(w).shape))};
}

Tensor add_channel_bias(Tensor out, Tensor bias, std::string_view op) {
  const int64_t channels = out.dim(1);
  if (bias.shape() != Shape{channels}) {
    throw Error(std::string(op) + ": bias " + type_string(bias.type()) + " should have shape [" +
                std::to_string(channels) + "] (one value per output channel)");
  }
  Shape bias_shape(out.rank() - 1, 1);
  bias_shape[0] = channels;
  return add(out, reshape(bias, bias_shape));
}

// The column geometry of an im2col or col2im node after rejecting bad attributes.
ColumnGeometry checked_columns(const Graph& graph, const Node& node) {
  constexpr int64_t kAnySign = std::numeric_limits<int64_t>::min();
  pair_attr(graph, node, "kernel", 1);
  pair_attr(graph, node, "stride", 1, {1, 1});
  pair_attr(graph, node, "padding", kAnySign, {0, 0});
  const auto dilation = pair_attr(graph, node, "dilation", kAnySign, {1, 1});
  pair_attr(graph, node, "output_size", 1);
  if (dilation[0] == 0 || dilation[1] == 0) op_error(graph, node, "dilation must not be 0");
  return column_geometry(node.attrs);
}

// Calls visit(image_index, column_index) for every element of the columns [N, C * KH * KW,
// OH * OW] that lies inside the image [N, C, H, W]. im2col and col2im are each other's adjoint
// because both walk this one loop.
template <class Visit>
void for_each_column_tap(const ColumnGeometry& g, const Shape& image, Visit visit) {
  const int64_t batch = image[0], channels = image[1], height = image[2], width = image[3];
  int64_t column = 0;
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t kh = 0; kh < g.kernel[0]; ++kh)
        for (int64_t kw = 0; kw < g.kernel[1]; ++kw)
          for (int64_t oy = 0; oy < g.output_size[0]; ++oy)
            for (int64_t ox = 0; ox < g.output_size[1]; ++ox, ++column) {
              const int64_t iy = oy * g.stride[0] - g.padding[0] + kh * g.dilation[0];
              const int64_t ix = ox * g.stride[1] - g.padding[1] + kw * g.dilation[1];
              if (iy >= 0 && iy < height && ix >= 0 && ix < width)
                visit(((n * channels + c) * height + iy) * width + ix, column);
            }
}

}  // namespace

void register_conv_ops(std::vector<OpDef>& registry) {
  // conv2d(x [N, C, H, W], w [O, C/groups, KH, KW]) -> [N, O, OH, OW], no bias.
  // attrs: stride [2] (default 1,1), padding [2] (0,0), dilation [2] (1,1), groups (1).
  registry.push_back(OpDef{
      .name = op::conv2d,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_conv_operands(graph, node);
            const TensorType& x = graph.type(node.inputs[0]);
            const Shape& w = graph.type(node.inputs[1]).shape;
            return TensorType{x.dtype, checked_geometry(graph, node, x.shape, w).output_shape()};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            return convolve(conv_geometry(node.attrs, in[0]->shape, in[1]->shape), *in[0], *in[1]);
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            const ValueId x = node.inputs[0];
            const ValueId w = node.inputs[1];
            const Attrs attrs = conv_attrs(node);
            return std::vector<ValueId>{
                graph.add(op::conv2d_grad_input, {grad, w},
                          with_shape(attrs, "input_shape", graph.type(x).shape)),
                graph.add(op::conv2d_grad_weight, {x, grad},
                          with_shape(attrs, "weight_shape", graph.type(w).shape))};
          },
  });

  // conv2d_grad_input(grad_out [N, O, OH, OW], w [O, C/groups, KH, KW]) -> [N, C, H, W]: the
  // gradient of conv2d with respect to x. attrs: those of conv2d plus input_shape [4].
  registry.push_back(OpDef{
      .name = op::conv2d_grad_input,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_conv_operands(graph, node);
            const TensorType& grad_out = graph.type(node.inputs[0]);
            const Shape input_shape = shape4_attr(graph, node, "input_shape");
            const ConvGeometry g =
                checked_geometry(graph, node, input_shape, graph.type(node.inputs[1]).shape);
            expect_shape(graph, node, "grad_out", grad_out.shape, g.output_shape());
            return TensorType{grad_out.dtype, input_shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const ConvGeometry g =
                conv_geometry(node.attrs, node.attrs.get_ints("input_shape"), in[1]->shape);
            return convolve_grad_input(g, *in[0], *in[1]);
          },
      .vjp = data_gradient_vjp,
  });

  // conv2d_grad_weight(x [N, C, H, W], grad_out [N, O, OH, OW]) -> [O, C/groups, KH, KW]: the
  // gradient of conv2d with respect to w. attrs: those of conv2d plus weight_shape [4], and
  // k_splits = S (only from the split-K pass) for S partial gradients [S, O, C/groups, KH, KW]
  // over slices of K = N * OH * OW.
  registry.push_back(OpDef{
      .name = op::conv2d_grad_weight,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_conv_operands(graph, node);
            const TensorType& x = graph.type(node.inputs[0]);
            const Shape weight_shape = shape4_attr(graph, node, "weight_shape");
            const ConvGeometry g = checked_geometry(graph, node, x.shape, weight_shape);
            expect_shape(graph, node, "grad_out", graph.type(node.inputs[1]).shape,
                         g.output_shape());
            return TensorType{
                x.dtype,
                split_k_shape(graph, node, g.batch * g.out_height * g.out_width, weight_shape)};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const ConvGeometry g =
                conv_geometry(node.attrs, in[0]->shape, node.attrs.get_ints("weight_shape"));
            return convolve_grad_weight(node, g, *in[0], *in[1]);
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            reject_split_gradient(graph, self);
            const Node node = graph.node(self);
            const ValueId x = node.inputs[0];
            const ValueId grad_out = node.inputs[1];
            const Attrs attrs = conv_attrs(node);
            return std::vector<ValueId>{
                graph.add(op::conv2d_grad_input, {grad_out, grad},
                          with_shape(attrs, "input_shape", graph.type(x).shape)),
                graph.add(op::conv2d, {x, grad}, attrs)};
          },
  });

  // im2col(x [N, C, H, W]) -> [N, C * KH * KW, OH * OW]: the taps of a convolution as the
  // columns of a GEMM operand, element [n, (c * KH + kh) * KW + kw, oy * OW + ox] =
  // x[n, c, oy * stride - padding + kh * dilation, ...] or 0 outside x. attrs: kernel [2],
  // output_size [2] (OH, OW), stride [2] (>= 1, default 1), padding and dilation [2] (either
  // sign, dilation not 0: a stride-1 data gradient reads grad_out with padding -P and dilation
  // -D), images_side_by_side (0 or 1, default 0: with 1 the result is [C * KH * KW,
  // N * OH * OW], element [(c * KH + kh) * KW + kw, n * OH * OW + oy * OW + ox], one GEMM
  // operand for the whole batch). Written by the im2col pass (passes/im2col.cpp); its gradient
  // is col2im.
  registry.push_back(OpDef{
      .name = op::im2col,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            const TensorType& x = graph.type(node.inputs[0]);
            if (x.shape.size() != 4) op_error(graph, node, "input must be [N, C, H, W]");
            const ColumnGeometry g = checked_columns(graph, node);
            const int64_t side_by_side = node.attrs.get_int("images_side_by_side", 0);
            if (side_by_side != 0 && side_by_side != 1)
              op_error(graph, node, "images_side_by_side must be 0 or 1");
            const int64_t rows = x.shape[1] * g.kernel[0] * g.kernel[1];
            const int64_t plane = g.output_size[0] * g.output_size[1];
            if (side_by_side == 1) return TensorType{x.dtype, {rows, x.shape[0] * plane}};
            return TensorType{x.dtype, {x.shape[0], rows, plane}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor columns(node.type.shape);
            const ColumnGeometry g = column_geometry(node.attrs);
            const int64_t batch = in[0]->shape[0];
            const int64_t rows = in[0]->shape[1] * g.kernel[0] * g.kernel[1];
            const int64_t plane = g.output_size[0] * g.output_size[1];
            const bool side_by_side = images_side_by_side(node.attrs);
            for_each_column_tap(g, in[0]->shape, [&](int64_t image, int64_t column) {
              // Per image the column index is (n rows + row) plane + p; side by side it is
              // (row N + n) plane + p.
              const int64_t n = column / (rows * plane), row = column / plane % rows;
              const int64_t at = side_by_side ? (row * batch + n) * plane + column % plane : column;
              columns.data[at] = in[0]->data[image];
            });
            return columns;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            Attrs attrs = node.attrs;
            const Shape& image = graph.type(node.inputs[0]).shape;
            attrs.set("image_size", std::vector<int64_t>{image[2], image[3]});
            return std::vector<ValueId>{graph.add(op::col2im, {grad}, std::move(attrs))};
          },
  });

  // col2im(columns [N, C * KH * KW, OH * OW]) -> [N, C, H, W]: the adjoint of im2col, each image
  // element the sum of the column elements that im2col would copy from it. attrs: those of
  // im2col plus image_size [2] (H, W); with images_side_by_side 1 the columns are
  // [C * KH * KW, N * OH * OW], as im2col writes them then. Written by the im2col pass for
  // strided data gradients: dx = col2im(W^T x grad_out) (passes/im2col.cpp); its gradient is
  // im2col.
  registry.push_back(OpDef{
      .name = op::col2im,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            const TensorType& columns = graph.type(node.inputs[0]);
            const ColumnGeometry g = checked_columns(graph, node);
            const auto image = pair_attr(graph, node, "image_size", 1);
            const int64_t side_by_side = node.attrs.get_int("images_side_by_side", 0);
            if (side_by_side != 0 && side_by_side != 1)
              op_error(graph, node, "images_side_by_side must be 0 or 1");
            const int64_t taps = g.kernel[0] * g.kernel[1];
            const int64_t plane = g.output_size[0] * g.output_size[1];
            if (side_by_side == 1) {
              if (columns.shape.size() != 2 || columns.shape[0] % taps != 0 ||
                  columns.shape[1] % plane != 0)
                op_error(graph, node,
                         "side-by-side columns must be [C * " + std::to_string(taps) + ", N * " +
                             std::to_string(plane) + "]");
              return TensorType{
                  columns.dtype,
                  {columns.shape[1] / plane, columns.shape[0] / taps, image[0], image[1]}};
            }
            if (columns.shape.size() != 3 || columns.shape[1] % taps != 0 ||
                columns.shape[2] != plane) {
              op_error(graph, node,
                       "columns must be [N, C * " + std::to_string(taps) + ", " +
                           std::to_string(plane) + "]");
            }
            return TensorType{columns.dtype,
                              {columns.shape[0], columns.shape[1] / taps, image[0], image[1]}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor image(node.type.shape);
            const ColumnGeometry g = column_geometry(node.attrs);
            const int64_t batch = node.type.shape[0];
            const int64_t rows = node.type.shape[1] * g.kernel[0] * g.kernel[1];
            const int64_t plane = g.output_size[0] * g.output_size[1];
            const bool side_by_side = images_side_by_side(node.attrs);
            for_each_column_tap(g, node.type.shape, [&](int64_t pixel, int64_t column) {
              const int64_t n = column / (rows * plane), row = column / plane % rows;
              const int64_t at = side_by_side ? (row * batch + n) * plane + column % plane : column;
              image.data[pixel] += in[0]->data[at];
            });
            return image;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            Attrs attrs;
            for (const auto& [name, value] : graph.node(self).attrs.items())
              if (name != "image_size") attrs.set(name, value);
            return std::vector<ValueId>{graph.add(op::im2col, {grad}, std::move(attrs))};
          },
  });

  // conv_transpose2d(x [N, C, H, W], w [C, O/groups, KH, KW]) -> [N, O, OH, OW] with
  // OH = (H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1.
  // attrs: stride [2], padding [2], output_padding [2] (each < stride), dilation [2], groups.
  registry.push_back(OpDef{
      .name = op::conv_transpose2d,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_conv_operands(graph, node);
            return TensorType{graph.type(node.inputs[0]).dtype,
                              checked_transposed_geometry(graph, node).input_shape()};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const Shape output = transposed_output_shape(node.attrs, in[0]->shape, in[1]->shape);
            return convolve_grad_input(conv_geometry(node.attrs, output, in[1]->shape), *in[0],
                                       *in[1]);
          },
      .vjp = data_gradient_vjp,
  });
}

Tensor conv2d(Tensor x, Tensor weight, std::optional<Tensor> bias, const Conv2dOptions& options) {
  Tensor out = apply(op::conv2d, {x, weight},
                     {{"stride", options.stride},
                      {"padding", options.padding},
                      {"dilation", options.dilation},
                      {"groups", options.groups}});
  return bias ? add_channel_bias(out, *bias, op::conv2d) : out;
}

Tensor conv1d(Tensor x, Tensor weight, std::optional<Tensor> bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  if (x.rank() != 3 || weight.rank() != 3) {
    throw Error("conv1d: input " + type_string(x.type()) + " and weight " +
                type_string(weight.type()) +
                " must both have rank 3 ([N, C, L], [O, C/groups, K])");
  }
  const Tensor x2d = reshape(x, {x.dim(0), x.dim(1), 1, x.dim(2)});
  const Tensor w2d = reshape(weight, {weight.dim(0), weight.dim(1), 1, weight.dim(2)});
  const Tensor out = conv2d(x2d, w2d, std::nullopt,
                            {.stride = {1, stride},
                             .padding = {0, padding},
                             .dilation = {1, dilation},
                             .groups = groups});
  const Tensor out1d = reshape(out, {out.dim(0), out.dim(1), out.dim(3)});
  return bias ? add_channel_bias(out1d, *bias, "conv1d") : out1d;
}

Tensor conv_transpose2d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                        const ConvTranspose2dOptions& options) {
  Tensor out = apply(op::conv_transpose2d, {x, weight},
                     {{"stride", options.stride},
                      {"padding", options.padding},
                      {"output_padding", options.output_padding},
                      {"dilation", options.dilation},
                      {"groups", options.groups}});
  return bias ? add_channel_bias(out, *bias, op::conv_transpose2d) : out;
}

}  // namespace mg
