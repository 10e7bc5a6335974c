// Pooling and resampling (NCHW): max/avg pooling, nearest and bilinear upsampling, each with a
// dedicated backward op, plus the global_avg_pool2d builder (a mean over H and W). Every
// backward op reuses the enumeration of its forward op (window taps, bilinear taps), so forward
// and backward see the same index mapping.
#include <algorithm>
#include <array>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/op_checks.hpp"
#include "ops/pool_geometry.hpp"

namespace mg {
namespace {

// Padding is limited to half the kernel (PyTorch's rule), so every window holds at least one
// real element and a max over padding alone cannot happen.
PoolGeometry checked_pool_geometry(const Graph& graph, const Node& node, const Shape& x) {
  const auto kernel = pair_attr(graph, node, "kernel", 1);
  pair_attr(graph, node, "stride", 1, {kernel[0], kernel[1]});
  const auto padding = pair_attr(graph, node, "padding", 0, {0, 0});
  if (padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2) {
    op_error(graph, node, "padding must be at most half the kernel");
  }
  if (x.size() != 4) op_error(graph, node, "input " + shape_string(x) + " must have rank 4");
  const PoolGeometry g = pool_geometry(node.attrs, x);
  if (g.out_height <= 0 || g.out_width <= 0) {
    op_error(graph, node,
             "kernel " + shape_string({kernel[0], kernel[1]}) + " does not fit the padded input " +
                 shape_string(x) + ": output size would be <= 0");
  }
  return g;
}

// Calls visit(output_index, input_index) for every in-bounds tap of every window, windows in
// output order and taps in row-major order within a window.
template <class Visit>
void for_each_window_tap(const PoolGeometry& g, Visit visit) {
  for (int64_t plane = 0; plane < g.batch * g.channels; ++plane) {
    for (int64_t oh = 0; oh < g.out_height; ++oh) {
      for (int64_t ow = 0; ow < g.out_width; ++ow) {
        const int64_t output_index = (plane * g.out_height + oh) * g.out_width + ow;
        for (int64_t kh = 0; kh < g.kernel[0]; ++kh) {
          const int64_t ih = oh * g.stride[0] - g.padding[0] + kh;
          if (ih < 0 || ih >= g.in_height) continue;
          for (int64_t kw = 0; kw < g.kernel[1]; ++kw) {
            const int64_t iw = ow * g.stride[1] - g.padding[1] + kw;
            if (iw < 0 || iw >= g.in_width) continue;
            visit(output_index, (plane * g.in_height + ih) * g.in_width + iw);
          }
        }
      }
    }
  }
}

// For each window, the input index of its first maximum (ties go to the earliest tap).
std::vector<int64_t> first_argmax(const PoolGeometry& g, const HostTensor& x) {
  const int64_t outputs = element_count(g.output_shape());
  std::vector<int64_t> best(outputs, -1);
  for_each_window_tap(g, [&](int64_t o, int64_t i) {
    if (best[o] < 0 || x.data[i] > x.data[best[o]]) best[o] = i;
  });
  return best;
}

void expect_grad_shape(const Graph& graph, const Node& node, const Shape& grad,
                       const Shape& expected) {
  if (grad != expected) {
    op_error(graph, node,
             "grad_out " + shape_string(grad) + " should be " + shape_string(expected));
  }
}

Attrs pool_attrs(const Node& node) {
  const std::vector<int64_t>& kernel = node.attrs.get_ints("kernel");
  return {{"kernel", kernel},
          {"stride", node.attrs.get_ints("stride", kernel)},
          {"padding", node.attrs.get_ints("padding", {0, 0})}};
}

// Bilinear source taps along one axis, PyTorch align_corners=False: the source coordinate is
// (o + 0.5) * in / out - 0.5, clamped at 0, split between floor and the next index (clamped).
struct BilinearTap {
  int64_t low = 0, high = 0;
  double low_weight = 0, high_weight = 0;
};

std::vector<BilinearTap> bilinear_taps(int64_t in, int64_t out) {
  std::vector<BilinearTap> taps(out);
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    const double source = std::max((static_cast<double>(o) + 0.5) * scale - 0.5, 0.0);
    BilinearTap& tap = taps[o];
    tap.low = std::min(static_cast<int64_t>(source), in - 1);
    tap.high = std::min(tap.low + 1, in - 1);
    tap.high_weight = source - static_cast<double>(tap.low);
    tap.low_weight = 1.0 - tap.high_weight;
  }
  return taps;
}

// Calls visit(output_index, input_index, weight) for the four taps of every output pixel of
// resizing `input` [N, C, H, W] to out_height x out_width.
template <class Visit>
void for_each_bilinear_tap(const Shape& input, int64_t out_height, int64_t out_width, Visit visit) {
  const std::vector<BilinearTap> rows = bilinear_taps(input[2], out_height);
  const std::vector<BilinearTap> cols = bilinear_taps(input[3], out_width);
  for (int64_t plane = 0; plane < input[0] * input[1]; ++plane) {
    for (int64_t oh = 0; oh < out_height; ++oh) {
      const BilinearTap& r = rows[oh];
      for (int64_t ow = 0; ow < out_width; ++ow) {
        const BilinearTap& c = cols[ow];
        const int64_t o = (plane * out_height + oh) * out_width + ow;
        const auto at = [&](int64_t h, int64_t w) { return (plane * input[2] + h) * input[3] + w; };
        visit(o, at(r.low, c.low), r.low_weight * c.low_weight);
        visit(o, at(r.low, c.high), r.low_weight * c.high_weight);
        visit(o, at(r.high, c.low), r.high_weight * c.low_weight);
        visit(o, at(r.high, c.high), r.high_weight * c.high_weight);
      }
    }
  }
}

int64_t positive_int_attr(const Graph& graph, const Node& node, std::string_view name) {
  const int64_t value = node.attrs.get_int(name);
  if (value < 1) {
    op_error(graph, node, std::string(name) + " " + std::to_string(value) + " must be >= 1");
  }
  return value;
}

// Shape inference shared by max_pool2d and avg_pool2d: x [N, C, H, W] -> [N, C, OH, OW].
TensorType infer_pooled(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  expect_floating(graph, node, 0, 4);
  const TensorType& x = graph.type(node.inputs[0]);
  return TensorType{x.dtype, checked_pool_geometry(graph, node, x.shape).output_shape()};
}

}  // namespace

void register_pool_ops(std::vector<OpDef>& registry) {
  // max_pool2d(x [N, C, H, W]) -> [N, C, OH, OW]; padding taps count as -inf.
  // attrs: kernel [2], stride [2] (default kernel), padding [2] (each <= kernel / 2).
  registry.push_back(OpDef{
      .name = op::max_pool2d,
      .infer = infer_pooled,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const PoolGeometry g = pool_geometry(node.attrs, in[0]->shape);
            HostTensor out(g.output_shape());
            const std::vector<int64_t> best = first_argmax(g, *in[0]);
            for (int64_t o = 0; o < out.elements(); ++o) out.data[o] = in[0]->data[best[o]];
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            return std::vector<ValueId>{
                graph.add(op::max_pool2d_grad, {node.inputs[0], grad, self}, pool_attrs(node))};
          },
  });

  // max_pool2d_grad(x [N, C, H, W], grad_out [N, C, OH, OW][, pooled]) -> [N, C, H, W]: each
  // output gradient goes to the first maximum of its window. `pooled`, max_pool2d(x) as the
  // forward computed it (its gradient passes it), changes nothing in the result: a kernel then
  // compares an element with the maxima of its windows and scans a window only where they are
  // equal. attrs: those of max_pool2d.
  registry.push_back(OpDef{
      .name = op::max_pool2d_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 3) expect_input_count(graph, node, 2);
            expect_floating(graph, node, 0, 4);
            expect_floating(graph, node, 1, 4);
            expect_same_dtype(graph, node);
            const TensorType& x = graph.type(node.inputs[0]);
            const Shape pooled = checked_pool_geometry(graph, node, x.shape).output_shape();
            expect_grad_shape(graph, node, graph.type(node.inputs[1]).shape, pooled);
            if (node.inputs.size() == 3) {
              expect_floating(graph, node, 2, 4);
              if (graph.type(node.inputs[2]).shape != pooled)
                op_error(graph, node,
                         "pooled " + shape_string(graph.type(node.inputs[2]).shape) +
                             " must be max_pool2d's result " + shape_string(pooled));
            }
            return x;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const PoolGeometry g = pool_geometry(node.attrs, in[0]->shape);
            HostTensor grad(in[0]->shape);
            const std::vector<int64_t> best = first_argmax(g, *in[0]);
            for (size_t o = 0; o < best.size(); ++o) grad.data[best[o]] += in[1]->data[o];
            return grad;
          },
  });

  // avg_pool2d(x [N, C, H, W]) -> [N, C, OH, OW]; padding taps count as zeros in the average
  // (divisor = kernel area). attrs: kernel [2], stride [2] (default kernel), padding [2].
  registry.push_back(OpDef{
      .name = op::avg_pool2d,
      .infer = infer_pooled,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const PoolGeometry g = pool_geometry(node.attrs, in[0]->shape);
            HostTensor out(g.output_shape());
            const double area = static_cast<double>(g.kernel[0] * g.kernel[1]);
            for_each_window_tap(
                g, [&](int64_t o, int64_t i) { out.data[o] += in[0]->data[i] / area; });
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            Attrs attrs = pool_attrs(node);
            attrs.set("input_shape", graph.type(node.inputs[0]).shape);
            return std::vector<ValueId>{graph.add(op::avg_pool2d_grad, {grad}, attrs)};
          },
  });

  // avg_pool2d_grad(grad_out [N, C, OH, OW]) -> input_shape: spreads each output gradient
  // evenly over its window. attrs: those of avg_pool2d plus input_shape [4].
  registry.push_back(OpDef{
      .name = op::avg_pool2d_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            const Shape input_shape = shape4_attr(graph, node, "input_shape");
            const TensorType& grad = graph.type(node.inputs[0]);
            expect_grad_shape(graph, node, grad.shape,
                              checked_pool_geometry(graph, node, input_shape).output_shape());
            return TensorType{grad.dtype, input_shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const PoolGeometry g = pool_geometry(node.attrs, node.attrs.get_ints("input_shape"));
            HostTensor grad(node.attrs.get_ints("input_shape"));
            const double area = static_cast<double>(g.kernel[0] * g.kernel[1]);
            for_each_window_tap(
                g, [&](int64_t o, int64_t i) { grad.data[i] += in[0]->data[o] / area; });
            return grad;
          },
      // The op is linear; its adjoint is the average pooling it differentiates.
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            return std::vector<ValueId>{
                graph.add(op::avg_pool2d, {grad}, pool_attrs(graph.node(self)))};
          },
  });

  // upsample_nearest2d(x [N, C, H, W]) -> [N, C, H * scale, W * scale]. attrs: scale (>= 1).
  registry.push_back(OpDef{
      .name = op::upsample_nearest2d,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            const int64_t scale = positive_int_attr(graph, node, "scale");
            TensorType type = graph.type(node.inputs[0]);
            type.shape[2] *= scale;
            type.shape[3] *= scale;
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const int64_t scale = node.attrs.get_int("scale");
            const Shape& x = in[0]->shape;
            HostTensor out({x[0], x[1], x[2] * scale, x[3] * scale});
            for (int64_t o = 0; o < out.elements(); ++o) {
              const int64_t ow = o % out.shape[3];
              const int64_t oh = (o / out.shape[3]) % out.shape[2];
              const int64_t plane = o / (out.shape[2] * out.shape[3]);
              out.data[o] = in[0]->data[(plane * x[2] + oh / scale) * x[3] + ow / scale];
            }
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            return std::vector<ValueId>{graph.add(op::upsample_nearest2d_grad, {grad},
                                                  {{"scale", node.attrs.get_int("scale")}})};
          },
  });

  // upsample_nearest2d_grad(grad_out [N, C, H * scale, W * scale]) -> [N, C, H, W]: sums each
  // scale x scale block. attrs: scale (>= 1, dividing the gradient's H and W).
  registry.push_back(OpDef{
      .name = op::upsample_nearest2d_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            const int64_t scale = positive_int_attr(graph, node, "scale");
            TensorType type = graph.type(node.inputs[0]);
            if (type.shape[2] % scale != 0 || type.shape[3] % scale != 0) {
              op_error(graph, node,
                       "grad_out " + shape_string(type.shape) + " is not a multiple of scale " +
                           std::to_string(scale) + " in H and W");
            }
            type.shape[2] /= scale;
            type.shape[3] /= scale;
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const int64_t scale = node.attrs.get_int("scale");
            const Shape& g = in[0]->shape;
            HostTensor grad({g[0], g[1], g[2] / scale, g[3] / scale});
            for (int64_t o = 0; o < in[0]->elements(); ++o) {
              const int64_t ow = o % g[3];
              const int64_t oh = (o / g[3]) % g[2];
              const int64_t plane = o / (g[2] * g[3]);
              grad.data[(plane * grad.shape[2] + oh / scale) * grad.shape[3] + ow / scale] +=
                  in[0]->data[o];
            }
            return grad;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            return std::vector<ValueId>{graph.add(op::upsample_nearest2d, {grad},
                                                  {{"scale", node.attrs.get_int("scale")}})};
          },
  });

  // upsample_bilinear2d(x [N, C, H, W]) -> [N, C, out_height, out_width], align_corners=False
  // (PyTorch's half-pixel source index, clamped at 0). attrs: out_height, out_width (>= 1).
  registry.push_back(OpDef{
      .name = op::upsample_bilinear2d,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            TensorType type = graph.type(node.inputs[0]);
            type.shape[2] = positive_int_attr(graph, node, "out_height");
            type.shape[3] = positive_int_attr(graph, node, "out_width");
            return type;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const Shape& x = in[0]->shape;
            const int64_t out_height = node.attrs.get_int("out_height");
            const int64_t out_width = node.attrs.get_int("out_width");
            HostTensor out({x[0], x[1], out_height, out_width});
            for_each_bilinear_tap(x, out_height, out_width, [&](int64_t o, int64_t i, double w) {
              out.data[o] += w * in[0]->data[i];
            });
            return out;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            return std::vector<ValueId>{
                graph.add(op::upsample_bilinear2d_grad, {grad},
                          {{"input_shape", graph.type(node.inputs[0]).shape}})};
          },
  });

  // upsample_bilinear2d_grad(grad_out [N, C, OH, OW]) -> input_shape: the adjoint of
  // upsample_bilinear2d from input_shape to OH x OW. attrs: input_shape [4].
  registry.push_back(OpDef{
      .name = op::upsample_bilinear2d_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            const Shape input_shape = shape4_attr(graph, node, "input_shape");
            const TensorType& grad = graph.type(node.inputs[0]);
            if (grad.shape[0] != input_shape[0] || grad.shape[1] != input_shape[1]) {
              op_error(graph, node,
                       "grad_out " + shape_string(grad.shape) + " and input_shape " +
                           shape_string(input_shape) + " differ in N or C");
            }
            return TensorType{grad.dtype, input_shape};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const Shape& g = in[0]->shape;
            HostTensor grad(node.attrs.get_ints("input_shape"));
            for_each_bilinear_tap(grad.shape, g[2], g[3], [&](int64_t o, int64_t i, double w) {
              grad.data[i] += w * in[0]->data[o];
            });
            return grad;
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Shape& grad_out = graph.type(graph.node(self).inputs[0]).shape;
            return std::vector<ValueId>{
                graph.add(op::upsample_bilinear2d, {grad},
                          {{"out_height", grad_out[2]}, {"out_width", grad_out[3]}})};
          },
  });
}

Tensor max_pool2d(Tensor x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  if (stride.empty()) stride = kernel;
  return apply(op::max_pool2d, {x},
               {{"kernel", std::move(kernel)},
                {"stride", std::move(stride)},
                {"padding", std::move(padding)}});
}

Tensor avg_pool2d(Tensor x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                  std::vector<int64_t> padding) {
  if (stride.empty()) stride = kernel;
  return apply(op::avg_pool2d, {x},
               {{"kernel", std::move(kernel)},
                {"stride", std::move(stride)},
                {"padding", std::move(padding)}});
}

Tensor global_avg_pool2d(Tensor x) {
  if (x.rank() != 4) {
    throw Error("global_avg_pool2d: input " + type_string(x.type()) + " must have rank 4");
  }
  return mean(x, {2, 3}, true);
}

Tensor upsample_nearest2d(Tensor x, int64_t scale) {
  return apply(op::upsample_nearest2d, {x}, {{"scale", scale}});
}

Tensor upsample_bilinear2d(Tensor x, int64_t out_height, int64_t out_width) {
  return apply(op::upsample_bilinear2d, {x},
               {{"out_height", out_height}, {"out_width", out_width}});
}

}  // namespace mg
