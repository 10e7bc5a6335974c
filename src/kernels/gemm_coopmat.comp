// GEMM on cooperative matrices (tensor cores), the `fast` precision path, shared by matmul and
// the convolutions: C[GEMM_M, GEMM_N] = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] for entry
// gl_WorkGroupID.z. Operands are read as f32 through the generated load functions, rounded to
// f16 into shared memory and multiplied on 16 x 8 x 16 fragments with f32 accumulators.
// A workgroup of WARPS_M x WARPS_N subgroups (32 invocations each) computes a BLOCK_M x BLOCK_N
// block of C; each subgroup a FRAGS_M x FRAGS_N grid of 16 x 8 accumulator fragments. K advances
// in slices of BLOCK_K: while the subgroups multiply one slice out of shared memory, every
// invocation already holds the next slice's values in registers (one barrier pair per slice).
// Results leave through a per-subgroup staging fragment in shared memory, so every element is
// written by store_c (which bounds nothing: rows and columns past the edge are skipped here).
// Defines: GEMM_M, GEMM_N, GEMM_K, WARPS_M, WARPS_N, FRAGS_M, FRAGS_N, BLOCK_K, A_M_CONTIGUOUS
// (consecutive m of A are adjacent in memory, else consecutive k), B_K_CONTIGUOUS (likewise
// for B: k adjacent, else n), VECTOR_LOADS (every block is whole: load four adjacent elements
// at a time through load_a4 / load_b4).
// Generated: float load_a(uint z, uint m, uint k), float load_b(uint z, uint k, uint n),
// void store_c(uint z, uint m, uint n, float value), and with VECTOR_LOADS
// vec4 load_a4(uint z, uint m, uint k), vec4 load_b4(uint z, uint k, uint n).
// Loops over fragments are unrolled so that fragment arrays stay in registers.
// A (16 x 16) and B (16 x 8) fragments have different shapes on purpose: the SPIR-V rewrite to
// SPV_KHR_cooperative_matrix infers each matrix type's use from its role.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

#define FRAG_M 16
#define FRAG_N 8
#define FRAG_K 16
#define BLOCK_M (WARPS_M * FRAGS_M * FRAG_M)
#define BLOCK_N (WARPS_N * FRAGS_N * FRAG_N)
#define THREADS (WARPS_M * WARPS_N * 32)
// Rows padded by 8 halves (16 bytes): fragment loads stay 16-byte aligned and consecutive rows
// start in different shared-memory banks.
#define A_STRIDE (BLOCK_K + 8)
#define B_STRIDE (BLOCK_N + 8)
#define A_PER_THREAD (BLOCK_M * BLOCK_K / THREADS)
#define B_PER_THREAD (BLOCK_K * BLOCK_N / THREADS)

layout(local_size_x = THREADS) in;

shared float16_t tile_a[BLOCK_M * A_STRIDE];
shared float16_t tile_b[BLOCK_K * B_STRIDE];
shared float staging[WARPS_M * WARPS_N * FRAG_M * FRAG_N];

#if VECTOR_LOADS
#define A_VECTORS (A_PER_THREAD / 4)
#define B_VECTORS (B_PER_THREAD / 4)
vec4 a_next[A_VECTORS];
vec4 b_next[B_VECTORS];

// Vector v of a tile, as the (row, column) of its first element; its four elements run along
// the contiguous index.
uvec2 a_vector(uint v) {  // (m, k) within the block
#if A_M_CONTIGUOUS
  return uvec2((v * 4) % BLOCK_M, (v * 4) / BLOCK_M);
#else
  return uvec2((v * 4) / BLOCK_K, (v * 4) % BLOCK_K);
#endif
}

uvec2 b_vector(uint v) {  // (k, n) within the block
#if B_K_CONTIGUOUS
  return uvec2((v * 4) % BLOCK_K, (v * 4) / BLOCK_K);
#else
  return uvec2((v * 4) / BLOCK_N, (v * 4) % BLOCK_N);
#endif
}

void fetch_slice(uint z, uint row0, uint col0, uint k0, uint thread) {
  [[unroll]] for (uint i = 0; i < A_VECTORS; ++i) {
    uvec2 mk = a_vector(thread + i * THREADS);
    a_next[i] = load_a4(z, row0 + mk.x, k0 + mk.y);
  }
  [[unroll]] for (uint i = 0; i < B_VECTORS; ++i) {
    uvec2 kn = b_vector(thread + i * THREADS);
    b_next[i] = load_b4(z, k0 + kn.x, col0 + kn.y);
  }
}

void store_slice(uint thread) {
  [[unroll]] for (uint i = 0; i < A_VECTORS; ++i) {
    uvec2 mk = a_vector(thread + i * THREADS);
    f16vec4 halves = f16vec4(a_next[i]);
    [[unroll]] for (uint c = 0; c < 4; ++c) {
#if A_M_CONTIGUOUS
      tile_a[(mk.x + c) * A_STRIDE + mk.y] = halves[c];
#else
      tile_a[mk.x * A_STRIDE + mk.y + c] = halves[c];
#endif
    }
  }
  [[unroll]] for (uint i = 0; i < B_VECTORS; ++i) {
    uvec2 kn = b_vector(thread + i * THREADS);
    f16vec4 halves = f16vec4(b_next[i]);
    [[unroll]] for (uint c = 0; c < 4; ++c) {
#if B_K_CONTIGUOUS
      tile_b[(kn.x + c) * B_STRIDE + kn.y] = halves[c];
#else
      tile_b[kn.x * B_STRIDE + kn.y + c] = halves[c];
#endif
    }
  }
}
#else
float a_next[A_PER_THREAD];
float b_next[B_PER_THREAD];

// Element e of a tile, in the order that makes consecutive invocations read adjacent memory.
uvec2 a_element(uint e) {  // (m, k) within the block
#if A_M_CONTIGUOUS
  return uvec2(e % BLOCK_M, e / BLOCK_M);
#else
  return uvec2(e / BLOCK_K, e % BLOCK_K);
#endif
}

uvec2 b_element(uint e) {  // (k, n) within the block
#if B_K_CONTIGUOUS
  return uvec2(e % BLOCK_K, e / BLOCK_K);
#else
  return uvec2(e / BLOCK_N, e % BLOCK_N);
#endif
}

void fetch_slice(uint z, uint row0, uint col0, uint k0, uint thread) {
  [[unroll]] for (uint i = 0; i < A_PER_THREAD; ++i) {
    uvec2 mk = a_element(thread + i * THREADS);
    uint m = row0 + mk.x, k = k0 + mk.y;
    a_next[i] = (m < GEMM_M && k < GEMM_K) ? load_a(z, m, k) : 0.0;
  }
  [[unroll]] for (uint i = 0; i < B_PER_THREAD; ++i) {
    uvec2 kn = b_element(thread + i * THREADS);
    uint k = k0 + kn.x, n = col0 + kn.y;
    b_next[i] = (k < GEMM_K && n < GEMM_N) ? load_b(z, k, n) : 0.0;
  }
}

void store_slice(uint thread) {
  [[unroll]] for (uint i = 0; i < A_PER_THREAD; ++i) {
    uvec2 mk = a_element(thread + i * THREADS);
    tile_a[mk.x * A_STRIDE + mk.y] = float16_t(a_next[i]);
  }
  [[unroll]] for (uint i = 0; i < B_PER_THREAD; ++i) {
    uvec2 kn = b_element(thread + i * THREADS);
    tile_b[kn.x * B_STRIDE + kn.y] = float16_t(b_next[i]);
  }
}
#endif

void main() {
  uint z = gl_WorkGroupID.z;
  uint row0 = gl_WorkGroupID.y * BLOCK_M;
  uint col0 = gl_WorkGroupID.x * BLOCK_N;
  uint thread = gl_LocalInvocationID.x;
  uint warp = thread / 32;
  uint lane = thread % 32;
  uint warp_row = (warp % WARPS_M) * FRAGS_M * FRAG_M;
  uint warp_col = (warp / WARPS_M) * FRAGS_N * FRAG_N;

  fcoopmatNV<32, gl_ScopeSubgroup, FRAG_M, FRAG_N> accumulators[FRAGS_M][FRAGS_N];
  [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
    [[unroll]] for (uint j = 0; j < FRAGS_N; ++j)
      accumulators[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, FRAG_M, FRAG_N>(0.0);

  fetch_slice(z, row0, col0, 0, thread);
  for (uint k0 = 0; k0 < GEMM_K; k0 += BLOCK_K) {
    barrier();  // the previous slice has been read out of shared memory
    store_slice(thread);
    barrier();
    if (k0 + BLOCK_K < GEMM_K) fetch_slice(z, row0, col0, k0 + BLOCK_K, thread);
    [[unroll]] for (uint kk = 0; kk < BLOCK_K; kk += FRAG_K) {
      fcoopmatNV<16, gl_ScopeSubgroup, FRAG_M, FRAG_K> a_fragments[FRAGS_M];
      fcoopmatNV<16, gl_ScopeSubgroup, FRAG_K, FRAG_N> b_fragments[FRAGS_N];
      [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
        coopMatLoadNV(a_fragments[i], tile_a, (warp_row + i * FRAG_M) * A_STRIDE + kk, A_STRIDE,
                      false);
      [[unroll]] for (uint j = 0; j < FRAGS_N; ++j)
        coopMatLoadNV(b_fragments[j], tile_b, kk * B_STRIDE + warp_col + j * FRAG_N, B_STRIDE,
                      false);
      [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
        [[unroll]] for (uint j = 0; j < FRAGS_N; ++j)
          accumulators[i][j] = coopMatMulAddNV(a_fragments[i], b_fragments[j], accumulators[i][j]);
    }
  }

  uint staged = warp * FRAG_M * FRAG_N;
  [[unroll]] for (uint i = 0; i < FRAGS_M; ++i) {
    [[unroll]] for (uint j = 0; j < FRAGS_N; ++j) {
      coopMatStoreNV(accumulators[i][j], staging, staged, FRAG_N, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (uint e = lane; e < FRAG_M * FRAG_N; e += 32) {
        uint row = row0 + warp_row + i * FRAG_M + e / FRAG_N;
        uint col = col0 + warp_col + j * FRAG_N + e % FRAG_N;
        if (row < GEMM_M && col < GEMM_N) store_c(z, row, col, staging[staged + e]);
      }
      subgroupBarrier();  // every lane has read the fragment before the next one lands
    }
  }
}
