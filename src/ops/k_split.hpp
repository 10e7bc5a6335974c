#pragma once
// Split-K (passes/split_k.cpp): a matmul or conv2d_grad_weight with attribute k_splits = S
// computes S partial results stacked along a new leading axis ([S, ...the whole result]);
// partial s sums only k in [s * L, min(K, (s + 1) * L)) with L = k_slice_length(K, S). The
// references (src/ops) and the kernels (src/backends/vulkan/kernels) share this arithmetic, so
// their slices agree.
#include <cstdint>

namespace mg {

// a / b rounded up, for positive a and b: slice lengths and counts, tiles and chunks.
constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Slice boundaries are multiples of 16: the K step of the GEMM kernels, and vec4 loads along K
// stay 16-byte aligned.
constexpr int64_t kKSliceAlignment = 16;

// Products with a shorter K stay whole: a split costs a reduction dispatch and the product's
// epilogue fusion, which a 64 x 256 x 256 layer of a small MLP does not win back. The fast
// GEMM's routing (backends/vulkan/kernels/gemm_coopmat.cpp) counts on splits from this K on.
constexpr int64_t kMinKToSplit = 512;

// Length of every K slice but the last (which may be shorter) when K is cut into `splits`.
constexpr int64_t k_slice_length(int64_t k, int64_t splits) {
  return ceil_div(ceil_div(k, splits), kKSliceAlignment) * kKSliceAlignment;
}

// The slices that are not empty when K is cut for `wanted` of them (aligned slices may cover K
// in fewer).
constexpr int64_t nonempty_slices(int64_t k, int64_t wanted) {
  return ceil_div(k, k_slice_length(k, wanted));
}

// Split attention (passes/split_attention.cpp): a scaled_dot_product_attention or
// attention_grad_q with attribute kv_splits = S computes S partial results over slices of the
// keys, an attention_grad_k / attention_grad_v with q_splits = S over slices of the queries:
// slice s covers [s * L, min(length, (s + 1) * L)) with L = attention_slice_length(length, S).
// Slice boundaries are multiples of 64, so every block of the kernels lies in one slice.
// dK and dV may also take head_splits = H (grouped-query attention): partial h * S + s then
// sums over slice s of the queries of the h-th of H equal parts of each group's query heads.
constexpr int64_t kAttentionSliceAlignment = 64;

constexpr int64_t attention_slice_length(int64_t length, int64_t splits) {
  return ceil_div(ceil_div(length, splits), kAttentionSliceAlignment) * kAttentionSliceAlignment;
}

}  // namespace mg
