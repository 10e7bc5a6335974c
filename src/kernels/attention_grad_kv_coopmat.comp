// Flash-attention backward for dK (GRAD_K=1) or dV (GRAD_K=0) on cooperative matrices (the
// `fast` path; the strict kernel, attention_grad_kv.comp, explains the algorithm). A workgroup
// of WARPS subgroups owns BK = WARPS * 16 keys of one (batch, kv head), 16 per subgroup, with
// (SCALE K) and, for dK, V as f16 fragments in registers. It walks every query head of its
// group and every block of BQ queries:
//   S^T = (SCALE K) Q^T and, for dK, dP^T = V dO^T on 16 x 8 fragments, staged to shared memory;
//   two lanes per key row form P^T = exp(S^T + mask - lse) (dV) or
//   dS^T = P^T * (dP^T - delta) * SCALE (dK), as f16;
//   dV += P^T dO or dK += dS^T Q, in f32 accumulator fragments.
// Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL, GRAD_K.
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
#define BQ 32
#define THREADS (WARPS * 32)
#define D_STRIDE (D + 8)
#define DV_STRIDE (DV + 8)
#define W_STRIDE (BQ + 8)
#define DO_OFFSET (BQ * D_STRIDE)
#define QDO_HALVES (DO_OFFSET + BQ * DV_STRIDE)
#define K_HALVES (BK * (D_STRIDE > DV_STRIDE ? D_STRIDE : DV_STRIDE))
#if GRAD_K
#define RESULT_DIM D
#else
#define RESULT_DIM DV
#endif
#define NEG_INF (-1.0 / 0.0)

layout(local_size_x = THREADS) in;

// The key block (and for dK the value block), then each query block's Q and dO tiles.
shared float16_t tiles[QDO_HALVES > K_HALVES ? QDO_HALVES : K_HALVES];
shared float scores[WARPS * ROWS * BQ];
#if GRAD_K
shared float dp_scores[WARPS * ROWS * BQ];
shared float query_delta[BQ];
#endif
shared float query_lse[BQ];
shared float16_t weights[WARPS * ROWS * W_STRIDE];

void main() {
  uint b = gl_WorkGroupID.y / HKV, kv_head = gl_WorkGroupID.y % HKV;
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint k0 = gl_WorkGroupID.x * BK;
  uint kv_base = gl_WorkGroupID.y * SK;
  uint row = lane / 2, half_index = lane % 2;
  uint j = k0 + warp * ROWS + row;
  uint score_row = (warp * ROWS + row) * BQ;

  for (uint e = t; e < BK * D; e += THREADS) {
    uint kj = k0 + e / D;
    tiles[(e / D) * D_STRIDE + e % D] =
        float16_t(kj < SK ? k[(kv_base + kj) * D + e % D] * SCALE : 0.0);
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> k_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(k_fragments[c], tiles, warp * ROWS * D_STRIDE + c * 16, D_STRIDE, false);
#if GRAD_K
  barrier();
  for (uint e = t; e < BK * DV; e += THREADS) {
    uint kj = k0 + e / DV;
    tiles[(e / DV) * DV_STRIDE + e % DV] =
        float16_t(kj < SK ? v[(kv_base + kj) * DV + e % DV] : 0.0);
  }
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> v_fragments[DV / 16];
  [[unroll]] for (uint c = 0; c < DV / 16; ++c)
    coopMatLoadNV(v_fragments[c], tiles, warp * ROWS * DV_STRIDE + c * 16, DV_STRIDE, false);
#endif

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> accumulators[RESULT_DIM / 8];
  [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n)
    accumulators[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  // Top-left causal masking: queries before k0 see none of this block's keys.
  uint q_start = CAUSAL != 0 ? (k0 / BQ) * BQ : 0u;

  for (uint h = kv_head * (HQ / HKV); h < (kv_head + 1u) * (HQ / HKV); ++h) {
    uint q_base = (b * HQ + h) * SQ;
    for (uint q0 = q_start; q0 < SQ; q0 += BQ) {
      barrier();  // every subgroup is done with the previous tiles (or the key block)
      for (uint e = t; e < BQ * D; e += THREADS) {
        uint qi = q0 + e / D;
        tiles[(e / D) * D_STRIDE + e % D] =
            float16_t(qi < SQ ? q[(q_base + qi) * D + e % D] : 0.0);
      }
      for (uint e = t; e < BQ * DV; e += THREADS) {
        uint qi = q0 + e / DV;
        tiles[DO_OFFSET + (e / DV) * DV_STRIDE + e % DV] =
            float16_t(qi < SQ ? grad_out[(q_base + qi) * DV + e % DV] : 0.0);
      }
      if (t < BQ) {
        uint qi = q0 + t;
        query_lse[t] = qi < SQ ? lse[q_base + qi] : 0.0;
#if GRAD_K
        float delta = 0.0;
        if (qi < SQ) {
          for (uint e = 0; e < DV; ++e)
            delta += grad_out[(q_base + qi) * DV + e] * out_value[(q_base + qi) * DV + e];
        }
        query_delta[t] = delta;
#endif
      }
      barrier();

      [[unroll]] for (uint n = 0; n < BQ / 8; ++n) {
        // Q^T (and dO^T) as column-major 16 x 8 blocks: element (d, i) is Q[i][d].
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint c = 0; c < D / 16; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> q_transposed;
          coopMatLoadNV(q_transposed, tiles, n * 8 * D_STRIDE + c * 16, D_STRIDE, true);
          s = coopMatMulAddNV(k_fragments[c], q_transposed, s);
        }
        coopMatStoreNV(s, scores, warp * ROWS * BQ + n * 8, BQ, false);
#if GRAD_K
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> dp =
            fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
        [[unroll]] for (uint c = 0; c < DV / 16; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> do_transposed;
          coopMatLoadNV(do_transposed, tiles, DO_OFFSET + n * 8 * DV_STRIDE + c * 16, DV_STRIDE,
                        true);
          dp = coopMatMulAddNV(v_fragments[c], do_transposed, dp);
        }
        coopMatStoreNV(dp, dp_scores, warp * ROWS * BQ + n * 8, BQ, false);
#endif
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();

      [[unroll]] for (uint c = 0; c < BQ / 2; ++c) {
        uint ii = half_index * (BQ / 2) + c;
        uint i = q0 + ii;
        float weight = 0.0;
        if (i < SQ && j < SK && (CAUSAL == 0 || j <= i)) {
          float p = exp(scores[score_row + ii] + mask_at(b, h, i, j) - query_lse[ii]);
#if GRAD_K
          weight = p * (dp_scores[score_row + ii] - query_delta[ii]) * SCALE;
#else
          weight = p;
#endif
        }
        weights[(warp * ROWS + row) * W_STRIDE + ii] = float16_t(weight);
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();

      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> w_fragments[BQ / 16];
      [[unroll]] for (uint c = 0; c < BQ / 16; ++c)
        coopMatLoadNV(w_fragments[c], weights, warp * ROWS * W_STRIDE + c * 16, W_STRIDE, false);
      [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n) {
        [[unroll]] for (uint c = 0; c < BQ / 16; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> operand;
#if GRAD_K
          coopMatLoadNV(operand, tiles, c * 16 * D_STRIDE + n * 8, D_STRIDE, false);
#else
          coopMatLoadNV(operand, tiles, DO_OFFSET + c * 16 * DV_STRIDE + n * 8, DV_STRIDE, false);
#endif
          accumulators[n] = coopMatMulAddNV(w_fragments[c], operand, accumulators[n]);
        }
      }
    }
  }

  // Out through the subgroup's score rows, one 16 x 8 fragment at a time.
  uint staged = warp * ROWS * BQ;
  [[unroll]] for (uint n = 0; n < RESULT_DIM / 8; ++n) {
    subgroupBarrier();
    coopMatStoreNV(accumulators[n], scores, staged, 8, false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint e = lane; e < ROWS * 8; e += 32) {
      uint kj = k0 + warp * ROWS + e / 8;
      if (kj < SK) result[(kv_base + kj) * RESULT_DIM + n * 8 + e % 8] = scores[staged + e];
    }
  }
}
