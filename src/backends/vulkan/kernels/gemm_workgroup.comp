// C[GEMM_M, GEMM_N] (f32, or f16 with F16_RESULT) = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] (f16)
// on workgroup-scope cooperative matrices: a workgroup of INVOCATIONS (256, or 128 for the
// blocks 112 wide) owns one
// BLOCK_M x BLOCK_N block of C and multiplies BLOCK_M x BLOCK_K and BLOCK_K x BLOCK_N operands
// loaded straight from memory; the driver stages them through shared memory. A_TRANSPOSED: a is
// stored [GEMM_K, GEMM_M], B_TRANSPOSED: b is stored [GEMM_N, GEMM_K]; both are then read as
// column-major matrices. The extents are multiples of the block (backends/vulkan/kernels/gemm_workgroup.hpp);
// ODD_STEPS: GEMM_K / BLOCK_K is odd, so one step follows the loop. Two steps a loop iteration
// and every matrix local to main: a matrix in a global variable or behind a function call ran
// much slower.
// Workgroup z multiplies batch entry z: its matrices start A_BATCH_STRIDE, B_BATCH_STRIDE and
// C_BATCH_STRIDE elements after the previous entry's (0: an operand shared by every entry).
// bf16 operands (Precision::bf16): this module with its f16 type, its buffers included,
// rewritten to bfloat16 (gpu::KernelSpec::bf16_buffers), so that F16_RESULT stores bfloat16.
// SPLIT_ROWS: the block is held as two BLOCK_M / 2 x BLOCK_N accumulators, one above the other,
// each multiplied by its half of A and the same B; the kernel is then built with tensor-layout
// loads (Launch::tensor_loads), without which that form ran slower.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = INVOCATIONS) in;

#if A_TRANSPOSED
#define LOAD_A(matrix, k, row) coopMatLoadNV(matrix, a, a_base + (k)*GEMM_M + (row), GEMM_M, true)
#else
#define LOAD_A(matrix, k, row) coopMatLoadNV(matrix, a, a_base + (row)*GEMM_K + (k), GEMM_K, false)
#endif
#if B_TRANSPOSED
#define LOAD_B(matrix, k) coopMatLoadNV(matrix, b, b_base + col0 * GEMM_K + (k), GEMM_K, true)
#else
#define LOAD_B(matrix, k) coopMatLoadNV(matrix, b, b_base + (k)*GEMM_N + col0, GEMM_N, false)
#endif
#if F16_RESULT
#define STORE_C(matrix, rows, row)                                                    \
  coopMatStoreNV(fcoopmatNV<16, gl_ScopeWorkgroup, rows, BLOCK_N>(matrix), c,         \
                 c_base + (row)*GEMM_N + col0, GEMM_N, false)
#else
#define STORE_C(matrix, rows, row) coopMatStoreNV(matrix, c, c_base + (row)*GEMM_N + col0, GEMM_N, false)
#endif

#if SPLIT_ROWS
#define HALF_M (BLOCK_M / 2)
#define STEP(k)                                                \
  {                                                            \
    fcoopmatNV<16, gl_ScopeWorkgroup, HALF_M, BLOCK_K> a_top;  \
    fcoopmatNV<16, gl_ScopeWorkgroup, HALF_M, BLOCK_K> a_low;  \
    fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_K, BLOCK_N> b_step; \
    LOAD_A(a_top, k, row0);                                    \
    LOAD_B(b_step, k);                                         \
    acc_top = coopMatMulAddNV(a_top, b_step, acc_top);         \
    LOAD_A(a_low, k, row0 + HALF_M);                           \
    acc_low = coopMatMulAddNV(a_low, b_step, acc_low);         \
  }
#else
#define STEP(k)                                                 \
  {                                                             \
    fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_M, BLOCK_K> a_step; \
    fcoopmatNV<16, gl_ScopeWorkgroup, BLOCK_K, BLOCK_N> b_step; \
    LOAD_A(a_step, k, row0);                                    \
    LOAD_B(b_step, k);                                          \
    acc = coopMatMulAddNV(a_step, b_step, acc);                 \
  }
#endif

void main() {
  const uint row0 = gl_WorkGroupID.y * BLOCK_M, col0 = gl_WorkGroupID.x * BLOCK_N;
  const uint a_base = gl_WorkGroupID.z * A_BATCH_STRIDE, b_base = gl_WorkGroupID.z * B_BATCH_STRIDE,
             c_base = gl_WorkGroupID.z * C_BATCH_STRIDE;
#if SPLIT_ROWS
  fcoopmatNV<32, gl_ScopeWorkgroup, HALF_M, BLOCK_N> acc_top =
      fcoopmatNV<32, gl_ScopeWorkgroup, HALF_M, BLOCK_N>(0.0);
  fcoopmatNV<32, gl_ScopeWorkgroup, HALF_M, BLOCK_N> acc_low =
      fcoopmatNV<32, gl_ScopeWorkgroup, HALF_M, BLOCK_N>(0.0);
#else
  fcoopmatNV<32, gl_ScopeWorkgroup, BLOCK_M, BLOCK_N> acc =
      fcoopmatNV<32, gl_ScopeWorkgroup, BLOCK_M, BLOCK_N>(0.0);
#endif
  uint k = 0;
  for (; k + 2 * BLOCK_K <= GEMM_K; k += 2 * BLOCK_K) {
    STEP(k)
    STEP(k + BLOCK_K)
  }
#if ODD_STEPS
  STEP(k)
#endif
#if SPLIT_ROWS
  STORE_C(acc_top, HALF_M, row0);
  STORE_C(acc_low, HALF_M, row0 + HALF_M);
#else
  STORE_C(acc, BLOCK_M, row0);
#endif
}
