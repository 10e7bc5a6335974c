// Strict (f32) flash attention, every mode in one kernel: the forward (WITH_LSE=1: writing the
// log-sum-exp as well, for the backward), the log-sum-exp alone, the dQ, dK and dV backward
// (dK and dV separately or together), and the scores' gradient W = SCALE * dS ([B, HQ, SQ, SK])
// alone or (WITH_SCORES=1) beside dK or dK and dV. A workgroup owns BO rows (queries, or keys
// for dK / dV / W) of one (batch, head) and streams blocks of BS rows of the other side. Each
// block is two small products through shared memory, both register-tiled so that a thread
// reuses every vec4 it loads:
//   1. a score-like tile W[BS][BO]: S = A1 . T1 over the head dimension (and, for dQ / dK,
//      dP = A2 . T2 over the value dimension), turned into probabilities or dS;
//   2. acc[BO][E] += W^T C, with C the streamed tile T1 or T2.
//   mode     owned A1 (A2)   streamed T1, T2   C    result
//   forward  Q               K, V              V    O (online softmax)
//   lse      Q               K                 -    log-sum-exp of each query
//   dQ       Q (dO)          K, V              K    SCALE * dS K
//   dK       K (V)           Q, dO             Q    SCALE * dS^T Q
//   dV       K               Q, dO             dO   P^T dO
//   dK, dV   K (V)           Q, dO             Q    dK as above; P^T dO (C = dO) into result_v
//   W        K (V)           Q, dO             -    SCALE * dS into scores (no step 2)
// with P = exp(S * SCALE + mask - lse), dS = P * (dP - delta), delta = dO . O. Every result
// element belongs to one thread and is summed in a fixed order: deterministic, no atomics.
// The next block's tiles (and, for dK / dV, its queries' lse and delta) are fetched into
// registers while the current block computes: the fetch latency was half the kernel's time.
// Phase 1: TC consecutive lanes share RO1 owned rows and take every TC-th streamed row; row
// maxima and sums combine over those lanes by subgroup shuffles. Phase 2: each thread owns 4
// owned rows and every CT-th vec4 column of the result.
// Tiles hold rows of vec4s (dimensions padded with zeros to a multiple of 4) with one vec4 of
// padding per row, so that the lanes reading consecutive rows start 4 banks apart.
// Slices of the streamed rows (passes/split_attention.cpp): workgroup z streams only rows
// [z * SLICE, (z + 1) * SLICE) when SPLITS > 1 (keys for the forward and dQ, queries for dK
// and dV) and writes partial result z, after the B * heads * owned rows of
// the partials before it. The forward's partial rows hold DV + 1 floats: its output over the
// slice's keys (zeros where a row sees none) and their log-sum-exp (-inf there), which the
// attention_combine kernel joins; the gradients' partials are summed.
// W is written block by block from the weights' tile, and needs every (query, key) pair of it:
// a workgroup that writes W visits the query blocks that causal masking would let it skip.
// HEADS_LAST (the forward over whole streams): its output written [B, SQ, HQ, DV], the heads
// after the queries, as the transpose that alone reads it would move it (kernels/fusion.cpp);
// HEADS_LAST_COPY: written as it is and, to out_t, heads last as well, for a transpose that reads
// it beside others (a training step's backward).
// Q_CHAIN (the forward): the queries computed as they are loaded, by the generated q_chain(i)
// (an index chain's value: heads apart, the rotation; fusion.cpp leaves chains that sum split-K
// partials to their own launch), instead of read from q.
// Defines: MODE (0 forward, 1 lse, 2 dQ, 3 dK, 4 dV, 5 dK and dV, 6 W), HEADS_LAST,
// HEADS_LAST_COPY, Q_CHAIN,
// WITH_LSE, WITH_SCORES
// (modes 3 and 5), SCORES_VEC4 (W written through the vec4 view scores4, SK a multiple of 4),
// HQ, HKV, SQ, SK, D,
// DV, SCALE, CAUSAL, BO, BS, TC, THREADS, U1 and U2 (vec4 steps of phase 1 and streamed rows of
// phase 2 whose loads are issued together), SPLITS and SLICE (a multiple of BS), HEAD_SPLITS.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require

#define KEY_OWNED (MODE >= 3)
#define GRAD_KV (MODE == 5)
#define SCORES_ONLY (MODE == 6)
#define WRITES_SCORES (WITH_SCORES || SCORES_ONLY)
#define ACCUMULATES (MODE != 1 && !SCORES_ONLY)
#define TWO_PRODUCTS (MODE == 2 || MODE == 3 || GRAD_KV || SCORES_ONLY)
#define STREAM_DELTA (MODE == 3 || GRAD_KV || SCORES_ONLY)
#define ONLINE_SOFTMAX (MODE <= 1)
#define HAS_T2 (MODE != 1)
#define C_IS_T1 TWO_PRODUCTS
#define D4 ((D + 3) / 4)
#define DV4 ((DV + 3) / 4)
#define K_ROW (D4 + 1)
#define V_ROW (DV4 + 1)
#if KEY_OWNED
#define OWNED_LEN SK
#define STREAM_LEN SQ
#else
#define OWNED_LEN SQ
#define STREAM_LEN SK
#endif
#if C_IS_T1
#define E D
#define C_TILE t1_tile
#define C_ROW K_ROW
#else
#define E DV
#define C_TILE t2_tile
#define C_ROW V_ROW
#endif
#define E4 ((E + 3) / 4)
#define RO1 (BO * TC / THREADS)
#define KPT (BS / TC)
#define CT (THREADS / (BO / 4))
#define E4PT ((E4 + CT - 1) / CT)
#define DV4PT ((DV4 + CT - 1) / CT)
#define NEG_INF (-1.0 / 0.0)
#define SPLIT (SPLITS > 1)
// dK and dV over parts of each group's query heads (HEAD_SPLITS > 1): workgroup z takes slice
// z % SPLITS of the queries of part z / SPLITS, GROUP_PART heads, and writes partial z.
#define GROUP_PART (HQ / HKV / HEAD_SPLITS)
#define KEY_PARTIALS (SPLITS * HEAD_SPLITS > 1)
// The first row of this workgroup's partial result: slice z's rows follow those of slices
// 0 .. z - 1 (grid y is B * heads).
#define PARTIAL_BASE (gl_WorkGroupID.z * gl_NumWorkGroups.y * OWNED_LEN)
// The forward's partial rows: the output over the slice, then its log-sum-exp.
#define OUT_BASE (PARTIAL_BASE + q_base)
#define OUT_STRIDE (DV + 1)

layout(local_size_x = THREADS) in;

shared vec4 a1_tile[BO * K_ROW];
#if TWO_PRODUCTS
shared vec4 a2_tile[BO * V_ROW];
#endif
shared vec4 t1_tile[BS * K_ROW];
#if HAS_T2
shared vec4 t2_tile[BS * V_ROW];
#endif
#if MODE != 1
// w_tile[s * (BO / 4) + o / 4][o % 4]: the weight of owned row o for streamed row s (for dK and
// dV together, dS; p_tile holds P).
shared vec4 w_tile[BS * (BO / 4)];
#endif
#if GRAD_KV
shared vec4 p_tile[BS * (BO / 4)];
#endif
#if ONLINE_SOFTMAX
shared float row_alpha[BO];
shared float row_sum[BO];
#endif
#if KEY_OWNED
shared float stream_lse[BS];
shared float stream_delta[BS];
#endif

// Rows [first, first + count) of a [.., DIM] buffer starting at row `base`, into `tile`; rows
// past `limit` are zero.
#define LOAD_TILE(tile, buffer, base, first, count, limit, DIM, DIM4, ROW)                  \
  for (uint e = t; e < (count) * (DIM4); e += THREADS) {                                    \
    uint tile_row = e / (DIM4), d4 = e % (DIM4), row_index = (first) + tile_row;            \
    tile[tile_row * (ROW) + d4] =                                                           \
        row_index < (limit) ? LOAD_ROW4(buffer, ((base) + row_index) * (DIM), 4u * d4, DIM) \
                            : vec4(0.0);                                                    \
  }

// The same for a streamed tile of BS rows, in two steps: into registers (`slots` vec4s per
// thread), and later from there into shared memory.
#define SLOTS(DIM4) ((BS * (DIM4) + THREADS - 1) / THREADS)
#define FETCH_TILE(slots, buffer, base, first, limit, DIM, DIM4)                   \
  [[unroll]] for (uint p = 0u; p < SLOTS(DIM4); ++p) {                             \
    uint e = t + p * THREADS;                                                      \
    uint tile_row = e / (DIM4), d4 = e % (DIM4), row_index = (first) + tile_row;   \
    slots[p] = e < BS * (DIM4) && row_index < (limit)                              \
                   ? LOAD_ROW4(buffer, ((base) + row_index) * (DIM), 4u * d4, DIM) \
                   : vec4(0.0);                                                    \
  }
#define STORE_TILE(tile, slots, DIM4, ROW)                                   \
  [[unroll]] for (uint p = 0u; p < SLOTS(DIM4); ++p) {                       \
    uint e = t + p * THREADS;                                                \
    if (e < BS * (DIM4)) tile[(e / (DIM4)) * (ROW) + e % (DIM4)] = slots[p]; \
  }

// result[r][k] = owned row group1 * RO1 + r . streamed row lane + TC * k, over DIM4 vec4s, U1
// vec4s per step with their loads first (one shared-memory latency per U1 steps); the
// columns past DIM4 of a partial step are clamped to its last (padding is zero: adding it twice
// would not be, so their products are skipped).
#define PRODUCT(result, owned_tile, streamed_tile, DIM4, ROW)                                 \
  [[unroll]] for (uint r = 0u; r < RO1; ++r) {                                                 \
    [[unroll]] for (uint k = 0u; k < KPT; ++k) result[r][k] = 0.0;                             \
  }                                                                                            \
  [[dont_unroll]] for (uint d0 = 0u; d0 < (DIM4); d0 += U1) {                                  \
    vec4 streamed[U1][KPT], owned[U1][RO1];                                                    \
    [[unroll]] for (uint u = 0u; u < U1; ++u) {                                                \
      uint d4 = min(d0 + u, (DIM4) - 1u);                                                      \
      [[unroll]] for (uint k = 0u; k < KPT; ++k)                                               \
        streamed[u][k] = streamed_tile[(lane + TC * k) * (ROW) + d4];                          \
      [[unroll]] for (uint r = 0u; r < RO1; ++r)                                               \
        owned[u][r] = owned_tile[(group1 * RO1 + r) * (ROW) + d4];                             \
    }                                                                                          \
    [[unroll]] for (uint u = 0u; u < U1; ++u) {                                                \
      if ((DIM4) % U1 != 0u && d0 + u >= (DIM4)) break;                                        \
      [[unroll]] for (uint r = 0u; r < RO1; ++r) {                                             \
        [[unroll]] for (uint k = 0u; k < KPT; ++k)                                           \
          result[r][k] += dot(owned[u][r], streamed[u][k]);                                    \
      }                                                                                        \
    }                                                                                          \
  }

// Phase 2: acc_[4 rows][vec4 columns column + CT * c] += W^T C for the block's BS streamed rows,
// U2 rows a step with their loads first (one shared-memory latency per U2 rows). Columns past
// DIM4 are clamped to its last and never written.
#define ACCUMULATE(acc_, weights, c_tile, ROW, DIM4, PER_THREAD)                         \
  [[dont_unroll]] for (uint s2 = 0u; s2 < BS; s2 += U2) {                                 \
    vec4 w[U2], value[U2][PER_THREAD];                                                    \
    [[unroll]] for (uint u = 0u; u < U2; ++u) {                                           \
      w[u] = weights[(s2 + u) * (BO / 4) + group2];                                       \
      [[unroll]] for (uint c = 0u; c < PER_THREAD; ++c)                                   \
        value[u][c] = c_tile[(s2 + u) * (ROW) + min(column + CT * c, (DIM4) - 1u)];       \
    }                                                                                     \
    [[unroll]] for (uint u = 0u; u < U2; ++u) {                                           \
      [[unroll]] for (uint c = 0u; c < PER_THREAD; ++c) {                                 \
        [[unroll]] for (uint r = 0u; r < 4u; ++r) acc_[r][c] += w[u][r] * value[u][c];   \
      }                                                                                   \
    }                                                                                     \
  }

// The owned rows' results (DIM floats at the start of rows of STRIDE floats, from row `base`),
// each row times `row_scale`.
#define WRITE_RESULT(buffer, base, acc_, DIM, STRIDE, OFFSET, DIM4, PER_THREAD, row_scale) \
  [[unroll]] for (uint r = 0u; r < 4u; ++r) {                                             \
    uint owned_row = 4u * group2 + r, o = o0 + owned_row;                                 \
    if (o >= OWNED_LEN) continue;                                                         \
    float scale = row_scale;                                                              \
    [[unroll]] for (uint c = 0u; c < PER_THREAD; ++c) {                                   \
      uint e4 = column + CT * c;                                                          \
      if (e4 >= (DIM4)) continue;                                                         \
      [[unroll]] for (uint component = 0u; component < 4u; ++component) {                \
        uint e = 4u * e4 + component;                                                     \
        if (e < (DIM)) buffer[((base) + o) * (STRIDE) + (OFFSET) + e] =                     \
            acc_[r][c][component] * scale;                                                \
      }                                                                                   \
    }                                                                                     \
  }

float lanes_max(float value) {
  [[unroll]] for (uint offset = 1u; offset < TC; offset *= 2u) value =
      max(value, subgroupShuffleXor(value, offset));
  return value;
}

float lanes_sum(float value) {
  [[unroll]] for (uint offset = 1u; offset < TC; offset *= 2u) value +=
      subgroupShuffleXor(value, offset);
  return value;
}

uint t, lane, group1;
uint b, kv_base;
// The streamed blocks, numbered 0 .. block_count - 1 (for dK / dV over every query head of the
// group), and the block whose tiles are in the registers below.
uint block_count;
#if !KEY_OWNED
uint stream_begin;  // the first key of this workgroup's slice
#endif
#if KEY_OWNED
uint first_head, s_begin, blocks_per_head;
#endif
vec4 next_t1[SLOTS(D4)];
#if HAS_T2
vec4 next_t2[SLOTS(DV4)];
#endif
#if KEY_OWNED
#define STAT_ROWS ((BS + THREADS / TC - 1) / (THREADS / TC))
float next_lse[STAT_ROWS];
#if STREAM_DELTA
// delta's factors for streamed row group1 + (THREADS / TC) * x, elements lane + TC * y.
#define DELTA_ELEMENTS ((DV + TC - 1) / TC)
float next_do[STAT_ROWS][DELTA_ELEMENTS], next_o[STAT_ROWS][DELTA_ELEMENTS];
#endif
#endif

// Head and first streamed row of block n.
uvec2 block_origin(uint n) {
#if KEY_OWNED
  return uvec2(first_head + n / blocks_per_head, s_begin + (n % blocks_per_head) * BS);
#else
  return uvec2(gl_WorkGroupID.y % HQ, stream_begin + n * BS);
#endif
}

void fetch_block(uint n) {
  uvec2 origin = block_origin(n);
  uint s0 = origin.y;
#if KEY_OWNED
  uint q_base = (b * HQ + origin.x) * SQ;
  FETCH_TILE(next_t1, q, q_base, s0, SQ, D, D4)
  FETCH_TILE(next_t2, grad_out, q_base, s0, SQ, DV, DV4)
  [[unroll]] for (uint x = 0u; x < STAT_ROWS; ++x) {
    uint ss = group1 + (THREADS / TC) * x, i = s0 + ss;
    bool valid = ss < BS && i < SQ;
    next_lse[x] = valid ? lse[q_base + i] : 0.0;
#if STREAM_DELTA
    [[unroll]] for (uint y = 0u; y < DELTA_ELEMENTS; ++y) {
      uint e = lane + TC * y;
      next_do[x][y] = valid && e < DV ? grad_out[(q_base + i) * DV + e] : 0.0;
      next_o[x][y] = valid && e < DV ? out_value[(q_base + i) * DV + e] : 0.0;
    }
#endif
  }
#else
  FETCH_TILE(next_t1, k, kv_base, s0, SK, D, D4)
#if HAS_T2
  FETCH_TILE(next_t2, v, kv_base, s0, SK, DV, DV4)
#endif
#endif
}

void store_block() {
  STORE_TILE(t1_tile, next_t1, D4, K_ROW)
#if HAS_T2
  STORE_TILE(t2_tile, next_t2, DV4, V_ROW)
#endif
#if KEY_OWNED
  [[unroll]] for (uint x = 0u; x < STAT_ROWS; ++x) {
    uint ss = group1 + (THREADS / TC) * x;
#if STREAM_DELTA
    float part = 0.0;
    [[unroll]] for (uint y = 0u; y < DELTA_ELEMENTS; ++y) part += next_do[x][y] * next_o[x][y];
    part = lanes_sum(part);
    if (lane == 0u && ss < BS) stream_delta[ss] = part;
#endif
    if (lane == 0u && ss < BS) stream_lse[ss] = next_lse[x];
  }
#endif
}

void main() {
  t = gl_LocalInvocationID.x;
  lane = t % TC;
  group1 = t / TC;                        // phase 1: owned rows group1 * RO1 + r
  uint group2 = t / CT, column = t % CT;  // phase 2: owned rows 4 * group2 + r
  uint o0 = gl_WorkGroupID.x * BO;
#if KEY_OWNED
  b = gl_WorkGroupID.y / HKV;
  kv_base = gl_WorkGroupID.y * SK;
  LOAD_TILE(a1_tile, k, kv_base, o0, BO, SK, D, D4, K_ROW)
#if TWO_PRODUCTS
  LOAD_TILE(a2_tile, v, kv_base, o0, BO, SK, DV, DV4, V_ROW)
#endif
#else
  uint bh = gl_WorkGroupID.y;
  b = bh / HQ;
  uint h = bh % HQ;
  kv_base = (b * HKV + h / (HQ / HKV)) * SK;
  uint q_base = bh * SQ;
#if Q_CHAIN
  // The queries computed as they are loaded: element i of q is q_chain(i).
  for (uint e = t; e < BO * D4; e += THREADS) {
    uint tile_row = e / D4, d4 = e % D4, row_index = o0 + tile_row;
    vec4 row4 = vec4(0.0);
    if (row_index < SQ) {
      uint start = (q_base + row_index) * D + 4u * d4;
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        if (4u * d4 + c < D) row4[c] = q_chain(start + c);
      }
    }
    a1_tile[tile_row * K_ROW + d4] = row4;
  }
#else
  LOAD_TILE(a1_tile, q, q_base, o0, BO, SQ, D, D4, K_ROW)
#endif
#if TWO_PRODUCTS
  LOAD_TILE(a2_tile, grad_out, q_base, o0, BO, SQ, DV, DV4, V_ROW)
  // delta and lse of this thread's queries; the TC lanes of a row split delta's dot product.
  float owned_lse[RO1], owned_delta[RO1];
  [[unroll]] for (uint r = 0u; r < RO1; ++r) {
    uint i = o0 + group1 * RO1 + r;
    float part = 0.0;
    if (i < SQ) {
      for (uint e = lane; e < DV; e += TC)
        part += grad_out[(q_base + i) * DV + e] * out_value[(q_base + i) * DV + e];
    }
    owned_delta[r] = lanes_sum(part);
    owned_lse[r] = i < SQ ? lse[q_base + i] : 0.0;
  }
#endif
#endif

#if ONLINE_SOFTMAX
  float m[RO1], l[RO1];
  [[unroll]] for (uint r = 0u; r < RO1; ++r) {
    m[r] = NEG_INF;
    l[r] = 0.0;
  }
#endif
#if GRAD_KV
  vec4 acc_v[4][DV4PT];
  [[unroll]] for (uint r = 0u; r < 4u; ++r) {
    [[unroll]] for (uint c = 0u; c < DV4PT; ++c) acc_v[r][c] = vec4(0.0);
  }
#endif
#if ACCUMULATES
  vec4 acc[4][E4PT];
  [[unroll]] for (uint r = 0u; r < 4u; ++r) {
    [[unroll]] for (uint c = 0u; c < E4PT; ++c) acc[r][c] = vec4(0.0);
  }
#endif

#if KEY_OWNED
  // Top-left causal masking: queries before o0 see none of the owned keys.
#if CAUSAL != 0 && !WRITES_SCORES
  s_begin = (o0 / BS) * BS;
#else
  s_begin = 0u;
#endif
  uint s_end = SQ;
#if SPLIT
  s_begin = max(s_begin, (gl_WorkGroupID.z % SPLITS) * SLICE);
  s_end = min(s_end, (gl_WorkGroupID.z % SPLITS) * SLICE + SLICE);
#endif
  first_head = (gl_WorkGroupID.y % HKV) * (HQ / HKV) + (gl_WorkGroupID.z / SPLITS) * GROUP_PART;
  blocks_per_head = s_begin < s_end ? (s_end - s_begin + BS - 1u) / BS : 0u;
  block_count = GROUP_PART * blocks_per_head;
#else
  // No owned query sees a key past its last query.
  uint stream_end = CAUSAL != 0 ? min(SK, o0 + BO) : SK;
#if SPLIT
  stream_begin = gl_WorkGroupID.z * SLICE;
  stream_end = min(stream_end, stream_begin + SLICE);
#else
  stream_begin = 0u;
#endif
  block_count = stream_end > stream_begin ? (stream_end - stream_begin + BS - 1u) / BS : 0u;
#endif
  fetch_block(0u);
  for (uint n = 0u; n < block_count; ++n) {
    uvec2 origin = block_origin(n);
#if KEY_OWNED
    uint h = origin.x;
    uint q_base = (b * HQ + h) * SQ;
#endif
    uint s0 = origin.y;
    barrier();  // the previous block's readers of the streamed tiles and weights are done
    store_block();
    barrier();
    if (n + 1u < block_count) fetch_block(n + 1u);

    // The mask under the block's scores (zeros without a mask), read before the products so that
    // the reads overlap them and each other instead of each waiting in turn.
    float block_mask[RO1][KPT];
    [[unroll]] for (uint r = 0u; r < RO1; ++r) {
      [[unroll]] for (uint k = 0u; k < KPT; ++k) {
#if KEY_OWNED
        block_mask[r][k] = mask_at(b, h, s0 + lane + TC * k, o0 + group1 * RO1 + r);
#else
        block_mask[r][k] = mask_at(b, h, o0 + group1 * RO1 + r, s0 + lane + TC * k);
#endif
      }
    }

    // Phase 1: S (and dP) for rows group1 * RO1 + r and streamed rows lane + TC * k.
    float score[RO1][KPT];
    PRODUCT(score, a1_tile, t1_tile, D4, K_ROW)
#if TWO_PRODUCTS
    float dp[RO1][KPT];
    PRODUCT(dp, a2_tile, t2_tile, DV4, V_ROW)
#endif
    [[unroll]] for (uint r = 0u; r < RO1; ++r) {
      uint owned_row = group1 * RO1 + r;
      uint o = o0 + owned_row;
#if ONLINE_SOFTMAX
      float block_max = NEG_INF;
#endif
      [[unroll]] for (uint k = 0u; k < KPT; ++k) {
        uint s = s0 + lane + TC * k;
#if KEY_OWNED
        uint i = s, j = o;
#else
        uint i = o, j = s;
#endif
        bool visible = o < OWNED_LEN && s < STREAM_LEN && (CAUSAL == 0 || j <= i);
        float x = visible ? score[r][k] * SCALE + block_mask[r][k] : NEG_INF;
#if ONLINE_SOFTMAX
        score[r][k] = x;
        block_max = max(block_max, x);
#elif MODE == 2
        score[r][k] = exp(x - owned_lse[r]) * (dp[r][k] - owned_delta[r]) * SCALE;
#elif STREAM_DELTA
        uint ss = lane + TC * k;
        float p = exp(x - stream_lse[ss]);
#if GRAD_KV
        p_tile[ss * (BO / 4) + owned_row / 4][owned_row % 4] = p;
#endif
        score[r][k] = p * (dp[r][k] - stream_delta[ss]) * SCALE;
#else
        score[r][k] = exp(x - stream_lse[lane + TC * k]);
#endif
      }
#if ONLINE_SOFTMAX
      float m_new = max(m[r], lanes_max(block_max));
      // A row with every key so far masked keeps m = -inf; shift by 0 so exp gives 0, not NaN.
      float shift = m_new == NEG_INF ? 0.0 : m_new;
      float alpha = exp(m[r] - shift);
      float block_sum = 0.0;
      [[unroll]] for (uint k = 0u; k < KPT; ++k) {
        score[r][k] = exp(score[r][k] - shift);
        block_sum += score[r][k];
      }
      l[r] = l[r] * alpha + block_sum;
      m[r] = m_new;
      if (lane == 0u) row_alpha[owned_row] = alpha;
#endif
#if MODE != 1
      // Masked scores give exp(-inf) = 0 (dS: 0 * finite), so padding rows add nothing.
      [[unroll]] for (uint k = 0u; k < KPT; ++k)
          w_tile[(lane + TC * k) * (BO / 4) + owned_row / 4][owned_row % 4] = score[r][k];
#endif
    }
#if MODE != 1
    barrier();
#endif
#if WRITES_SCORES
    // This block's weights, streamed queries s0 .. s0 + BS by owned keys o0 .. o0 + BO.
    for (uint e = t; e < BS * (BO / 4); e += THREADS) {
      uint i = s0 + e / (BO / 4), j = o0 + 4u * (e % (BO / 4));
      if (i >= SQ) continue;
      vec4 weights = w_tile[e];
      uint base = ((b * HQ + h) * SQ + i) * SK + j;
#if SCORES_VEC4
      if (j < SK) scores4[base / 4u] = weights;
#else
      [[unroll]] for (uint c = 0u; c < 4u; ++c) {
        if (j + c < SK) scores[base + c] = weights[c];
      }
#endif
    }
#endif
#if ACCUMULATES
    // Phase 2: acc[4 rows][E4PT vec4 columns] += W^T C.
#if ONLINE_SOFTMAX
    [[unroll]] for (uint r = 0u; r < 4u; ++r) {
      float alpha = row_alpha[4u * group2 + r];
      [[unroll]] for (uint c = 0u; c < E4PT; ++c) acc[r][c] *= alpha;
    }
#endif
    ACCUMULATE(acc, w_tile, C_TILE, C_ROW, E4, E4PT)
#if GRAD_KV
    ACCUMULATE(acc_v, p_tile, t2_tile, V_ROW, DV4, DV4PT)
#endif
#endif
  }

#if ONLINE_SOFTMAX
  [[unroll]] for (uint r = 0u; r < RO1; ++r) {
    float total = lanes_sum(l[r]);
    uint owned_row = group1 * RO1 + r, i = o0 + owned_row;
#if SPLIT && MODE == 0
    // A row that saw no key of the slice has m = -inf and total = 0: its lse is -inf.
    if (lane == 0u && i < SQ) out_[(OUT_BASE + i) * OUT_STRIDE + DV] = m[r] + log(total);
#elif MODE == 1 || WITH_LSE
    if (lane == 0u && i < SQ) lse[q_base + i] = m[r] + log(total);
#endif
#if MODE == 0
    if (lane == 0u) row_sum[owned_row] = total;
#endif
  }
#endif
#if SPLIT && MODE == 0
  barrier();
  // A slice's row without visible keys contributes nothing (its weight in the combine is 0).
  WRITE_RESULT(out_, OUT_BASE, acc, E, OUT_STRIDE, 0u, E4, E4PT,
               row_sum[owned_row] > 0.0 ? 1.0 / row_sum[owned_row] : 0.0)
#elif MODE == 0 && HEADS_LAST
  barrier();
  WRITE_RESULT(out_, b * SQ, acc, E, HQ * E, h * E, E4, E4PT, 1.0 / row_sum[owned_row])
#elif MODE == 0
  barrier();
  WRITE_RESULT(out_, q_base, acc, E, E, 0u, E4, E4PT, 1.0 / row_sum[owned_row])
#if HEADS_LAST_COPY
  WRITE_RESULT(out_t, b * SQ, acc, E, HQ * E, h * E, E4, E4PT, 1.0 / row_sum[owned_row])
#endif
#elif MODE == 2
  WRITE_RESULT(grad_q, (SPLIT ? PARTIAL_BASE : 0u) + q_base, acc, E, E, 0u, E4, E4PT, 1.0)
#elif ACCUMULATES
  WRITE_RESULT(result, (KEY_PARTIALS ? PARTIAL_BASE : 0u) + kv_base, acc, E, E, 0u, E4, E4PT, 1.0)
#endif
#if GRAD_KV
  WRITE_RESULT(result_v, (KEY_PARTIALS ? PARTIAL_BASE : 0u) + kv_base, acc_v, DV, DV, 0u, DV4, DV4PT,
               1.0)
#endif
}
