// Flash-attention backward for dQ: one workgroup per (batch * query head, block of BQ queries)
// streams over key blocks, recomputing P = exp(S - lse) from the saved log-sum-exp:
// dS = P * (dO . V - delta), delta = dO . O, and dQ = SCALE * dS K. TPR threads share a query
// row, splitting the keys of a block and the head dimensions of dQ.
// Defines: HQ, HKV, SQ, SK, D, DV, SCALE, CAUSAL, BQ, BK, TPR.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#define THREADS (BQ * TPR)
#define K_STRIDE (D + 1)
#define V_STRIDE (DV + 1)
#define KV_TILE (BK * (K_STRIDE > V_STRIDE ? K_STRIDE : V_STRIDE))
#define KEYS_PER_THREAD ((BK + TPR - 1) / TPR)
#define D_PER_THREAD ((D + TPR - 1) / TPR)
#define NEG_INF (-1.0 / 0.0)
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = THREADS) in;

shared float q_tile[BQ * D];
shared float do_tile[BQ * DV];
shared float kv_tile[KV_TILE];
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

  for (uint e = t; e < BQ * D; e += THREADS) {
    uint qi = q0 + e / D;
    q_tile[e] = qi < SQ ? q[(q_base + qi) * D + e % D] : 0.0;
  }
  float delta_part = 0.0;
  for (uint e = t; e < BQ * DV; e += THREADS) {
    uint qi = q0 + e / DV;
    do_tile[e] = qi < SQ ? grad_out[(q_base + qi) * DV + e % DV] : 0.0;
  }
  for (uint e = r; e < DV; e += TPR) {
    if (i < SQ) delta_part += grad_out[(q_base + i) * DV + e] * out_value[(q_base + i) * DV + e];
  }
  row_partial[t] = delta_part;
  barrier();
  float delta = 0.0;
  for (uint rr = 0u; rr < TPR; ++rr) delta += row_partial[row * TPR + rr];
  float row_lse = i < SQ ? lse[q_base + i] : 0.0;

  float acc[D_PER_THREAD];
  for (uint c = 0u; c < D_PER_THREAD; ++c) acc[c] = 0.0;
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;

  for (uint k0 = 0u; k0 < kv_end; k0 += BK) {
    barrier();  // the previous block's readers of kv_tile and ds_tile are done
    for (uint e = t; e < BK * DV; e += THREADS) {
      uint kj = k0 + e / DV;
      kv_tile[(e / DV) * V_STRIDE + e % DV] = kj < SK ? v[(kv_base + kj) * DV + e % DV] : 0.0;
    }
    barrier();
    float dp[KEYS_PER_THREAD];
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      dp[c] = 0.0;
      if (jj >= BK) continue;
      for (uint e = 0u; e < DV; ++e) dp[c] += do_tile[row * DV + e] * kv_tile[jj * V_STRIDE + e];
    }
    barrier();
    for (uint e = t; e < BK * D; e += THREADS) {
      uint kj = k0 + e / D;
      kv_tile[(e / D) * K_STRIDE + e % D] = kj < SK ? k[(kv_base + kj) * D + e % D] : 0.0;
    }
    barrier();
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      uint j = k0 + jj;
      if (jj >= BK) continue;
      float ds = 0.0;
      if (i < SQ && j < SK && (CAUSAL == 0 || j <= i)) {
        float dot = 0.0;
        for (uint d = 0u; d < D; ++d) dot += q_tile[row * D + d] * kv_tile[jj * K_STRIDE + d];
        float p = exp(dot * SCALE + mask_at(b, h, i, j) - row_lse);
        ds = p * (dp[c] - delta) * SCALE;
      }
      ds_tile[row * BK + jj] = ds;
    }
    barrier();
    // Rolled over keys, unrolled over the accumulator (see attention_forward.comp).
    [[dont_unroll]] for (uint jj = 0u; jj < BK; ++jj) {
      float ds = ds_tile[row * BK + jj];
      [[unroll]] for (uint c = 0u; c < D_PER_THREAD; ++c) {
        uint d = r + c * TPR;
        if (d < D) acc[c] += ds * kv_tile[jj * K_STRIDE + d];
      }
    }
  }

  if (i >= SQ) return;
  for (uint c = 0u; c < D_PER_THREAD; ++c) {
    uint d = r + c * TPR;
    if (d < D) grad_q[(q_base + i) * D + d] = acc[c];
  }
}
