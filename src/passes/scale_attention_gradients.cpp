// Attention gradients in f16's range: the cooperative-matrix backward rounds dO, P and
// dS = P (dP - delta) scale to f16 before its products. dS is smaller than dO by P (about 1 / Sk
// where attention is spread out) and by scale, so at the small gradients of an untrained model's
// loss it falls below f16's smallest subnormal (2^-24) and dQ and dK come out as zeros. The
// gradients are linear in dO, so the pass feeds each backward op dO times
// s = kGradientMaximum / max |dO| (one s per batch and head, or per batch with grouped heads)
// and divides its result by s: dS then lies in f16's normal range at any scale of the loss, as
// loss scaling gives mixed-precision training, with no scale to tune or back off.
#include <map>

#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// The largest |dO| after scaling. |dS| is at most |dP - delta| scale (P <= 1), and |dP - delta|
// at most max |dO| sqrt(Dv) |v_j - o_i|: with scale = 1 / sqrt(D) and Dv = D, 64 |v_j - o_i|,
// below f16's largest value (65504) unless two value rows lie over 1000 apart, while the dS
// that matter stay far above f16's smallest normal (2^-14).
constexpr double kGradientMaximum = 64.0;
// A floor for max |dO|: a zero cotangent keeps a finite scale (and zero gradients).
constexpr double kSmallestMaximum = 1e-30;

bool is_attention_gradient(const Node& node) {
  return node.op == op::attention_grad_q || node.op == op::attention_grad_k ||
         node.op == op::attention_grad_v;
}

// s [B, H, 1, 1] where query and kv heads are as many (one scale per head), else [B, 1, 1, 1]
// (the kv heads' gradients sum over their group's query heads, which must share a scale).
ValueId gradient_scale(Graph& target, ValueId grad_out, int64_t kv_heads) {
  const TensorType type = target.type(grad_out);  // a copy: adding nodes may move it
  const std::vector<int64_t> axes =
      type.shape[1] == kv_heads ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{1, 2, 3};
  const ValueId magnitude = target.add(op::abs, {grad_out});
  const ValueId largest =
      target.add(op::max, {magnitude}, {{"axes", axes}, {"keepdims", int64_t{1}}});
  const TensorType scalar{type.dtype, {}};
  const ValueId floored =
      target.add(op::maximum, {largest, target.constant(kSmallestMaximum, scalar)});
  return target.add(op::div, {target.constant(kGradientMaximum, scalar), floored});
}

}  // namespace

Graph scale_attention_gradients(const Graph& graph, std::vector<ValueId>* remap) {
  // The scaled dO and its scale, once per (cotangent, kv heads) of the new graph.
  std::map<std::pair<ValueId, int64_t>, std::pair<ValueId, ValueId>> scaled;
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&](Graph& target, ValueId, Node node) {
        if (!is_attention_gradient(node)) return target.add_typed(std::move(node));
        // Inputs: q, k, v, mask?, out, grad_out, lse.
        ValueId& grad_out = node.inputs[node.inputs.size() - 2];
        const int64_t kv_heads = target.type(node.inputs[1]).shape[1];
        auto [entry, inserted] = scaled.try_emplace({grad_out, kv_heads});
        if (inserted) {
          const ValueId scale = gradient_scale(target, grad_out, kv_heads);
          entry->second = {target.add(op::mul, {grad_out, scale}), scale};
        }
        const auto [scaled_grad_out, scale] = entry->second;
        grad_out = scaled_grad_out;
        const ValueId result = target.add_typed(std::move(node));
        return target.add(op::div, {result, scale});
      },
      remap);
}

}  // namespace mg::passes
