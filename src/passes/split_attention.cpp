// Split attention (flash-decoding style): an attention over few owned blocks, Whisper's encoder
// at batch 1 (6 heads x 24 blocks of 64 queries = 144 workgroups, and as many key blocks in
// dK / dV), leaves a GPU of 132 compute units with one workgroup of 4 subgroups each, too few
// to hide the latency of their loads and barriers. The pass cuts the streamed rows into S
// slices (see ops/k_split.hpp): the forward and dQ get kv_splits (key slices), dK and dV
// q_splits (query slices); one dispatch computes every (owned block, slice) pair. The
// forward's partial results (output and log-sum-exp per slice) are joined by
// attention_combine, the gradients' by a sum over the slices. The partials cost S rows per
// owned row, small next to the multiply-adds each one sums.
// dK and dV of grouped-query attention also stream every query head of their group (three in
// SmolLM2), so that even split into slices a short prompt at batch 1 leaves most compute units
// idle: there the query heads of a group are split as well (head_splits), each part summed
// by its own workgroups.
// A split forward's combine writes the heads after the queries ([B, Sq, H, Dv], heads_last) where
// the graph moves them there (a transpose of [0, 2, 1, 3], as a multi-head layer does before its
// output projection): the transpose's launch, and the barrier before it, go. Other readers of
// the forward (the backward reads its output) get the heads back in place by a transpose of the
// combined result, which waits for nothing else and so shares a barrier with other launches.
#include <map>
#include <string>
#include <vector>

#include "ir/op_names.hpp"
#include "ops/k_split.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Workgroups wanted in flight: five of the kernels' 64-row workgroups on each compute unit, as
// many as the forward's shared memory allows on a 48 KiB device. For Whisper's 144 blocks on 132
// units that is 4 slices, which ran faster than 2, 3, 6 or 8, strict and fast.
constexpr int64_t kWorkgroupsPerUnit = 5;
constexpr int64_t kRowsPerWorkgroup = 64;
// A slice keeps at least this many streamed rows, so that its partial result is small next to
// its work; where the owned blocks would leave three quarters of the compute units idle (a
// 128-token prompt at batch 1: 18 blocks), idle units cost more than partials, and slices may
// be as short as kMinRowsPerSliceWhenIdle.
constexpr int64_t kMinRowsPerSlice = 256;
constexpr int64_t kMinRowsPerSliceWhenIdle = 64;
// Two short slices of a forward over many queries a head cost more than they save: the slices'
// partial outputs are joined, in the output projection's loads or a combine launch, and over a
// block of many queries that join outweighs halving the key stream (SmolLM2's 128-token prompt,
// SmolVLA's 50-action flow steps over 163 keys). A forward of few queries a head (a decode
// step's one) keeps them, as do the gradients and forwards whose keys make three or more (the
// U-Net's 256-key forward at batch 1 takes four).
constexpr int64_t kMostQueriesForTwoShortForwardSlices = 16;

const std::vector<int64_t> kHeadsAfterQueries{0, 2, 1, 3};

// Whether `node` is a transpose that moves the heads of an attention result [B, H, Sq, Dv] after
// its queries.
bool moves_heads_last(const Graph& graph, const Node& node) {
  return node.op == op::transpose && graph.type(node.inputs[0]).rank() == 4 &&
         node.attrs.get_ints("permutation") == kHeadsAfterQueries;
}

// Which split a node takes: the forward and dQ (query-owned kernels) over the keys, dK and dV
// (key-owned) over the queries.
enum class Kind { forward, grad_q, grad_kv };

// Slices for `workgroups` owned blocks of `owned` rows a head that each stream `streamed` rows; 1
// keeps the node whole.
// MEGANEURA_ATTENTION_SPLITS=N (every kind) or F,Q,KV (forward, dQ, dK and dV) forces the
// count (sweeps and tests).
int64_t split_count(Kind kind, int64_t workgroups, int64_t owned, int64_t streamed,
                    const target::Target& device) {
  const std::vector<int64_t>& forced = device.switches().attention_splits;
  const int64_t units = device.traits().compute_units;
  const bool idle = 4 * workgroups <= units;
  const int64_t min_rows = idle ? kMinRowsPerSliceWhenIdle : kMinRowsPerSlice;
  const int64_t wanted =
      forced.empty()       ? std::min(kWorkgroupsPerUnit * units / workgroups, streamed / min_rows)
      : forced.size() == 1 ? forced[0]
                           : forced[static_cast<size_t>(kind)];
  if (wanted < 2) return 1;
  if (forced.empty() && idle && kind == Kind::forward &&
      owned > kMostQueriesForTwoShortForwardSlices && wanted == 2)
    return 1;
  // Aligned slices may cover the rows in fewer than `wanted`; count those that are not empty.
  return ceil_div(streamed, attention_slice_length(streamed, wanted));
}

// Parts of each group's query heads for dK and dV launched as `workgroups` owned blocks over
// `slices` query slices: the largest divisor of the group that keeps every part's workgroups
// within one of the kernels' 64-row workgroups a compute unit (more would queue behind each
// other instead of filling idle units). MEGANEURA_ATTENTION_HEAD_SPLITS=1 splits every group
// into single heads, =0 keeps it whole, as do forced slice counts where it is unset.
int64_t head_split_count(int64_t group, int64_t workgroups, int64_t slices,
                         const target::Target& device) {
  const Switches& switches = device.switches();
  if (switches.attention_head_splits) return *switches.attention_head_splits ? group : 1;
  if (!switches.attention_splits.empty()) return 1;
  const int64_t units = device.traits().compute_units;
  for (int64_t parts = group; parts > 1; --parts)
    if (group % parts == 0 && workgroups * slices * parts <= units) return parts;
  return 1;
}

}  // namespace

Graph split_attention(Graph graph, const target::Target& device, std::vector<ValueId>* remap) {
  // For each forward, the transposes that move its heads after its queries, and whether anything
  // else (a node, an output, an assignment) reads it.
  std::vector<std::vector<ValueId>> head_moves(graph.size());
  std::vector<bool> read_otherwise(graph.size(), false);
  for (const auto& [name, id] : graph.outputs()) read_otherwise[id] = true;
  for (const auto& [leaf, value] : graph.updates()) read_otherwise[value] = true;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    for (const ValueId input : node.inputs) {
      if (graph.node(input).op != op::scaled_dot_product_attention) continue;
      if (moves_heads_last(graph, node))
        head_moves[input].push_back(static_cast<ValueId>(i));
      else
        read_otherwise[input] = true;
    }
  }
  // Each such transpose's replacement: the combine that writes its layout.
  std::map<ValueId, ValueId> combined_for;
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId old_id, Node node) {
        if (const auto found = combined_for.find(old_id); found != combined_for.end())
          return found->second;
        const bool forward = node.op == op::scaled_dot_product_attention;
        const bool grad_q = node.op == op::attention_grad_q;
        const bool grad_kv = node.op == op::attention_grad_k || node.op == op::attention_grad_v;
        const char* attribute = grad_kv ? "q_splits" : "kv_splits";
        if ((!forward && !grad_q && !grad_kv) || node.attrs.has(attribute))
          return target.add_typed(std::move(node));
        const Shape& q = target.type(node.inputs[0]).shape;
        const Shape& k = target.type(node.inputs[1]).shape;
        const Kind kind = forward ? Kind::forward : grad_q ? Kind::grad_q : Kind::grad_kv;
        const int64_t splits =
            grad_kv ? split_count(kind, k[0] * k[1] * ceil_div(k[2], kRowsPerWorkgroup), k[2], q[2],
                                  device)
                    : split_count(kind, q[0] * q[1] * ceil_div(q[2], kRowsPerWorkgroup), q[2], k[2],
                                  device);
        const int64_t head_splits =
            grad_kv && !node.attrs.has("head_splits")
                ? head_split_count(q[1] / k[1], k[0] * k[1] * ceil_div(k[2], kRowsPerWorkgroup),
                                   splits, device)
                : 1;
        if (splits < 2 && head_splits < 2) return target.add_typed(std::move(node));
        Attrs attrs = node.attrs;
        if (splits > 1) attrs.set(attribute, splits);
        if (head_splits > 1) attrs.set("head_splits", head_splits);
        const ValueId partials = target.add(node.op, node.inputs, std::move(attrs));
        if (forward && head_moves[old_id].empty())
          return target.add(op::attention_combine, {partials}, {});
        if (!forward) return sum_leading_axis(target, partials);
        const ValueId combined =
            target.add(op::attention_combine, {partials}, {{"heads_last", int64_t{1}}});
        for (const ValueId move : head_moves[old_id]) combined_for[move] = combined;
        // Read by nothing but those transposes, the forward's value is the combined result.
        if (!read_otherwise[old_id]) return combined;
        return target.add(op::transpose, {combined}, {{"permutation", kHeadsAfterQueries}});
      },
      remap);
}

}  // namespace mg::passes
