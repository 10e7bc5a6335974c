// Tiled SIMT f32 GEMM, one batch entry per workgroup z: C[M, N] = op(A) op(B) where op
// transposes when TRANSPOSE_A / TRANSPOSE_B is 1. Each workgroup computes a TILE x TILE block of
// C; each thread a WORK x WORK sub-block strided by 16 so shared-memory reads do not conflict.
// Defines: M, N, K, TRANSPOSE_A, TRANSPOSE_B, WORK (2, 4 or 8), TILE_K.
// Generated: a_offset(batch), b_offset(batch), and store_c(batch, row, col, value), which writes
// one element of C (and applies any fused epilogue); called only with in-range row and col.
#define THREADS_PER_SIDE 16
#define TILE (THREADS_PER_SIDE * WORK)

layout(local_size_x = 256) in;

shared float tile_a[TILE_K][TILE];
shared float tile_b[TILE_K][TILE];

float load_a(uint base, uint m, uint k) {
  if (m >= M || k >= K) return 0.0;
#if TRANSPOSE_A
  return a[base + k * M + m];
#else
  return a[base + m * K + k];
#endif
}

float load_b(uint base, uint k, uint n) {
  if (k >= K || n >= N) return 0.0;
#if TRANSPOSE_B
  return b[base + n * K + k];
#else
  return b[base + k * N + n];
#endif
}

void main() {
  uint batch = gl_WorkGroupID.z;
  uint row0 = gl_WorkGroupID.y * TILE;
  uint col0 = gl_WorkGroupID.x * TILE;
  uint thread = gl_LocalInvocationID.x;
  uint thread_row = thread / THREADS_PER_SIDE;
  uint thread_col = thread % THREADS_PER_SIDE;
  uint base_a = a_offset(batch);
  uint base_b = b_offset(batch);

  float accumulator[WORK][WORK];
  for (uint i = 0; i < WORK; ++i)
    for (uint j = 0; j < WORK; ++j) accumulator[i][j] = 0.0;

  for (uint k0 = 0; k0 < K; k0 += TILE_K) {
    for (uint e = thread; e < TILE * TILE_K; e += 256) {
#if TRANSPOSE_A
      uint mm = e % TILE, kk = e / TILE;
#else
      uint mm = e / TILE_K, kk = e % TILE_K;
#endif
      tile_a[kk][mm] = load_a(base_a, row0 + mm, k0 + kk);
    }
    for (uint e = thread; e < TILE * TILE_K; e += 256) {
#if TRANSPOSE_B
      uint nn = e / TILE_K, kk = e % TILE_K;
#else
      uint nn = e % TILE, kk = e / TILE;
#endif
      tile_b[kk][nn] = load_b(base_b, k0 + kk, col0 + nn);
    }
    barrier();
    for (uint kk = 0; kk < TILE_K; ++kk) {
      float a_values[WORK];
      float b_values[WORK];
      for (uint i = 0; i < WORK; ++i) a_values[i] = tile_a[kk][thread_row + i * THREADS_PER_SIDE];
      for (uint j = 0; j < WORK; ++j) b_values[j] = tile_b[kk][thread_col + j * THREADS_PER_SIDE];
      for (uint i = 0; i < WORK; ++i)
        for (uint j = 0; j < WORK; ++j) accumulator[i][j] += a_values[i] * b_values[j];
    }
    barrier();
  }

  for (uint i = 0; i < WORK; ++i) {
    uint row = row0 + thread_row + i * THREADS_PER_SIDE;
    if (row >= M) continue;
    for (uint j = 0; j < WORK; ++j) {
      uint col = col0 + thread_col + j * THREADS_PER_SIDE;
      if (col < N) store_c(batch, row, col, accumulator[i][j]);
    }
  }
}
