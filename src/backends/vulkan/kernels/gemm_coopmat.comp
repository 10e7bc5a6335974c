// GEMM on cooperative matrices (tensor cores), the `fast` precision path, shared by matmul and
// the convolutions: C[GEMM_M, GEMM_N] = A[GEMM_M, GEMM_K] B[GEMM_K, GEMM_N] for entry
// gl_WorkGroupID.z. Operands are read as f32 through the generated load functions (or as f16,
// HALF_A_UNITS, HALF_B_UNITS), rounded to f16 into shared memory and multiplied on 16 x 8 x 16
// fragments with f32 accumulators.
// A workgroup of WARPS_M x WARPS_N subgroups (32 invocations each) computes a BLOCK_M x BLOCK_N
// block of C; each subgroup a FRAGS_M x FRAGS_N grid of 16 x 8 (BFLOAT16_FRAGMENTS: 16 x 16)
// accumulator fragments. K advances
// in slices of BLOCK_K through two shared slots: while the subgroups multiply the slice in one
// slot, every invocation holds its part of the next PREFETCH_SLICES (1 or 2) slices in
// registers, and stores the next one into the other slot after its multiplies, so one barrier
// per slice suffices.
// Shared tiles keep each operand's contiguous index contiguous: an invocation reads eight
// adjacent elements and stores them as one 16-byte uvec4 of halves, and an operand contiguous
// along the "wrong" index (A along m, B along k) is read as column-major fragments instead of
// being transposed on its way in.
// Results leave through a per-subgroup staging fragment in shared memory, so every element is
// written by store_c (which bounds nothing: rows and columns past the edge are skipped here);
// with DIRECT_STORE (C is the row-major f32 product itself, N a multiple of 4, so every fragment
// starts 16-byte aligned) a fragment wholly inside C is stored to it straight away.
// Defines: GEMM_M, GEMM_N, GEMM_K, WARPS_M, WARPS_N, FRAGS_M, FRAGS_N, BLOCK_K (a multiple of
// 16), A_M_CONTIGUOUS (consecutive m of A are adjacent in memory, else consecutive k),
// B_K_CONTIGUOUS (likewise for B: k adjacent, else n), VECTOR_A and VECTOR_B (load four adjacent
// elements of that operand at a time through load_a4 / load_b4: its contiguous extent is a
// multiple of 4, so a vec4 lies wholly inside or outside each edge), WHOLE_BLOCKS (no block
// reaches past an edge, so loads need no bounds), PREFETCH_SLICES, DIRECT_STORE (the binding c
// holds C row-major, entry after entry), HALF_A_UNITS and HALF_B_UNITS (that
// operand is f16 in memory and its contiguous extent a multiple of 8: each unit of 8 halves is
// read as one uvec4 through load_a8 / load_b8 and stored as it is, without the f32 round trip;
// each operand independently), BFLOAT16_FRAGMENTS (below). The lowering
// (gemm_coopmat.cpp) makes each tile's units a multiple of THREADS.
// Generated: float load_a(uint z, uint m, uint k), float load_b(uint z, uint k, uint n),
// void store_c(uint z, uint m, uint n, float value), with VECTOR_A
// vec4 load_a4(uint z, uint m, uint k), with VECTOR_B vec4 load_b4(uint z, uint k, uint n), and
// with HALF_A_UNITS uvec4 load_a8(uint z, uint m, uint k), with HALF_B_UNITS
// uvec4 load_b8(uint z, uint k, uint n).
// Loops over fragments are unrolled so that fragment arrays stay in registers.
// A (16 x 16) and B (16 x 8) fragments have different shapes on purpose: the SPIR-V rewrite to
// SPV_KHR_cooperative_matrix infers each matrix type's use from its role. BFLOAT16_FRAGMENTS
// (bfloat16 operands, which devices offer as 16 x 16 x 16 only: spirv_bfloat16.cpp) makes B and
// the accumulators 16 columns wide; their column count is then a specialization constant of
// value 16, a different id from A's 16, so that the types of A and B still differ.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

#define FRAG_M 16
#define FRAG_K 16
#if BFLOAT16_FRAGMENTS
#define FRAG_N 16
layout(constant_id = 0) const uint FRAGMENT_COLUMNS = 16;
#else
#define FRAG_N 8
#define FRAGMENT_COLUMNS FRAG_N
#endif
#define BLOCK_M (WARPS_M * FRAGS_M * FRAG_M)
#define BLOCK_N (WARPS_N * FRAGS_N * FRAG_N)
#define THREADS (WARPS_M * WARPS_N * 32)
#define SLICES ((GEMM_K + BLOCK_K - 1) / BLOCK_K)

// A tile row runs along the operand's contiguous index, in units of 8 halves (one uvec4).
#if A_M_CONTIGUOUS
#define A_ROWS BLOCK_K
#define A_ROW_UNITS (BLOCK_M / 8)
#else
#define A_ROWS BLOCK_M
#define A_ROW_UNITS (BLOCK_K / 8)
#endif
#if B_K_CONTIGUOUS
#define B_ROWS BLOCK_N
#define B_ROW_UNITS (BLOCK_K / 8)
#else
#define B_ROWS BLOCK_K
#define B_ROW_UNITS (BLOCK_N / 8)
#endif
// Rows padded by one unit: with an odd stride the 8 rows (16 bytes each) that a fragment load
// reads at once fall in different shared-memory banks.
#define A_STRIDE (A_ROW_UNITS + 1)
#define B_STRIDE (B_ROW_UNITS + 1)
#define A_SLOT (A_ROWS * A_STRIDE)
#define B_SLOT (B_ROWS * B_STRIDE)
#define A_UNITS (A_ROWS * A_ROW_UNITS / THREADS)  // per invocation and slice
#define B_UNITS (B_ROWS * B_ROW_UNITS / THREADS)

layout(local_size_x = THREADS) in;

shared uvec4 tile_a[2 * A_SLOT];
shared uvec4 tile_b[2 * B_SLOT];
shared float staging[WARPS_M * WARPS_N * FRAG_M * FRAG_N];

// The next slice, unit i of an invocation in elements [8 i, 8 i + 8): as 8 halves, or as two
// vec4s to round.
#if HALF_A_UNITS
uvec4 a_next[PREFETCH_SLICES][A_UNITS];
#else
vec4 a_next[PREFETCH_SLICES][2 * A_UNITS];
#endif
#if HALF_B_UNITS
uvec4 b_next[PREFETCH_SLICES][B_UNITS];
#else
vec4 b_next[PREFETCH_SLICES][2 * B_UNITS];
#endif
fcoopmatNV<32, gl_ScopeSubgroup, FRAG_M, FRAGMENT_COLUMNS> accumulators[FRAGS_M][FRAGS_N];

// Steps of one element along each operand's contiguous index, as (m, k) and (k, n).
#define A_ALONG uvec2(A_M_CONTIGUOUS, 1 - A_M_CONTIGUOUS)
#define B_ALONG uvec2(B_K_CONTIGUOUS, 1 - B_K_CONTIGUOUS)

// Unit v of a tile as (row, unit within the row). Consecutive invocations take consecutive units
// of a row, so they read adjacent memory. A 16-byte store is served 8 invocations at a time;
// where a row is shorter than 8 units those 8 take rows `row_units` apart, which the odd
// stride puts in disjoint banks (adjacent rows would overlap).
uvec2 tile_unit(uint v, uint row_units) {
  if (row_units >= 8 || 8 % row_units != 0) return uvec2(v / row_units, v % row_units);
  uint group = v / (8 * row_units), wave = (v / 8) % row_units, lane = v % 8;
  return uvec2(group * 8 + wave + row_units * (lane / row_units), lane % row_units);
}

// (m, k) within the block of unit `unit`'s first element, and (k, n) for B.
uvec2 a_origin(uvec2 unit) {
#if A_M_CONTIGUOUS
  return uvec2(unit.y * 8, unit.x);
#else
  return uvec2(unit.x, unit.y * 8);
#endif
}

uvec2 b_origin(uvec2 unit) {
#if B_K_CONTIGUOUS
  return uvec2(unit.y * 8, unit.x);
#else
  return uvec2(unit.x, unit.y * 8);
#endif
}

// Offsets, in units, of element (m, k) of an A slice and (k, n) of a B slice within their slot;
// m and k (k and n) are multiples of 8 along the contiguous index.
uint a_offset_in_slot(uint m, uint k) {
#if A_M_CONTIGUOUS
  return k * A_STRIDE + m / 8;
#else
  return m * A_STRIDE + k / 8;
#endif
}

uint b_offset_in_slot(uint k, uint n) {
#if B_K_CONTIGUOUS
  return n * B_STRIDE + k / 8;
#else
  return k * B_STRIDE + n / 8;
#endif
}

// Four elements of A from (m, k) along its contiguous index (zero past the edges).
vec4 read_a4(uint z, uvec2 mk) {
#if VECTOR_A && WHOLE_BLOCKS
  return load_a4(z, mk.x, mk.y);
#elif VECTOR_A
  vec4 values = vec4(0.0);
  if (mk.x < GEMM_M && mk.y < GEMM_K) values = load_a4(z, mk.x, mk.y);
  return values;
#else
  vec4 values;
  [[unroll]] for (uint c = 0; c < 4; ++c) {
    uvec2 at = mk + c * A_ALONG;
    values[c] = at.x < GEMM_M && at.y < GEMM_K ? load_a(z, at.x, at.y) : 0.0;
  }
  return values;
#endif
}

vec4 read_b4(uint z, uvec2 kn) {
#if VECTOR_B && WHOLE_BLOCKS
  return load_b4(z, kn.x, kn.y);
#elif VECTOR_B
  vec4 values = vec4(0.0);
  if (kn.x < GEMM_K && kn.y < GEMM_N) values = load_b4(z, kn.x, kn.y);
  return values;
#else
  vec4 values;
  [[unroll]] for (uint c = 0; c < 4; ++c) {
    uvec2 at = kn + c * B_ALONG;
    values[c] = at.x < GEMM_K && at.y < GEMM_N ? load_b(z, at.x, at.y) : 0.0;
  }
  return values;
#endif
}

uvec4 halves(vec4 low, vec4 high) {
  return uvec4(packFloat2x16(f16vec2(low.xy)), packFloat2x16(f16vec2(low.zw)),
               packFloat2x16(f16vec2(high.xy)), packFloat2x16(f16vec2(high.zw)));
}

// Eight halves of A from (m, k) along its contiguous index (zero past the edges, which a unit
// never straddles), and of B from (k, n).
#if HALF_A_UNITS
uvec4 read_a8(uint z, uvec2 mk) {
#if WHOLE_BLOCKS
  return load_a8(z, mk.x, mk.y);
#else
  return mk.x < GEMM_M && mk.y < GEMM_K ? load_a8(z, mk.x, mk.y) : uvec4(0);
#endif
}
#endif

#if HALF_B_UNITS
uvec4 read_b8(uint z, uvec2 kn) {
#if WHOLE_BLOCKS
  return load_b8(z, kn.x, kn.y);
#else
  return kn.x < GEMM_K && kn.y < GEMM_N ? load_b8(z, kn.x, kn.y) : uvec4(0);
#endif
}
#endif

void fetch_slice(uint z, uint row0, uint col0, uint k0, uint thread, uint set) {
  [[unroll]] for (uint i = 0; i < A_UNITS; ++i) {
    uvec2 mk = uvec2(row0, k0) + a_origin(tile_unit(thread + i * THREADS, A_ROW_UNITS));
#if HALF_A_UNITS
    a_next[set][i] = read_a8(z, mk);
#else
    a_next[set][2 * i] = read_a4(z, mk);
    a_next[set][2 * i + 1] = read_a4(z, mk + 4 * A_ALONG);
#endif
  }
  [[unroll]] for (uint i = 0; i < B_UNITS; ++i) {
    uvec2 kn = uvec2(k0, col0) + b_origin(tile_unit(thread + i * THREADS, B_ROW_UNITS));
#if HALF_B_UNITS
    b_next[set][i] = read_b8(z, kn);
#else
    b_next[set][2 * i] = read_b4(z, kn);
    b_next[set][2 * i + 1] = read_b4(z, kn + 4 * B_ALONG);
#endif
  }
}

void store_slice(uint slot, uint thread, uint set) {
  [[unroll]] for (uint i = 0; i < A_UNITS; ++i) {
    uvec2 unit = tile_unit(thread + i * THREADS, A_ROW_UNITS);
#if HALF_A_UNITS
    tile_a[slot * A_SLOT + unit.x * A_STRIDE + unit.y] = a_next[set][i];
#else
    tile_a[slot * A_SLOT + unit.x * A_STRIDE + unit.y] =
        halves(a_next[set][2 * i], a_next[set][2 * i + 1]);
#endif
  }
  [[unroll]] for (uint i = 0; i < B_UNITS; ++i) {
    uvec2 unit = tile_unit(thread + i * THREADS, B_ROW_UNITS);
#if HALF_B_UNITS
    tile_b[slot * B_SLOT + unit.x * B_STRIDE + unit.y] = b_next[set][i];
#else
    tile_b[slot * B_SLOT + unit.x * B_STRIDE + unit.y] =
        halves(b_next[set][2 * i], b_next[set][2 * i + 1]);
#endif
  }
}

// Multiplies the slice in `slot` into the accumulators.
void multiply_slice(uint slot, uint warp_row, uint warp_col) {
  [[unroll]] for (uint kk = 0; kk < BLOCK_K; kk += FRAG_K) {
    fcoopmatNV<16, gl_ScopeSubgroup, FRAG_M, FRAG_K> a_fragments[FRAGS_M];
    [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
      coopMatLoadNV(a_fragments[i], tile_a,
                    slot * A_SLOT + a_offset_in_slot(warp_row + i * FRAG_M, kk), A_STRIDE,
                    A_M_CONTIGUOUS != 0);
    // One B fragment at a time: it meets every A fragment at once, and fewer registers stay
    // live next to the accumulators and the prefetched slices.
    [[unroll]] for (uint j = 0; j < FRAGS_N; ++j) {
      fcoopmatNV<16, gl_ScopeSubgroup, FRAG_K, FRAGMENT_COLUMNS> b_fragment;
      coopMatLoadNV(b_fragment, tile_b,
                    slot * B_SLOT + b_offset_in_slot(kk, warp_col + j * FRAG_N), B_STRIDE,
                    B_K_CONTIGUOUS != 0);
      [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
        accumulators[i][j] = coopMatMulAddNV(a_fragments[i], b_fragment, accumulators[i][j]);
    }
  }
}

// One slice of the K loop with PREFETCH_SLICES register sets: the fetch of slice + PREFETCH_SLICES
// is issued before the multiplies, so that global latency hides behind them, into the set that
// held this slice (already in shared memory); the next slice's set goes to the other slot, which
// was last read before the previous barrier and is not written again until every subgroup has
// passed the barrier here.
void advance(uint z, uint row0, uint col0, uint thread, uint warp_row, uint warp_col, uint slice,
             uint set) {
  uint slot = slice % 2;
  if (slice + PREFETCH_SLICES < SLICES)
    fetch_slice(z, row0, col0, (slice + PREFETCH_SLICES) * BLOCK_K, thread, set);
  multiply_slice(slot, warp_row, warp_col);
  if (slice + 1 < SLICES) {
    store_slice(1 - slot, thread, (set + 1) % PREFETCH_SLICES);
    barrier();
  }
}

void main() {
  uint z = gl_WorkGroupID.z;
  uint row0 = gl_WorkGroupID.y * BLOCK_M;
  uint col0 = gl_WorkGroupID.x * BLOCK_N;
  uint thread = gl_LocalInvocationID.x;
  uint warp = thread / 32;
  uint lane = thread % 32;
  uint warp_row = (warp % WARPS_M) * FRAGS_M * FRAG_M;
  uint warp_col = (warp / WARPS_M) * FRAGS_N * FRAG_N;

  [[unroll]] for (uint i = 0; i < FRAGS_M; ++i)
    [[unroll]] for (uint j = 0; j < FRAGS_N; ++j)
      accumulators[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, FRAG_M, FRAGMENT_COLUMNS>(0.0);

  fetch_slice(z, row0, col0, 0, thread, 0);
  store_slice(0, thread, 0);
#if PREFETCH_SLICES == 2
  if (SLICES > 1) fetch_slice(z, row0, col0, BLOCK_K, thread, 1);
#endif
  barrier();
  // Stepping by PREFETCH_SLICES keeps every register set's index a constant.
  for (uint slice = 0; slice < SLICES; slice += PREFETCH_SLICES) {
    advance(z, row0, col0, thread, warp_row, warp_col, slice, 0);
#if PREFETCH_SLICES == 2
    if (slice + 1 < SLICES) advance(z, row0, col0, thread, warp_row, warp_col, slice + 1, 1);
#endif
  }

  uint staged = warp * FRAG_M * FRAG_N;
  [[unroll]] for (uint i = 0; i < FRAGS_M; ++i) {
    [[unroll]] for (uint j = 0; j < FRAGS_N; ++j) {
      uint fragment_row = row0 + warp_row + i * FRAG_M, fragment_col = col0 + warp_col + j * FRAG_N;
#if DIRECT_STORE
      // No `continue` here: it would keep the loops from unrolling, and the accumulators would
      // leave registers for the whole kernel.
      if (fragment_row + FRAG_M <= GEMM_M && fragment_col + FRAG_N <= GEMM_N) {
        coopMatStoreNV(accumulators[i][j], c, (z * GEMM_M + fragment_row) * GEMM_N + fragment_col,
                       GEMM_N, false);
      } else
#endif
      {
        coopMatStoreNV(accumulators[i][j], staging, staged, FRAG_N, false);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint e = lane; e < FRAG_M * FRAG_N; e += 32) {
          uint row = fragment_row + e / FRAG_N, col = fragment_col + e % FRAG_N;
          if (row < GEMM_M && col < GEMM_N) store_c(z, row, col, staging[staged + e]);
        }
        subgroupBarrier();  // every lane has read the fragment before the next one lands
      }
    }
  }
}
