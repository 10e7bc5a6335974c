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
// SPLITS > 1 (passes/split_attention.cpp): workgroup z streams only keys [z * SLICE,
// (z + 1) * SLICE) and writes partial result z (after the B * HQ * SQ rows of those before).
// Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL, BK (32 or 64),
// SPLITS, SLICE (a multiple of BK), OUT_BINDING and GRAD_OUT_BINDING (the bindings of
// out_value and grad_out). Generated:
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
#define D_STRIDE (D + 8)
#define DV_STRIDE (DV + 8)
#define W_STRIDE (BK + 8)
// Staged S, dP and parts of the dQ rows at the end share a stride; the 4 floats of padding
// spread the rows of a subgroup over the shared-memory banks.
#define STAGE_STRIDE (BK + 4)
// The result leaves in parts of OUT_COLUMNS columns, as wide as the staging rows allow.
#define OUT_COLUMNS (D % BK == 0 ? BK : 16)
#define V_OFFSET (BK * D_STRIDE)
#define KV_HALVES (V_OFFSET + BK * DV_STRIDE)
#define Q_HALVES (BQ * (D_STRIDE > DV_STRIDE ? D_STRIDE : DV_STRIDE))
#define K_VECTORS (BK * D / 4 / THREADS)
#define V_VECTORS (BK * DV / 4 / THREADS)
#define Q_VECTORS (BQ * D / 4 / THREADS)
#define DO_VECTORS (BQ * DV / 4 / THREADS)
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
shared float16_t tiles[KV_HALVES > Q_HALVES ? KV_HALVES : Q_HALVES];
// Per subgroup: the block's S, then its dP, and parts of the dQ rows at the end.
shared float stage[BQ * STAGE_STRIDE];
shared float16_t weights[BQ * W_STRIDE];

vec4 k_next[K_VECTORS];
vec4 v_next[V_VECTORS];

// Reads the key block at k0 into registers; rows past SK read as zeros so that the padding
// keys' dS (zero) never meets a NaN.
void load_kv(uint kv_base, uint k0, uint t) {
  [[unroll]] for (uint r = 0; r < K_VECTORS; ++r) {
    uint e = t + r * THREADS, kj = k0 + e / (D / 4);
    k_next[r] = kj < SK ? k4[(kv_base + kj) * (D / 4) + e % (D / 4)] : vec4(0.0);
  }
  [[unroll]] for (uint r = 0; r < V_VECTORS; ++r) {
    uint e = t + r * THREADS, kj = k0 + e / (DV / 4);
    v_next[r] = kj < SK ? v4[(kv_base + kj) * (DV / 4) + e % (DV / 4)] : vec4(0.0);
  }
}

void store_halves(uint at, vec4 value) {
  tiles[at] = float16_t(value.x);
  tiles[at + 1] = float16_t(value.y);
  tiles[at + 2] = float16_t(value.z);
  tiles[at + 3] = float16_t(value.w);
}

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint q0 = gl_WorkGroupID.x * BQ;
  uint q_base = bh * SQ;
  uint kv_base = (b * HKV + kv_head) * SK;
  // Two lanes per query row; lane half_index owns the row's columns 2c + half_index, which
  // interleaves the pair over the banks.
  uint row = lane / 2, half_index = lane % 2;
  uint i = q0 + warp * ROWS + row;
  uint stage_row = (warp * ROWS + row) * STAGE_STRIDE + half_index;
  uint stage_block = warp * ROWS * STAGE_STRIDE;
  uint w_row = (warp * ROWS + row) * W_STRIDE + half_index;

  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_begin = 0;
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;
#if SPLITS > 1
  kv_begin = gl_WorkGroupID.z * SLICE;
  kv_end = min(kv_end, kv_begin + SLICE);
#endif
  load_kv(kv_base, kv_begin, t);
  [[unroll]] for (uint r = 0; r < Q_VECTORS; ++r) {
    uint e = t + r * THREADS, qi = q0 + e / (D / 4);
    vec4 value = qi < SQ ? q4[(q_base + qi) * (D / 4) + e % (D / 4)] : vec4(0.0);
    store_halves((e / (D / 4)) * D_STRIDE + (e % (D / 4)) * 4, value * float(SCALE * LOG2E));
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> q_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(q_fragments[c], tiles, warp * ROWS * D_STRIDE + c * 16, D_STRIDE, false);
  barrier();
  [[unroll]] for (uint r = 0; r < DO_VECTORS; ++r) {
    uint e = t + r * THREADS, qi = q0 + e / (DV / 4);
    vec4 value = qi < SQ ? grad_out4[(q_base + qi) * (DV / 4) + e % (DV / 4)] : vec4(0.0);
    store_halves((e / (DV / 4)) * DV_STRIDE + (e % (DV / 4)) * 4, value);
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> do_fragments[DV / 16];
  [[unroll]] for (uint c = 0; c < DV / 16; ++c)
    coopMatLoadNV(do_fragments[c], tiles, warp * ROWS * DV_STRIDE + c * 16, DV_STRIDE, false);

  // delta = rowsum(dO * O), each lane of the pair summing half the row.
  float delta = 0.0;
  if (i < SQ) {
    [[unroll]] for (uint c = 0; c < DV / 8; ++c) {
      uint at = (q_base + i) * (DV / 4) + half_index * (DV / 8) + c;
      delta += dot(grad_out4[at], out_value4[at]);
    }
  }
  delta += subgroupShuffleXor(delta, 1);
  float row_lse = i < SQ ? lse[q_base + i] * float(LOG2E) : 0.0;

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulators[D / 8];
  [[unroll]] for (uint n = 0; n < D / 8; ++n)
    accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);

  for (uint k0 = kv_begin; k0 < kv_end; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles (or dO)
    [[unroll]] for (uint r = 0; r < K_VECTORS; ++r) {
      uint e = t + r * THREADS;
      store_halves((e / (D / 4)) * D_STRIDE + (e % (D / 4)) * 4, k_next[r]);
    }
    [[unroll]] for (uint r = 0; r < V_VECTORS; ++r) {
      uint e = t + r * THREADS;
      store_halves(V_OFFSET + (e / (DV / 4)) * DV_STRIDE + (e % (DV / 4)) * 4, v_next[r]);
    }
    barrier();
    if (k0 + BK < kv_end) load_kv(kv_base, k0 + BK, t);

    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        // K^T as a column-major 16 x 8 block: element (d, j) is K[j][d].
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_STRIDE + c * 16, D_STRIDE, true);
        s = coopMatMulAddNV(q_fragments[c], k_transposed, s);
      }
      coopMatStoreNV(s, stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    float p[BK / 2];
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      uint j = k0 + 2 * c + half_index;
      bool visible = i < SQ && j < SK && (CAUSAL == 0 || j <= i);
      p[c] = visible
                 ? exp2(stage[stage_row + 2 * c] + mask_at(b, h, i, j) * float(LOG2E) - row_lse)
                 : 0.0;
    }
    subgroupBarrier();  // every lane has read its scores: the staging area is free for dP

    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_transposed;
        coopMatLoadNV(v_transposed, tiles, V_OFFSET + n * 8 * DV_STRIDE + c * 16, DV_STRIDE,
                      true);
        dp = coopMatMulAddNV(do_fragments[c], v_transposed, dp);
      }
      coopMatStoreNV(dp, stage, stage_block + n * 8, STAGE_STRIDE, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // Hidden keys have P = 0 and a finite dP (zero rows past SK), so their dS is 0.
    [[unroll]] for (uint c = 0; c < BK / 2; ++c)
      weights[w_row + 2 * c] = float16_t(p[c] * (stage[stage_row + 2 * c] - delta) * SCALE);
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ds_fragments[BK / 16];
    [[unroll]] for (uint c = 0; c < BK / 16; ++c)
      coopMatLoadNV(ds_fragments[c], weights, warp * ROWS * W_STRIDE + c * 16, W_STRIDE, false);
    [[unroll]] for (uint n = 0; n < D / 8; ++n) {
      [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_fragment;
        coopMatLoadNV(k_fragment, tiles, c * 16 * D_STRIDE + n * 8, D_STRIDE, false);
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
      coopMatStoreNV(accumulators[part * (OUT_COLUMNS / 8) + n], stage, stage_block + n * 8,
                     STAGE_STRIDE, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint r = 0; r < ROWS * OUT_COLUMNS / 32; ++r) {
      uint e = lane + r * 32, qi = q0 + warp * ROWS + e / OUT_COLUMNS;
      if (qi < SQ)
        grad_q[(partial_base + q_base + qi) * D + part * OUT_COLUMNS + e % OUT_COLUMNS] =
            stage[stage_block + (e / OUT_COLUMNS) * STAGE_STRIDE + e % OUT_COLUMNS];
    }
  }
}
