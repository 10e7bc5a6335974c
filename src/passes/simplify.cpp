#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ir/op_names.hpp"
#include "ops/interpreter.hpp"
#include "ops/op.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

ValueId copy_node(Graph& target, ValueId, Node node) {
  return target.add_typed(std::move(node));
}

}  // namespace

Graph eliminate_dead_code(Graph graph, std::vector<ValueId>* remap) {
  std::vector<bool> live(graph.size(), false);
  for (const auto& [name, id] : graph.outputs()) live[id] = true;
  for (const auto& [leaf, value] : graph.updates()) live[leaf] = live[value] = true;
  for (size_t i = graph.size(); i-- > 0;) {
    if (!live[i]) continue;
    for (ValueId input : graph.nodes()[i].inputs) live[input] = true;
  }
  // Parameters and state stay even when unused, so checkpoints keep their layout.
  for (size_t i = 0; i < graph.size(); ++i) {
    const std::string& op = graph.nodes()[i].op;
    if (op == op::parameter || op == op::state || op == op::input) live[i] = true;
  }
  if (std::all_of(live.begin(), live.end(), [](bool kept) { return kept; }))
    return unchanged(std::move(graph), remap);
  return rebuild(std::move(graph), live, copy_node, remap);
}

Graph eliminate_common_subexpressions(Graph graph, std::vector<ValueId>* remap) {
  // Nodes are the same expression when op, inputs, type, name and attributes are equal (the
  // attributes compared by value: printed, two constants that differ past the sixth digit would
  // look alike). Candidates are found by a hash of all but the attributes.
  const auto hash_of = [](const Node& node) {
    size_t hash = std::hash<std::string_view>{}(node.op);
    for (ValueId input : node.inputs) hash = hash * 1000003 + static_cast<size_t>(input);
    hash = hash * 31 + static_cast<size_t>(node.type.dtype);
    for (int64_t extent : node.type.shape) hash = hash * 1000003 + static_cast<size_t>(extent);
    return hash * 31 + std::hash<std::string_view>{}(node.name);
  };
  std::unordered_multimap<size_t, ValueId> kept_by_hash(graph.size());
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId, Node node) {
        if (node.is_leaf() && node.op != op::constant) return target.add_typed(std::move(node));
        if (node.data) return target.add_typed(std::move(node));
        const size_t hash = hash_of(node);
        const auto [first, last] = kept_by_hash.equal_range(hash);
        for (auto it = first; it != last; ++it) {
          const Node& kept = target.node(it->second);
          if (kept.op == node.op && kept.inputs == node.inputs && kept.type == node.type &&
              kept.name == node.name && kept.attrs == node.attrs)
            return it->second;
        }
        const ValueId id = target.add_typed(std::move(node));
        kept_by_hash.emplace(hash, id);
        return id;
      },
      remap);
}

Graph fold_constants(const Graph& graph, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&](Graph& target, ValueId, Node node) {
        bool foldable = !node.is_leaf() && !node.inputs.empty() && is_floating(node.type.dtype) &&
                        find_op(node.op) && find_op(node.op)->reference;
        for (ValueId input : node.inputs)
          foldable = foldable && target.node(input).is_uniform_constant();
        if (!foldable) return target.add_typed(std::move(node));
        // Uniform inputs give a uniform result for every elementwise op; evaluate one element
        // on scalar stand-ins and check the op kept the shape rules (same-shape result).
        std::vector<HostTensor> scalars;
        for (ValueId input : node.inputs) {
          const Node& constant = target.node(input);
          scalars.emplace_back(constant.type.shape, constant.attrs.get_float("value"));
        }
        std::vector<const HostTensor*> pointers;
        for (const HostTensor& tensor : scalars) pointers.push_back(&tensor);
        const HostTensor result = op_def(node.op).reference(node, pointers);
        for (double value : result.data) {
          if (value != result.data.front()) return target.add_typed(std::move(node));
        }
        return target.constant(result.data.empty() ? 0.0 : result.data.front(), node.type);
      },
      remap);
}

Graph optimize(const Graph& graph, std::vector<ValueId>* remap) {
  std::vector<ValueId> fold_map, cse_map, dce_map;
  Graph folded = fold_constants(graph, &fold_map);
  Graph merged = eliminate_common_subexpressions(std::move(folded), &cse_map);
  Graph result = eliminate_dead_code(std::move(merged), &dce_map);
  if (remap) *remap = compose(compose(fold_map, cse_map), dce_map);
  return result;
}

}  // namespace mg::passes
