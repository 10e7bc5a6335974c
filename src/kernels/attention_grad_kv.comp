// Flash-attention backward for dK (GRAD_K=1) or dV (GRAD_K=0): one workgroup per (batch * kv
// head, block of BK keys) walks every query head of its group and every block of BQ queries,
// recomputing P = exp(S - lse) from the saved log-sum-exp. dV = P^T dO; dK = SCALE * dS^T Q
// with dS = P * (dO . V - delta), delta = dO . O. Each output element belongs to one thread
// and is summed in a fixed order, so results are deterministic without atomics. TPR threads
// share a key row, splitting the queries of a block and the dimensions of the result. For dK,
// the THREADS / BQ threads of each query in a block sum parts of its delta side by side
// (a query's delta read by one thread was a serial chain of 2 * DV global loads per block).
// Tiles hold padded rows of vec4s, as in attention_forward.comp.
// Defines: HQ, HKV, SQ, SK, D, DV, SCALE, CAUSAL, GRAD_K, BQ, BK, TPR.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#define THREADS (BK * TPR)
#define D4 ((D + 3) / 4)
#define DV4 ((DV + 3) / 4)
#define K_ROW (D4 + 1)
#define V_ROW (DV4 + 1)
#define QUERIES_PER_THREAD ((BQ + TPR - 1) / TPR)
#if GRAD_K
#define RESULT_DIM D
#else
#define RESULT_DIM DV
#endif
#define RESULT4 ((RESULT_DIM + 3) / 4)
#define RESULT4_PER_THREAD ((RESULT4 + TPR - 1) / TPR)
#define NEG_INF (-1.0 / 0.0)
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = THREADS) in;

shared vec4 k_tile[BK * K_ROW];
shared vec4 q_tile[BQ * K_ROW];
shared vec4 do_tile[BQ * V_ROW];
shared float row_lse[BQ];
// Per (query, key): P for dV, SCALE * dS for dK.
shared float weight_tile[BQ * BK];
#if GRAD_K
#define DELTA_PARTS (THREADS / BQ)
shared vec4 v_tile[BK * V_ROW];
// delta_part[ii * DELTA_PARTS + p]: part p of query ii's delta.
shared float delta_part[THREADS];
#endif

void main() {
  uint b = gl_WorkGroupID.y / HKV, kv_head = gl_WorkGroupID.y % HKV;
  uint t = gl_LocalInvocationID.x;
  uint row = t / TPR, r = t % TPR;
  uint k0 = gl_WorkGroupID.x * BK;
  uint j = k0 + row;
  uint kv_base = gl_WorkGroupID.y * SK;

  for (uint e = t; e < BK * D4; e += THREADS) {
    uint kj = k0 + e / D4, d = 4u * (e % D4);
    k_tile[(e / D4) * K_ROW + e % D4] =
        kj < SK ? LOAD_ROW4(k, (kv_base + kj) * D, d, D) : vec4(0.0);
  }
#if GRAD_K
  for (uint e = t; e < BK * DV4; e += THREADS) {
    uint kj = k0 + e / DV4, d = 4u * (e % DV4);
    v_tile[(e / DV4) * V_ROW + e % DV4] =
        kj < SK ? LOAD_ROW4(v, (kv_base + kj) * DV, d, DV) : vec4(0.0);
  }
#endif
  vec4 acc[RESULT4_PER_THREAD];
  for (uint c = 0u; c < RESULT4_PER_THREAD; ++c) acc[c] = vec4(0.0);
  // Top-left causal masking: queries before k0 see none of this block's keys.
  uint q_start = CAUSAL != 0 ? (k0 / BQ) * BQ : 0u;

  for (uint h = kv_head * (HQ / HKV); h < (kv_head + 1u) * (HQ / HKV); ++h) {
    uint q_base = (b * HQ + h) * SQ;
    for (uint q0 = q_start; q0 < SQ; q0 += BQ) {
      barrier();  // the previous block's readers of the query tiles are done
      for (uint e = t; e < BQ * D4; e += THREADS) {
        uint qi = q0 + e / D4, d = 4u * (e % D4);
        q_tile[(e / D4) * K_ROW + e % D4] =
            qi < SQ ? LOAD_ROW4(q, (q_base + qi) * D, d, D) : vec4(0.0);
      }
      for (uint e = t; e < BQ * DV4; e += THREADS) {
        uint qi = q0 + e / DV4, d = 4u * (e % DV4);
        do_tile[(e / DV4) * V_ROW + e % DV4] =
            qi < SQ ? LOAD_ROW4(grad_out, (q_base + qi) * DV, d, DV) : vec4(0.0);
      }
      for (uint ii = t; ii < BQ; ii += THREADS) {
        uint qi = q0 + ii;
        row_lse[ii] = qi < SQ ? lse[q_base + qi] : 0.0;
      }
#if GRAD_K
      {
        uint qi = q0 + t / DELTA_PARTS;
        float part = 0.0;
        if (t < BQ * DELTA_PARTS && qi < SQ) {
          for (uint e = t % DELTA_PARTS; e < DV; e += DELTA_PARTS)
            part += grad_out[(q_base + qi) * DV + e] * out_value[(q_base + qi) * DV + e];
        }
        delta_part[t] = part;
      }
#endif
      barrier();
      for (uint c = 0u; c < QUERIES_PER_THREAD; ++c) {
        uint ii = r + c * TPR;
        uint i = q0 + ii;
        if (ii >= BQ) continue;
        float w = 0.0;
        if (i < SQ && j < SK && (CAUSAL == 0 || j <= i)) {
          float score = 0.0;
          for (uint d4 = 0u; d4 < D4; ++d4)
            score += dot(q_tile[ii * K_ROW + d4], k_tile[row * K_ROW + d4]);
          w = exp(score * SCALE + mask_at(b, h, i, j) - row_lse[ii]);
#if GRAD_K
          float dp = 0.0;
          for (uint e4 = 0u; e4 < DV4; ++e4)
            dp += dot(do_tile[ii * V_ROW + e4], v_tile[row * V_ROW + e4]);
          float delta = 0.0;
          for (uint p = 0u; p < DELTA_PARTS; ++p) delta += delta_part[ii * DELTA_PARTS + p];
          w *= (dp - delta) * SCALE;
#endif
        }
        weight_tile[ii * BK + row] = w;
      }
      barrier();
      // Rolled over queries, unrolled over the accumulator (see attention_forward.comp).
      [[dont_unroll]] for (uint ii = 0u; ii < BQ; ++ii) {
        float w = weight_tile[ii * BK + row];
        [[unroll]] for (uint c = 0u; c < RESULT4_PER_THREAD; ++c) {
          uint e4 = r + c * TPR;
#if GRAD_K
          if (e4 < RESULT4) acc[c] += w * q_tile[ii * K_ROW + e4];
#else
          if (e4 < RESULT4) acc[c] += w * do_tile[ii * V_ROW + e4];
#endif
        }
      }
    }
  }

  if (j >= SK) return;
  for (uint c = 0u; c < RESULT4_PER_THREAD; ++c) {
    uint e4 = r + c * TPR;
    if (e4 >= RESULT4) continue;
    [[unroll]] for (uint lane = 0u; lane < 4u; ++lane) {
      uint e = 4u * e4 + lane;
      if (e < RESULT_DIM) result[(kv_base + j) * RESULT_DIM + e] = acc[c][lane];
    }
  }
}
