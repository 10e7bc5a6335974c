// Flash-attention backward for dK (GRAD_K=1), dV (GRAD_K=0) or both (GRAD_K=1, WITH_GRAD_V=1,
// dV into result_v) on cooperative matrices (the `fast` path; the strict kernel,
// attention_tiled.comp, explains the algorithm). A workgroup
// of WARPS subgroups owns BK = WARPS * 16 keys of one (batch, kv head), 16 per subgroup, with
// (SCALE log2(e) K) and, for dK, V as f16 fragments in registers. It walks every query head of
// its group and every block of BQ queries as one sequence of blocks, the next block's Q and dO
// read into registers (as vec4) while the current one is multiplied:
//   S^T = (SCALE log2(e) K) Q^T on 16 x 8 fragments, staged to shared memory (log2 units);
//   two lanes per key row read it into P^T = exp2(S^T + log2(e) (mask - lse)), which is
//   exp(S^T + mask - lse) in natural units;
//   for dK, dP^T = V dO^T, staged through the same area once P^T is read;
//   the lanes write P^T (dV) or dS^T = P^T * (dP^T - delta) * SCALE (dK) as f16;
//   dV += P^T dO or dK += dS^T Q, in f32 accumulator fragments.
// With both, P^T goes into dV before dP^T is staged, and dS^T then into dK: one pass over the
// scores for the two gradients, where separate launches computed S^T and P^T twice.
// FRAGMENT_REGISTERS=1 (where the fragments keep their elements as NVIDIA's do, as for the
// forward and dQ): S^T, P^T, dP^T and dS^T stay in registers, 16 queries at a time (the lane's
// own elements of two 16 x 8 score fragments make the 16 x 16 A fragment of P^T or dS^T), and
// each lane writes its own elements of the result; no staging area, no subgroup barrier.
// SPLITS > 1 (passes/split_attention.cpp): workgroup z streams only queries [s * SLICE,
// (s + 1) * SLICE), s = z % SPLITS, of each head and writes partial result z (after the
// B * HKV * SK rows of those before); HEAD_SPLITS > 1: only the GROUP_PART query heads of part
// z / SPLITS of the group.
// SCALED_GRAD_OUT: dO (and delta) times GRAD_OUT_SCALE, the results divided by it
// (attention_coopmat_tiles.glsl); with SCALED_GRAD_OUT=2 the largest |dO| of the rows the
// workgroup streams, read once before it streams them.
// Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL, GRAD_K, WITH_GRAD_V,
// BQ (32 or 64), SPLITS, SLICE (a multiple of BQ), HEAD_SPLITS, GRAD_OUT_BINDING and, for dK,
// OUT_BINDING (the bindings of grad_out and out_value), FRAGMENT_REGISTERS, SCALED_GRAD_OUT.
// Generated: float mask_at(b, h, i, j). Loops over fragments are unrolled so that fragment
// arrays stay in registers.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

#define WARPS 4
#define ROWS 16
#define BK (WARPS * ROWS)
#define THREADS (WARPS * 32)
// Threads per query of a block for its lse and delta.
#define TPQ (THREADS / BQ)
// Tile row strides in uvec2s of 4 halves (attention_coopmat_tiles.glsl).
#define D_UVEC2S ATTENTION_ROW_UVEC2S(D)
#define DV_UVEC2S ATTENTION_ROW_UVEC2S(DV)
#define W_STRIDE (BQ + 8)
#if GRAD_K
#define RESULT_DIM D
#else
#define RESULT_DIM DV
#endif
// Staged S^T, dP^T and parts of the result rows at the end share a stride; the 4 floats of
// padding spread the rows of a subgroup over the shared-memory banks.
#define STAGE_STRIDE (BQ + 4)
// A result of `dim` columns leaves in parts as wide as the staging rows allow.
#define OUT_COLUMNS(dim) ((dim) % BQ == 0 ? BQ : 16)
#define DO_OFFSET (BQ * D_UVEC2S)
#define QDO_UVEC2S (DO_OFFSET + BQ * DV_UVEC2S)
#define K_UVEC2S (BK * (D_UVEC2S > DV_UVEC2S ? D_UVEC2S : DV_UVEC2S))
#define LOG2E 1.4426950408889634

layout(local_size_x = THREADS) in;

// q, k, v, out_value and grad_out read four elements at a time: D and DV are multiples of 16,
// so a vec4 never straddles a row.
layout(std430, set = 0, binding = 0) readonly buffer buffer_q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer buffer_k4 { vec4 k4[]; };
layout(std430, set = 0, binding = GRAD_OUT_BINDING) readonly buffer buffer_grad_out4 {
  vec4 grad_out4[];
};
#if GRAD_K
layout(std430, set = 0, binding = 2) readonly buffer buffer_v4 { vec4 v4[]; };
layout(std430, set = 0, binding = OUT_BINDING) readonly buffer buffer_out_value4 {
  vec4 out_value4[];
};
#endif

// The key block (and for dK the value block), then each query block's Q and dO tiles.
shared uvec2 tiles[QDO_UVEC2S > K_UVEC2S ? QDO_UVEC2S : K_UVEC2S];
shared float query_lse[BQ];
#if SCALED_GRAD_OUT == 2
shared float grad_out_maxima[WARPS];
#endif
#if GRAD_K
shared float query_delta[BQ];
#endif
#if !FRAGMENT_REGISTERS
// Per subgroup: the block's S^T, then (dK) its dP^T, and parts of the result rows at the end.
shared float stage[BK * STAGE_STRIDE];
shared float16_t weights[BK * W_STRIDE];
#endif

vec4 q_next[ATTENTION_LOADS(BQ, D)];
vec4 do_next[ATTENTION_LOADS(BQ, DV)];
// This thread's query of the next block: its lse (log2 units) and, for dK, part of its delta.
float lse_next;
#if GRAD_K
float delta_next;
#endif

// Reads the query block at q0 of the head whose rows start at q_base into registers; rows past
// SQ read as zeros so that their P (zero) never meets a NaN.
void load_qdo(uint q_base, uint q0, uint t) {
  ATTENTION_FETCH(q_next, q4, q_base, q0, SQ, BQ, D, t)
  ATTENTION_FETCH(do_next, grad_out4, q_base, q0, SQ, BQ, DV, t)
  uint qi = q0 + t / TPQ;
  lse_next = qi < SQ ? lse[q_base + qi] * float(LOG2E) : 0.0;
#if GRAD_K
  // delta = rowsum(dO * O), each of the query's TPQ threads summing a TPQ-th of the row.
  delta_next = 0.0;
  if (qi < SQ) {
    [[unroll]] for (uint c = 0; c < DV / 4 / TPQ; ++c) {
      uint at = (q_base + qi) * (DV / 4) + (t % TPQ) * (DV / 4 / TPQ) + c;
      delta_next += dot(grad_out4[at], out_value4[at]);
    }
  }
#endif
}

// Writes this subgroup's rows of accumulator fragments `fragments` (dim columns), times
// result_scale, to `target` through its staging rows, OUT_COLUMNS(dim) columns at a time.
#define WRITE_ROWS(fragments, target, dim)                                                        \
  [[unroll]] for (uint part = 0; part < (dim) / OUT_COLUMNS(dim); ++part) {                      \
    subgroupBarrier(); /* every lane has written the previous part out */                        \
    [[unroll]] for (uint n = 0; n < OUT_COLUMNS(dim) / 8; ++n)                                   \
      coopMatStoreNV(fragments[part * (OUT_COLUMNS(dim) / 8) + n], stage, stage_block + n * 8, \
                     STAGE_STRIDE, false);                                                       \
    subgroupMemoryBarrierShared();                                                               \
    subgroupBarrier();                                                                           \
    [[unroll]] for (uint r = 0; r < ROWS * OUT_COLUMNS(dim) / 32; ++r) {                         \
      uint e = lane + r * 32, kj = k0 + warp * ROWS + e / OUT_COLUMNS(dim);                      \
      if (kj < SK)                                                                               \
        target[(partial_base + kv_base + kj) * (dim) + part * OUT_COLUMNS(dim) +                 \
               e % OUT_COLUMNS(dim)] =                                                           \
            stage[stage_block + (e / OUT_COLUMNS(dim)) * STAGE_STRIDE + e % OUT_COLUMNS(dim)] *  \
            result_scale;                                                                        \
    }                                                                                            \
  }

#define GROUP_PART (HQ / HKV / HEAD_SPLITS)

void main() {
  uint b = gl_WorkGroupID.y / HKV, kv_head = gl_WorkGroupID.y % HKV;
  float grad_out_scale = GRAD_OUT_SCALE(b, kv_head), result_scale = 1.0 / grad_out_scale;
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint k0 = gl_WorkGroupID.x * BK;
  uint kv_base = gl_WorkGroupID.y * SK;
#if FRAGMENT_REGISTERS
  // The lane's two key rows of the subgroup's 16 (upper: e = 0, 1 of a 16 x 8 fragment; lower:
  // e = 2, 3) and its two query columns of each 8 (e % 2 more than quad_col).
  uint quad_row = lane / 4, quad_col = 2 * (lane % 4);
  uint j_upper = k0 + warp * ROWS + quad_row, j_lower = j_upper + 8;
#else
  // Two lanes per key row; lane half_index owns the row's columns 2c + half_index, which
  // interleaves the pair over the banks.
  uint row = lane / 2, half_index = lane % 2;
  uint j = k0 + warp * ROWS + row;
  uint stage_row = (warp * ROWS + row) * STAGE_STRIDE + half_index;
  uint stage_block = warp * ROWS * STAGE_STRIDE;
  uint w_row = (warp * ROWS + row) * W_STRIDE + half_index;
#endif

  // Top-left causal masking: queries before k0 see none of this block's keys. The blocks of
  // every query head of the group form one sequence, so the prefetch crosses heads too.
  uint q_start = CAUSAL != 0 ? (k0 / BQ) * BQ : 0u;
  uint q_end = SQ;
#if SPLITS > 1
  q_start = max(q_start, (gl_WorkGroupID.z % SPLITS) * SLICE);
  q_end = min(q_end, (gl_WorkGroupID.z % SPLITS) * SLICE + SLICE);
#endif
  uint q_blocks = q_start < q_end ? (q_end - q_start + BQ - 1) / BQ : 0u;
  uint blocks = GROUP_PART * q_blocks;
  uint h_first = kv_head * (HQ / HKV) + (gl_WorkGroupID.z / SPLITS) * GROUP_PART;
  if (blocks > 0) load_qdo((b * HQ + h_first) * SQ, q_start, t);
#if SCALED_GRAD_OUT == 2
  {
    float largest = 0.0;
    uint vectors = q_blocks > 0 ? (q_end - q_start) * (DV / 4) : 0u;
    for (uint part = 0; part < GROUP_PART; ++part) {
      uint first = ((b * HQ + h_first + part) * SQ + q_start) * (DV / 4);
      for (uint e = t; e < vectors; e += THREADS)
        largest = max(largest, ATTENTION_LARGEST4(grad_out4[first + e]));
    }
    ATTENTION_WORKGROUP_MAX(largest, largest, grad_out_maxima, warp, lane)
    grad_out_scale = GRAD_OUT_FACTOR(largest);
    result_scale = 1.0 / grad_out_scale;
  }
#endif

  {
    vec4 k_values[ATTENTION_LOADS(BK, D)];
    ATTENTION_FETCH(k_values, k4, kv_base, k0, SK, BK, D, t)
    ATTENTION_STASH(tiles, 0, k_values, float(SCALE * LOG2E), BK, D, t)
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> k_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(k_fragments[c], tiles, warp * ROWS * D_UVEC2S + c * 4, D_UVEC2S, false);
#if GRAD_K
  barrier();
  {
    vec4 v_values[ATTENTION_LOADS(BK, DV)];
    ATTENTION_FETCH(v_values, v4, kv_base, k0, SK, BK, DV, t)
    ATTENTION_STASH(tiles, 0, v_values, 1.0, BK, DV, t)
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> v_fragments[DV / 16];
  [[unroll]] for (uint c = 0; c < DV / 16; ++c)
    coopMatLoadNV(v_fragments[c], tiles, warp * ROWS * DV_UVEC2S + c * 4, DV_UVEC2S, false);
#endif

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulators[RESULT_DIM / 8];
  [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n)
    accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
#if WITH_GRAD_V
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> value_accumulators[DV / 8];
  [[unroll]] for (uint n = 0; n < DV / 8; ++n)
    value_accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
#endif

  for (uint block = 0; block < blocks; ++block) {
    uint h = h_first + block / q_blocks;
    uint q0 = q_start + (block % q_blocks) * BQ;
#if GRAD_K
    float delta = delta_next;
    [[unroll]] for (uint s = 1; s < TPQ; s *= 2) delta += subgroupShuffleXor(delta, s);
#endif
    barrier();  // every subgroup is done with the previous tiles (or the key block)
    ATTENTION_STASH(tiles, 0, q_next, 1.0, BQ, D, t)
    ATTENTION_STASH(tiles, DO_OFFSET, do_next, grad_out_scale, BQ, DV, t)
    if (t % TPQ == 0) {
      query_lse[t / TPQ] = lse_next;
#if GRAD_K
      query_delta[t / TPQ] = delta * grad_out_scale;
#endif
    }
    barrier();
    if (block + 1 < blocks) {
      uint next = block + 1;
      load_qdo((b * HQ + h_first + next / q_blocks) * SQ, q_start + (next % q_blocks) * BQ, t);
    }

    // The mask under the block's scores (zeros without a mask), read before the products so that
    // the reads overlap them and each other instead of each waiting in turn.
#if FRAGMENT_REGISTERS
    vec4 block_mask[BQ / 8];
    [[unroll]] for (uint n = 0; n < BQ / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 4; ++e)
        block_mask[n][e] =
            mask_at(b, h, q0 + n * 8 + quad_col + e % 2, e < 2 ? j_upper : j_lower);
    }
    // Per 16 queries: S^T (and dP^T) of both 8-query halves on fragments, P^T (and dS^T) from
    // the lane's own elements into A fragments (component 4 (e / 2) + 2 half + e % 2 holds
    // element e of half `half`), and their products with dO (and Q) into the results.
    [[unroll]] for (uint c = 0; c < BQ / 16; ++c) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p_fragment;
#if GRAD_K
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ds_fragment;
#endif
      [[unroll]] for (uint half_queries = 0; half_queries < 2; ++half_queries) {
        uint n = 2 * c + half_queries;
        // Q^T (and dO^T) as column-major 16 x 8 blocks: element (d, i) is Q[i][d].
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint d = 0; d < D / 16; ++d) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> q_transposed;
          coopMatLoadNV(q_transposed, tiles, n * 8 * D_UVEC2S + d * 4, D_UVEC2S, true);
          s = coopMatMulAddNV(k_fragments[d], q_transposed, s);
        }
#if GRAD_K
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint d = 0; d < DV / 16; ++d) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> do_transposed;
          coopMatLoadNV(do_transposed, tiles, DO_OFFSET + n * 8 * DV_UVEC2S + d * 4, DV_UVEC2S,
                        true);
          dp = coopMatMulAddNV(v_fragments[d], do_transposed, dp);
        }
#endif
        // Hidden queries have P = 0 and a finite dP (zero rows past SQ), so their dS is 0.
        [[unroll]] for (uint e = 0; e < 4; ++e) {
          uint ii = n * 8 + quad_col + e % 2, i = q0 + ii, j = e < 2 ? j_upper : j_lower;
          bool visible = i < SQ && j < SK && (CAUSAL == 0 || j <= i);
          float p = visible ? exp2(s[e] + block_mask[n][e] * float(LOG2E) - query_lse[ii]) : 0.0;
          uint component = 4 * (e / 2) + 2 * half_queries + e % 2;
          p_fragment[component] = float16_t(p);
#if GRAD_K
          ds_fragment[component] = float16_t(p * (dp[e] - query_delta[ii]) * SCALE);
#endif
        }
      }
#if WITH_GRAD_V || !GRAD_K
      [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> grad_out_fragment;
        coopMatLoadNV(grad_out_fragment, tiles, DO_OFFSET + c * 16 * DV_UVEC2S + n * 2, DV_UVEC2S,
                      false);
#if WITH_GRAD_V
        value_accumulators[n] = coopMatMulAddNV(p_fragment, grad_out_fragment, value_accumulators[n]);
#else
        accumulators[n] = coopMatMulAddNV(p_fragment, grad_out_fragment, accumulators[n]);
#endif
      }
#endif
#if GRAD_K
      [[unroll]] for (uint n = 0; n < D / 8; ++n) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> q_fragment;
        coopMatLoadNV(q_fragment, tiles, c * 16 * D_UVEC2S + n * 2, D_UVEC2S, false);
        accumulators[n] = coopMatMulAddNV(ds_fragment, q_fragment, accumulators[n]);
      }
#endif
    }
  }

  // Each lane writes its own elements of the result, after the rows of the partials before this
  // one (grid y is B * HKV).
  uint partial_base = gl_WorkGroupID.z * gl_NumWorkGroups.y * SK;
  [[unroll]] for (uint half_rows = 0; half_rows < 2; ++half_rows) {
    uint j = half_rows == 0 ? j_upper : j_lower;
    if (j >= SK) continue;
    [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 2; ++e)
        result[(partial_base + kv_base + j) * RESULT_DIM + n * 8 + quad_col + e] =
            accumulators[n][2 * half_rows + e] * result_scale;
    }
#if WITH_GRAD_V
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 2; ++e)
        result_v[(partial_base + kv_base + j) * DV + n * 8 + quad_col + e] =
            value_accumulators[n][2 * half_rows + e] * result_scale;
    }
#endif
  }
#else
    float block_mask[BQ / 2];
    [[unroll]] for (uint c = 0; c < BQ / 2; ++c)
      block_mask[c] = mask_at(b, h, q0 + 2 * c + half_index, j);
    [[unroll]] for (uint n = 0; n < BQ / 8; ++n) {
      // Q^T (and dO^T) as column-major 16 x 8 blocks: element (d, i) is Q[i][d].
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> q_transposed;
        coopMatLoadNV(q_transposed, tiles, n * 8 * D_UVEC2S + c * 4, D_UVEC2S, true);
        s = coopMatMulAddNV(k_fragments[c], q_transposed, s);
      }
      coopMatStoreNV(s, stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    float p[BQ / 2];
    [[unroll]] for (uint c = 0; c < BQ / 2; ++c) {
      uint ii = 2 * c + half_index;
      uint i = q0 + ii;
      bool visible = i < SQ && j < SK && (CAUSAL == 0 || j <= i);
      p[c] = visible ? exp2(stage[stage_row + 2 * c] + block_mask[c] * float(LOG2E) - query_lse[ii])
                     : 0.0;
    }
#if WITH_GRAD_V
    [[unroll]] for (uint c = 0; c < BQ / 2; ++c) weights[w_row + 2 * c] = float16_t(p[c]);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p_fragments[BQ / 16];
      [[unroll]] for (uint c = 0; c < BQ / 16; ++c)
        coopMatLoadNV(p_fragments[c], weights, warp * ROWS * W_STRIDE + c * 16, W_STRIDE, false);
      [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
        [[unroll]] for (uint c = 0; c < BQ / 16; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> grad_out_fragment;
          coopMatLoadNV(grad_out_fragment, tiles, DO_OFFSET + c * 16 * DV_UVEC2S + n * 2,
                        DV_UVEC2S, false);
          value_accumulators[n] =
              coopMatMulAddNV(p_fragments[c], grad_out_fragment, value_accumulators[n]);
        }
      }
    }
    // Every lane has loaded P^T before dS^T overwrites it (the subgroup barrier below).
#endif
#if GRAD_K
    subgroupBarrier();  // every lane has read its scores: the staging area is free for dP^T
    [[unroll]] for (uint n = 0; n < BQ / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> do_transposed;
        coopMatLoadNV(do_transposed, tiles, DO_OFFSET + n * 8 * DV_UVEC2S + c * 4, DV_UVEC2S,
                      true);
        dp = coopMatMulAddNV(v_fragments[c], do_transposed, dp);
      }
      coopMatStoreNV(dp, stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    // Hidden queries have P = 0 and a finite dP (zero rows past SQ), so their dS is 0.
    [[unroll]] for (uint c = 0; c < BQ / 2; ++c) {
      float dp_minus_delta = stage[stage_row + 2 * c] - query_delta[2 * c + half_index];
      weights[w_row + 2 * c] = float16_t(p[c] * dp_minus_delta * SCALE);
    }
#else
    [[unroll]] for (uint c = 0; c < BQ / 2; ++c) weights[w_row + 2 * c] = float16_t(p[c]);
#endif
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> w_fragments[BQ / 16];
    [[unroll]] for (uint c = 0; c < BQ / 16; ++c)
      coopMatLoadNV(w_fragments[c], weights, warp * ROWS * W_STRIDE + c * 16, W_STRIDE, false);
    [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n) {
      [[unroll]] for (uint c = 0; c < BQ / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> operand;
#if GRAD_K
        coopMatLoadNV(operand, tiles, c * 16 * D_UVEC2S + n * 2, D_UVEC2S, false);
#else
        coopMatLoadNV(operand, tiles, DO_OFFSET + c * 16 * DV_UVEC2S + n * 2, DV_UVEC2S, false);
#endif
        accumulators[n] = coopMatMulAddNV(w_fragments[c], operand, accumulators[n]);
      }
    }
  }

  // The last block's staged values were read before its products, so the staging area is
  // free; out in parts, consecutive lanes on consecutive columns, after the rows of the
  // partials before this one (grid y is B * HKV).
  uint partial_base = gl_WorkGroupID.z * gl_NumWorkGroups.y * SK;
  WRITE_ROWS(accumulators, result, RESULT_DIM)
#if WITH_GRAD_V
  WRITE_ROWS(value_accumulators, result_v, DV)
#endif
#endif
}
