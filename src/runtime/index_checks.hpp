#pragma once
// Indices and labels fed to a program are checked on the host as they are set: a kernel cannot
// raise an error, so an out-of-range index would silently read zeros (gather, embeddings) or a
// wrong row (cross-entropy labels), where PyTorch raises. The check is one pass over values the
// host copies anyway.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::runtime {

// What one i32 input feeds: values must lie in [0, limit), or equal `ignored` where set.
struct IndexRule {
  std::string op;    // gather, scatter_add, cross_entropy, ...
  std::string what;  // "a table of 2 rows", "10 classes"
  int64_t limit = 0;
  bool has_ignored = false;
  int64_t ignored = 0;
};

// The rules of every i32 input that reaches the index operand of gather / scatter_add or the
// labels of a cross-entropy, directly or through reshapes; keyed by input name.
std::map<std::string, std::vector<IndexRule>, std::less<>> index_rules(const Graph& graph);

// Throws mg::Error naming the input, the op and the first bad value and its position.
void check_indices(std::string_view input, std::span<const int32_t> values,
                   const std::vector<IndexRule>& rules);

}  // namespace mg::runtime
