#include "ops/op_checks.hpp"

#include <algorithm>

#include "ops/k_split.hpp"

namespace mg {

void expect_input_count(const Graph& graph, const Node& node, size_t count) {
  if (node.inputs.size() != count) {
    op_error(graph, node,
             "expects " + std::to_string(count) + " inputs (given the has_* attributes), got " +
                 std::to_string(node.inputs.size()));
  }
}

void expect_floating(const Graph& graph, const Node& node, size_t index, int64_t rank) {
  if (index >= node.inputs.size()) {
    op_error(graph, node, "input " + std::to_string(index) + " is missing");
  }
  const TensorType& type = graph.type(node.inputs[index]);
  if (!is_floating(type.dtype)) {
    op_error(graph, node,
             "input " + std::to_string(index) + " has dtype " +
                 std::string(dtype_name(type.dtype)) + "; a floating dtype is required");
  }
  if (rank >= 0 && type.rank() != rank) {
    op_error(graph, node,
             "input " + std::to_string(index) + " " + shape_string(type.shape) +
                 " must have rank " + std::to_string(rank));
  }
}

void expect_same_dtype(const Graph& graph, const Node& node) {
  for (ValueId id : node.inputs) {
    if (graph.type(id).dtype != graph.type(node.inputs.front()).dtype) {
      op_error(graph, node, "inputs have different dtypes");
    }
  }
}

std::array<int64_t, 2> pair_attr(const Graph& graph, const Node& node, std::string_view name,
                                 int64_t minimum, std::vector<int64_t> fallback) {
  if (!node.attrs.has(name) && fallback.empty()) {
    op_error(graph, node, "attribute '" + std::string(name) + "' is missing");
  }
  const std::vector<int64_t> values = node.attrs.get_ints(name, std::move(fallback));
  if (values.size() != 2 || values[0] < minimum || values[1] < minimum) {
    op_error(graph, node,
             std::string(name) + " " + shape_string(values) +
                 " must have 2 entries, each >= " + std::to_string(minimum));
  }
  return {values[0], values[1]};
}

Shape shape4_attr(const Graph& graph, const Node& node, std::string_view name) {
  if (!node.attrs.has(name)) {
    op_error(graph, node, "attribute '" + std::string(name) + "' is missing");
  }
  const Shape& shape = node.attrs.get_ints(name);
  if (shape.size() != 4 || element_count(shape) <= 0 ||
      *std::min_element(shape.begin(), shape.end()) <= 0) {
    op_error(graph, node,
             std::string(name) + " " + shape_string(shape) +
                 " must have 4 positive extents (N, C, H, W)");
  }
  return shape;
}

Shape split_k_shape(const Graph& graph, const Node& node, int64_t k, Shape whole) {
  if (!node.attrs.has("k_splits")) return whole;
  const int64_t splits = node.attrs.get_int("k_splits");
  if (splits < 1 || (splits - 1) * k_slice_length(k, splits) >= k) {
    op_error(graph, node,
             "k_splits " + std::to_string(splits) +
                 " must be >= 1 and leave every slice of K = " + std::to_string(k) +
                 " (multiples of " + std::to_string(kKSliceAlignment) + ") non-empty");
  }
  whole.insert(whole.begin(), splits);
  return whole;
}

void reject_split_gradient(const Graph& graph, ValueId self) {
  const Node& node = graph.node(self);
  for (const char* attribute : {"k_splits", "kv_splits"}) {
    if (!node.attrs.has(attribute)) continue;
    throw Error(node.op + " %" + std::to_string(self) + " computes partial results (" + attribute +
                "), which have no gradient: the passes that split products and attention run "
                "after differentiation");
  }
}

void reject_pass_written_gradient(const Graph& graph, ValueId self, const std::string& writer,
                                  const std::string& instead) {
  throw Error(graph.node(self).op + " %" + std::to_string(self) + " is written by " + writer +
              " after differentiation and has no gradient; differentiate " + instead + " instead");
}

}  // namespace mg
