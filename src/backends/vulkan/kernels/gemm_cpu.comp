// GEMM for CPU Vulkan devices (Lavapipe), shared by matmul and the convolution kernels:
// C[GEMM_M, GEMM_N] = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] for entry gl_WorkGroupID.z (a matmul
// batch or a convolution group). llvmpipe runs the LANES invocations of a subgroup as the lanes
// of one SIMD register, turns barriers into coroutine switches and performs every buffer load
// lane by lane, so the cost that matters is loads per multiply-add. Hence: one subgroup per
// workgroup, no shared memory, no barriers; each invocation keeps a ROWS x COLS block of C in
// registers. Rows are the same for every lane, so the A values a step needs are equal across
// lanes: each lane loads a different k of A once per LANES steps and subgroupShuffle hands
// the value to all lanes (register extracts, not a load; Mesa 22's llvmpipe makes
// subgroupBroadcast search for the first active lane first, about twice as slow). Columns
// differ per lane (column col0 + lane + j * LANES), so every B load is a distinct value, reused
// ROWS times.
// The per-row statements are generated (gemm.cpp) as macros over scalar variables rather than
// loops over arrays: an array that survives into llvmpipe becomes per-lane scratch memory.
// Defines: LANES (== the subgroup size), ROWS, COLS, GEMM_M, GEMM_N, GEMM_K.
// Generated: float load_a(uint z, uint m, uint k), float load_b(uint z, uint k, uint n),
// void store_c(uint z, uint m, uint n, float value), all called with in-range indices, and the
// macros DECLARE_ACCUMULATORS, LOAD_CHUNK(k) (this lane's A values at k, zero past GEMM_K:
// chunk_<i>), STEP(kk) (the rank-1 update of k step k0 + kk) and STORE_ACCUMULATORS.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = LANES) in;

void main() {
  uint z = gl_WorkGroupID.z;
  uint lane = gl_LocalInvocationID.x;
  uint row0 = gl_WorkGroupID.y * ROWS;
  uint col0 = gl_WorkGroupID.x * (LANES * COLS) + lane;
  // Out-of-range rows and columns compute on clamped indices and are dropped at the store, so
  // no lane ever leaves the subgroup's shuffles.
  DECLARE_ACCUMULATORS

  // GEMM_K is padded to a multiple of LANES: the padding steps read A as zero and B at a clamped
  // k, adding exact zeros (llvmpipe would execute a uniform branch around them anyway). The
  // steps are a loop, not unrolled, to keep llvmpipe's compile time down; subgroupShuffle
  // accepts the loop counter as its lane index.
  for (uint k0 = 0u; k0 < GEMM_K; k0 += LANES) {
    LOAD_CHUNK(k0 + lane)
    for (uint kk = 0u; kk < LANES; ++kk) STEP(kk)
  }
  STORE_ACCUMULATORS
}
