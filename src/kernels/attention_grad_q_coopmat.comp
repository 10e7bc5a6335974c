// Flash-attention backward for dQ on cooperative matrices (the `fast` path; the strict kernel,
// attention_grad_q.comp, explains the algorithm). A workgroup of WARPS subgroups owns
// BQ = WARPS * 16 queries of one (batch, query head), 16 per subgroup, with (SCALE Q) and dO as
// f16 fragments in registers, and streams over blocks of BK keys:
//   S = (SCALE Q) K^T and dP = dO V^T on 16 x 8 fragments, staged to shared memory;
//   two lanes per query row form dS = P * (dP - delta) * SCALE with P = exp(S + mask - lse);
//   dQ += dS K with dQ in f32 accumulator fragments (no rescaling: P uses the saved lse).
// Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL.
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
#define BQ (WARPS * ROWS)
#define BK 32
#define THREADS (WARPS * 32)
#define D_STRIDE (D + 8)
#define DV_STRIDE (DV + 8)
#define W_STRIDE (BK + 8)
#define V_OFFSET (BK * D_STRIDE)
#define KV_HALVES (V_OFFSET + BK * DV_STRIDE)
#define Q_HALVES (BQ * (D_STRIDE > DV_STRIDE ? D_STRIDE : DV_STRIDE))
#define NEG_INF (-1.0 / 0.0)

layout(local_size_x = THREADS) in;

// The query block, then dO, then each key block's K and V tiles.
shared float16_t tiles[KV_HALVES > Q_HALVES ? KV_HALVES : Q_HALVES];
shared float scores[WARPS * ROWS * BK];
shared float dp_scores[WARPS * ROWS * BK];
shared float16_t weights[WARPS * ROWS * W_STRIDE];

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint q0 = gl_WorkGroupID.x * BQ;
  uint q_base = bh * SQ;
  uint kv_base = (b * HKV + kv_head) * SK;
  uint row = lane / 2, half_index = lane % 2;
  uint i = q0 + warp * ROWS + row;
  uint score_row = (warp * ROWS + row) * BK;

  for (uint e = t; e < BQ * D; e += THREADS) {
    uint qi = q0 + e / D;
    tiles[(e / D) * D_STRIDE + e % D] =
        float16_t(qi < SQ ? q[(q_base + qi) * D + e % D] * SCALE : 0.0);
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> q_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(q_fragments[c], tiles, warp * ROWS * D_STRIDE + c * 16, D_STRIDE, false);
  barrier();
  for (uint e = t; e < BQ * DV; e += THREADS) {
    uint qi = q0 + e / DV;
    tiles[(e / DV) * DV_STRIDE + e % DV] =
        float16_t(qi < SQ ? grad_out[(q_base + qi) * DV + e % DV] : 0.0);
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> do_fragments[DV / 16];
  [[unroll]] for (uint c = 0; c < DV / 16; ++c)
    coopMatLoadNV(do_fragments[c], tiles, warp * ROWS * DV_STRIDE + c * 16, DV_STRIDE, false);

  float delta = 0.0;
  if (i < SQ) {
    for (uint e = half_index * (DV / 2); e < (half_index + 1) * (DV / 2); ++e)
      delta += grad_out[(q_base + i) * DV + e] * out_value[(q_base + i) * DV + e];
  }
  delta += subgroupShuffleXor(delta, 1);
  float row_lse = i < SQ ? lse[q_base + i] : 0.0;

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulators[D / 8];
  [[unroll]] for (uint n = 0; n < D / 8; ++n)
    accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);

  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;
  for (uint k0 = 0; k0 < kv_end; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles (or dO)
    for (uint e = t; e < BK * D; e += THREADS) {
      uint kj = k0 + e / D;
      tiles[(e / D) * D_STRIDE + e % D] =
          float16_t(kj < SK ? k[(kv_base + kj) * D + e % D] : 0.0);
    }
    for (uint e = t; e < BK * DV; e += THREADS) {
      uint kj = k0 + e / DV;
      tiles[V_OFFSET + (e / DV) * DV_STRIDE + e % DV] =
          float16_t(kj < SK ? v[(kv_base + kj) * DV + e % DV] : 0.0);
    }
    barrier();

    [[unroll]] for (uint n = 0; n < BK / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < D / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_STRIDE + c * 16, D_STRIDE, true);
        s = coopMatMulAddNV(q_fragments[c], k_transposed, s);
      }
      coopMatStoreNV(s, scores, warp * ROWS * BK + n * 8, BK, false);
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
      [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_transposed;
        coopMatLoadNV(v_transposed, tiles, V_OFFSET + n * 8 * DV_STRIDE + c * 16, DV_STRIDE,
                      true);
        dp = coopMatMulAddNV(do_fragments[c], v_transposed, dp);
      }
      coopMatStoreNV(dp, dp_scores, warp * ROWS * BK + n * 8, BK, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      uint jj = half_index * (BK / 2) + c;
      uint j = k0 + jj;
      float ds = 0.0;
      if (i < SQ && j < SK && (CAUSAL == 0 || j <= i)) {
        float p = exp(scores[score_row + jj] + mask_at(b, h, i, j) - row_lse);
        ds = p * (dp_scores[score_row + jj] - delta) * SCALE;
      }
      weights[(warp * ROWS + row) * W_STRIDE + jj] = float16_t(ds);
    }
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

  // Out through the subgroup's score rows, one 16 x 8 fragment at a time.
  uint staged = warp * ROWS * BK;
  [[unroll]] for (uint n = 0; n < D / 8; ++n) {
    subgroupBarrier();
    coopMatStoreNV(accumulators[n], scores, staged, 8, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint e = lane; e < ROWS * 8; e += 32) {
      uint qi = q0 + warp * ROWS + e / 8;
      if (qi < SQ) grad_q[(q_base + qi) * D + n * 8 + e % 8] = scores[staged + e];
    }
  }
}
