// attention_combine: joins the partial results of an attention forward over key slices
// (passes/split_attention.cpp). Slice s holds, per query row, its output over its keys O_s and
// their log-sum-exp lse_s in rows of DV + 1 floats; with M the row's largest lse_s and
// w_s = exp(lse_s - M), the output is sum_s w_s O_s / sum_s w_s and (WITH_LSE) the row's
// log-sum-exp M + log(sum_s w_s), which the backward reads. One invocation per output element.
// HEADS_LAST: the rows are (b, h, i) of HEADS heads of QUERIES queries and the output is written
// [B, QUERIES, HEADS, DV] (attribute heads_last), the log-sum-exp as ever.
// Defines: SPLITS, ROWS (query rows of every slice), DV, WITH_LSE, HEADS_LAST, HEADS, QUERIES.
#define WIDTH (DV + 1)

layout(local_size_x = 256) in;

void main() {
  uint index = linear_workgroup() * 256u + gl_LocalInvocationID.x;
  if (index >= ROWS * DV) return;
  uint row = index / DV, e = index % DV;
  // Two passes over the slices' lse (cached) instead of an array of SPLITS registers: a
  // decoding-like shape (few queries, many keys) may have hundreds of slices.
  float largest = -1.0 / 0.0;
  for (uint s = 0u; s < SPLITS; ++s)
    largest = max(largest, partials[(s * ROWS + row) * WIDTH + DV]);
  float total = 0.0, value = 0.0;
  for (uint s = 0u; s < SPLITS; ++s) {
    float weight = exp(partials[(s * ROWS + row) * WIDTH + DV] - largest);
    total += weight;
    value += weight * partials[(s * ROWS + row) * WIDTH + e];
  }
#if HEADS_LAST
  uint query = row % QUERIES, head = (row / QUERIES) % HEADS, entry = row / (QUERIES * HEADS);
  out_[((entry * QUERIES + query) * HEADS + head) * DV + e] = value / total;
#else
  out_[index] = value / total;
#endif
#if WITH_LSE
  if (e == 0u) lse[row] = largest + log(total);
#endif
}
