#include "passes/value_readers.hpp"

#include "ops/op.hpp"

namespace mg::passes {

ValueReaders::ValueReaders(const Graph& graph)
    : graph_(graph), readers_(graph.size()), kept_(graph.size(), false) {
  for (size_t i = 0; i < graph.size(); ++i) {
    for (ValueId input : graph.nodes()[i].inputs) {
      std::vector<ValueId>& readers = readers_[input];
      if (readers.empty() || readers.back() != static_cast<ValueId>(i))
        readers.push_back(static_cast<ValueId>(i));
    }
  }
  const auto keep = [&](ValueId value) {
    kept_[value] = true;
    while (is_view_op(graph_.node(value).op)) {
      value = graph_.node(value).inputs[0];
      kept_[value] = true;
    }
  };
  for (const auto& [name, value] : graph.outputs()) keep(value);
  for (const auto& [leaf, value] : graph.updates()) keep(value);
}

std::vector<ValueId> ValueReaders::kernel_readers(ValueId value) const {
  std::vector<ValueId> found;
  std::vector<ValueId> pending{value};
  while (!pending.empty()) {
    const ValueId current = pending.back();
    pending.pop_back();
    for (ValueId reader : readers_[current]) {
      if (is_view_op(graph_.node(reader).op))
        pending.push_back(reader);
      else
        found.push_back(reader);
    }
  }
  return found;
}

ValueId ValueReaders::storage_source(ValueId value) const {
  while (is_view_op(graph_.node(value).op)) value = graph_.node(value).inputs[0];
  return value;
}

}  // namespace mg::passes
