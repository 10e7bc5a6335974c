// Reductions (sum, mean, max, argmax) and the softmax family. Reduction axes in nodes are
// non-negative and sorted when built through the builder; inference accepts any valid list.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

// Normalised axes of a node already checked by inference; an empty list means every axis.
std::vector<int64_t> reduced_axes(const Node& node, int64_t rank) {
  std::vector<int64_t> axes = node.attrs.get_ints("axes", {});
  if (axes.empty()) {
    for (int64_t axis = 0; axis < rank; ++axis) axes.push_back(axis);
  }
  for (int64_t& axis : axes) {
    if (axis < 0) axis += rank;
  }
  return axes;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& axes, bool keepdims) {
  std::vector<bool> reduced(shape.size(), false);
  for (int64_t axis : axes) reduced[axis] = true;
  Shape result;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!reduced[i]) {
      result.push_back(shape[i]);
    } else if (keepdims) {
      result.push_back(1);
    }
  }
  return result;
}

// For each element of `shape`, the flat index of the reduction group it belongs to (the same
// with or without keepdims, since dropping unit axes keeps the row-major order).
std::vector<int64_t> group_of_elements(const Shape& shape, const std::vector<int64_t>& axes) {
  std::vector<int64_t> strides = row_major_strides(reduced_shape(shape, axes, true));
  for (int64_t axis : axes) strides[axis] = 0;
  std::vector<int64_t> groups(static_cast<size_t>(element_count(shape)));
  for (size_t k = 0; k < groups.size(); ++k) {
    groups[k] = ravel(unravel(static_cast<int64_t>(k), shape), strides);
  }
  return groups;
}

// For each group, the flat index of its first maximal element (row-major order).
std::vector<int64_t> first_argmax_of_groups(const HostTensor& x, const std::vector<int64_t>& axes,
                                            int64_t group_count) {
  const std::vector<int64_t> groups = group_of_elements(x.shape, axes);
  std::vector<int64_t> best(static_cast<size_t>(group_count), -1);
  for (int64_t k = 0; k < x.elements(); ++k) {
    int64_t& current = best[groups[k]];
    if (current < 0 || x.data[k] > x.data[current]) current = k;
  }
  return best;
}

// sum / mean / max (x) {axes: list (empty = all), keepdims: 0|1}.
TensorType infer_reduction(const Graph& graph, const Node& node, bool floating_only) {
  if (node.inputs.size() != 1) op_error(graph, node, "takes one input");
  const TensorType& x = graph.type(node.inputs[0]);
  if (floating_only && !is_floating(x.dtype)) {
    op_error(graph, node, "needs a floating-point input");
  }
  const std::vector<int64_t> axes =
      normalize_axes(graph, node, node.attrs.get_ints("axes", {}), x.rank());
  return {x.dtype, reduced_shape(x.shape, axes, flag_attr(graph, node, "keepdims"))};
}

enum class Reduction { sum, mean, max };

HostTensor reference_reduction(const Node& node, const HostTensor& x, Reduction kind) {
  const std::vector<int64_t> axes = reduced_axes(node, static_cast<int64_t>(x.shape.size()));
  HostTensor out(node.type.shape);
  if (kind == Reduction::max) {
    const std::vector<int64_t> best = first_argmax_of_groups(x, axes, out.elements());
    for (int64_t group = 0; group < out.elements(); ++group) out.data[group] = x.data[best[group]];
    return out;
  }
  const std::vector<int64_t> groups = group_of_elements(x.shape, axes);
  for (int64_t k = 0; k < x.elements(); ++k) out.data[groups[k]] += x.data[k];
  if (kind == Reduction::mean) {
    const double count = static_cast<double>(x.elements()) / static_cast<double>(out.elements());
    for (double& value : out.data) value /= count;
  }
  return out;
}

// The gradient of a sum: each group's gradient copied to all of its elements.
Tensor spread_over_groups(Tensor grad, const Shape& shape, const std::vector<int64_t>& axes) {
  const Shape kept = reduced_shape(shape, axes, true);
  if (!(grad.shape() == kept)) grad = reshape(grad, kept);
  return kept == shape ? grad : broadcast_to(grad, shape);
}

OpDef reduction_op(std::string_view name, Reduction kind) {
  OpDef def{
      .name = name,
      .infer =
          [kind](const Graph& graph, const Node& node) {
            return infer_reduction(graph, node, kind == Reduction::mean);
          },
      .reference =
          [kind](const Node& node, const std::vector<const HostTensor*>& in) {
            return reference_reduction(node, *in[0], kind);
          },
  };
  def.vjp = [kind](Graph& graph, ValueId self, ValueId grad) {
    const Node node = graph.node(self);
    const Shape shape = graph.type(node.inputs[0]).shape;
    const std::vector<int64_t> axes = reduced_axes(node, static_cast<int64_t>(shape.size()));
    Tensor g(&graph, grad);
    if (kind == Reduction::max) {
      return std::vector<ValueId>{graph.add(op::max_grad, {node.inputs[0], grad}, node.attrs)};
    }
    if (kind == Reduction::mean) {
      g = g *
          (static_cast<double>(node.type.elements()) / static_cast<double>(element_count(shape)));
    }
    return std::vector<ValueId>{spread_over_groups(g, shape, axes).id()};
  };
  return def;
}

// max_grad(x, grad) {axes, keepdims: as max}: grad (of max's result shape) routed to the first
// maximal element of each group in row-major order, zeros elsewhere; so ties never count twice.
OpDef max_grad_op() {
  return {
      .name = op::max_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 2) op_error(graph, node, "takes inputs (x, grad)");
            const TensorType& x = graph.type(node.inputs[0]);
            const std::vector<int64_t> axes =
                normalize_axes(graph, node, node.attrs.get_ints("axes", {}), x.rank());
            const TensorType expected{
                x.dtype, reduced_shape(x.shape, axes, flag_attr(graph, node, "keepdims"))};
            if (!(graph.type(node.inputs[1]) == expected)) {
              op_error(graph, node,
                       "grad must have the type of max's result, " + type_string(expected));
            }
            return x;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            const HostTensor& grad = *in[1];
            const std::vector<int64_t> best = first_argmax_of_groups(
                x, reduced_axes(node, static_cast<int64_t>(x.shape.size())), grad.elements());
            HostTensor out(x.shape);
            for (int64_t group = 0; group < grad.elements(); ++group) {
              out.data[best[group]] = grad.data[group];
            }
            return out;
          },
  };
}

// argmax(x) {axis, keepdims: 0|1} -> i32: index of the first maximum along the axis.
OpDef argmax_op() {
  return {
      .name = op::argmax,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 1) op_error(graph, node, "takes one input");
            const TensorType& x = graph.type(node.inputs[0]);
            const int64_t axis = normalize_axis(graph, node, node.attrs.get_int("axis"), x.rank());
            return TensorType{DType::i32,
                              reduced_shape(x.shape, {axis}, flag_attr(graph, node, "keepdims"))};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            const int64_t rank = static_cast<int64_t>(x.shape.size());
            int64_t axis = node.attrs.get_int("axis");
            if (axis < 0) axis += rank;
            const AxisView view(x.shape, axis);
            HostTensor out(node.type.shape);
            for (int64_t o = 0; o < view.outer; ++o) {
              for (int64_t i = 0; i < view.inner; ++i) {
                int64_t best = 0;
                for (int64_t e = 1; e < view.extent; ++e) {
                  if (x.data[view.at(o, e, i)] > x.data[view.at(o, best, i)]) best = e;
                }
                out.data[o * view.inner + i] = static_cast<double>(best);
              }
            }
            return out;
          },
  };
}

// softmax / log_softmax (x) {axis}: numerically stable (the maximum is subtracted first).
OpDef softmax_op(std::string_view name, bool logarithmic) {
  OpDef def{
      .name = name,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.inputs.size() != 1) op_error(graph, node, "takes one input");
            const TensorType& x = graph.type(node.inputs[0]);
            if (!is_floating(x.dtype)) op_error(graph, node, "needs a floating-point input");
            normalize_axis(graph, node, node.attrs.get_int("axis"), x.rank());
            return x;
          },
      .reference =
          [logarithmic](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& x = *in[0];
            int64_t axis = node.attrs.get_int("axis");
            if (axis < 0) axis += static_cast<int64_t>(x.shape.size());
            const AxisView view(x.shape, axis);
            HostTensor out(x.shape);
            for (int64_t o = 0; o < view.outer; ++o) {
              for (int64_t i = 0; i < view.inner; ++i) {
                double peak = -std::numeric_limits<double>::infinity();
                for (int64_t e = 0; e < view.extent; ++e) {
                  peak = std::max(peak, x.data[view.at(o, e, i)]);
                }
                double total = 0;
                for (int64_t e = 0; e < view.extent; ++e) {
                  total += std::exp(x.data[view.at(o, e, i)] - peak);
                }
                for (int64_t e = 0; e < view.extent; ++e) {
                  const double shifted = x.data[view.at(o, e, i)] - peak;
                  out.data[view.at(o, e, i)] =
                      logarithmic ? shifted - std::log(total) : std::exp(shifted) / total;
                }
              }
            }
            return out;
          },
  };
  // softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g); sums along the axis.
  def.vjp = [logarithmic](Graph& graph, ValueId self, ValueId grad) {
    const int64_t axis = graph.node(self).attrs.get_int("axis");
    const Tensor y(&graph, self);
    const Tensor g(&graph, grad);
    const Tensor result =
        logarithmic ? g - exp(y) * sum(g, {axis}, true) : y * (g - sum(g * y, {axis}, true));
    return std::vector<ValueId>{result.id()};
  };
  return def;
}

// Sorted non-negative axes, every axis when `axes` is empty.
std::vector<int64_t> builder_axes(std::string_view op, Tensor x, const std::vector<int64_t>& axes) {
  std::vector<int64_t> result =
      normalize_axes(x.graph(), pending_node(op, {x}, {{"axes", axes}}), axes, x.rank());
  std::sort(result.begin(), result.end());
  return result;
}

Tensor reduce(std::string_view op, Tensor x, const std::vector<int64_t>& axes, bool keepdims) {
  return apply(op, {x}, {{"axes", builder_axes(op, x, axes)}, {"keepdims", int64_t{keepdims}}});
}

}  // namespace

void register_reduce_ops(std::vector<OpDef>& registry) {
  registry.push_back(reduction_op(op::sum, Reduction::sum));
  registry.push_back(reduction_op(op::mean, Reduction::mean));
  registry.push_back(reduction_op(op::max, Reduction::max));
  registry.push_back(max_grad_op());
  registry.push_back(argmax_op());
  registry.push_back(softmax_op(op::softmax, false));
  registry.push_back(softmax_op(op::log_softmax, true));
}

Tensor sum(Tensor x, std::vector<int64_t> axes, bool keepdims) {
  return reduce(op::sum, x, axes, keepdims);
}
Tensor mean(Tensor x, std::vector<int64_t> axes, bool keepdims) {
  return reduce(op::mean, x, axes, keepdims);
}
Tensor max(Tensor x, std::vector<int64_t> axes, bool keepdims) {
  return reduce(op::max, x, axes, keepdims);
}
Tensor sum_all(Tensor x) {
  return sum(x, {});
}
Tensor mean_all(Tensor x) {
  return mean(x, {});
}

Tensor argmax(Tensor x, int64_t axis, bool keepdims) {
  return apply(op::argmax, {x},
               {{"axis", builder_axis(op::argmax, x, axis)}, {"keepdims", int64_t{keepdims}}});
}
Tensor softmax(Tensor x, int64_t axis) {
  return apply(op::softmax, {x}, {{"axis", builder_axis(op::softmax, x, axis)}});
}
Tensor log_softmax(Tensor x, int64_t axis) {
  return apply(op::log_softmax, {x}, {{"axis", builder_axis(op::log_softmax, x, axis)}});
}

}  // namespace mg
