#include "passes/rebuild.hpp"
#include "ir/op_names.hpp"

namespace mg::passes {

Graph rebuild(Graph source, const std::vector<bool>& keep,
              const std::function<ValueId(Graph& target, ValueId old_id, Node node)>& rewrite,
              std::vector<ValueId>* remap) {
  const std::vector<std::pair<std::string, ValueId>> outputs = source.outputs();
  const std::vector<std::pair<ValueId, ValueId>> updates = source.updates();
  std::vector<Node> nodes = std::move(source).release_nodes();
  Graph target;
  target.reserve(nodes.size());
  std::vector<ValueId> mapping(nodes.size(), kNoValue);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i]) continue;
    Node node = std::move(nodes[i]);
    for (ValueId& input : node.inputs) {
      input = mapping[input];
      if (input == kNoValue) throw Error("internal: pass dropped a value that is still used");
    }
    mapping[i] = rewrite(target, static_cast<ValueId>(i), std::move(node));
  }
  for (const auto& [name, id] : outputs) target.set_output(name, mapping[id]);
  for (const auto& [leaf, value] : updates) target.assign(mapping[leaf], mapping[value]);
  if (remap) *remap = std::move(mapping);
  return target;
}

Graph unchanged(Graph graph, std::vector<ValueId>* remap) {
  if (remap) {
    remap->resize(graph.size());
    for (size_t i = 0; i < graph.size(); ++i) (*remap)[i] = static_cast<ValueId>(i);
  }
  return graph;
}

std::vector<ValueId> compose(const std::vector<ValueId>& first,
                             const std::vector<ValueId>& second) {
  std::vector<ValueId> result(first.size(), kNoValue);
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] != kNoValue) result[i] = second[first[i]];
  }
  return result;
}

ValueId sum_leading_axis(Graph& target, ValueId value) {
  return target.add(op::sum, {value},
                    {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}});
}

std::optional<WholeProduct> whole_f32_product(const Graph& graph, const Node& node) {
  if (node.op != op::matmul || node.attrs.has("k_splits") || node.type.rank() != 2 ||
      node.type.dtype != DType::f32)
    return std::nullopt;
  const TensorType& a = graph.type(node.inputs[0]);
  const TensorType& b = graph.type(node.inputs[1]);
  if (a.rank() != 2 || b.rank() != 2) return std::nullopt;
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  return WholeProduct{.m = node.type.shape[0],
                      .n = node.type.shape[1],
                      .k = a.shape[transpose_a ? 0 : 1],
                      .transpose_a = transpose_a,
                      .transpose_b = node.attrs.get_int("transpose_b", 0) != 0};
}

}  // namespace mg::passes
