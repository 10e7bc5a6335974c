// C[GEMM_M, GEMM_N] (f32, or f16 with F16_RESULT) = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] (f16)
// on workgroup-scope cooperative matrices: a workgroup of 256 invocations owns one
// BLOCK_M x BLOCK_N accumulator and multiplies BLOCK_M x BLOCK_K and BLOCK_K x BLOCK_N operands
// loaded straight from memory; the driver stages them through shared memory. A_TRANSPOSED: a is
// stored [GEMM_K, GEMM_M], B_TRANSPOSED: b is stored [GEMM_N, GEMM_K]; both are then read as
// column-major matrices. The extents are multiples of the block (kernels/gemm_workgroup.hpp);
// ODD_STEPS: GEMM_K / BLOCK_K is odd, so one step follows the loop. Two steps a loop iteration
// and every matrix local to main: on the H200 a matrix in a global variable or behind a
// function call ran 1.5x slower (docs/BENCHMARKS.md run 48).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 256) in;

#if A_TRANSPOSED
#define LOAD_A(matrix, k) coopMatLoadNV(matrix, a, (k)*GEMM_M + row0, GEMM_M, true)
#else
#define LOAD_A(matrix, k) coopMatLoadNV(matrix, a, row0* GEMM_K + (k), GEMM_K, false)
#endif
#if B_TRANSPOSED
#define LOAD_B(matrix, k) coopMatLoadNV(matrix, b, col0* GEMM_K + (k), GEMM_K, true)
#else
#define LOAD_B(matrix, k) coopMatLoadNV(matrix, b, (k)*GEMM_N + col0, GEMM_N, false)
#endif
#define STEP(k)                                                 \
  {                                                             \
    fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_M, BLOCK_K> a_step; \
    fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_K, BLOCK_N> b_step; \
    LOAD_A(a_step, k);                                          \
    LOAD_B(b_step, k);                                          \
    acc = coopMatMulAddNV(a_step, b_step, acc);                 \
  }

void main() {
  const uint row0 = gl_WorkGroupID.y * BLOCK_M, col0 = gl_WorkGroupID.x * BLOCK_N;
  fcoopmatNV<32, gl_ScopeWorkgroup, BLOCK_M, BLOCK_N> acc =
      fcoopmatNV<32, gl_ScopeWorkgroup, BLOCK_M, BLOCK_N>(0.0);
  uint k = 0;
  for (; k + 2 * BLOCK_K <= GEMM_K; k += 2 * BLOCK_K) {
    STEP(k)
    STEP(k + BLOCK_K)
  }
#if ODD_STEPS
  STEP(k)
#endif
#if F16_RESULT
  coopMatStoreNV(fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_M, BLOCK_N>(acc), c, row0 * GEMM_N + col0,
                 GEMM_N, false);
#else
  coopMatStoreNV(acc, c, row0 * GEMM_N + col0, GEMM_N, false);
#endif
}
