#pragma once
// The `fast` precision path on cooperative matrices: the GEMM (gemm_coopmat.comp) that matmul and
// the convolutions run, and the switches the fast attention forward shares with it.
#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/lowering.hpp"

namespace mg::kernels {

// True when `device` runs GEMMs on cooperative matrices: fast precision was asked for, the
// device has 16x16 x 16x8 fragments of the operand type asked for (f16 through the NV or KHR
// extension; bfloat16 through KHR) with f32 accumulators and 32-wide subgroups, and
// MEGANEURA_NO_COOPMAT=1 (the kill switch, DeviceTraits::switches) is not set.
bool use_coop_gemm(const DeviceTraits& device);

// The columns of gemm_coopmat.comp's widest block (128 x 256).
constexpr int64_t kWidestSubgroupBlockColumns = 256;

// Whether a product of `m` rows and `multiply_adds` (M * N * K times the batch entries) over `k`
// runs on the cooperative-matrix GEMM where use_coop_gemm(device) holds: products of few rows
// that gemm_few_rows.comp takes (a decode step's) stay there, as its lanes read each weight once
// where the coop GEMM's smallest block would be mostly padding, and so do products over a K
// shorter than a fragment's 16 steps (Whisper's embedding gradient over its 4 decoder tokens),
// which the fragments would pad with zeros; every other product from 64K
// multiply-adds per compute unit, below which one dispatch of either kernel is all latency and
// gemm.comp's 4 x 4 tiles keep more workgroups in flight; a transformer's products at a short
// sequence (its weight gradients over K = 128 tokens) lie above it (how the bound was chosen:
// docs/KERNELS.md, Size bound).
// MEGANEURA_COOP_GEMM_MIN=N sets one bound for all, the multiply-adds per compute unit from which
// products take the coop GEMM (0: all, few rows too); anything else is an error naming it.
bool coop_gemm_suits(int64_t m, int64_t multiply_adds, int64_t k, bool b_transposed,
                     const DeviceTraits& device);

// Whether cooperative-matrix kernels compile through SPV_KHR_cooperative_matrix: wherever the
// device has it, unless MEGANEURA_COOPMAT=nv asks for the NV extension on a device that has both
// (NVIDIA's, where the same kernels run faster through KHR); validated sessions leave KHR off
// (backends/vulkan/runtime/device_features.cpp), so they use NV. bfloat16 operands exist only
// through KHR.
bool coop_wants_khr(const DeviceTraits& device);

// A matmul's or half_matmul's extents: C[m, n] over k for `batches` entries (`batch_shape`, the
// output's leading axes) of `splits` K slices each (split: k_splits, ops/k_split.hpp).
struct MatmulShape {
  int64_t m = 0, n = 0, k = 0, splits = 1, batches = 1;
  bool split = false, transpose_a = false, transpose_b = false;
  Shape batch_shape;
};
MatmulShape matmul_shape(const Graph& graph, const Node& node);

// A half_matmul (ops/half_gemm.hpp) on gemm_coopmat.comp (gemm.cpp): its f16 operands read as
// f16, its result stored as f16 where it is f16; products the workgroup GEMM does not take.
void emit_half_matmul_on_subgroups(LoweringContext& context);

// Runs `gemm` on gemm_coopmat.comp (f16 fragments, f32 accumulators).
void emit_coop_gemm(LoweringContext& context, const GeneratedGemm& gemm,
                    std::vector<Operand> operands);

}  // namespace mg::kernels
