// Attention heads padded to whole matrix fragments: the cooperative-matrix attention kernels
// multiply Q K^T, P V and the backward's products in fragments of 16 along the head
// dimensions, so heads of another width (Stable Diffusion's 40 at its first level) would run
// the strict kernels. Zero columns change none of the products (q . k, and the padded columns
// of P V, dQ, dK and dV are zeros that the slice drops), so each attention node reads q, k, v,
// out and grad_out padded with zeros to the next multiple and keeps the scale of its own head
// width; its result is sliced back.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

bool is_attention(const Node& node) {
  return node.op == op::scaled_dot_product_attention || node.op == op::attention_lse ||
         node.op == op::attention_grad_q || node.op == op::attention_grad_k ||
         node.op == op::attention_grad_v || node.op == op::attention_grad_scores;
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Whether attention node `node` of `graph` has q, k or v rows that are not a multiple wide.
bool needs_padding(const Graph& graph, const Node& node, int64_t multiple) {
  if (!is_attention(node)) return false;
  const bool with_value = node.op != op::attention_lse;
  return graph.type(node.inputs[0]).shape.back() % multiple != 0 ||
         (with_value && graph.type(node.inputs[2]).shape.back() % multiple != 0);
}

}  // namespace

Graph pad_attention_heads(Graph graph, int64_t multiple, std::vector<ValueId>* remap) {
  const bool any = multiple > 1 &&
                   std::any_of(graph.nodes().begin(), graph.nodes().end(), [&](const Node& node) {
                     return needs_padding(graph, node, multiple);
                   });
  if (!any) return unchanged(std::move(graph), remap);
  // Each value padded to a width, once; and the padded result behind each slice this pass made,
  // which a backward node reads as `out` instead of padding the slice again.
  std::map<std::pair<ValueId, int64_t>, ValueId> padded;
  std::map<ValueId, ValueId> padded_behind_slice;
  auto pad_to = [&](Graph& target, ValueId value, int64_t width) {
    const TensorType type = target.type(value);  // a copy: adding nodes may move it
    const int64_t extra = width - type.shape.back();
    if (extra == 0) return value;
    if (const auto behind = padded_behind_slice.find(value);
        behind != padded_behind_slice.end() && target.type(behind->second).shape.back() == width)
      return behind->second;
    auto [entry, inserted] = padded.try_emplace({value, width});
    if (inserted) {
      std::vector<int64_t> pads(2 * type.shape.size(), 0);
      pads.back() = extra;
      entry->second = target.add(op::pad, {value}, {{"pads", pads}, {"value", 0.0}});
    }
    return entry->second;
  };

  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId, Node node) {
        if (!needs_padding(target, node, multiple)) return target.add_typed(std::move(node));
        const int64_t head_dim = target.type(node.inputs[0]).shape.back();
        const bool with_value = node.op != op::attention_lse;
        const int64_t value_dim = with_value ? target.type(node.inputs[2]).shape.back() : 0;
        const int64_t padded_head = round_up(head_dim, multiple);
        const int64_t padded_value = round_up(value_dim, multiple);

        // Inputs: q, k, v, mask?, out, grad_out, lse (backward); q, k, v, mask? (forward);
        // q, k, mask? (attention_lse).
        const bool backward = node.op != op::scaled_dot_product_attention && with_value;
        node.attrs.set(
            "scale", node.attrs.get_float("scale", 1.0 / std::sqrt(static_cast<double>(head_dim))));
        node.inputs[0] = pad_to(target, node.inputs[0], padded_head);
        node.inputs[1] = pad_to(target, node.inputs[1], padded_head);
        if (with_value) node.inputs[2] = pad_to(target, node.inputs[2], padded_value);
        if (backward) {
          const size_t out = node.inputs.size() - 3;
          node.inputs[out] = pad_to(target, node.inputs[out], padded_value);
          node.inputs[out + 1] = pad_to(target, node.inputs[out + 1], padded_value);
        }
        const std::string op = node.op;
        const ValueId result = target.add(op, node.inputs, node.attrs);
        int64_t width = 0;
        if (op == op::scaled_dot_product_attention || op == op::attention_grad_v) width = value_dim;
        if (op == op::attention_grad_q || op == op::attention_grad_k) width = head_dim;
        if (width == 0) return result;  // the log-sum-exp and the scores' gradient keep their shape
        const int64_t axis = static_cast<int64_t>(target.type(result).shape.size()) - 1;
        const ValueId sliced = target.add(op::slice, {result},
                                          {{"axis", axis}, {"start", int64_t{0}}, {"end", width}});
        padded_behind_slice[sliced] = result;
        return sliced;
      },
      remap);
}

}  // namespace mg::passes
