// Flash-attention forward on cooperative matrices (the `fast` precision path): f16 Q, K, V and
// probabilities, f32 scores, softmax statistics and output accumulator. A workgroup of WARPS
// subgroups owns BQ = WARPS * 16 queries of one (batch, query head), 16 per subgroup, and
// streams over blocks of BK keys, the next block's K and V read into registers (as vec4) while
// the current one is multiplied:
//   S = (SCALE log2(e) Q) K^T on 16 x 8 fragments, staged to shared memory (scores in log2
//   units, so that P needs only exp2);
//   two lanes per query row read the row's scores once, apply mask and causality and write
//   P = exp2(S - m) as f16, m being the row's reference maximum;
//   O += P V on accumulator fragments held in registers for the whole key loop.
// An accumulator fragment's rows cannot be rescaled in registers, so the rescale is lazy (as in
// FlashAttention-3/4): m stays put while a block's maximum exceeds it by at most THRESHOLD, which
// bounds P by 2^THRESHOLD (safe in f16 and in the f32 sums). Only when some row of the subgroup
// needs a larger m does the subgroup spill O through shared memory, rescale the rows there and
// reload it; O and l stay relative to the same m, so the result O / l is exact either way. The
// division by l at the end goes through the same staging area.
// WITH_VALUE=0 gives attention_lse: no V, no P V, and m exact (l rescaled in its register), the
// row's log-sum-exp (m + log2 l) / log2(e) its only output. WITH_LSE=1 writes it beside O.
// SPLITS > 1 (passes/split_attention.cpp): workgroup z takes keys [z * SLICE, (z + 1) * SLICE)
// and writes rows of DV + 1 floats, its O / l (zeros where a row sees no key of the slice) and
// the log-sum-exp (-inf there), which attention_combine joins.
// FRAGMENT_REGISTERS=1 keeps S and P in registers instead, on devices whose fragments keep
// their elements as NVIDIA's do (gpu::is_quad_row_layout, probed by the session): a lane holds
// two rows of each 16 x 8 score fragment, and the four lanes of a row reduce its maximum by
// subgroup shuffles; the P fragment for keys 16 c .. 16 c + 15 is built from the lane's own
// elements of score fragments 2 c and 2 c + 1; O's rows are rescaled in registers at every new
// maximum (no lazy threshold), l is summed per lane and over the row's lanes at the end, and
// each lane writes its own elements of O. No staging area, no subgroup barrier.
// HEADS_LAST=1 (whole key streams): O written [B, SQ, HQ, DV], the heads after the queries, as the
// transpose that alone reads it would move it (kernels/fusion.cpp). HEADS_LAST_COPY=1 (whole key
// streams): O written as it is and, to out_t, heads last as well, for a transpose that reads it
// beside others (a training step's backward, which reads O as it is).
// Q_CHAIN=1: the queries computed as they are loaded, four at a time by the generated
// q_chain4(i4) (an index chain's value: heads apart, the rotation; fusion.cpp leaves chains
// that sum split-K partials to their own launch), instead of read from q (binding 0 then holds
// the chain's first buffer, unread).
// No Sq x Sk matrix exists. Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL,
// BK (32 or 64), WITH_VALUE, WITH_LSE, SPLITS, SLICE (a multiple of BK), FRAGMENT_REGISTERS,
// HEADS_LAST, HEADS_LAST_COPY, Q_CHAIN. Generated: float
// mask_at(b, h, i, j). Loops over fragments are unrolled so that fragment arrays stay in
// registers.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : require

#define WARPS 4
#define ROWS 16
#define BQ (WARPS * ROWS)
#define THREADS (WARPS * 32)
// Tile row strides in uvec2s of 4 halves (attention_coopmat_tiles.glsl).
#define D_UVEC2S ATTENTION_ROW_UVEC2S(D)
#define DV_UVEC2S ATTENTION_ROW_UVEC2S(DV)
#define P_STRIDE (BK + 8)
// Staged scores and output rows share a stride; the 4 floats of padding spread the rows of a
// subgroup over the shared-memory banks.
#define STAGE_STRIDE ((BK > DV ? BK : DV) + 4)
#define V_OFFSET (BK * D_UVEC2S)
#if WITH_VALUE
#define KV_UVEC2S (V_OFFSET + BK * DV_UVEC2S)
#else
#define KV_UVEC2S V_OFFSET
#endif
#define Q_UVEC2S (BQ * D_UVEC2S)
#define LOG2E 1.4426950408889634
#define THRESHOLD 11.0
#define NEG_INF (-1.0 / 0.0)
#define SPLIT (WITH_VALUE && SPLITS > 1)

layout(local_size_x = THREADS) in;

// q, k and v (bindings 0 to 2) read four elements at a time: D and DV are multiples of 16, so a
// vec4 never straddles a row.
#if !Q_CHAIN
layout(std430, set = 0, binding = 0) readonly buffer buffer_q4 { vec4 q4[]; };
#endif
layout(std430, set = 0, binding = 1) readonly buffer buffer_k4 { vec4 k4[]; };
#if WITH_VALUE
layout(std430, set = 0, binding = 2) readonly buffer buffer_v4 { vec4 v4[]; };
#endif

// The scaled query block first, then each key block's K and V tiles.
shared uvec2 tiles[KV_UVEC2S > Q_UVEC2S ? KV_UVEC2S : Q_UVEC2S];
#if !FRAGMENT_REGISTERS
// Per subgroup: the block's scores, or the output rows during a rescale and at the end.
shared float stage[BQ * STAGE_STRIDE];
#if WITH_VALUE
shared float16_t probabilities[BQ * P_STRIDE];
#endif
#endif
#if WITH_VALUE
vec4 v_next[ATTENTION_LOADS(BK, DV)];
#endif
vec4 k_next[ATTENTION_LOADS(BK, D)];

// Reads the key block at k0 into registers; rows past SK read as zeros so that the padding
// keys' P (zero) never meets a NaN.
void load_kv(uint kv_base, uint k0, uint t) {
  ATTENTION_FETCH(k_next, k4, kv_base, k0, SK, BK, D, t)
#if WITH_VALUE
  ATTENTION_FETCH(v_next, v4, kv_base, k0, SK, BK, DV, t)
#endif
}

// The output row of query i of head h of entry b, where the whole stream's output goes.
#define HEADS_LAST_ROW(i) ((b * SQ + (i)) * HQ + h)
#if HEADS_LAST
#define OUT_ROW(i) HEADS_LAST_ROW(i)
#else
#define OUT_ROW(i) (q_base + (i))
#endif

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint q0 = gl_WorkGroupID.x * BQ;
  uint q_base = bh * SQ;
  uint kv_base = (b * HKV + kv_head) * SK;
#if FRAGMENT_REGISTERS
  // The lane's two rows of the subgroup's 16 (upper: e = 0, 1 of a 16 x 8 fragment; lower: e = 2,
  // 3) and its two columns of each 8 (e % 2 more than quad_col).
  uint quad_row = lane / 4, quad_col = 2 * (lane % 4);
  uint i_upper = q0 + warp * ROWS + quad_row, i_lower = i_upper + 8;
#else
  // Two lanes per query row; lane half_index owns the row's columns 2c + half_index, which
  // interleaves the pair over the banks.
  uint row = lane / 2, half_index = lane % 2;
  uint i = q0 + warp * ROWS + row;
  uint stage_row = (warp * ROWS + row) * STAGE_STRIDE + half_index;
  uint stage_block = warp * ROWS * STAGE_STRIDE;
  uint p_row = (warp * ROWS + row) * P_STRIDE + half_index;
#endif

  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_begin = 0;
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;
#if SPLIT
  kv_begin = gl_WorkGroupID.z * SLICE;
  kv_end = min(kv_end, kv_begin + SLICE);
#endif
  load_kv(kv_base, kv_begin, t);
  {
    vec4 q_values[ATTENTION_LOADS(BQ, D)];
#if Q_CHAIN
    ATTENTION_FETCH_BY(q_values, q_chain4, q_base, q0, SQ, BQ, D, t)
#else
    ATTENTION_FETCH(q_values, q4, q_base, q0, SQ, BQ, D, t)
#endif
    ATTENTION_STASH(tiles, 0, q_values, float(SCALE * LOG2E), BQ, D, t)
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> q_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(q_fragments[c], tiles, warp * ROWS * D_UVEC2S + c * 4, D_UVEC2S, false);
#if WITH_VALUE
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> o[DV / 8];
  [[unroll]] for (uint n = 0; n < DV / 8; ++n)
    o[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
#endif

#if FRAGMENT_REGISTERS
  // Per row, upper and lower: m, the running maximum (log2 units), -inf until the row sees a
  // visible key; l, this lane's part of the sum of 2^(s - m) (its columns), the row's four lanes
  // adding theirs at the end.
  vec2 m = vec2(NEG_INF), l = vec2(0.0);
#else
  // m: the row's reference maximum (log2 units), -inf until the row sees a visible key; l: the
  // sum of 2^(s - m) over the keys so far.
  float m = NEG_INF, l = 0.0;
#endif
  for (uint k0 = kv_begin; k0 < kv_end; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles (or the query block)
    ATTENTION_STASH(tiles, 0, k_next, 1.0, BK, D, t)
#if WITH_VALUE
    ATTENTION_STASH(tiles, V_OFFSET, v_next, 1.0, BK, DV, t)
#endif
    barrier();
    if (k0 + BK < kv_end) load_kv(kv_base, k0 + BK, t);

    // The mask under the block's scores (zeros without a mask), read before the products so that
    // the reads overlap them and each other instead of each waiting in turn.
#if FRAGMENT_REGISTERS
    vec4 block_mask[BK / 8];
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 4; ++e)
        block_mask[n][e] =
            mask_at(b, h, e < 2 ? i_upper : i_lower, k0 + n * 8 + quad_col + e % 2);
    }
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s[BK / 8];
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      s[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_UVEC2S + c * 4, D_UVEC2S, true);
        s[n] = coopMatMulAddNV(q_fragments[c], k_transposed, s[n]);
      }
    }
    vec2 block_max = vec2(NEG_INF);
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        uint i = e < 2 ? i_upper : i_lower, j = k0 + n * 8 + quad_col + e % 2;
        bool visible = j < SK && i < SQ && (CAUSAL == 0 || j <= i);
        s[n][e] = visible ? s[n][e] + block_mask[n][e] * float(LOG2E) : NEG_INF;
        block_max[e / 2] = max(block_max[e / 2], s[n][e]);
      }
    }
    block_max = max(block_max, vec2(subgroupShuffleXor(block_max.x, 1),
                                    subgroupShuffleXor(block_max.y, 1)));
    block_max = max(block_max, vec2(subgroupShuffleXor(block_max.x, 2),
                                    subgroupShuffleXor(block_max.y, 2)));
    vec2 m_new = max(m, block_max);
    // Rows with every key so far masked keep m = -inf: shift by 0 so exp2 gives 0, not NaN.
    vec2 shift = vec2(m_new.x == NEG_INF ? 0.0 : m_new.x, m_new.y == NEG_INF ? 0.0 : m_new.y);
    vec2 alpha = exp2(m - shift);
    m = m_new;
#if WITH_VALUE
    // The rows' earlier sums and outputs move to the new maximum in registers: the lane knows
    // the rows of its accumulator elements. P's fragment of keys 16 c .. 16 c + 15 holds the
    // lane's elements of score fragments 2 c and 2 c + 1, upper row first: component e is
    // element 2 (e / 4) + e % 2 of fragment 2 c + (e / 2) % 2.
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
    }
    vec2 block_sum = vec2(0.0);
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p_fragments[BK / 16];
    [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
      [[unroll]] for (uint e = 0; e < 8; ++e) {
        float p = exp2(s[2 * c + (e / 2) % 2][2 * (e / 4) + e % 2] - shift[e / 4]);
        p_fragments[c][e] = float16_t(p);
        block_sum[e / 4] += p;
      }
    }
    l = l * alpha + block_sum;
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_fragment;
        coopMatLoadNV(v_fragment, tiles, V_OFFSET + c * 16 * DV_UVEC2S + n * 2, DV_UVEC2S, false);
        o[n] = coopMatMulAddNV(p_fragments[c], v_fragment, o[n]);
      }
    }
#else
    vec2 block_sum = vec2(0.0);
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 4; ++e) block_sum[e / 2] += exp2(s[n][e] - shift[e / 2]);
    }
    l = l * alpha + block_sum;
#endif
  }
#else
    float block_mask[BK / 2];
    [[unroll]] for (uint c = 0; c < BK / 2; ++c)
      block_mask[c] = mask_at(b, h, i, k0 + 2 * c + half_index);
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        // K^T as a column-major 16 x 8 block: element (d, j) is K[j][d].
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_UVEC2S + c * 4, D_UVEC2S, true);
        s = coopMatMulAddNV(q_fragments[c], k_transposed, s);
      }
      coopMatStoreNV(s, stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    float row_scores[BK / 2];
    float block_max = NEG_INF;
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      uint j = k0 + 2 * c + half_index;
      bool visible = j < SK && i < SQ && (CAUSAL == 0 || j <= i);
      row_scores[c] =
          visible ? stage[stage_row + 2 * c] + block_mask[c] * float(LOG2E) : NEG_INF;
      block_max = max(block_max, row_scores[c]);
    }
    block_max = max(block_max, subgroupShuffleXor(block_max, 1));
#if WITH_VALUE
    // A row's first visible block sets m (O and l are still zero); later blocks move it only
    // past the threshold. A row with every key so far masked keeps m = -inf.
    float m_new = m == NEG_INF || block_max > m + THRESHOLD ? block_max : m;
    bool rescale = m != NEG_INF && m_new != m;
    if (subgroupAny(rescale)) {
      float alpha = rescale ? exp2(m - m_new) : 1.0;
      l *= alpha;
      subgroupBarrier();  // every lane has read its scores: the staging area is free
      [[unroll]] for (uint n = 0; n < DV / 8; ++n)
        coopMatStoreNV(o[n], stage, stage_block + n * 8, STAGE_STRIDE, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint c = 0; c < DV / 2; ++c) stage[stage_row + 2 * c] *= alpha;
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint n = 0; n < DV / 8; ++n)
        coopMatLoadNV(o[n], stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    m = m_new;
    // With m = -inf every score of the block is -inf too: shift by 0 so exp2 gives 0, not NaN.
    float shift = m == NEG_INF ? 0.0 : m;
    float block_sum = 0.0;
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      float p = exp2(row_scores[c] - shift);
      probabilities[p_row + 2 * c] = float16_t(p);
      block_sum += p;
    }
    l += block_sum + subgroupShuffleXor(block_sum, 1);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#else
    float m_new = max(m, block_max);
    // Masked rows keep m = -inf: shift by 0 so exp2 gives 0, not NaN.
    float shift = m_new == NEG_INF ? 0.0 : m_new;
    float block_sum = 0.0;
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) block_sum += exp2(row_scores[c] - shift);
    l = l * exp2(m - shift) + block_sum + subgroupShuffleXor(block_sum, 1);
    m = m_new;
#endif

#if WITH_VALUE
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p_fragments[BK / 16];
    [[unroll]] for (uint c = 0; c < BK / 16; ++c)
      coopMatLoadNV(p_fragments[c], probabilities, warp * ROWS * P_STRIDE + c * 16, P_STRIDE,
                    false);
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_fragment;
        coopMatLoadNV(v_fragment, tiles, V_OFFSET + c * 16 * DV_UVEC2S + n * 2, DV_UVEC2S, false);
        o[n] = coopMatMulAddNV(p_fragments[c], v_fragment, o[n]);
      }
    }
#endif
  }
#endif

#if FRAGMENT_REGISTERS
  // Each row's sum over its four lanes; then the lane writes its elements of the rows.
  l += vec2(subgroupShuffleXor(l.x, 1), subgroupShuffleXor(l.y, 1));
  l += vec2(subgroupShuffleXor(l.x, 2), subgroupShuffleXor(l.y, 2));
  [[unroll]] for (uint half_rows = 0; half_rows < 2; ++half_rows) {
    uint i = half_rows == 0 ? i_upper : i_lower;
    if (i >= SQ) continue;
    float lse_value = (m[half_rows] + log2(l[half_rows])) / float(LOG2E);
#if WITH_VALUE
#if SPLIT
    uint out_row = gl_WorkGroupID.z * gl_NumWorkGroups.y * SQ + q_base + i;
    float inverse_sum = l[half_rows] > 0.0 ? 1.0 / l[half_rows] : 0.0;
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 2; ++e)
        out_[out_row * (DV + 1) + n * 8 + quad_col + e] = o[n][2 * half_rows + e] * inverse_sum;
    }
    if (quad_col == 0) out_[out_row * (DV + 1) + DV] = lse_value;
#else
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 2; ++e) {
        float value = o[n][2 * half_rows + e] / l[half_rows];
        out_[OUT_ROW(i) * DV + n * 8 + quad_col + e] = value;
#if HEADS_LAST_COPY
        out_t[HEADS_LAST_ROW(i) * DV + n * 8 + quad_col + e] = value;
#endif
      }
    }
#endif
#if WITH_LSE
    if (quad_col == 0) lse[q_base + i] = lse_value;
#endif
#else
    if (quad_col == 0) lse[q_base + i] = lse_value;
#endif
  }
#elif WITH_VALUE

  // The last block's scores were read before its products, so the staging area is free.
  [[unroll]] for (uint n = 0; n < DV / 8; ++n)
    coopMatStoreNV(o[n], stage, stage_block + n * 8, STAGE_STRIDE, false);
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  if (i >= SQ) return;
#if SPLIT
  // Slice z's rows follow those of slices 0 .. z - 1 (B * HQ * SQ each; grid y is B * HQ).
  uint out_row = gl_WorkGroupID.z * gl_NumWorkGroups.y * SQ + q_base + i;
  // A row that saw no key of the slice (l = 0, m = -inf) gets zeros and lse -inf.
  float inverse_sum = l > 0.0 ? 1.0 / l : 0.0;
  [[unroll]] for (uint c = 0; c < DV / 2; ++c)
    out_[out_row * (DV + 1) + 2 * c + half_index] = stage[stage_row + 2 * c] * inverse_sum;
  if (half_index == 0) out_[out_row * (DV + 1) + DV] = (m + log2(l)) / float(LOG2E);
#else
  [[unroll]] for (uint c = 0; c < DV / 2; ++c) {
    float value = stage[stage_row + 2 * c] / l;
    out_[OUT_ROW(i) * DV + 2 * c + half_index] = value;
#if HEADS_LAST_COPY
    out_t[HEADS_LAST_ROW(i) * DV + 2 * c + half_index] = value;
#endif
  }
#endif
#if WITH_LSE
  // O and l are relative to the same m, so m + log2 l is the log-sum-exp here too.
  if (half_index == 0) lse[q_base + i] = (m + log2(l)) / float(LOG2E);
#endif
#else
  if (i < SQ && half_index == 0) lse[q_base + i] = (m + log2(l)) / float(LOG2E);
#endif
}
