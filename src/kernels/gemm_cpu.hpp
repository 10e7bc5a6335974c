#pragma once
// The GEMMs that read their operands through generated load functions: the CPU-device GEMM
// (gemm_cpu.comp) that matmul and the convolutions lower to on Lavapipe, and gemm.comp's
// GENERATED_LOADS form that the convolutions lower to on GPUs; and the split-K form of the load
// functions that they, the cooperative-matrix GEMM and conv_igemm.comp read through.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/lowering.hpp"

namespace mg::kernels {

// True when `device` is a CPU implementation whose subgroup the CPU kernels can use, unless
// MEGANEURA_NO_CPU_KERNELS=1 forces the GPU kernels (so both paths can be tested on Lavapipe).
// Read at every lowering, not cached, so a test can flip it between Sessions.
bool use_cpu_kernels(const DeviceTraits& device);

// C[m, n] = sum_k A[m, k] B[k, n] for each of `entries` independent problems (grid z).
// `functions` defines load_a(z, m, k), load_b(z, k, n) and store_c(z, m, n, value) over the
// launch's operands (see gemm_cpu.comp).
struct CpuGemm {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  std::string functions;
};

void emit_cpu_gemm(LoweringContext& context, const CpuGemm& gemm, std::vector<Operand> operands);

// The same problems on gemm.comp (GENERATED_LOADS), its tile chosen as for matmul. The contiguity
// flags pick each operand's tile fill: a thread reads four consecutive elements along the
// operand's fastest index.
struct SimtGemm {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  bool a_m_contiguous = false;  // else A's k is the fastest index
  bool b_k_contiguous = false;  // else B's n is the fastest index
  std::string functions;
};

// Whether gemm.comp's square tiles suit a convolution GEMM (else conv_igemm.comp runs it);
// MEGANEURA_GEMM_TILE, which forces a square tile, also forces this route for every product
// of at least 32 x 32.
bool simt_gemm_suits(const SimtGemm& gemm);

void emit_simt_gemm(LoweringContext& context, const SimtGemm& gemm, std::vector<Operand> operands);

// Split-K over GEMM load functions (ops/k_split.hpp): `functions` defines load_a(z, m, k) and
// load_b(z, k, n) for `entries` problems summing all of `k`; the result defines them for
// entries * splits problems of one K slice each (GEMM K = k_slice_length(k, splits)). Problem z
// is slice z / entries of problem z % entries: loads shift k into the slice and read zero past
// `k`. store_c is left as it is: it receives z itself, the flat index over [splits, entries] and
// so over the leading axes of the [splits, ...] partial results.
std::string split_k_functions(const std::string& functions, int64_t entries, int64_t k,
                              int64_t splits);

}  // namespace mg::kernels
