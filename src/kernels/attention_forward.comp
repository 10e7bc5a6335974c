// Flash-attention forward: one workgroup per (batch * query head, block of BQ queries) streams
// over blocks of BK keys with an online softmax, so no Sq x Sk matrix exists anywhere. TPR
// threads share a query row: they split the keys of a block for the scores and the value
// dimensions for the output accumulator. WITH_VALUE=0 gives attention_lse (log-sum-exp only).
// Defines: HQ, HKV, SQ, SK, D, DV, SCALE, CAUSAL, WITH_VALUE, BQ, BK, TPR.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#define THREADS (BQ * TPR)
#define K_STRIDE (D + 1)
#define V_STRIDE (DV + 1)
#define KV_TILE (BK * (K_STRIDE > V_STRIDE ? K_STRIDE : V_STRIDE))
#define KEYS_PER_THREAD ((BK + TPR - 1) / TPR)
#define DV_PER_THREAD ((DV + TPR - 1) / TPR)
#define NEG_INF (-1.0 / 0.0)
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = THREADS) in;

shared float q_tile[BQ * D];
// Padded rows: the TPR threads of a row read different key rows at the same d.
shared float kv_tile[KV_TILE];
shared float p_tile[BQ * BK];
shared float row_partial[THREADS];

// Sum (or maximum) over the TPR threads of this thread's row, through row_partial.
float row_reduce(float value, bool take_max) {
  uint t = gl_LocalInvocationID.x;
  uint first = (t / TPR) * TPR;
  row_partial[t] = value;
  barrier();
  float result = take_max ? NEG_INF : 0.0;
  for (uint r = 0u; r < TPR; ++r) {
    float other = row_partial[first + r];
    result = take_max ? max(result, other) : result + other;
  }
  barrier();
  return result;
}

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
#if WITH_VALUE
  float acc[DV_PER_THREAD];
  for (uint c = 0u; c < DV_PER_THREAD; ++c) acc[c] = 0.0;
#endif
  float m = NEG_INF, l = 0.0;
  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;

  for (uint k0 = 0u; k0 < kv_end; k0 += BK) {
    barrier();  // the previous block's readers of kv_tile and p_tile are done
    for (uint e = t; e < BK * D; e += THREADS) {
      uint kj = k0 + e / D;
      kv_tile[(e / D) * K_STRIDE + e % D] = kj < SK ? k[(kv_base + kj) * D + e % D] : 0.0;
    }
    barrier();
    float s[KEYS_PER_THREAD];
    float block_max = NEG_INF;
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      uint j = k0 + jj;
      s[c] = NEG_INF;
      if (jj >= BK || j >= SK || (CAUSAL != 0 && j > i)) continue;
      float dot = 0.0;
      for (uint d = 0u; d < D; ++d) dot += q_tile[row * D + d] * kv_tile[jj * K_STRIDE + d];
      s[c] = dot * SCALE + mask_at(b, h, i, j);
      block_max = max(block_max, s[c]);
    }
    float m_new = max(m, row_reduce(block_max, true));
    // A row with every key so far masked keeps m = -inf; shift by 0 so exp gives 0, not NaN.
    float shift = m_new == NEG_INF ? 0.0 : m_new;
    float alpha = exp(m - shift);
    float block_sum = 0.0;
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      if (jj >= BK) continue;
      float p = exp(s[c] - shift);
      p_tile[row * BK + jj] = p;
      block_sum += p;
    }
    l = l * alpha + row_reduce(block_sum, false);
    m = m_new;
#if WITH_VALUE
    // row_reduce's barriers also ordered every read of K before these writes.
    for (uint e = t; e < BK * DV; e += THREADS) {
      uint kj = k0 + e / DV;
      kv_tile[(e / DV) * V_STRIDE + e % DV] = kj < SK ? v[(kv_base + kj) * DV + e % DV] : 0.0;
    }
    barrier();
    for (uint c = 0u; c < DV_PER_THREAD; ++c) acc[c] *= alpha;
    // Rolled over keys, unrolled over the accumulator: keeps acc in registers without the
    // BK * DV_PER_THREAD straight-line body that makes compilers (llvmpipe's LLVM) crawl.
    [[dont_unroll]] for (uint jj = 0u; jj < BK; ++jj) {
      float p = p_tile[row * BK + jj];
      [[unroll]] for (uint c = 0u; c < DV_PER_THREAD; ++c) {
        uint e = r + c * TPR;
        if (e < DV) acc[c] += p * kv_tile[jj * V_STRIDE + e];
      }
    }
#endif
  }

  if (i >= SQ) return;
#if WITH_VALUE
  for (uint c = 0u; c < DV_PER_THREAD; ++c) {
    uint e = r + c * TPR;
    if (e < DV) out_[(q_base + i) * DV + e] = acc[c] / l;
  }
#else
  if (r == 0u) lse[q_base + i] = m + log(l);
#endif
}
