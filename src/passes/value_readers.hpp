#pragma once
// Who reads a graph's values, seen through views, for the passes that choose how a value is
// stored (half_activations.cpp, half_products.cpp, workgroup_gemm.cpp's Winograd points): a view
// reads its input's bytes, so the kernels that read a value are the non-view readers of it and
// of its views, and a value that the program keeps (an output, an assignment) keeps the values
// its views read.
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::passes {

class ValueReaders {
 public:
  explicit ValueReaders(const Graph& graph);

  // The nodes whose inputs name `value`, each once, in graph order.
  const std::vector<ValueId>& readers(ValueId value) const { return readers_[value]; }
  // The nodes other than views that read `value`, through its views.
  std::vector<ValueId> kernel_readers(ValueId value) const;
  // The value whose bytes `value` (through views) reads.
  ValueId storage_source(ValueId value) const;
  // Whether the program keeps `value` or a view of it: an output or an assignment.
  bool kept(ValueId value) const { return kept_[value]; }

 private:
  const Graph& graph_;
  std::vector<std::vector<ValueId>> readers_;
  std::vector<bool> kept_;
};

}  // namespace mg::passes
