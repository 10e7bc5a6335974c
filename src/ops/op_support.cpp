// Shared pieces of the op contract: error formatting, axes, broadcasting.
#include "ir/op_names.hpp"
#include "meganeura/ops.hpp"
#include "ops/op.hpp"

namespace mg {

void op_error(const Graph& graph, const Node& node, const std::string& problem) {
  std::string message = node.op + "(";
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (i > 0) message += ", ";
    const ValueId id = node.inputs[i];
    if (id >= 0 && static_cast<size_t>(id) < graph.size()) {
      message += type_string(graph.type(id));
    } else {
      message += '%';
      message += std::to_string(id);
    }
  }
  message += ")";
  if (!node.attrs.items().empty()) message += " {" + node.attrs.to_string() + "}";
  throw Error(message + ": " + problem);
}

int64_t normalize_axis(const Graph& graph, const Node& node, int64_t axis, int64_t rank) {
  const int64_t normalized = axis < 0 ? axis + rank : axis;
  if (normalized < 0 || normalized >= rank) {
    op_error(graph, node,
             "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  }
  return normalized;
}

int64_t broadcast_source_index(const Shape& from, const Shape& to, int64_t flat) {
  int64_t source = 0;
  int64_t source_stride = 1;
  const size_t offset = to.size() - from.size();
  for (size_t i = to.size(); i-- > 0;) {
    const int64_t coordinate = flat % to[i];
    flat /= to[i];
    if (i >= offset) {
      const int64_t extent = from[i - offset];
      if (extent != 1) source += coordinate * source_stride;
      source_stride *= extent;
    }
  }
  return source;
}

ValueId reduce_to_shape(Graph& graph, ValueId grad, const Shape& target_shape) {
  // A copy: callers often pass a shape held by the graph, which appending may move.
  const Shape target = target_shape;
  const Shape shape = graph.type(grad).shape;
  if (shape == target) return grad;
  const size_t offset = shape.size() - target.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < offset || (target[i - offset] == 1 && shape[i] != 1)) {
      axes.push_back(static_cast<int64_t>(i));
    }
  }
  ValueId reduced = grad;
  if (!axes.empty()) {
    reduced = graph.add(op::sum, {grad}, {{"axes", axes}, {"keepdims", int64_t{1}}});
  }
  return graph.add(op::reshape, {reduced}, {{"shape", target}});
}

}  // namespace mg
