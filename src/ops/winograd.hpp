#pragma once
// Winograd's minimal filtering F(2 x 2, 3 x 3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016), turned around for the weight gradient of a 3 x 3
// stride-1 convolution. The forward computes a 2 x 2 output tile from the 4 x 4 input patch d
// under it as Y = A^T [(G g G^T) . (B^T d B)] A, which is linear in the filter g, so the
// gradient of a tile with respect to g is G^T [(A dY A^T) . (B^T d B)] G. Summed over tiles,
// each of the 16 points of the 4 x 4 transformed tile is one matrix product over the tiles:
// M[p] = U[p] V[p]^T with U the transformed grad_out tiles [O, T] and V the transformed input
// patches [C, T], and dW = G^T M G, 16 products per tile where the direct sum takes 36.
// The forward itself is winograd_filter (U [16, O, C], the points of G g G^T), winograd_tiles
// (V [16, C, T]), one batched product M = U V ([16, O, T]) and winograd_output (A^T M A, each
// tile's 2 x 2 outputs back in [N, O, OH, OW]): 16 products per tile where the direct sum
// takes 36. The stride-1 data gradient is the forward over grad_out padded by 2 - P, with the
// filter turned by 180 degrees and its two axes swapped (winograd_filter's `transposed`).
// Shared by the reference (ops/winograd.cpp) and the kernels (kernels/conv.cpp).
#include <cstdint>

namespace mg::winograd {

// Outputs a tile covers along each axis (m), the kernel's extent (r) and the transformed tile's
// (m + r - 1).
constexpr int64_t kOutputs = 2;
constexpr int64_t kKernel = 3;
constexpr int64_t kTile = 4;
constexpr int64_t kPoints = kTile * kTile;

// The tiles of 2 x 2 outputs that cover `outputs` along one axis, and a batch of images.
constexpr int64_t tiles_along(int64_t outputs) {
  return (outputs + kOutputs - 1) / kOutputs;
}
constexpr int64_t tile_count(int64_t batch, int64_t height, int64_t width) {
  return batch * tiles_along(height) * tiles_along(width);
}

// B^T: the input patch's transform, V = B^T d B.
inline constexpr double kInputTransform[kTile][kTile] = {
    {1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
// A (the forward's output transform A^T, transposed): the gradient tile's transform,
// U = A dY A^T.
inline constexpr double kGradTransform[kTile][kOutputs] = {{1, 0}, {1, 1}, {1, -1}, {0, -1}};
// G: the filter transform; the weight gradient is G^T M G.
inline constexpr double kFilterTransform[kTile][kKernel] = {
    {1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

}  // namespace mg::winograd
