#pragma once
// Reverse-mode differentiation of a static graph.
#include <map>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg {

// Appends to `graph` the gradient of `output` with respect to each value in `wrt`, seeded with
// `seed` (same type as `output`), or with ones when seed is kNoValue. Walks the nodes in
// reverse order, calls each op's VJP, sums gradients of values used more than once, and
// stops at stop_gradient. A value in `wrt` that `output` does not depend on gets a zero
// gradient. Returns wrt value -> gradient value.
std::map<ValueId, ValueId> gradients(Graph& graph, ValueId output, const std::vector<ValueId>& wrt,
                                     ValueId seed = kNoValue);

}  // namespace mg
