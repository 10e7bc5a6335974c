#pragma once
// The fast GEMM on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2,
// gemm_workgroup.comp): one block of C a workgroup of 256 invocations, its f16 operands loaded
// 64 deep straight from memory, the staging through shared memory left to the driver. A matmul
// takes it through passes/workgroup_gemm.cpp, as round_to_f16 of each operand and a half_matmul
// (ops/half_gemm.hpp; round_to_bf16 in bf16 precision, whose operands the kernel then reads as
// bfloat16), and a product of f16 tensors through passes/half_storage.cpp.
#include <cstdint>
#include <optional>

#include "backends/vulkan/kernels/lowering.hpp"
#include "target/target.hpp"

namespace mg::kernels {

constexpr int64_t kWorkgroupGemmBlockK = 64, kWorkgroupGemmInvocations = 256;

// The block of C a workgroup computes. Where the device loads workgroup-scope matrices through
// tensor layouts (DeviceTraits::workgroup_tensor_loads) and M is a multiple of 256: 256 x 128,
// held as two 128 x 128 accumulators one above the other (split_rows), the faster form; otherwise
// one 128 x 256 accumulator with plain loads. Where neither divides N (planes of 784 and 3136,
// ResNet's 28 x 28 and 56 x 56; DeviceTraits::workgroup_narrow_blocks): 128 x 224 where 224
// does, else 128 x 112 on 128 invocations, since NVIDIA's 256-invocation matrices come in
// multiples of 32 columns and its 128-invocation ones of 16; 64 rows high where 128 do not
// divide M (the 64-channel products of ResNet's first stage). The device's workgroup
// granularities for the form's invocations must divide its accumulator (accumulator_rows x n)
// and its 64-deep steps. MEGANEURA_WORKGROUP_BLOCK (tuning sweeps) forces a block wherever it
// divides M and N and the device runs it (DeviceTraits::workgroup_forced_block).
struct WorkgroupGemmBlock {
  int64_t m = 128, n = 256;
  bool split_rows = false;
  int64_t invocations = kWorkgroupGemmInvocations;
  constexpr int64_t accumulator_rows() const { return split_rows ? m / 2 : m; }
};
constexpr WorkgroupGemmBlock kWholeBlock{128, 256, false}, kSplitRowsBlock{256, 128, true};
constexpr WorkgroupGemmBlock kNarrowBlock{128, 224, false}, kNarrowerBlock{128, 112, false, 128};
constexpr WorkgroupGemmBlock kLowNarrowBlock{64, 224, false},
    kLowNarrowerBlock{64, 112, false, 128};
// The block MEGANEURA_WORKGROUP_BLOCK names.
constexpr WorkgroupGemmBlock forced_workgroup_block(const Switches::WorkgroupBlock& forced) {
  return {forced.m, forced.n, forced.split_rows, forced.invocations};
}
// The block an M x N product takes on `device`, or none where neither divides it.
std::optional<WorkgroupGemmBlock> workgroup_gemm_block(int64_t m, int64_t n,
                                                       const DeviceTraits& device);

using target::OperandsIn;

// Whether an M x N x K product (2-D, no split) runs on the workgroup GEMM on `device`: the coop
// GEMM is on (use_coop_gemm), the device has workgroup-scope f16 matrices
// (DeviceTraits::workgroup_coop_matrix_f16; for f32 operands with bfloat16 operands also
// workgroup_coop_matrix_bf16), a block fits M and N (workgroup_gemm_block), K is
// a multiple of 64, and the blocks of all `batches` entries fill every compute unit once; for
// f32 operands also M N >= 512 (M + N), so that the product outweighs the roundings of its
// operands (gemm_workgroup.cpp), which large products then run far faster than on the
// subgroup-scope kernel.
// MEGANEURA_WORKGROUP_GEMM=0 turns it off, =1 drops the
// size bounds (the extents must still be multiples of the block); anything else is an error naming
// it.
bool workgroup_gemm_suits(int64_t m, int64_t n, int64_t k, const DeviceTraits& device,
                          OperandsIn operands, int64_t batches = 1);

// Whether the product `node` of `graph` (a matmul or half_matmul, a transposed when its
// transpose_a says) of f16 operands (or bf16 ones, with bfloat16 operands on a device with
// workgroup_coop_matrix_bf16) runs on the workgroup GEMM on `device`: never once split
// over K (k_splits); batched only where each operand has a matrix an entry or one matrix for
// all of them (workgroup z runs entry z); else by workgroup_gemm_suits for f16 operands; with an
// f16 or bf16 result, only where its block can store one (not blocks 64 rows high or a forced
// one 64 wide, as workgroup_gemm_writes_half_result). The half storage pass, split-K and
// half_matmul's lowering ask it of the same product.
bool workgroup_gemm_takes_f16_product(const Graph& graph, const Node& node,
                                      const DeviceTraits& device);
// Whether the workgroup GEMM takes the product `node` of f16 (bf16) operands and can store its
// result as f16 (bfloat16): half_matmul's f16_result (bf16_result); not in blocks 64 rows high
// (or, forced, 64 wide), whose 16-bit accumulator would have B's (A's) type.
bool workgroup_gemm_writes_half_result(const Graph& graph, const Node& node,
                                       const DeviceTraits& device);

// Whether a convolution's `batch` per-image column products [M, K] x [K, plane] should run as
// one 2-D product over f16 columns side by side (target::Target::half_columns_suit): wherever the
// workgroup GEMM takes it, whatever the plane, as im2col writes such columns in one pass, with
// nothing to move but the result. MEGANEURA_HALF_COLUMNS=0 and MEGANEURA_COLUMNS_SIDE_BY_SIDE=0
// turn it off, MEGANEURA_HALF_COLUMNS=1 also takes one image. With bfloat16 operands
// (DeviceTraits::bf16_operands), whose range f16 columns would lose, the columns are bfloat16
// and need the device's bfloat16 workgroup-scope matrices (workgroup_coop_matrix_bf16), as do
// the two routes below.
bool half_columns_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                       const DeviceTraits& device);

// Whether `batch` per-image products [M, K] x [K, plane] over a value's images should run one an
// image on the workgroup GEMM (target::Target::half_images_suit), reading 16-bit images that the
// value's producer writes beside it, rather than on the subgroup GEMM reading f32 ones: wherever
// the workgroup GEMM takes the batched product, except where the images go side by side
// (images_side_by_side_suit). MEGANEURA_HALF_IMAGES=0 keeps them on f32 images.
bool half_images_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                      const DeviceTraits& device);

// Whether `batch` per-image products [M, K] x [K, plane] should run as one 2-D product over the
// images side by side (target::Target::images_side_by_side_suit): on the workgroup GEMM (16-bit
// operands, which the transpose that puts the images side by side writes), where a plane is
// narrower than the subgroup GEMM's widest block, so that its per-image products leave that
// kernel's blocks partly empty, while the moves there and back cost about what a wider plane's
// per-image products lose. MEGANEURA_COLUMNS_SIDE_BY_SIDE=0 keeps every image apart, =1 drops
// the plane bound.
bool images_side_by_side_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                              const DeviceTraits& device);

}  // namespace mg::kernels
