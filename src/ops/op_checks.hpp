#pragma once
// Input checks shared by the spatial, normalisation, attention and matmul op families. Every
// check reports through op_error, so the message names the op and the types of all its inputs.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "ops/op.hpp"

namespace mg {

// Input `index` must exist, be floating point and (when rank >= 0) have that rank.
void expect_floating(const Graph& graph, const Node& node, size_t index, int64_t rank = -1);
// Every input has the dtype of input 0 (ops do not mix precisions silently).
void expect_same_dtype(const Graph& graph, const Node& node);
// The node has exactly `count` inputs (optional inputs are announced by has_* attributes).
void expect_input_count(const Graph& graph, const Node& node, size_t count);
// A two-entry list attribute (height, width) whose entries are all >= minimum; `fallback`
// applies when the attribute is absent (empty fallback: the attribute is required).
std::array<int64_t, 2> pair_attr(const Graph& graph, const Node& node, std::string_view name,
                                 int64_t minimum, std::vector<int64_t> fallback = {});
// A four-entry shape attribute (input_shape, weight_shape) with positive extents.
Shape shape4_attr(const Graph& graph, const Node& node, std::string_view name);
// The result shape of a node that may carry k_splits (ops/k_split.hpp): `whole` without the
// attribute, else [S, ...whole] after checking S >= 1 and that every slice of `k` is non-empty.
Shape split_k_shape(const Graph& graph, const Node& node, int64_t k, Shape whole);
// Throws for a node carrying k_splits or kv_splits: partial results have no gradient, and the
// passes that split run after differentiation.
void reject_split_gradient(const Graph& graph, ValueId self);
// Throws for node `self`, which `writer` (a pass that runs after differentiation) wrote: it has
// no gradient, and the message says to differentiate `instead`.
[[noreturn]] void reject_pass_written_gradient(const Graph& graph, ValueId self,
                                               const std::string& writer,
                                               const std::string& instead);

}  // namespace mg
