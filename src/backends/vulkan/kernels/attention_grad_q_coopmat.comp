// Flash-attention backward for dQ on cooperative matrices (the `fast` path; the strict kernel,
// attention_grad_q.comp, explains the algorithm). A workgroup of WARPS subgroups owns
// BQ = WARPS * 16 queries of one (batch, query head), 16 per subgroup, with (SCALE log2(e) Q)
// and dO as f16 fragments in registers, and streams over blocks of BK keys, the next block's K
// and V read into registers (as vec4) while the current one is multiplied:
//   S = (SCALE log2(e) Q) K^T on 16 x 8 fragments, staged to shared memory (log2 units); two
//   lanes per query row read it into P = exp2(S + log2(e) (mask - lse)) = exp(S + mask - lse);
//   dP = dO V^T, staged through the same area once P is read; the lanes form
//   dS = P * (dP - delta) * SCALE in f16;
//   dQ += dS K with dQ in f32 accumulator fragments (no rescaling: P uses the saved lse).
// Each lane of a row's pair owns every other vec4 of its columns, so it reads S and dP as vec4s
// and writes dS 4 halves at a time, faster here than interleaved single columns (the forward and
// dK / dV kernels ran slower so and keep single columns).
// FRAGMENT_REGISTERS=1 (where the fragments keep their elements as NVIDIA's do, as for the
// forward): S, P, dP and dS stay in registers, 16 keys at a time, and each lane writes its own
// elements of dQ; no staging area, no subgroup barrier.
// SPLITS > 1 (passes/split_attention.cpp): workgroup z streams only keys [z * SLICE,
// (z + 1) * SLICE) and writes partial result z (after the B * HQ * SQ rows of those before).
// SCALED_GRAD_OUT: dO (and delta) times GRAD_OUT_SCALE, dQ divided by it
// (attention_coopmat_tiles.glsl); with SCALED_GRAD_OUT=2 the largest |dO| of the block's rows,
// found as they are fetched.
// Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL, BK (32 or 64),
// SPLITS, SLICE (a multiple of BK), OUT_BINDING and GRAD_OUT_BINDING (the bindings of
// out_value and grad_out), FRAGMENT_REGISTERS, SCALED_GRAD_OUT. Generated:
// float mask_at(b, h, i, j). Loops over fragments are unrolled so that fragment arrays stay in
// registers.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

#define WARPS 4
#define ROWS 16
#define BQ (WARPS * ROWS)
#define THREADS (WARPS * 32)
// Tile row strides in uvec2s of 4 halves (attention_coopmat_tiles.glsl).
#define D_UVEC2S ATTENTION_ROW_UVEC2S(D)
#define DV_UVEC2S ATTENTION_ROW_UVEC2S(DV)
// dS rows in units of 4 halves (one uvec2).
#define W_UVEC2S ((BK + 8) / 4)
// Staged S, dP and parts of the dQ rows at the end share a stride, in vec4s: 8 floats of
// padding put the rows of a subgroup 8 or 24 banks apart, so that the vec4 reads of the two
// lanes of 4 consecutive rows fall in distinct banks.
#define STAGE_VEC4S ((BK + 8) / 4)
// The result leaves in parts of OUT_COLUMNS columns, as wide as the staging rows allow.
#define OUT_COLUMNS (D % BK == 0 ? BK : 16)
#define V_OFFSET (BK * D_UVEC2S)
#define KV_UVEC2S (V_OFFSET + BK * DV_UVEC2S)
#define Q_UVEC2S (BQ * (D_UVEC2S > DV_UVEC2S ? D_UVEC2S : DV_UVEC2S))
#define LOG2E 1.4426950408889634

layout(local_size_x = THREADS) in;

// q, k, v, out_value and grad_out read four elements at a time: D and DV are multiples of 16,
// so a vec4 never straddles a row.
layout(std430, set = 0, binding = 0) readonly buffer buffer_q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer buffer_k4 { vec4 k4[]; };
layout(std430, set = 0, binding = 2) readonly buffer buffer_v4 { vec4 v4[]; };
layout(std430, set = 0, binding = OUT_BINDING) readonly buffer buffer_out_value4 {
  vec4 out_value4[];
};
layout(std430, set = 0, binding = GRAD_OUT_BINDING) readonly buffer buffer_grad_out4 {
  vec4 grad_out4[];
};

// The query block, then dO, then each key block's K and V tiles.
shared uvec2 tiles[KV_UVEC2S > Q_UVEC2S ? KV_UVEC2S : Q_UVEC2S];
#if SCALED_GRAD_OUT == 2
shared float grad_out_maxima[WARPS];
#endif
#if !FRAGMENT_REGISTERS
// Per subgroup: the block's S, then its dP, and parts of the dQ rows at the end.
shared uvec4 stage[BQ * STAGE_VEC4S];
shared uvec2 weights[BQ * W_UVEC2S];
#endif

// The f32 staging rows are a uvec4 array (glslang 12 stores cooperative matrices only into
// 32-bit unsigned vectors, not float ones): vec4 `at` of them.
#define STAGED(at) uintBitsToFloat(stage[(at)])

// Part `part` (OUT_COLUMNS columns) of the subgroup's ROWS result rows, staged at stage_block
// (rows STAGE_VEC4S vec4s apart), times `factor`, into `result` (rows of `width` floats) at row
// base + row0 + r, for the rows row0 + r below `limit`; consecutive lanes on consecutive vec4s.
#define ATTENTION_WRITE_PART(result, base, row0, limit, width, part, factor)                  \
  [[unroll]] for (uint r_ = 0; r_ < ROWS * OUT_COLUMNS / 128; ++r_) {                      \
    uint e_ = lane + r_ * 32, row_ = e_ / (OUT_COLUMNS / 4), column_ = e_ % (OUT_COLUMNS / 4); \
    if ((row0) + row_ < (limit)) {                                                            \
      vec4 value_ = STAGED(stage_block + row_ * STAGE_VEC4S + column_) * (factor);             \
      uint at_ = ((base) + (row0) + row_) * (width) + (part) * OUT_COLUMNS + 4 * column_;     \
      [[unroll]] for (uint c_ = 0; c_ < 4; ++c_) result[at_ + c_] = value_[c_];             \
    }                                                                                         \
  }

vec4 k_next[ATTENTION_LOADS(BK, D)];
vec4 v_next[ATTENTION_LOADS(BK, DV)];

// Reads the key block at k0 into registers; rows past SK read as zeros so that the padding
// keys' dS (zero) never meets a NaN.
void load_kv(uint kv_base, uint k0, uint t) {
  ATTENTION_FETCH(k_next, k4, kv_base, k0, SK, BK, D, t)
  ATTENTION_FETCH(v_next, v4, kv_base, k0, SK, BK, DV, t)
}

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  float grad_out_scale = GRAD_OUT_SCALE(b, kv_head), result_scale = 1.0 / grad_out_scale;
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
  // Two lanes per query row; lane half_index owns the row's columns 8c + 4 half_index .. + 3
  // (vec4 2c + half_index), which interleaves the pair over the banks.
  uint row = lane / 2, half_index = lane % 2;
  uint i = q0 + warp * ROWS + row;
  uint stage_row = (warp * ROWS + row) * STAGE_VEC4S + half_index;
  uint stage_block = warp * ROWS * STAGE_VEC4S;
  uint w_row = (warp * ROWS + row) * W_UVEC2S + half_index;
#endif

  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_begin = 0;
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;
#if SPLITS > 1
  kv_begin = gl_WorkGroupID.z * SLICE;
  kv_end = min(kv_end, kv_begin + SLICE);
#endif
  load_kv(kv_base, kv_begin, t);
  {
    vec4 q_values[ATTENTION_LOADS(BQ, D)];
    ATTENTION_FETCH(q_values, q4, q_base, q0, SQ, BQ, D, t)
    ATTENTION_STASH(tiles, 0, q_values, float(SCALE * LOG2E), BQ, D, t)
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> q_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(q_fragments[c], tiles, warp * ROWS * D_UVEC2S + c * 4, D_UVEC2S, false);
  barrier();
  {
    vec4 do_values[ATTENTION_LOADS(BQ, DV)];
    ATTENTION_FETCH(do_values, grad_out4, q_base, q0, SQ, BQ, DV, t)
#if SCALED_GRAD_OUT == 2
    float largest = 0.0;
    [[unroll]] for (uint r = 0; r < ATTENTION_LOADS(BQ, DV); ++r)
      largest = max(largest, ATTENTION_LARGEST4(do_values[r]));
    ATTENTION_WORKGROUP_MAX(largest, largest, grad_out_maxima, warp, lane)
    grad_out_scale = GRAD_OUT_FACTOR(largest);
    result_scale = 1.0 / grad_out_scale;
#endif
    ATTENTION_STASH(tiles, 0, do_values, grad_out_scale, BQ, DV, t)
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> do_fragments[DV / 16];
  [[unroll]] for (uint c = 0; c < DV / 16; ++c)
    coopMatLoadNV(do_fragments[c], tiles, warp * ROWS * DV_UVEC2S + c * 4, DV_UVEC2S, false);

#if FRAGMENT_REGISTERS
  // delta = rowsum(dO * O) and the log-sum-exp (log2 units) of both rows, each of a row's four
  // lanes summing a quarter of it.
  vec2 delta = vec2(0.0), row_lse = vec2(0.0);
  [[unroll]] for (uint half_rows = 0; half_rows < 2; ++half_rows) {
    uint i = half_rows == 0 ? i_upper : i_lower;
    if (i >= SQ) continue;
    [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
      uint at = (q_base + i) * (DV / 4) + (lane % 4) * (DV / 16) + c;
      delta[half_rows] += dot(grad_out4[at], out_value4[at]);
    }
    row_lse[half_rows] = lse[q_base + i] * float(LOG2E);
  }
  delta += vec2(subgroupShuffleXor(delta.x, 1), subgroupShuffleXor(delta.y, 1));
  delta += vec2(subgroupShuffleXor(delta.x, 2), subgroupShuffleXor(delta.y, 2));
  delta *= grad_out_scale;
#else
  // delta = rowsum(dO * O), each lane of the pair summing half the row.
  float delta = 0.0;
  if (i < SQ) {
    [[unroll]] for (uint c = 0; c < DV / 8; ++c) {
      uint at = (q_base + i) * (DV / 4) + half_index * (DV / 8) + c;
      delta += dot(grad_out4[at], out_value4[at]);
    }
  }
  delta += subgroupShuffleXor(delta, 1);
  delta *= grad_out_scale;
  float row_lse = i < SQ ? lse[q_base + i] * float(LOG2E) : 0.0;
#endif

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulators[D / 8];
  [[unroll]] for (uint n = 0; n < D / 8; ++n)
    accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);

  for (uint k0 = kv_begin; k0 < kv_end; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles (or dO)
    ATTENTION_STASH(tiles, 0, k_next, 1.0, BK, D, t)
    ATTENTION_STASH(tiles, V_OFFSET, v_next, 1.0, BK, DV, t)
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
    // Per 16 keys: S and dP of both 8-key halves on fragments, dS from the lane's own elements
    // into the A fragment (component 4 (e / 2) + 2 half + e % 2 holds element e of half
    // `half`), and its product with K into dQ.
    [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ds_fragment;
      [[unroll]] for (uint half_keys = 0; half_keys < 2; ++half_keys) {
        uint n = 2 * c + half_keys;
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint d = 0; d < D / 16; ++d) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
          coopMatLoadNV(k_transposed, tiles, n * 8 * D_UVEC2S + d * 4, D_UVEC2S, true);
          s = coopMatMulAddNV(q_fragments[d], k_transposed, s);
        }
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint d = 0; d < DV / 16; ++d) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_transposed;
          coopMatLoadNV(v_transposed, tiles, V_OFFSET + n * 8 * DV_UVEC2S + d * 4, DV_UVEC2S,
                        true);
          dp = coopMatMulAddNV(do_fragments[d], v_transposed, dp);
        }
        [[unroll]] for (uint e = 0; e < 4; ++e) {
          uint i = e < 2 ? i_upper : i_lower, j = k0 + n * 8 + quad_col + e % 2;
          bool visible = i < SQ && j < SK && (CAUSAL == 0 || j <= i);
          float p = visible ? exp2(s[e] + block_mask[n][e] * float(LOG2E) - row_lse[e / 2]) : 0.0;
          ds_fragment[4 * (e / 2) + 2 * half_keys + e % 2] =
              float16_t(p * (dp[e] - delta[e / 2]) * SCALE);
        }
      }
      [[unroll]] for (uint n = 0; n < D / 8; ++n) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_fragment;
        coopMatLoadNV(k_fragment, tiles, c * 16 * D_UVEC2S + 2 * n, D_UVEC2S, false);
        accumulators[n] = coopMatMulAddNV(ds_fragment, k_fragment, accumulators[n]);
      }
    }
  }

  // Each lane writes its own elements of dQ, after the rows of the partials before this one
  // (grid y is B * HQ).
  uint partial_base = gl_WorkGroupID.z * gl_NumWorkGroups.y * SQ;
  [[unroll]] for (uint half_rows = 0; half_rows < 2; ++half_rows) {
    uint i = half_rows == 0 ? i_upper : i_lower;
    if (i >= SQ) continue;
    [[unroll]] for (uint n = 0; n < D / 8; ++n) {
      [[unroll]] for (uint e = 0; e < 2; ++e)
        grad_q[(partial_base + q_base + i) * D + n * 8 + quad_col + e] =
            accumulators[n][2 * half_rows + e] * result_scale;
    }
  }
#else
    vec4 block_mask[BK / 8];
    [[unroll]] for (uint c = 0; c < BK / 8; ++c) {
      [[unroll]] for (uint e = 0; e < 4; ++e)
        block_mask[c][e] = mask_at(b, h, i, k0 + 8 * c + 4 * half_index + e);
    }
    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        // K^T as a column-major 16 x 8 block: element (d, j) is K[j][d].
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_UVEC2S + c * 4, D_UVEC2S, true);
        s = coopMatMulAddNV(q_fragments[c], k_transposed, s);
      }
      coopMatStoreNV(s, stage, stage_block + n * 2, STAGE_VEC4S, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    vec4 p[BK / 8];
    [[unroll]] for (uint c = 0; c < BK / 8; ++c) {
      vec4 staged = STAGED(stage_row + 2 * c);
      [[unroll]] for (uint e = 0; e < 4; ++e) {
        uint j = k0 + 8 * c + 4 * half_index + e;
        bool visible = i < SQ && j < SK && (CAUSAL == 0 || j <= i);
        p[c][e] = visible ? exp2(staged[e] + block_mask[c][e] * float(LOG2E) - row_lse) : 0.0;
      }
    }
    subgroupBarrier();  // every lane has read its scores: the staging area is free for dP

    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_transposed;
        coopMatLoadNV(v_transposed, tiles, V_OFFSET + n * 8 * DV_UVEC2S + c * 4, DV_UVEC2S, true);
        dp = coopMatMulAddNV(do_fragments[c], v_transposed, dp);
      }
      coopMatStoreNV(dp, stage, stage_block + n * 2, STAGE_VEC4S, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // Hidden keys have P = 0 and a finite dP (zero rows past SK), so their dS is 0.
    [[unroll]] for (uint c = 0; c < BK / 8; ++c)
      weights[w_row + 2 * c] = QUARTER_HALVES(p[c] * (STAGED(stage_row + 2 * c) - delta) * SCALE);
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ds_fragments[BK / 16];
    [[unroll]] for (uint c = 0; c < BK / 16; ++c)
      coopMatLoadNV(ds_fragments[c], weights, warp * ROWS * W_UVEC2S + c * 4, W_UVEC2S, false);
    [[unroll]] for (uint n = 0; n < D / 8; ++n) {
      [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_fragment;
        coopMatLoadNV(k_fragment, tiles, c * 16 * D_UVEC2S + 2 * n, D_UVEC2S, false);
        accumulators[n] = coopMatMulAddNV(ds_fragments[c], k_fragment, accumulators[n]);
      }
    }
  }

  // The last block's dP was read before its products, so the staging area is free; out in
  // parts, consecutive lanes on consecutive columns, after the rows of the partials before
  // this one (grid y is B * HQ).
  uint partial_base = gl_WorkGroupID.z * gl_NumWorkGroups.y * SQ;
  [[unroll]] for (uint part = 0; part < D / OUT_COLUMNS; ++part) {
    subgroupBarrier();  // every lane has written the previous part out
    [[unroll]] for (uint n = 0; n < OUT_COLUMNS / 8; ++n)
      coopMatStoreNV(accumulators[part * (OUT_COLUMNS / 8) + n], stage, stage_block + n * 2,
                     STAGE_VEC4S, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    ATTENTION_WRITE_PART(grad_q, partial_base + q_base, q0 + warp * ROWS, SQ, D, part,
                         result_scale)
  }
#endif
}
