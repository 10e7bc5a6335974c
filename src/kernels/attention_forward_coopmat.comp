// Flash-attention forward on cooperative matrices (the `fast` precision path): f16 Q, K, V and
// probabilities, f32 scores, softmax statistics and output accumulator. A workgroup of WARPS
// subgroups owns BQ = WARPS * 16 queries of one (batch, query head), 16 per subgroup, and
// streams over blocks of BK keys:
//   S = (SCALE Q) K^T on 16 x 8 fragments, staged to shared memory;
//   two lanes per query row apply mask and causality, update the running maximum and sum, write
//   P = exp(S - max) as f16 and rescale the row's output accumulator;
//   O += P V on fragments, O living in shared memory (an accumulator fragment's rows cannot be
//   rescaled in registers, so O is loaded, multiplied into and stored back each block).
// No Sq x Sk matrix exists. Defines: HQ, HKV, SQ, SK, D, DV (multiples of 16), SCALE, CAUSAL.
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
#define P_STRIDE (BK + 8)
#define V_OFFSET (BK * D_STRIDE)
#define KV_HALVES (V_OFFSET + BK * DV_STRIDE)
#define Q_HALVES (BQ * D_STRIDE)
#define NEG_INF (-1.0 / 0.0)

layout(local_size_x = THREADS) in;

// The scaled query block first, then each key block's K and V tiles.
shared float16_t tiles[KV_HALVES > Q_HALVES ? KV_HALVES : Q_HALVES];
shared float scores[WARPS * ROWS * BK];
shared float16_t probabilities[WARPS * ROWS * P_STRIDE];
shared float output_rows[WARPS * ROWS * DV];

void main() {
  uint bh = gl_WorkGroupID.y;
  uint b = bh / HQ, h = bh % HQ;
  uint kv_head = h / (HQ / HKV);
  uint t = gl_LocalInvocationID.x;
  uint warp = t / 32, lane = t % 32;
  uint q0 = gl_WorkGroupID.x * BQ;
  uint q_base = bh * SQ;
  uint kv_base = (b * HKV + kv_head) * SK;
  // Two lanes per query row, each owning half of the row's key and output columns.
  uint row = lane / 2, half_index = lane % 2;
  uint i = q0 + warp * ROWS + row;
  uint score_row = (warp * ROWS + row) * BK;
  uint output_row = (warp * ROWS + row) * DV;

  for (uint e = t; e < BQ * D; e += THREADS) {
    uint qi = q0 + e / D;
    tiles[(e / D) * D_STRIDE + e % D] =
        float16_t(qi < SQ ? q[(q_base + qi) * D + e % D] * SCALE : 0.0);
  }
  [[unroll]] for (uint c = half_index * (DV / 2); c < (half_index + 1) * (DV / 2); ++c)
    output_rows[output_row + c] = 0.0;
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> q_fragments[D / 16];
  [[unroll]] for (uint c = 0; c < D / 16; ++c)
    coopMatLoadNV(q_fragments[c], tiles, warp * ROWS * D_STRIDE + c * 16, D_STRIDE, false);

  float m = NEG_INF, l = 0.0;
  // Top-left causal masking: no query of this block sees a key past its last query.
  uint kv_end = CAUSAL != 0 ? min(SK, q0 + BQ) : SK;
  for (uint k0 = 0; k0 < kv_end; k0 += BK) {
    barrier();  // every subgroup is done with the previous tiles (or the query block)
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
        // K^T as a column-major 16 x 8 block: element (d, j) is K[j][d].
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> k_transposed;
        coopMatLoadNV(k_transposed, tiles, n * 8 * D_STRIDE + c * 16, D_STRIDE, true);
        s = coopMatMulAddNV(q_fragments[c], k_transposed, s);
      }
      coopMatStoreNV(s, scores, warp * ROWS * BK + n * 8, BK, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    float row_scores[BK / 2];
    float block_max = NEG_INF;
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      uint jj = half_index * (BK / 2) + c;
      uint j = k0 + jj;
      bool visible = j < SK && i < SQ && (CAUSAL == 0 || j <= i);
      row_scores[c] = visible ? scores[score_row + jj] + mask_at(b, h, i, j) : NEG_INF;
      block_max = max(block_max, row_scores[c]);
    }
    block_max = max(block_max, subgroupShuffleXor(block_max, 1));
    float m_new = max(m, block_max);
    // A row with every key so far masked keeps m = -inf; shift by 0 so exp gives 0, not NaN.
    float shift = m_new == NEG_INF ? 0.0 : m_new;
    float alpha = exp(m - shift);
    float block_sum = 0.0;
    [[unroll]] for (uint c = 0; c < BK / 2; ++c) {
      float p = exp(row_scores[c] - shift);
      probabilities[(warp * ROWS + row) * P_STRIDE + half_index * (BK / 2) + c] = float16_t(p);
      block_sum += p;
    }
    l = l * alpha + block_sum + subgroupShuffleXor(block_sum, 1);
    m = m_new;
    [[unroll]] for (uint c = half_index * (DV / 2); c < (half_index + 1) * (DV / 2); ++c)
      output_rows[output_row + c] *= alpha;
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p_fragments[BK / 16];
    [[unroll]] for (uint c = 0; c < BK / 16; ++c)
      coopMatLoadNV(p_fragments[c], probabilities, warp * ROWS * P_STRIDE + c * 16, P_STRIDE,
                    false);
    [[unroll]] for (uint n = 0; n < DV / 8; ++n) {
      fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> o;
      coopMatLoadNV(o, output_rows, warp * ROWS * DV + n * 8, DV, false);
      [[unroll]] for (uint c = 0; c < BK / 16; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> v_fragment;
        coopMatLoadNV(v_fragment, tiles, V_OFFSET + c * 16 * DV_STRIDE + n * 8, DV_STRIDE, false);
        o = coopMatMulAddNV(p_fragments[c], v_fragment, o);
      }
      coopMatStoreNV(o, output_rows, warp * ROWS * DV + n * 8, DV, false);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  }

  if (i >= SQ) return;
  [[unroll]] for (uint c = half_index * (DV / 2); c < (half_index + 1) * (DV / 2); ++c)
    out_[(q_base + i) * DV + c] = output_rows[output_row + c] / l;
}
