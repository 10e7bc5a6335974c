#pragma once
// Shape arithmetic shared by the inference and reference functions of the op families:
// broadcasting with op-style errors, axis lists, and multi-index <-> flat index conversions.
#include <string>
#include <vector>

#include "ops/op.hpp"

namespace mg {

// NumPy broadcast of `a` and `b`; on failure throws through op_error naming both shapes.
inline Shape broadcast_or_error(const Graph& graph, const Node& node, const Shape& a,
                                const Shape& b) {
  try {
    return broadcast_shapes(a, b, node.op);
  } catch (const Error&) {
    op_error(graph, node,
             "shapes " + shape_string(a) + " and " + shape_string(b) + " do not broadcast");
  }
}

// Normalised, duplicate-free axes in the given order; an empty list means every axis.
inline std::vector<int64_t> normalize_axes(const Graph& graph, const Node& node,
                                           const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> result;
  if (axes.empty()) {
    for (int64_t axis = 0; axis < rank; ++axis) result.push_back(axis);
    return result;
  }
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    const int64_t normalized = normalize_axis(graph, node, axis, rank);
    if (seen[normalized]) {
      op_error(graph, node, "axis " + std::to_string(axis) + " is listed twice");
    }
    seen[normalized] = true;
    result.push_back(normalized);
  }
  return result;
}

// A flag attribute must be 0 or 1.
inline bool flag_attr(const Graph& graph, const Node& node, const std::string& name,
                      int64_t fallback = 0) {
  const int64_t value = node.attrs.get_int(name, fallback);
  if (value != 0 && value != 1) {
    op_error(graph, node, name + " must be 0 or 1, not " + std::to_string(value));
  }
  return value == 1;
}

inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = flat % shape[i];
    flat /= shape[i];
  }
  return index;
}

inline int64_t ravel(const std::vector<int64_t>& index, const std::vector<int64_t>& strides) {
  int64_t flat = 0;
  for (size_t i = 0; i < index.size(); ++i) flat += index[i] * strides[i];
  return flat;
}

// A shape seen as [outer, extent, inner] around one axis: element (o, e, i) sits at flat index
// (o * extent + e) * inner + i. Softmax-like ops, slices and concatenation work in this view.
struct AxisView {
  int64_t outer = 1;
  int64_t extent = 1;
  int64_t inner = 1;

  AxisView(const Shape& shape, int64_t axis) {
    for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
      if (i < axis) outer *= shape[i];
      if (i == axis) extent = shape[i];
      if (i > axis) inner *= shape[i];
    }
  }
  int64_t at(int64_t o, int64_t e, int64_t i) const { return (o * extent + e) * inner + i; }
};

}  // namespace mg
