#pragma once
// Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016), for m = 2 and 4, and turned around for the weight
// gradient of a 3 x 3 stride-1 convolution. The forward computes an m x m output tile from the
// (m + 2) x (m + 2) input patch d under it as Y = A^T [(G g G^T) . (B^T d B)] A, which is linear
// in the filter g, so the gradient of a tile with respect to g is G^T [(A dY A^T) . (B^T d B)] G.
// Summed over tiles, each of the (m + 2)^2 points of the transformed tile is one matrix product
// over the tiles: M[p] = U[p] V[p]^T with U the transformed grad_out tiles [O, T] and V the
// transformed input patches [C, T], and dW = G^T M G: (m + 2)^2 products per tile (16 for m = 2,
// 36 for m = 4) where the direct sum takes 9 m^2 (36, 144).
// The forward itself (F(2 x 2, 3 x 3) only) is winograd_filter (U [16, O, C], the points of
// G g G^T), winograd_tiles (V [16, C, T]), one batched product M = U V ([16, O, T]) and
// winograd_output (A^T M A, each tile's 2 x 2 outputs back in [N, O, OH, OW]): 16 products per
// tile where the direct sum takes 36. The stride-1 data gradient is the forward over grad_out
// padded by 2 - P, with the filter turned by 180 degrees and its two axes swapped
// (winograd_filter's `transposed`).
// Shared by the reference (ops/winograd.cpp) and the kernels (backends/vulkan/kernels/conv.cpp).
#include <cstdint>

#include "meganeura/graph.hpp"

namespace mg::winograd {

constexpr int64_t kKernel = 3;

// A transform matrix: `rows` x `columns` of `values` (row-major), or the transpose of such a
// matrix where `transposed` (then values is stored columns x rows).
struct Matrix {
  const double* values = nullptr;
  int64_t rows = 0, columns = 0;
  bool transposed = false;
  constexpr double at(int64_t row, int64_t column) const {
    return transposed ? values[column * rows + row] : values[row * columns + column];
  }
  constexpr Matrix transpose() const { return {values, columns, rows, !transposed}; }
};

// F(m x m, 3 x 3): m outputs a tile side (`outputs`), the transformed tile's side m + 2.
struct Variant {
  int64_t outputs = 2;
  Matrix input;   // B^T, tile x tile: V = B^T d B
  Matrix grad;    // A (the forward's output transform A^T, transposed), tile x m: U = A dY A^T
  Matrix filter;  // G, tile x 3: G g G^T, and the weight gradient G^T M G
  constexpr int64_t tile() const { return outputs + kKernel - 1; }
  constexpr int64_t points() const { return tile() * tile(); }
  // The tiles that cover `extent` outputs along one axis, and those of a batch of images.
  constexpr int64_t tiles_along(int64_t extent) const { return (extent + outputs - 1) / outputs; }
  constexpr int64_t tile_count(int64_t batch, int64_t height, int64_t width) const {
    return batch * tiles_along(height) * tiles_along(width);
  }
};

// F(2 x 2, 3 x 3): the points 0, 1, -1 and infinity.
inline constexpr double kInputTransform2[] = {1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1};
inline constexpr double kGradTransform2[] = {1, 0, 1, 1, 1, -1, 0, -1};
inline constexpr double kFilterTransform2[] = {1, 0, 0, 0.5, 0.5, 0.5, 0.5, -0.5, 0.5, 0, 0, 1};
inline constexpr Variant kF2{
    2, {kInputTransform2, 4, 4}, {kGradTransform2, 4, 2}, {kFilterTransform2, 4, 3}};

// F(4 x 4, 3 x 3): the points 0, 1, -1, 2, -2 and infinity; 36 products a tile for 16 outputs
// where F(2 x 2, 3 x 3) takes 64, at about 4x its rounding error in f32 (docs/KERNELS.md, the
// Winograd weight gradient).
inline constexpr double kInputTransform4[] = {4, 0, -5, 0,  1, 0, 0, -4, -4, 1,  1, 0,
                                              0, 4, -4, -1, 1, 0, 0, -2, -1, 2,  1, 0,
                                              0, 2, -1, -2, 1, 0, 0, 4,  0,  -5, 0, 1};
inline constexpr double kGradTransform4[] = {1, 0, 0, 0, 1, 1,  1, 1,  1, -1, 1, -1,
                                             1, 2, 4, 8, 1, -2, 4, -8, 0, 0,  0, 1};
inline constexpr double kFilterTransform4[] = {
    1.0 / 4,  0,        0,       -1.0 / 6, -1.0 / 6,  -1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6,
    1.0 / 24, 1.0 / 12, 1.0 / 6, 1.0 / 24, -1.0 / 12, 1.0 / 6,  0,        0,       1};
inline constexpr Variant kF4{
    4, {kInputTransform4, 6, 6}, {kGradTransform4, 6, 4}, {kFilterTransform4, 6, 3}};

// The variant of m = `outputs` (2 or 4; the ops' checks refuse others first).
constexpr const Variant& variant(int64_t outputs) {
  return outputs == 4 ? kF4 : kF2;
}

// The attribute that carries m on winograd_tiles, winograd_grad_tiles and winograd_weight_grad
// (absent: 2), and the variant a node's attributes name.
inline constexpr const char* kOutputsAttribute = "outputs";
inline int64_t outputs_of(const Attrs& attrs) {
  return attrs.get_int(kOutputsAttribute, 2);
}
inline const Variant& variant_of(const Attrs& attrs) {
  return variant(outputs_of(attrs));
}

// The attribute with which winograd_tiles, winograd_grad_tiles and winograd_filter store their
// transformed points rounded to f16 (1; absent or 0: in their input's dtype): the operands of a
// half_matmul in fast precision (passes/workgroup_gemm.cpp).
inline constexpr const char* kF16ResultAttribute = "f16_result";
inline bool f16_result(const Attrs& attrs) {
  return attrs.get_int(kF16ResultAttribute, 0) != 0;
}
// The same in bfloat16 (1): the operands of a half_matmul in bf16 precision.
inline constexpr const char* kBf16ResultAttribute = "bf16_result";
inline bool bf16_result(const Attrs& attrs) {
  return attrs.get_int(kBf16ResultAttribute, 0) != 0;
}

}  // namespace mg::winograd
