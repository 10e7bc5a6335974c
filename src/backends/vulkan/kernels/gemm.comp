// Tiled SIMT f32 GEMM: C[M, N] = op(A) op(B), where op transposes when TRANSPOSE_A /
// TRANSPOSE_B is 1. Workgroup z computes batch entry z % BATCHES over all of K or, with SPLIT_K,
// over split-K range r = z / BATCHES, k in [r * K_SLICE, min(K, (r + 1) * K_SLICE)): one
// partial product (ops/k_split.hpp). The classic high-performance SGEMM structure:
// - a workgroup computes a TILE_M x TILE_N block of C, a thread WORK_M x WORK_N outputs of it:
//   WORK_M / 4 groups of 4 consecutive rows, the groups 4 * THREADS_M apart (and likewise its
//   columns), so that the fragments a thread needs per k are vec4 reads (LDS.128) from shared
//   memory;
// - both shared tiles are k-major (A transposed on the way in), TILE_K x TILE_M and
//   TILE_K x TILE_N;
// - the next K slice is fetched from global memory into registers while the current one is
//   multiplied, then stored into the other of two shared slots: one barrier per K slice;
// - global loads are vec4 wherever the operand's contiguous extent is a multiple of 4 (A_VEC4 /
//   B_VEC4, through the vec4 views a4 / b4); split-K ranges start at multiples of 16.
// Sliced K within the workgroup: a small C has too few tiles to occupy a large GPU, and a thread
// that walks all of K is then bound by the latency of its serial slices. With K_GROUPS > 1 the
// workgroup runs K_GROUPS k-groups of THREADS threads (local y); k-group g has its own two slots
// of both tiles and multiplies the K slices t * K_GROUPS + g of the workgroup's range (t = 0,
// 1, ...). Every k-group runs the same number of iterations, so the barriers stay uniform: a
// slice past the range is fetched as zeros. At the end k-groups g > 0 leave their accumulators
// in their own slots and k-group 0 adds them up and alone calls store_c, which must see each
// element once (it may apply an epilogue). K_GROUPS = 1 is the plain kernel.
// With GENERATED_LOADS (the implicit-GEMM convolutions, conv.cpp) the operands are not buffers:
// every element comes from the generated load_a(z, m, k) / load_b(z, k, n) for workgroup z, the
// tiles are filled the same way (TRANSPOSE_A / TRANSPOSE_B then say along which of its indices
// an operand is contiguous in memory), and any split-K slicing is in the load functions.
// With PREFETCH = P > 1 each thread keeps the next P slices' loads in registers instead of the
// next one, so that a slice's fetch has P slices' multiply-adds to land behind (gemm.cpp's
// prefetch_depth chooses P; MEGANEURA_GEMM_PREFETCH forces it).
// Defines: M, N, K (the operands' K extent), SPLIT_K, K_SLICE, BATCHES, TRANSPOSE_A,
// TRANSPOSE_B, TILE_M, TILE_N, WORK_M, WORK_N (multiples of 4), TILE_K, K_GROUPS, A_VEC4, B_VEC4,
// GENERATED_LOADS, JOINED_A, PAD_K_ROWS, PREFETCH, A_QUADS (A, contiguous along k, enters in
// vec4s of 4 rows at one k), A_SWIZZLE (those vec4s are swizzled instead of padded), C_VEC4 (C is the
// product itself, row-major with rows of a multiple of 4 floats, and the vec4 view c4 of it is
// bound: a thread's four adjacent outputs are one store).
// Generated: a_offset(batch), b_offset(batch), the views a4 / b4 when A_VEC4 / B_VEC4 (or
// load_a / load_b with GENERATED_LOADS), and store_c(z, row, col, value), which writes one
// element of C (and applies any fused epilogue) for workgroup z, the flat index over
// [ranges, BATCHES]; called only with in-range row and col.
#extension GL_EXT_control_flow_attributes : enable

#define THREADS_M (TILE_M / WORK_M)
#define THREADS_N (TILE_N / WORK_N)
#define THREADS (THREADS_M * THREADS_N)
#define TILE_M_VEC4 (TILE_M / 4)
#define TILE_N_VEC4 (TILE_N / 4)
// vec4s along k of one row of an operand's slice.
#define K_VEC4 (TILE_K / 4)
// A k row of a shared tile: TILE_M (TILE_N) floats, plus, with PAD_K_ROWS (where shared memory
// allows), one vec4 of padding for an operand contiguous along k, whose 4 scalar stores per vec4
// (below) then spread the K_VEC4 vec4s of a row over different banks.
#define A_ROW_VEC4 (TILE_M_VEC4 + (TRANSPOSE_A != 0 || A_SWIZZLE != 0 ? 0 : PAD_K_ROWS))
// With A_SWIZZLE instead, A's row quads (A_QUADS) land in k row k at vec4 column c ^ (k % 8):
// the 8 lanes of one 128-bit store phase, at 8 consecutive k of one column, then reach 8
// different banks without the padding, which a tile that fills shared memory has no room for.
// Readers of the tile undo it per k; since THREADS_M is a multiple of 8, the XOR stays within a
// thread's own group of rows.
#if A_SWIZZLE
#if THREADS_M % 8 != 0 || !A_QUADS
#error "A_SWIZZLE permutes the vec4 columns of A's row quads in aligned groups of 8"
#endif
#define A_COLUMN(k, column) ((column) ^ ((k) % 8))
#else
#define A_COLUMN(k, column) (column)
#endif
#define B_ROW_VEC4 (TILE_N_VEC4 + (TRANSPOSE_B != 0 ? PAD_K_ROWS : 0))
#define GROUPS_M (WORK_M / 4)
#define GROUPS_N (WORK_N / 4)
// vec4s of each operand's K slice that one thread moves from global to shared memory.
#define LOADS_A (TILE_M * TILE_K / 4 / THREADS)
#define LOADS_B (TILE_N * TILE_K / 4 / THREADS)
#if LOADS_A * THREADS * 4 != TILE_M * TILE_K || LOADS_B * THREADS * 4 != TILE_N * TILE_K
#error "every thread moves a whole number of vec4s of each slice"
#endif
#if THREADS_N % 8 != 0 || THREADS % 32 != 0
#error "warps are 4 x 8 blocks of the thread grid"
#endif
// The loops over both operands' vec4s and fragments run to the larger count, each statement
// guarded by its own. Square tiles need no guard, and leaving it out keeps their SPIR-V the
// interleaved loops the NVIDIA compiler scheduled best (one loop per operand instead ran the
// skinny products slower).
#define LOADS (LOADS_A > LOADS_B ? LOADS_A : LOADS_B)
#define GROUPS (GROUPS_M > GROUPS_N ? GROUPS_M : GROUPS_N)
#if LOADS_A == LOADS_B
#define IF_LOAD_A(l)
#define IF_LOAD_B(l)
#else
#define IF_LOAD_A(l) if ((l) < LOADS_A)
#define IF_LOAD_B(l) if ((l) < LOADS_B)
#endif
#if GROUPS_M == GROUPS_N
#define IF_GROUP_M(g)
#define IF_GROUP_N(g)
#else
#define IF_GROUP_M(g) if ((g) < GROUPS_M)
#define IF_GROUP_N(g) if ((g) < GROUPS_N)
#endif

// Invocations are numbered x first, so each warp lies within one k-group.
layout(local_size_x = THREADS, local_size_y = K_GROUPS) in;

// Slot s of k-group g is tile_a[2 * g + s] and tile_b[2 * g + s].
shared vec4 tile_a[2 * K_GROUPS][TILE_K][A_ROW_VEC4];
shared vec4 tile_b[2 * K_GROUPS][TILE_K][B_ROW_VEC4];

#if K_GROUPS > 1
// A k-group's accumulators (TILE_M * TILE_N floats) go through its own four slots
// (2 * TILE_K * (TILE_M + TILE_N) floats) when the k-groups' sums meet.
#if TILE_M * TILE_N > 2 * TILE_K * (TILE_M + TILE_N)
#error "K_GROUPS > 1 needs TILE_M * TILE_N <= 2 * TILE_K * (TILE_M + TILE_N)"
#endif
#define A_SLOT_VEC4S (TILE_K * A_ROW_VEC4)
#define B_SLOT_VEC4S (TILE_K * B_ROW_VEC4)

// Vec4 `index` of k-group `k_group`'s accumulators: its two slots of tile_a, then its two of
// tile_b, taken as one array.
void stash_partial(uint k_group, uint index, vec4 value) {
  if (index < 2 * A_SLOT_VEC4S) {
    uint slot = 2 * k_group + index / A_SLOT_VEC4S, within = index % A_SLOT_VEC4S;
    tile_a[slot][within / A_ROW_VEC4][within % A_ROW_VEC4] = value;
  } else {
    index -= 2 * A_SLOT_VEC4S;
    uint slot = 2 * k_group + index / B_SLOT_VEC4S, within = index % B_SLOT_VEC4S;
    tile_b[slot][within / B_ROW_VEC4][within % B_ROW_VEC4] = value;
  }
}

vec4 partial(uint k_group, uint index) {
  if (index < 2 * A_SLOT_VEC4S) {
    uint slot = 2 * k_group + index / A_SLOT_VEC4S, within = index % A_SLOT_VEC4S;
    return tile_a[slot][within / A_ROW_VEC4][within % A_ROW_VEC4];
  }
  index -= 2 * A_SLOT_VEC4S;
  uint slot = 2 * k_group + index / B_SLOT_VEC4S, within = index % B_SLOT_VEC4S;
  return tile_b[slot][within / B_ROW_VEC4][within % B_ROW_VEC4];
}
#endif

// Slice loads. Element e of a slice (e < TILE_M * TILE_K / 4 for A) is one vec4 of the operand:
// - an operand contiguous along m (A transposed) or n (B plain) reads 4 consecutive rows or
//   columns of one k; consecutive threads take consecutive vec4s of a k row, and the vec4 is
//   stored as it is;
// - an operand contiguous along k reads 4 consecutive k of one row or column and scatters them
//   down the k-major tile; consecutive threads take the K_VEC4 consecutive vec4s of a row, then
//   the next row, so that a warp reads 32 / K_VEC4 rows, each one contiguous run (a warp over
//   32 rows, 16 bytes of each, ran slower on every GEMM-shaped case). The padded k rows spread
//   the scalar
//   stores of a warp over the banks (at most two lanes to a bank);
// - with A_QUADS, A (contiguous along k) is read as 4 adjacent rows at one k, four scalars whose
//   vec4 is stored as it is, in one padded k row or at a swizzled column (A_SWIZZLE; gemm.cpp
//   says where).

// With JOINED_A, A has no buffer of its own: element e of its memory is a split attention's
// joined result, which the generated joined_a(e) and joined_a4(e) (four elements from a multiple
// of 4) compute from the slices' partials, bound as a (attention.cpp, join_slices_functions).
#if JOINED_A
#define A_AT(e) joined_a(e)
#define A4_AT(e) joined_a4(e)
#else
#define A_AT(e) a[e]
#define A4_AT(e) a4[(e) / 4]
#endif

// Element (m, k) of op(A) and (k, n) of op(B) for the problem at `base`: the batch entry's element
// offset or, with GENERATED_LOADS, the workgroup z. Zero unless `inside`.
float a_element(uint base, uint m, uint k, bool inside) {
  if (!inside) return 0.0;
#if GENERATED_LOADS
  return load_a(base, m, k);
#elif TRANSPOSE_A
  return A_AT(base + k * M + m);
#else
  return A_AT(base + m * K + k);
#endif
}

float b_element(uint base, uint k, uint n, bool inside) {
  if (!inside) return 0.0;
#if GENERATED_LOADS
  return load_b(base, k, n);
#elif TRANSPOSE_B
  return b[base + n * K + k];
#else
  return b[base + k * N + n];
#endif
}

#if TRANSPOSE_A
vec4 fetch_a(uint base, uint row0, uint k0, uint k_end, uint e) {
  uint k = k0 + e / TILE_M_VEC4, m = row0 + 4 * (e % TILE_M_VEC4);
  if (k >= k_end) return vec4(0.0);
#if A_VEC4
  if (m >= M) return vec4(0.0);
  return A4_AT(base + k * M + m);
#else
  return vec4(a_element(base, m, k, m < M), a_element(base, m + 1, k, m + 1 < M),
              a_element(base, m + 2, k, m + 2 < M), a_element(base, m + 3, k, m + 3 < M));
#endif
}

void stash_a(uint slot, uint e, vec4 value) {
  tile_a[slot][e / TILE_M_VEC4][e % TILE_M_VEC4] = value;
}
#elif A_QUADS
// Four adjacent rows at one k, stored as one vec4: consecutive threads take consecutive k, so a
// warp's load of each row is one contiguous run.
vec4 fetch_a(uint base, uint row0, uint k0, uint k_end, uint e) {
  uint k = k0 + e % TILE_K, m = row0 + 4 * (e / TILE_K);
  if (k >= k_end) return vec4(0.0);
  return vec4(a_element(base, m, k, m < M), a_element(base, m + 1, k, m + 1 < M),
              a_element(base, m + 2, k, m + 2 < M), a_element(base, m + 3, k, m + 3 < M));
}

void stash_a(uint slot, uint e, vec4 value) {
  tile_a[slot][e % TILE_K][A_COLUMN(e % TILE_K, e / TILE_K)] = value;
}
#else
vec4 fetch_a(uint base, uint row0, uint k0, uint k_end, uint e) {
  uint m = row0 + e / K_VEC4, k = k0 + 4 * (e % K_VEC4);
  if (m >= M) return vec4(0.0);
#if A_VEC4
  if (k >= k_end) return vec4(0.0);
  return A4_AT(base + m * K + k);
#else
  return vec4(a_element(base, m, k, k < k_end), a_element(base, m, k + 1, k + 1 < k_end),
              a_element(base, m, k + 2, k + 2 < k_end), a_element(base, m, k + 3, k + 3 < k_end));
#endif
}

void stash_a(uint slot, uint e, vec4 value) {
  uint m = e / K_VEC4, k = 4 * (e % K_VEC4);
  [[unroll]] for (uint i = 0; i < 4; ++i) tile_a[slot][k + i][m / 4][m % 4] = value[i];
}
#endif

#if TRANSPOSE_B
vec4 fetch_b(uint base, uint col0, uint k0, uint k_end, uint e) {
  uint n = col0 + e / K_VEC4, k = k0 + 4 * (e % K_VEC4);
  if (n >= N) return vec4(0.0);
#if B_VEC4
  if (k >= k_end) return vec4(0.0);
  return b4[(base + n * K + k) / 4];
#else
  return vec4(b_element(base, k, n, k < k_end), b_element(base, k + 1, n, k + 1 < k_end),
              b_element(base, k + 2, n, k + 2 < k_end), b_element(base, k + 3, n, k + 3 < k_end));
#endif
}

void stash_b(uint slot, uint e, vec4 value) {
  uint n = e / K_VEC4, k = 4 * (e % K_VEC4);
  [[unroll]] for (uint i = 0; i < 4; ++i) tile_b[slot][k + i][n / 4][n % 4] = value[i];
}
#else
vec4 fetch_b(uint base, uint col0, uint k0, uint k_end, uint e) {
  uint k = k0 + e / TILE_N_VEC4, n = col0 + 4 * (e % TILE_N_VEC4);
  if (k >= k_end) return vec4(0.0);
#if B_VEC4
  if (n >= N) return vec4(0.0);
  return b4[(base + k * N + n) / 4];
#else
  return vec4(b_element(base, k, n, n < N), b_element(base, k, n + 1, n + 1 < N),
              b_element(base, k, n + 2, n + 2 < N), b_element(base, k, n + 3, n + 3 < N));
#endif
}

void stash_b(uint slot, uint e, vec4 value) {
  tile_b[slot][e / TILE_N_VEC4][e % TILE_N_VEC4] = value;
}
#endif

// One K slice (at k, for this thread's share) from global memory into registers, from registers
// into shared slot `slot`, and the multiply-adds of the slice in shared slot `slot`.
#define FETCH_SLICE(into_a, into_b, k)                                                  \
  [[unroll]] for (uint l = 0; l < LOADS; ++l) {                                       \
    IF_LOAD_A(l) into_a[l] = fetch_a(base_a, row0, (k), k_end, thread + l * THREADS); \
    IF_LOAD_B(l) into_b[l] = fetch_b(base_b, col0, (k), k_end, thread + l * THREADS); \
  }
#define STASH_SLICE(slot, from_a, from_b)                                 \
  [[unroll]] for (uint l = 0; l < LOADS; ++l) {                         \
    IF_LOAD_A(l) stash_a((slot), thread + l * THREADS, from_a[l]);      \
    IF_LOAD_B(l) stash_b((slot), thread + l * THREADS, from_b[l]);      \
  }
#define MULTIPLY_SLOT(slot)                                                         \
  [[unroll]] for (uint kk = 0; kk < TILE_K; ++kk) {                                 \
    vec4 a_values[GROUPS_M], b_values[GROUPS_N];                                    \
    [[unroll]] for (uint g = 0; g < GROUPS; ++g) {                                  \
      IF_GROUP_M(g) a_values[g] = tile_a[(slot)][kk][g * THREADS_M + A_COLUMN(kk, thread_row)]; \
      IF_GROUP_N(g) b_values[g] = tile_b[(slot)][kk][g * THREADS_N + thread_col];   \
    }                                                                               \
    [[unroll]] for (uint g = 0; g < GROUPS_M; ++g) {                                \
      [[unroll]] for (uint i = 0; i < 4; ++i) {                                     \
        [[unroll]] for (uint h = 0; h < GROUPS_N; ++h) {                            \
          accumulator[4 * g + i][h] += a_values[g][i] * b_values[h];                \
        }                                                                           \
      }                                                                             \
    }                                                                               \
  }

void main() {
#if SPLIT_K
  uint k_begin = gl_WorkGroupID.z / BATCHES * K_SLICE;
  uint k_end = min(K, k_begin + K_SLICE);
#else
  // Constant bounds for the whole product.
  const uint k_begin = 0u, k_end = K;
#endif
  uint row0 = gl_WorkGroupID.y * TILE_M;
  uint col0 = gl_WorkGroupID.x * TILE_N;
  uint thread = gl_LocalInvocationID.x;
#if K_GROUPS > 1
  uint k_group = gl_LocalInvocationID.y;
#else
  // A constant, so that the plain kernel's addressing stays as it was.
  const uint k_group = 0u;
#endif
  // A warp of 32 is a 4 x 8 block of the THREADS_M x THREADS_N thread grid: per k it reads 4
  // distinct A vec4s and 8 distinct B vec4s, 64 and 128 bytes, one shared-memory wavefront each.
  uint warp = thread / 32, lane = thread % 32;
  uint thread_row = warp / (THREADS_N / 8) * 4 + lane / 8;
  uint thread_col = warp % (THREADS_N / 8) * 8 + lane % 8;
#if GENERATED_LOADS
  uint base_a = gl_WorkGroupID.z, base_b = gl_WorkGroupID.z;
#else
  uint batch = gl_WorkGroupID.z % BATCHES;
  uint base_a = a_offset(batch);
  uint base_b = b_offset(batch);
#endif

  // accumulator[4 * g + i][h].j is C at row 4 * (g * THREADS_M + thread_row) + i and column
  // 4 * (h * THREADS_N + thread_col) + j of the tile.
  vec4 accumulator[WORK_M][GROUPS_N];
  [[unroll]] for (uint r = 0; r < WORK_M; ++r) {
    [[unroll]] for (uint h = 0; h < GROUPS_N; ++h) accumulator[r][h] = vec4(0.0);
  }

  // Every k-group runs each round k0 of the loop, multiplying its slice at k0 + k_offset.
  uint k_offset = k_group * TILE_K;
  vec4 staged_a[LOADS_A], staged_b[LOADS_B];
  FETCH_SLICE(staged_a, staged_b, k_begin + k_offset)
#if PREFETCH > 1
  // ahead_*[d] holds slice t + 1 + ((d - t) mod PREFETCH) while slice t is multiplied.
  const uint k_step = K_GROUPS * TILE_K;
  vec4 ahead_a[PREFETCH][LOADS_A], ahead_b[PREFETCH][LOADS_B];
  [[unroll]] for (uint d = 0; d < PREFETCH; ++d) {
    FETCH_SLICE(ahead_a[d], ahead_b[d], k_begin + k_offset + (d + 1) * k_step)
  }
#endif
  uint slot = 2 * k_group;
  STASH_SLICE(slot, staged_a, staged_b)
  barrier();

#if PREFETCH > 1
  for (uint k0 = k_begin; k0 < k_end; k0 += PREFETCH * k_step) {
    [[unroll]] for (uint d = 0; d < PREFETCH; ++d) {
      uint k_this = k0 + d * k_step;
      if (k_this >= k_end) break;
      MULTIPLY_SLOT(slot)
      // Slice t + 1 goes to the other slot, whose readers the last barrier separated from
      // these writes, and its registers fetch slice t + 1 + PREFETCH.
      if (k_this + k_step < k_end) {
        STASH_SLICE(slot ^ 1, ahead_a[d], ahead_b[d])
        FETCH_SLICE(ahead_a[d], ahead_b[d], k_this + (PREFETCH + 1) * k_step + k_offset)
      }
      barrier();
      slot ^= 1;
    }
  }
#else
  for (uint k0 = k_begin; k0 < k_end; k0 += K_GROUPS * TILE_K) {
    // The next slice's global loads are in flight during this slice's multiply-adds.
    uint k_next = k0 + K_GROUPS * TILE_K;
    bool more = k_next < k_end;
    if (more) {
      FETCH_SLICE(staged_a, staged_b, k_next + k_offset)
    }
    MULTIPLY_SLOT(slot)
    // Nobody reads the other slot any more: the barrier that ended the previous slice
    // separated its readers from these writes.
    if (more) {
      STASH_SLICE(slot ^ 1, staged_a, staged_b)
    }
    barrier();
    slot ^= 1;
  }
#endif

#if K_GROUPS > 1
  // The loop's last barrier has passed every read of the slots.
  if (k_group > 0) {
    [[unroll]] for (uint r = 0; r < WORK_M; ++r) {
      [[unroll]] for (uint h = 0; h < GROUPS_N; ++h) {
        stash_partial(k_group, (r * GROUPS_N + h) * THREADS + thread, accumulator[r][h]);
      }
    }
  }
  barrier();
  if (k_group > 0) return;
  [[unroll]] for (uint other = 1; other < K_GROUPS; ++other) {
    [[unroll]] for (uint r = 0; r < WORK_M; ++r) {
      [[unroll]] for (uint h = 0; h < GROUPS_N; ++h) {
        accumulator[r][h] += partial(other, (r * GROUPS_N + h) * THREADS + thread);
      }
    }
  }
#endif

  [[unroll]] for (uint g = 0; g < GROUPS_M; ++g) {
    [[unroll]] for (uint i = 0; i < 4; ++i) {
      uint row = row0 + 4 * (g * THREADS_M + thread_row) + i;
      if (row >= M) continue;
      [[unroll]] for (uint h = 0; h < GROUPS_N; ++h) {
#if C_VEC4
        // In vec4s throughout: (z M + row) N / 4 + col / 4 with a constant N / 4 and col / 4 a sum
        // of the thread's own terms, no division of the whole offset.
        uint col4 = col0 / 4 + h * THREADS_N + thread_col;
        if (col4 < N / 4)
          c4[(gl_WorkGroupID.z * M + row) * (N / 4) + col4] = accumulator[4 * g + i][h];
#else
        [[unroll]] for (uint j = 0; j < 4; ++j) {
          uint col = col0 + 4 * (h * THREADS_N + thread_col) + j;
          if (col < N) store_c(gl_WorkGroupID.z, row, col, accumulator[4 * g + i][h][j]);
        }
#endif
      }
    }
  }
}
