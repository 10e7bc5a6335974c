// Implicit GEMM shared by the convolution forward, data-gradient and weight-gradient kernels:
// C[GEMM_M, GEMM_N] = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] for convolution group
// gl_WorkGroupID.z, where A and B are never materialised: the generated load_a / load_b
// compute an element from the NCHW tensors (zero for padding taps) and store_c scatters the
// result back to NCHW. Each workgroup owns one TILE_M x TILE_N block of C and loops over all of
// GEMM_K, so every output is written once by one thread: deterministic, no atomics.
// Defines: GEMM_M, GEMM_N, GEMM_K, THREADS_M, THREADS_N, WORK_M, WORK_N, TILE_K,
// A_K_FASTEST / B_K_FASTEST (1 when consecutive k are adjacent in memory, so tile loads
// coalesce), M_FASTEST (1 when consecutive m are adjacent in C, so stores coalesce).
// Generated: float load_a(uint group, uint m, uint k), float load_b(uint group, uint k, uint n),
// void store_c(uint group, uint m, uint n, float value).
#define TILE_M (THREADS_M * WORK_M)
#define TILE_N (THREADS_N * WORK_N)
#define THREADS (THREADS_M * THREADS_N)

layout(local_size_x = THREADS) in;

shared float tile_a[TILE_K][TILE_M];
shared float tile_b[TILE_K][TILE_N];

void main() {
  uint group = gl_WorkGroupID.z;
  uint row0 = gl_WorkGroupID.y * TILE_M;
  uint col0 = gl_WorkGroupID.x * TILE_N;
  uint thread = gl_LocalInvocationID.x;
#if M_FASTEST
  uint thread_row = thread % THREADS_M;
  uint thread_col = thread / THREADS_M;
#else
  uint thread_col = thread % THREADS_N;
  uint thread_row = thread / THREADS_N;
#endif

  float accumulator[WORK_M][WORK_N];
  for (uint i = 0u; i < WORK_M; ++i)
    for (uint j = 0u; j < WORK_N; ++j) accumulator[i][j] = 0.0;

  for (uint k0 = 0u; k0 < GEMM_K; k0 += TILE_K) {
    for (uint e = thread; e < TILE_M * TILE_K; e += THREADS) {
#if A_K_FASTEST
      uint mm = e / TILE_K, kk = e % TILE_K;
#else
      uint mm = e % TILE_M, kk = e / TILE_M;
#endif
      uint m = row0 + mm, k = k0 + kk;
      float value = 0.0;
      if (m < GEMM_M && k < GEMM_K) value = load_a(group, m, k);
      tile_a[kk][mm] = value;
    }
    for (uint e = thread; e < TILE_N * TILE_K; e += THREADS) {
#if B_K_FASTEST
      uint nn = e / TILE_K, kk = e % TILE_K;
#else
      uint nn = e % TILE_N, kk = e / TILE_N;
#endif
      uint n = col0 + nn, k = k0 + kk;
      float value = 0.0;
      if (n < GEMM_N && k < GEMM_K) value = load_b(group, k, n);
      tile_b[kk][nn] = value;
    }
    barrier();
    for (uint kk = 0u; kk < TILE_K; ++kk) {
      float a_values[WORK_M];
      float b_values[WORK_N];
      for (uint i = 0u; i < WORK_M; ++i) a_values[i] = tile_a[kk][thread_row + i * THREADS_M];
      for (uint j = 0u; j < WORK_N; ++j) b_values[j] = tile_b[kk][thread_col + j * THREADS_N];
      for (uint i = 0u; i < WORK_M; ++i)
        for (uint j = 0u; j < WORK_N; ++j) accumulator[i][j] += a_values[i] * b_values[j];
    }
    barrier();
  }

  for (uint i = 0u; i < WORK_M; ++i) {
    uint m = row0 + thread_row + i * THREADS_M;
    if (m >= GEMM_M) continue;
    for (uint j = 0u; j < WORK_N; ++j) {
      uint n = col0 + thread_col + j * THREADS_N;
      if (n < GEMM_N) store_c(group, m, n, accumulator[i][j]);
    }
  }
}
