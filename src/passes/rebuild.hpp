#pragma once
// Shared machinery of the passes: copy a graph node by node into a new one, remapping inputs,
// outputs and assignments.
#include <functional>
#include <optional>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::passes {

// Calls `rewrite(node, remapped_inputs)` for each node that `keep` accepts, in order; it returns
// the new value for the node (usually target.add_typed of the node with remapped inputs).
// `source`'s nodes are moved into the calls: a pass whose `rewrite` reads no node of the graph
// it rebuilds passes that graph moved, and so copies none of its nodes.
Graph rebuild(Graph source, const std::vector<bool>& keep,
              const std::function<ValueId(Graph& target, ValueId old_id, Node node)>& rewrite,
              std::vector<ValueId>* remap);

// `graph` as it is, for a pass with nothing to rewrite: `remap` (when given) the identity.
// Passes take their graph by value, so that a caller who moves it in pays for no copy.
Graph unchanged(Graph graph, std::vector<ValueId>* remap);

// A sum over the leading axis of `value` (split partial results, a batch of per-image
// products), appended to `target`.
ValueId sum_leading_axis(Graph& target, ValueId value);

// A 2-D f32 matmul of 2-D operands over its whole K (no k_splits): C[m, n] over k, A stored
// [k, m] where transpose_a says, B stored [n, k] where transpose_b says.
struct WholeProduct {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;

  // The extents along which each operand is contiguous in memory.
  int64_t a_run() const { return transpose_a ? m : k; }
  int64_t b_run() const { return transpose_b ? k : n; }
};
std::optional<WholeProduct> whole_f32_product(const Graph& graph, const Node& node);

// Composes remaps: first then second.
std::vector<ValueId> compose(const std::vector<ValueId>& first, const std::vector<ValueId>& second);

}  // namespace mg::passes
