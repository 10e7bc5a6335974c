// C[z] = A[z] B[z]^T for products of few rows (GEMM_M <= 8) against B stored [N, K]: a decode
// step's or a short decoder's rows times a wide weight (y = x W^T, a vocabulary's logits). The
// tiled GEMM would spend most of its tile on rows that do not exist and read B through shared
// memory once per tile; here LANES threads share each of COLUMNS columns n, consecutive threads
// reading consecutive vec4s (or floats) of B's row n, so B is read once and coalesced, with the
// GEMM_M rows' sums in registers; A, a few rows, comes from the caches. The lanes' sums meet in
// shared memory, and one thread a row and column adds them and calls store_c.
// Defines: LANES, COLUMNS (gemm.cpp), GEMM_M, GEMM_N, GEMM_K, A_TRANSPOSED (a stored [K, M]), VEC4
// (K a multiple of 4 and a stored [M, K]: the a4 and b4 views). Generated: uint a_offset(uint z),
// uint b_offset(uint z), void store_c(uint z, uint m, uint n, float value).
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = LANES * COLUMNS) in;

// Row m's sums of column c's lanes: LANES floats at (m COLUMNS + c) LANES.
shared float lane_sums[GEMM_M * COLUMNS * LANES];

void main() {
  const uint lane = gl_LocalInvocationID.x % LANES, column = gl_LocalInvocationID.x / LANES;
  const uint n0 = linear_workgroup() * COLUMNS, z = gl_WorkGroupID.z;
  float sums[GEMM_M];
  [[unroll]] for (uint m = 0; m < GEMM_M; ++m) sums[m] = 0.0;
  if (n0 + column < GEMM_N) {
    const uint a_base = a_offset(z), b_row = b_offset(z) + (n0 + column) * GEMM_K;
#if VEC4
    for (uint q = lane; q < GEMM_K / 4; q += LANES) {
      const vec4 b_value = b4[b_row / 4 + q];
      [[unroll]] for (uint m = 0; m < GEMM_M; ++m)
        sums[m] += dot(a4[a_base / 4 + m * (GEMM_K / 4) + q], b_value);
    }
#else
    for (uint k = lane; k < GEMM_K; k += LANES) {
      const float b_value = b[b_row + k];
#if A_TRANSPOSED
      [[unroll]] for (uint m = 0; m < GEMM_M; ++m) sums[m] += a[a_base + k * GEMM_M + m] * b_value;
#else
      [[unroll]] for (uint m = 0; m < GEMM_M; ++m) sums[m] += a[a_base + m * GEMM_K + k] * b_value;
#endif
    }
#endif
  }
  [[unroll]] for (uint m = 0; m < GEMM_M; ++m)
    lane_sums[(m * COLUMNS + column) * LANES + lane] = sums[m];
  barrier();
  const uint sum_index = gl_LocalInvocationID.x;
  if (sum_index < GEMM_M * COLUMNS) {
    const uint m = sum_index / COLUMNS, n = n0 + sum_index % COLUMNS;
    float total = 0.0;
    // Starting at a different lane per thread spreads the threads' reads over the banks.
    for (uint l = 0; l < LANES; ++l)
      total += lane_sums[sum_index * LANES + (l + sum_index) % LANES];
    if (n < GEMM_N) store_c(z, m, n, total);
  }
}
