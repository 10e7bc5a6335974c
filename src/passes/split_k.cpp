// Split-K: a matmul whose output is a handful of GEMM tiles but whose K is long (the data
// gradients of a transformer at short sequence length, e.g. 128 x 576 x 49152) runs on a few
// workgroups of a GPU with 132 compute units, each walking all of K. Cutting K into slices gives
// partial products (matmuls with k_begin / k_end) that run as independent dispatches, summed by
// one fused pointwise kernel; the extra traffic is small next to the product, since every slice
// keeps at least kMinKPerSlice multiply-adds per output.
#include <algorithm>

#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Workgroups wanted in flight: two 128 x 128 GEMM tiles on each of an H200's 132 compute units.
// The slice count rounds down, so the partial products fill at most one such wave.
constexpr int64_t kWorkgroupsWanted = 264;
constexpr int64_t kOutputTile = 128;
constexpr int64_t kMinKPerSlice = 256;
// Slice boundaries are multiples of the GEMM's K tile, which also keeps vec4 loads along K.
constexpr int64_t kSliceAlignment = 16;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Length of each K slice (the last may be shorter), or k when the product stays whole.
int64_t slice_length(int64_t m, int64_t n, int64_t k, int64_t batches) {
  const int64_t tiles =
      std::max<int64_t>(1, batches * ceil_div(m, kOutputTile) * ceil_div(n, kOutputTile));
  const int64_t slices = std::min(kWorkgroupsWanted / tiles, k / kMinKPerSlice);
  if (slices < 2) return k;
  return ceil_div(ceil_div(k, slices), kSliceAlignment) * kSliceAlignment;
}

}  // namespace

Graph split_long_k_matmuls(const Graph& graph, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [](Graph& target, ValueId, Node node) {
        if (node.op != "matmul" || node.attrs.has("k_begin")) {
          return target.add_typed(std::move(node));
        }
        const Shape& a_shape = target.type(node.inputs[0]).shape;
        const Shape& out_shape = node.type.shape;
        const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
        const int64_t k = a_shape[a_shape.size() - (transpose_a ? 2 : 1)];
        const int64_t m = out_shape[out_shape.size() - 2];
        const int64_t n = out_shape[out_shape.size() - 1];
        const int64_t batches = element_count(Shape(out_shape.begin(), out_shape.end() - 2));
        const int64_t length = slice_length(m, n, k, batches);
        if (length >= k) return target.add_typed(std::move(node));
        ValueId total = kNoValue;
        for (int64_t k_begin = 0; k_begin < k; k_begin += length) {
          Attrs attrs = node.attrs;
          attrs.set("k_begin", k_begin).set("k_end", std::min(k, k_begin + length));
          const ValueId partial = target.add("matmul", node.inputs, std::move(attrs));
          total = total == kNoValue ? partial : target.add("add", {total, partial});
        }
        return total;
      },
      remap);
}

}  // namespace mg::passes
