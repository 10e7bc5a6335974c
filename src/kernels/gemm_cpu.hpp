#pragma once
// The CPU-device GEMM (gemm_cpu.comp) that matmul and the convolutions lower to on Lavapipe.
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

}  // namespace mg::kernels
