// Flash-attention forward: one workgroup per (batch * query head, block of BQ queries) streams
// over blocks of BK keys with an online softmax, so no Sq x Sk matrix exists anywhere. TPR
// threads share a query row: they split the keys of a block for the scores and the value
// dimensions for the output accumulator. WITH_VALUE=0 gives attention_lse (log-sum-exp only).
// Shared tiles hold rows of vec4s (head dimensions padded with zeros to a multiple of 4) with
// one vec4 of padding per row: a score is D4 vec4 dot products of two LDS.128 each, and the
// rows a warp reads at once start 4 banks apart.
// Defines: HQ, HKV, SQ, SK, D, DV, SCALE, CAUSAL, WITH_VALUE, BQ, BK, TPR.
// Generated: float mask_at(b, h, i, j) (0 without a mask).
#define THREADS (BQ * TPR)
#define D4 ((D + 3) / 4)
#define DV4 ((DV + 3) / 4)
#define K_ROW (D4 + 1)
#define V_ROW (DV4 + 1)
#define KV_TILE (BK * (K_ROW > V_ROW ? K_ROW : V_ROW))
#define KEYS_PER_THREAD ((BK + TPR - 1) / TPR)
#define DV4_PER_THREAD ((DV4 + TPR - 1) / TPR)
#define NEG_INF (-1.0 / 0.0)
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = THREADS) in;

shared vec4 q_tile[BQ * K_ROW];
shared vec4 kv_tile[KV_TILE];
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

  for (uint e = t; e < BQ * D4; e += THREADS) {
    uint qi = q0 + e / D4, d = 4u * (e % D4);
    q_tile[(e / D4) * K_ROW + e % D4] =
        qi < SQ ? LOAD_ROW4(q, (q_base + qi) * D, d, D) : vec4(0.0);
  }
#if WITH_VALUE
  vec4 acc[DV4_PER_THREAD];
  for (uint c = 0u; c < DV4_PER_THREAD; ++c) acc[c] = vec4(0.0);
#endif
  float m = NEG_INF, l = 0.0;
  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;

  for (uint k0 = 0u; k0 < kv_end; k0 += BK) {
    barrier();  // the previous block's readers of kv_tile and p_tile are done
    for (uint e = t; e < BK * D4; e += THREADS) {
      uint kj = k0 + e / D4, d = 4u * (e % D4);
      kv_tile[(e / D4) * K_ROW + e % D4] =
          kj < SK ? LOAD_ROW4(k, (kv_base + kj) * D, d, D) : vec4(0.0);
    }
    barrier();
    float s[KEYS_PER_THREAD];
    float block_max = NEG_INF;
    for (uint c = 0u; c < KEYS_PER_THREAD; ++c) {
      uint jj = r + c * TPR;
      uint j = k0 + jj;
      s[c] = NEG_INF;
      if (jj >= BK || j >= SK || (CAUSAL != 0 && j > i)) continue;
      float score = 0.0;
      for (uint d4 = 0u; d4 < D4; ++d4)
        score += dot(q_tile[row * K_ROW + d4], kv_tile[jj * K_ROW + d4]);
      s[c] = score * SCALE + mask_at(b, h, i, j);
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
    for (uint e = t; e < BK * DV4; e += THREADS) {
      uint kj = k0 + e / DV4, d = 4u * (e % DV4);
      kv_tile[(e / DV4) * V_ROW + e % DV4] =
          kj < SK ? LOAD_ROW4(v, (kv_base + kj) * DV, d, DV) : vec4(0.0);
    }
    barrier();
    for (uint c = 0u; c < DV4_PER_THREAD; ++c) acc[c] *= alpha;
    // Rolled over keys, unrolled over the accumulator: keeps acc in registers without the
    // BK * DV4_PER_THREAD straight-line body that makes compilers (llvmpipe's LLVM) crawl.
    [[dont_unroll]] for (uint jj = 0u; jj < BK; ++jj) {
      float p = p_tile[row * BK + jj];
      [[unroll]] for (uint c = 0u; c < DV4_PER_THREAD; ++c) {
        uint e4 = r + c * TPR;
        if (e4 < DV4) acc[c] += p * kv_tile[jj * V_ROW + e4];
      }
    }
#endif
  }

  if (i >= SQ) return;
#if WITH_VALUE
  for (uint c = 0u; c < DV4_PER_THREAD; ++c) {
    uint e4 = r + c * TPR;
    if (e4 >= DV4) continue;
    [[unroll]] for (uint lane = 0u; lane < 4u; ++lane) {
      if (4u * e4 + lane < DV) out_[(q_base + i) * DV + 4u * e4 + lane] = acc[c][lane] / l;
    }
  }
#else
  if (r == 0u) lse[q_base + i] = m + log(l);
#endif
}
