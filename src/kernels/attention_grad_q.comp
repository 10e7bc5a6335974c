// Flash-attention backward for dQ: one workgroup per (batch * query head, block of BQ queries)
// streams over key blocks, recomputing P = exp(S - lse) from the saved log-sum-exp:
// dS = P * (dO . V - delta), delta = dO . O, and dQ = SCALE * dS K. TPR threads share a query
// row, splitting the keys of a block and the head dimensions of dQ. Tiles hold padded rows of
// vec4s, as in attention_forward.comp.
// Defines: HQ, HKV, SQ, SK, D, DV, SCALE, CAUSAL, BQ, BK, TPR.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#define THREADS (BQ * TPR)
#define D4 ((D + 3) / 4)
#define DV4 ((DV + 3) / 4)
#define K_ROW (D4 + 1)
#define V_ROW (DV4 + 1)
#define KV_TILE (BK * (K_ROW > V_ROW ? K_ROW : V_ROW))
#define KEYS_PER_THREAD ((BK + TPR - 1) / TPR)
#define D4_PER_THREAD ((D4 + TPR - 1) / TPR)
#define NEG_INF (-1.0 / 0.0)
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = THREADS) in;

shared vec4 q_tile[BQ * K_ROW];
shared vec4 do_tile[BQ * V_ROW];
shared vec4 kv_tile[KV_TILE];
shared float ds_tile[BQ * BK];
shared float row_partial[THREADS];

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  uint t = gl_LocalInvocationID.x;
  uint row = t / TPR, r = t % TPR;
  uint q0 = gl_WorkGroupID.x * BQ;
  uint i = q0 + row;
  uint q_base = bh * SQ;
  uint kv_base = (b * HKV + kv_head) * SK;

  for (uint e = t; e < BQ * D4; e += THREADS) {
    uint qi = q0 + e / D4, d = 4u * (e % D4);
    q_tile[(e / D4) * K_ROW + e % D4] =
        qi < SQ ? LOAD_ROW4(q, (q_base + qi) * D, d, D) : vec4(0.0);
  }
  float delta_part = 0.0;
  for (uint e = t; e < BQ * DV4; e += THREADS) {
    uint qi = q0 + e / DV4, d = 4u * (e % DV4);
    do_tile[(e / DV4) * V_ROW + e % DV4] =
        qi < SQ ? LOAD_ROW4(grad_out, (q_base + qi) * DV, d, DV) : vec4(0.0);
  }
  for (uint e = r; e < DV; e += TPR) {
    if (i < SQ) delta_part += grad_out[(q_base + i) * DV + e] * out_value[(q_base + i) * DV + e];
  }
  row_partial[t] = delta_part;
  barrier();
  float delta = 0.0;
  for (uint rr = 0u; rr < TPR; ++rr) delta += row_partial[row * TPR + rr];
  float row_lse = i < SQ ? lse[q_base + i] : 0.0;

  vec4 acc[D4_PER_THREAD];
  for (uint c = 0u; c < D4_PER_THREAD; ++c) acc[c] = vec4(0.0);
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;

  for (uint k0 = 0u; k0 < kv_end; k0 += BK) {
    barrier();  // the previous block's readers of kv_tile and ds_tile are done
    for (uint e = t; e < BK * DV4; e += THREADS) {
      uint kj = k0 + e / DV4, d = 4u * (e % DV4);
      kv_tile[(e / DV4) * V_ROW + e % DV4] =
          kj < SK ? LOAD_ROW4(v, (kv_base + kj) * DV, d, DV) : vec4(0.0);
    }
    barrier();
    float dp[KEYS_PER_THREAD];
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      dp[c] = 0.0;
      if (jj >= BK) continue;
      for (uint e4 = 0u; e4 < DV4; ++e4)
        dp[c] += dot(do_tile[row * V_ROW + e4], kv_tile[jj * V_ROW + e4]);
    }
    barrier();
    for (uint e = t; e < BK * D4; e += THREADS) {
      uint kj = k0 + e / D4, d = 4u * (e % D4);
      kv_tile[(e / D4) * K_ROW + e % D4] =
          kj < SK ? LOAD_ROW4(k, (kv_base + kj) * D, d, D) : vec4(0.0);
    }
    barrier();
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      uint j = k0 + jj;
      if (jj >= BK) continue;
      float ds = 0.0;
      if (i < SQ && j < SK && (CAUSAL == 0 || j <= i)) {
        float score = 0.0;
        for (uint d4 = 0u; d4 < D4; ++d4)
          score += dot(q_tile[row * K_ROW + d4], kv_tile[jj * K_ROW + d4]);
        float p = exp(score * SCALE + mask_at(b, h, i, j) - row_lse);
        ds = p * (dp[c] - delta) * SCALE;
      }
      ds_tile[row * BK + jj] = ds;
    }
    barrier();
    // Rolled over keys, unrolled over the accumulator (see attention_forward.comp).
    [[dont_unroll]] for (uint jj = 0u; jj < BK; ++jj) {
      float ds = ds_tile[row * BK + jj];
      [[unroll]] for (uint c = 0u; c < D4_PER_THREAD; ++c) {
        uint d4 = r + c * TPR;
        if (d4 < D4) acc[c] += ds * kv_tile[jj * K_ROW + d4];
      }
    }
  }

  if (i >= SQ) return;
  for (uint c = 0u; c < D4_PER_THREAD; ++c) {
    uint d4 = r + c * TPR;
    if (d4 >= D4) continue;
    [[unroll]] for (uint lane = 0u; lane < 4u; ++lane) {
      if (4u * d4 + lane < D) grad_q[(q_base + i) * D + 4u * d4 + lane] = acc[c][lane];
    }
  }
}
