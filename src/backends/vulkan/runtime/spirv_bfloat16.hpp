#pragma once
// Debian 12's glslang (12.0) has no bfloat16 type (GL_EXT_bfloat16 came later), so the fast
// kernels are written once with f16 operands and their SPIR-V is rewritten for bfloat16 ones
// (Precision::bf16).
#include <cstdint>
#include <span>
#include <vector>

namespace mg::gpu::detail {

// Rewrites a KHR cooperative-matrix module (nv_to_khr_cooperative_matrix's output) whose f16 type
// serves only as the matrices' operand type into the same module with that type bfloat16
// (SPV_KHR_bfloat16): the type gains the BFloat16KHR encoding, f16 constants become the bfloat16
// of their value, and the capabilities and extension are declared. Conversions to it from f32
// then round to bfloat16, so the kernel's operands carry f32's range with 8 significant bits.
// Throws mg::Error when the module computes with f16 values (bfloat16 allows only conversions,
// moves, selects and the matrix operations), holds NV matrices of f16, has no f16 type at all,
// or reads or writes f16 memory (buffers, push constants) unless `buffers` says that memory
// holds bfloat16 values (the workgroup GEMM's bf16 operands), which it then reads as such.
enum class HalfBuffers { refused, hold_bfloat16 };
std::vector<uint32_t> f16_operands_to_bf16(std::span<const uint32_t> khr_module,
                                           HalfBuffers buffers = HalfBuffers::refused);

}  // namespace mg::gpu::detail
