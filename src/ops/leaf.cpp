// Leaves: input, parameter, state, constant. Their values come from outside the graph, so the
// interpreter and the runtime bind them; only constants evaluate themselves.
#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg {

void register_leaf_ops(std::vector<OpDef>& registry) {
  for (std::string_view name : {op::input, op::parameter, op::state}) {
    registry.push_back(OpDef{
        .name = name,
        .infer = [](const Graph&, const Node& node) { return node.type; },
    });
  }
  registry.push_back(OpDef{
      .name = op::constant,
      .infer = [](const Graph&, const Node& node) { return node.type; },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>&) {
            if (node.data) return HostTensor(node.type.shape, *node.data);
            return HostTensor(node.type.shape, node.attrs.get_float("value"));
          },
  });
}

}  // namespace mg
