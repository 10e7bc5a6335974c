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
// macros DECLARE_ACCUMULATORS, LOAD_CHUNK(k) (this lane's A values at k: chunk_<i>),
// STEP(KK) (the rank-1 update of k step k0 + KK) and STORE_ACCUMULATORS.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = LANES) in;

// The last, partial chunk skips the steps past GEMM_K (the condition is uniform, so every lane
// still takes part in each shuffle).
#define TAIL_STEP(KK) \
  if (k0 + KK < GEMM_K) STEP(KK)

#if LANES == 4
#define CHUNK(S) S(0u) S(1u) S(2u) S(3u)
#elif LANES == 8
#define CHUNK(S) S(0u) S(1u) S(2u) S(3u) S(4u) S(5u) S(6u) S(7u)
#elif LANES == 16
#define CHUNK(S)                                                                          \
  S(0u) S(1u) S(2u) S(3u) S(4u) S(5u) S(6u) S(7u) S(8u) S(9u) S(10u) S(11u) S(12u) S(13u) \
      S(14u) S(15u)
#endif

void main() {
  uint z = gl_WorkGroupID.z;
  uint lane = gl_LocalInvocationID.x;
  uint row0 = gl_WorkGroupID.y * ROWS;
  uint col0 = gl_WorkGroupID.x * (LANES * COLS) + lane;
  // Out-of-range rows and columns compute on clamped indices and are dropped at the store, so
  // no lane ever leaves the subgroup's shuffles.
  DECLARE_ACCUMULATORS

  const uint full_end = GEMM_K - GEMM_K % LANES;
  uint k0 = 0u;
  for (; k0 < full_end; k0 += LANES) {
    LOAD_CHUNK(k0 + lane)
    CHUNK(STEP)
  }
  if (k0 < GEMM_K) {
    LOAD_CHUNK(min(k0 + lane, GEMM_K - 1u))
    CHUNK(TAIL_STEP)
  }
  STORE_ACCUMULATORS
}
