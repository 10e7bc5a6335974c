// Split attention (flash-decoding style): an attention forward over few query blocks, Whisper's
// encoder at batch 1 (6 heads x 24 blocks of 64 queries = 144 workgroups), leaves an H200's
// 132 compute units with one workgroup of 4 subgroups each, too few to hide the latency of
// its loads and barriers. The pass cuts the keys into S slices (attribute kv_splits, see
// ops/k_split.hpp): one dispatch computes every (query block, slice) pair's output and
// log-sum-exp, and attention_combine joins the S partial results per query. The partials cost
// S * (Dv + 1) floats per query, small next to the Sk * D multiply-adds each one sums.
#include <cstdlib>
#include <string>

#include "ops/k_split.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Workgroups wanted in flight: five of the kernels' 64-query workgroups on each of an H200's
// 132 compute units, as many as their shared memory allows there. For Whisper's 144 query
// blocks that is 4 slices: forward 0.305 -> 0.210 ms strict and 0.108 -> 0.087 ms fast on the
// H200, where 2, 3, 6 and 8 slices were slower for one of the two or both (docs/BENCHMARKS.md).
constexpr int64_t kWorkgroupsWanted = 5 * 132;
constexpr int64_t kQueriesPerWorkgroup = 64;
// A slice keeps at least this many keys, so that its partial result is small next to its work.
constexpr int64_t kMinKeysPerSlice = 256;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// MEGANEURA_ATTENTION_SPLITS=N: N slices for every attention forward (1: none), for sweeps.
int64_t forced_splits() {
  const char* text = std::getenv("MEGANEURA_ATTENTION_SPLITS");
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 1024) {
    throw Error("MEGANEURA_ATTENTION_SPLITS=" + std::string(text) +
                ": expected a whole number of key slices from 1 to 1024 (1: no split); unset it "
                "for the built-in choice");
  }
  return value;
}

// Slices for an attention over `kv_len` keys with `workgroups` query blocks; 1 keeps it whole.
int64_t split_count(int64_t workgroups, int64_t kv_len) {
  int64_t wanted = forced_splits();
  if (wanted == 0) wanted = std::min(kWorkgroupsWanted / workgroups, kv_len / kMinKeysPerSlice);
  if (wanted < 2) return 1;
  // Aligned slices may cover the keys in fewer than `wanted`; count those that are not empty.
  return ceil_div(kv_len, kv_slice_length(kv_len, wanted));
}

}  // namespace

Graph split_attention(const Graph& graph, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [](Graph& target, ValueId, Node node) {
        if (node.op != "scaled_dot_product_attention" || node.attrs.has("kv_splits"))
          return target.add_typed(std::move(node));
        const Shape& q = target.type(node.inputs[0]).shape;
        const int64_t kv_len = target.type(node.inputs[1]).shape[2];
        const int64_t splits =
            split_count(q[0] * q[1] * ceil_div(q[2], kQueriesPerWorkgroup), kv_len);
        if (splits < 2) return target.add_typed(std::move(node));
        Attrs attrs = node.attrs;
        attrs.set("kv_splits", splits);
        const ValueId partials = target.add(node.op, node.inputs, std::move(attrs));
        return target.add("attention_combine", {partials}, {});
      },
      remap);
}

}  // namespace mg::passes
