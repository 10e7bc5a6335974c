// GEMM for CPU Vulkan devices (Lavapipe), shared by matmul and the convolution kernels:
// C[GEMM_M, GEMM_N] = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] for entry gl_WorkGroupID.z (a matmul
// batch or a convolution group). llvmpipe runs the LANES invocations of a subgroup as the lanes
// of one SIMD register, turns barriers into coroutine switches and performs every buffer load
// lane by lane, so the cost that matters is loads per multiply-add. Hence: one subgroup per
// workgroup, no shared memory, no barriers; each invocation keeps a ROWS x COLS block of C in
// registers. Rows are the same for every lane, so the A values a step needs are equal across
// lanes: each lane loads a different k of A once per LANES steps and subgroupBroadcast hands
// the value to all lanes (a register extract, not a load). Columns differ per lane (column
// col0 + lane + j * LANES), so every B load is a distinct value, reused ROWS times.
// Defines: LANES (== the subgroup size), ROWS, COLS, GEMM_M, GEMM_N, GEMM_K.
// Generated: float load_a(uint z, uint m, uint k), float load_b(uint z, uint k, uint n),
// void store_c(uint z, uint m, uint n, float value); m, n and k passed in are always in range.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = LANES) in;

// One k step: B values for this lane's columns, then a rank-1 update with broadcast A values.
// KK must be a literal (subgroupBroadcast takes a constant lane index).
#define STEP(KK)                                                                  \
  {                                                                               \
    uint k = k0 + KK;                                                             \
    float b_values[COLS];                                                         \
    [[unroll]] for (uint j = 0u; j < COLS; ++j) b_values[j] = load_b(z, k, columns[j]); \
    [[unroll]] for (uint i = 0u; i < ROWS; ++i) {                                 \
      float a_value = subgroupBroadcast(chunk[i], KK);                            \
      [[unroll]] for (uint j = 0u; j < COLS; ++j) accumulator[i][j] += a_value * b_values[j]; \
    }                                                                             \
  }
// The last, partial chunk skips the steps past GEMM_K (the condition is uniform, so every lane
// still takes part in each broadcast).
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
  // no lane ever leaves the subgroup's broadcasts.
  uint rows[ROWS];
  [[unroll]] for (uint i = 0u; i < ROWS; ++i) rows[i] = min(row0 + i, GEMM_M - 1u);
  uint columns[COLS];
  [[unroll]] for (uint j = 0u; j < COLS; ++j) columns[j] = min(col0 + j * LANES, GEMM_N - 1u);

  float accumulator[ROWS][COLS];
  [[unroll]] for (uint i = 0u; i < ROWS; ++i)
    [[unroll]] for (uint j = 0u; j < COLS; ++j) accumulator[i][j] = 0.0;

  const uint full_end = GEMM_K - GEMM_K % LANES;
  uint k0 = 0u;
  for (; k0 < full_end; k0 += LANES) {
    float chunk[ROWS];
    [[unroll]] for (uint i = 0u; i < ROWS; ++i) chunk[i] = load_a(z, rows[i], k0 + lane);
    CHUNK(STEP)
  }
  if (k0 < GEMM_K) {
    uint k_lane = min(k0 + lane, GEMM_K - 1u);
    float chunk[ROWS];
    [[unroll]] for (uint i = 0u; i < ROWS; ++i) chunk[i] = load_a(z, rows[i], k_lane);
    CHUNK(TAIL_STEP)
  }

  [[unroll]] for (uint i = 0u; i < ROWS; ++i) {
    if (row0 + i >= GEMM_M) break;
    [[unroll]] for (uint j = 0u; j < COLS; ++j) {
      if (col0 + j * LANES < GEMM_N) store_c(z, row0 + i, col0 + j * LANES, accumulator[i][j]);
    }
  }
}
