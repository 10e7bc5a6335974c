#include <unordered_map>

#include "ir/op_names.hpp"
#include "meganeura/autodiff.hpp"
#include "ops/op.hpp"

namespace mg {
namespace {

// Which nodes lie on a path from a `wrt` value to `output`: only they need gradients.
std::vector<bool> nodes_needing_gradients(const Graph& graph, ValueId output,
                                          const std::vector<ValueId>& wrt) {
  std::vector<bool> depends_on_wrt(graph.size(), false);
  for (ValueId id : wrt) depends_on_wrt[id] = true;
  for (size_t i = 0; i < graph.size(); ++i) {
    for (ValueId input : graph.nodes()[i].inputs) {
      if (depends_on_wrt[input]) depends_on_wrt[i] = true;
    }
  }
  std::vector<bool> reaches_output(graph.size(), false);
  reaches_output[output] = true;
  for (size_t i = static_cast<size_t>(output) + 1; i-- > 0;) {
    if (!reaches_output[i]) continue;
    for (ValueId input : graph.nodes()[i].inputs) reaches_output[input] = true;
  }
  std::vector<bool> needed(graph.size(), false);
  for (size_t i = 0; i < graph.size(); ++i) needed[i] = depends_on_wrt[i] && reaches_output[i];
  return needed;
}

}  // namespace

std::map<ValueId, ValueId> gradients(Graph& graph, ValueId output, const std::vector<ValueId>& wrt,
                                     ValueId seed) {
  const TensorType output_type = graph.type(output);
  if (!is_floating(output_type.dtype)) {
    throw Error("gradients: output %" + std::to_string(output) + " has non-floating type " +
                type_string(output_type));
  }
  if (seed == kNoValue) {
    seed = graph.constant(1.0, output_type);
  } else if (!(graph.type(seed) == output_type)) {
    throw Error("gradients: seed type " + type_string(graph.type(seed)) + " differs from output " +
                type_string(output_type));
  }
  const std::vector<bool> needed = nodes_needing_gradients(graph, output, wrt);

  std::unordered_map<ValueId, ValueId> accumulated;
  accumulated[output] = seed;
  auto accumulate = [&](ValueId target, ValueId grad) {
    auto [it, inserted] = accumulated.emplace(target, grad);
    if (inserted) return;
    // A gather's gradient scatters rows into zeros: added to another contribution (an embedding
    // tied to the output projection), the rows are scattered into that one instead, which leaves
    // no table of zeros nor a sum over the whole table.
    const auto scatter_into_zeros = [&](ValueId value) {
      const Node& node = graph.node(value);
      if (node.op != op::scatter_add) return false;
      const Node& target = graph.node(node.inputs[0]);
      return target.is_uniform_constant() && target.attrs.get_float("value") == 0.0;
    };
    for (const auto& [scatter, other] :
         {std::pair{grad, it->second}, std::pair{it->second, grad}}) {
      if (!scatter_into_zeros(scatter)) continue;
      const Node node = graph.node(scatter);
      it->second = graph.add(op::scatter_add, {other, node.inputs[1], node.inputs[2]});
      return;
    }
    it->second = graph.add(op::add, {it->second, grad});
  };

  for (ValueId id = output; id >= 0; --id) {
    auto it = accumulated.find(id);
    if (it == accumulated.end() || !needed[id]) continue;
    const Node node = graph.node(id);
    if (node.is_leaf()) continue;
    const OpDef& def = op_def(node.op);
    if (!def.vjp) continue;  // ops such as stop_gradient or argmax pass nothing back
    const std::vector<ValueId> input_grads = def.vjp(graph, id, it->second);
    for (size_t k = 0; k < node.inputs.size() && k < input_grads.size(); ++k) {
      const ValueId input = node.inputs[k];
      if (input_grads[k] == kNoValue || !needed[input]) continue;
      if (!(graph.type(input_grads[k]).shape == graph.type(input).shape)) {
        throw Error("internal: VJP of '" + node.op + "' gave a gradient of type " +
                    type_string(graph.type(input_grads[k])) + " for input of type " +
                    type_string(graph.type(input)));
      }
      accumulate(input, input_grads[k]);
    }
  }

  std::map<ValueId, ValueId> result;
  for (ValueId id : wrt) {
    auto it = accumulated.find(id);
    result[id] = it != accumulated.end() ? it->second : graph.constant(0.0, graph.type(id));
  }
  return result;
}

}  // namespace mg
