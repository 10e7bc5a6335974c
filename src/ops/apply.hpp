#pragma once
// Builder-side plumbing shared by the op family files: appending a node over Tensor handles, and
// checking arguments before the node exists so that builder errors read like op errors
// ("<op>(<input types>) {attrs}: <problem>").
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/ops.hpp"
#include "ops/op.hpp"

namespace mg {

// The graph every input belongs to; throws when they come from different graphs.
inline Graph& common_graph(std::string_view op, const std::vector<Tensor>& inputs) {
  if (inputs.empty()) throw Error(std::string(op) + ": needs at least one input");
  Graph& graph = inputs.front().graph();
  for (const Tensor& input : inputs) {
    if (&input.graph() != &graph)
      throw Error(std::string(op) + ": inputs belong to different graphs");
  }
  return graph;
}

inline std::vector<ValueId> value_ids(const std::vector<Tensor>& tensors) {
  std::vector<ValueId> ids;
  ids.reserve(tensors.size());
  for (const Tensor& tensor : tensors) ids.push_back(tensor.id());
  return ids;
}

// Appends `op` over `inputs` and returns its result.
inline Tensor apply(std::string_view op, const std::vector<Tensor>& inputs, Attrs attrs = {}) {
  Graph& graph = common_graph(op, inputs);
  return {&graph, graph.add(op, value_ids(inputs), std::move(attrs))};
}

// The node `op` would be, for error messages raised before appending it.
inline Node pending_node(std::string_view op, const std::vector<Tensor>& inputs, Attrs attrs = {}) {
  Node node;
  node.op = op;
  node.inputs = value_ids(inputs);
  node.attrs = std::move(attrs);
  return node;
}

[[noreturn]] inline void builder_error(std::string_view op, const std::vector<Tensor>& inputs,
                                       const std::string& problem, Attrs attrs = {}) {
  op_error(common_graph(op, inputs), pending_node(op, inputs, std::move(attrs)), problem);
}

// Normalises a possibly negative axis of `x` for builder `op`, which stores it non-negative.
// `extra_positions` widens the range past the last axis (unsqueeze may insert at rank).
inline int64_t builder_axis(std::string_view op, Tensor x, int64_t axis,
                            int64_t extra_positions = 0) {
  return normalize_axis(x.graph(), pending_node(op, {x}, {{"axis", axis}}), axis,
                        x.rank() + extra_positions);
}

}  // namespace mg
