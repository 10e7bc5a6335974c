#pragma once
// The `fast` precision path on cooperative matrices: the GEMM (gemm_coopmat.comp) that matmul and
// the convolutions run, and the switches the fast attention forward shares with it.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/lowering.hpp"

namespace mg::kernels {

// True when `device` runs GEMMs on cooperative matrices: fast precision was asked for, the
// device has f16 16x16 x 16x8 fragments with f32 accumulators (NV or KHR extension) and 32-wide
// subgroups, and MEGANEURA_NO_COOPMAT=1 (the kill switch) is not set. Read at every lowering.
bool use_coop_gemm(const DeviceTraits& device);

// Whether cooperative-matrix kernels compile through SPV_KHR_cooperative_matrix: on devices
// without the NV extension, or where both exist and MEGANEURA_COOPMAT=khr asks for it (NVIDIA
// drivers have both, which is how the KHR rewrite is proven on NVIDIA hardware).
bool coop_wants_khr(const DeviceTraits& device);

// C[m, n] = sum over k of A[m, k] B[k, n] for each of `entries` problems (grid
// z). `functions` defines load_a(z, m, k), load_b(z, k, n) and store_c(z, m, n, value) over the
// launch's operands; the kernel calls them with in-range indices only. The layout hints say
// which index is adjacent in memory, so that neighbouring invocations load neighbouring words.
struct CoopGemm {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  bool a_m_contiguous = false;  // else A's k is the fastest index
  bool b_k_contiguous = false;  // else B's n is the fastest index
  // `functions` also define vec4 load_a4(z, m, k) and load_b4(z, k, n): four consecutive
  // elements along the contiguous index, starting at a multiple of 4.
  bool vector_loads = false;
  std::string functions;
};

void emit_coop_gemm(LoweringContext& context, const CoopGemm& gemm, std::vector<Operand> operands);

}  // namespace mg::kernels
