#pragma once
// The target boundary: what the compiler (passes and planning) asks about the device it builds
// for. A backend implements Target in its own folder (src/backends/vulkan: VulkanTarget); nothing
// above this header includes a backend. The questions are of two kinds: which kernel and tile a
// node gets, where that decides how the graph is rewritten (split-K, Winograd, the f16 GEMMs),
// and the lowering of a whole graph to launches.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "ops/conv_geometry.hpp"
#include "target/device_traits.hpp"
#include "target/launch.hpp"

namespace mg::target {

// What a product's operands are before the workgroup GEMM reads them: f32 values it must round
// to f16 first (passes/workgroup_gemm.cpp), or f16 tensors it reads as they are
// (passes/half_storage.cpp).
enum class OperandsIn { f32, f16 };

// A product the split-K pass may cut: C[M, N] for each of `entries` problems summed over K.
struct GemmProduct {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  bool generated_loads = false;  // conv2d_grad_weight's implicit GEMM, not a matmul's buffers
  bool half_operands = false;    // a half_matmul of f16 operands
  bool winograd_weight_gradient = false;  // U V^T of a Winograd weight gradient's tiles
  bool b_transposed = false;              // a matmul's B stored [N, K] (transpose_b)
};

class Target {
 public:
  explicit Target(DeviceTraits traits) : traits_(std::move(traits)) {}
  virtual ~Target() = default;

  const DeviceTraits& traits() const { return traits_; }
  const Switches& switches() const { return traits_.switches; }

  // Whether matrix products run on the device's matrix units (cooperative matrices): fast
  // precision on a device that has them, unless switched off.
  virtual bool cooperative_matrices() const = 0;
  // Whether `op` runs in the generated elementwise kernel, where a chain of them fuses and f16
  // inputs widen as they are read.
  virtual bool is_pointwise_op(std::string_view op) const = 0;

  // Whether an M x N x K product (2-D, whole K) runs on the workgroup-scope f16 GEMM.
  virtual bool workgroup_gemm_suits(int64_t m, int64_t n, int64_t k, OperandsIn operands) const = 0;
  // Whether the product `node` of `graph` (a matmul or half_matmul, 2-D or batched) of f16
  // operands (or bf16 ones, in bf16 precision) does, storing its result in their format where
  // the node's type is.
  virtual bool workgroup_gemm_takes_f16_product(const Graph& graph, const Node& node) const = 0;
  // Whether it does and can also store the product's result in its operands' 16-bit format
  // (half_matmul's f16_result, or bf16_result for bf16 operands).
  virtual bool workgroup_gemm_writes_half_result(const Graph& graph, const Node& node) const = 0;
  // Whether the GEMM of product `node` (a matmul or half_matmul) stores an f32 result through
  // the store that an elementwise consumer can join (an epilogue: a bias add computed in f32).
  virtual bool product_takes_epilogue(const Graph& graph, const Node& node) const = 0;
  // Whether a 2-D M x N x K product (whole K) runs on the subgroup-scope GEMM on cooperative
  // matrices, which rounds f32 operands to f16 as it loads them.
  virtual bool subgroup_gemm_takes_product(int64_t m, int64_t n, int64_t k,
                                           bool b_transposed) const = 0;
  // Whether `batch` per-image products [M, K] x [K, plane] run faster as one M x K x (batch
  // plane) product over the images side by side, moved there and back (passes/im2col.cpp, 1x1
  // convolutions).
  virtual bool images_side_by_side_suit(int64_t m, int64_t k, int64_t batch,
                                        int64_t plane) const = 0;
  // Whether `batch` per-image products [M, K] x [K, plane] of a convolution's columns run faster
  // as one M x K x (batch plane) product over f16 columns side by side (passes/im2col.cpp).
  virtual bool half_columns_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const = 0;
  // Whether `batch` per-image products [M, K] x [K, plane] over a value's images (1x1
  // convolutions) run faster on f16 images, rounded as they are produced, one product an image.
  virtual bool half_images_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const = 0;
  // The K slices `product` runs fastest on here (1: whole), for a K of at least kMinKToSplit.
  virtual int64_t gemm_k_splits(const GemmProduct& product) const = 0;

  // The multiple of the head widths at which attention runs its fastest kernels here (1: any
  // width); passes::pad_attention_heads pads other heads to it.
  virtual int64_t attention_head_multiple() const = 0;
  // Whether the attention gradient `node` of `graph` (attention_grad_q / _k / _v), taken over a
  // rescaled cotangent, finds the largest |dO| in its kernels, among the rows each reads
  // (attribute own_grad_out_scale), rather than reading a max-reduction made before it
  // (passes::scale_attention_gradients).
  virtual bool attention_gradient_scales_itself(const Graph& graph, const Node& node) const = 0;

  // Convolution routes: the direct weight-gradient kernel and its K splits, Winograd's weight
  // gradient and its tile side m of F(m x m, 3 x 3), Winograd's forward and data gradient.
  virtual bool direct_weight_gradient_suits(const ConvGeometry& g) const = 0;
  virtual int64_t direct_weight_gradient_splits(const ConvGeometry& g) const = 0;
  virtual bool winograd_weight_gradient_suits(const ConvGeometry& g) const = 0;
  virtual int64_t winograd_weight_gradient_outputs(const ConvGeometry& g) const = 0;
  virtual bool winograd_convolution_suits(const ConvGeometry& g, bool data_gradient) const = 0;

  // The launches of every non-leaf, non-view node of `graph`, in order, with the target's
  // fusions; `fused_away` receives how many dispatches fusion saved. Throws mg::Error naming
  // the op and the device where no kernel runs a node.
  virtual std::vector<Launch> lower(const Graph& graph, size_t* fused_away = nullptr) const = 0;

 private:
  DeviceTraits traits_;
};

}  // namespace mg::target
