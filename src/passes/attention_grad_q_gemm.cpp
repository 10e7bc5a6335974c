// dQ as a matmul: the flash-attention backward recomputes the probabilities once for dK / dV
// (key-owned) and once more for dQ (query-owned), and the dQ pass is three products (S, dP and
// dS K) at the attention kernels' rate. Where the key-owned launch can keep its weights
// W = scale * dS (attention_grad_scores, written beside dK as a companion value,
// backends/vulkan/kernels/attention.cpp) and W is small enough to store, dQ = W K is one batched
// matmul at the GEMM kernels' rate instead. Causal attention keeps its dQ kernel: W's masked half
// would be stored and multiplied for nothing.
#include <map>

#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

bool same_attention_attrs(const Node& a, const Node& b) {
  return a.attrs.get_int("causal", 0) == b.attrs.get_int("causal", 0) &&
         a.attrs.get_int("has_mask", 0) == b.attrs.get_int("has_mask", 0) &&
         a.attrs.get_float("scale", 0.0) == b.attrs.get_float("scale", 0.0);
}

// dQ [B, Hq, Sq, D] = W [B, Hq, Sq, Sk] . K [B, Hkv, Sk, D]; query head h reads kv head
// h / (Hq / Hkv), so with grouped heads W is taken as [B, Hkv, Hq / Hkv, Sq, Sk] against K
// broadcast as [B, Hkv, 1, Sk, D].
ValueId grad_q_from_scores(Graph& target, ValueId scores, ValueId keys) {
  const Shape w = target.type(scores).shape, k = target.type(keys).shape;
  const int64_t group = w[1] / k[1];
  if (group == 1) return target.add(op::matmul, {scores, keys}, {});
  const ValueId grouped =
      target.add(op::reshape, {scores}, {{"shape", Shape{w[0], k[1], group, w[2], w[3]}}});
  const ValueId broadcast =
      target.add(op::reshape, {keys}, {{"shape", Shape{k[0], k[1], 1, k[2], k[3]}}});
  const ValueId product = target.add(op::matmul, {grouped, broadcast}, {});
  return target.add(op::reshape, {product}, {{"shape", Shape{w[0], w[1], w[2], k[3]}}});
}

}  // namespace

Graph attention_grad_q_gemm(Graph graph, uint64_t max_score_bytes, std::vector<ValueId>* remap) {
  // Each rewritten attention_grad_q and the attention_grad_k of the same inputs, which is emitted
  // in its place so that W (its companion) follows it.
  std::map<ValueId, ValueId> grad_k_of;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.op != op::attention_grad_q || node.attrs.has("kv_splits") ||
        node.attrs.get_int("causal", 0) != 0)
      continue;
    const Shape& q = graph.type(node.inputs[0]).shape;
    const Shape& k = graph.type(node.inputs[1]).shape;
    const uint64_t score_bytes = static_cast<uint64_t>(q[0] * q[1] * q[2] * k[2]) *
                                 dtype_bytes(graph.type(node.inputs[0]).dtype);
    if (score_bytes > max_score_bytes) continue;
    for (size_t j = i + 1; j < graph.size(); ++j) {
      const Node& other = graph.nodes()[j];
      if (other.op == op::attention_grad_k && other.inputs == node.inputs &&
          same_attention_attrs(other, node) && !other.attrs.has("q_splits")) {
        grad_k_of.emplace(static_cast<ValueId>(i), static_cast<ValueId>(j));
        break;
      }
    }
  }
  if (grad_k_of.empty()) return unchanged(std::move(graph), remap);
  std::map<ValueId, ValueId> emitted_early;  // old attention_grad_k -> its new value
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&](Graph& target, ValueId old_id, Node node) {
        if (auto early = emitted_early.find(old_id); early != emitted_early.end())
          return early->second;
        const auto pair = grad_k_of.find(old_id);
        if (pair == grad_k_of.end()) return target.add_typed(std::move(node));
        // The same inputs, already remapped in `node`.
        Node grad_k = graph.node(pair->second);
        grad_k.inputs = node.inputs;
        emitted_early.emplace(pair->second, target.add_typed(std::move(grad_k)));
        const ValueId scores = target.add(op::attention_grad_scores, node.inputs, node.attrs);
        return grad_q_from_scores(target, scores, node.inputs[1]);
      },
      remap);
}

}  // namespace mg::passes
