// Attention gradients in f16's range: the cooperative-matrix backward rounds dO, P and
// dS = P (dP - delta) scale to f16 before its products. dS is smaller than dO by P (about 1 / Sk
// where attention is spread out) and by scale, so at the small gradients of an untrained model's
// loss it falls below f16's smallest subnormal (2^-24) and dQ and dK come out as zeros. The
// gradients are linear in dO, so a kernel may multiply dO by any s as it loads it and divide its
// result by s as it stores it; the pass gives each backward op the largest |dO| that its s is
// drawn from (one per batch and head, or per batch with grouped heads), so that dS lies in f16's
// normal range at any scale of the loss, as loss scaling gives mixed-precision training, with no
// scale to tune or back off. How large s makes dO is the kernels' choice
// (backends/vulkan/kernels/attention.cpp). Where the target says so, a kernel draws s from the
// largest |dO| among the rows it reads instead (attribute own_grad_out_scale): each kernel's
// results are unscaled as they are stored, so its s need not be any other's, and the gradient
// then needs no reduction of its own before it.
#include <map>

#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

bool is_attention_gradient(const Node& node) {
  return node.op == op::attention_grad_q || node.op == op::attention_grad_k ||
         node.op == op::attention_grad_v;
}

// max |dO| as [B, H, 1, 1] where query and kv heads are as many (one per head), else
// [B, 1, 1, 1] (the kv heads' gradients sum over their group's query heads, which must share a
// scale).
ValueId largest_magnitude(Graph& target, ValueId grad_out, int64_t kv_heads) {
  const TensorType type = target.type(grad_out);  // a copy: adding nodes may move it
  const std::vector<int64_t> axes =
      type.shape[1] == kv_heads ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{1, 2, 3};
  const ValueId magnitude = target.add(op::abs, {grad_out});
  return target.add(op::max, {magnitude}, {{"axes", axes}, {"keepdims", int64_t{1}}});
}

}  // namespace

Graph scale_attention_gradients(Graph graph, const ScalesItself& scales_itself,
                                std::vector<ValueId>* remap) {
  // max |dO| once per (cotangent, kv heads) of the new graph, so that the dK and dV of one
  // attention keep equal inputs (and one launch).
  std::map<std::pair<ValueId, int64_t>, ValueId> largest;
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId, Node node) {
        if (!is_attention_gradient(node) || node.attrs.get_int("has_grad_out_max", 0) != 0 ||
            node.attrs.get_int("own_grad_out_scale", 0) != 0)
          return target.add_typed(std::move(node));
        if (scales_itself && scales_itself(target, node)) {
          node.attrs.set("own_grad_out_scale", int64_t{1});
          return target.add(node.op, node.inputs, node.attrs);
        }
        // Inputs: q, k, v, mask?, out, grad_out, lse.
        const ValueId grad_out = node.inputs[node.inputs.size() - 2];
        const int64_t kv_heads = target.type(node.inputs[1]).shape[1];
        auto [entry, inserted] = largest.try_emplace({grad_out, kv_heads});
        if (inserted) entry->second = largest_magnitude(target, grad_out, kv_heads);
        node.inputs.push_back(entry->second);
        node.attrs.set("has_grad_out_max", int64_t{1});
        return target.add(node.op, node.inputs, node.attrs);
      },
      remap);
}

}  // namespace mg::passes
