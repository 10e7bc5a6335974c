// GEMM for CPU Vulkan devices (Lavapipe): one invocation computes 4 adjacent outputs of a row
// with no shared memory and no barriers, which llvmpipe runs far faster than the tiled GPU
// kernel (its barriers serialise the invocations of a workgroup).
// Defines: M, N, K, TRANSPOSE_A, TRANSPOSE_B. Generated: a_offset(batch), b_offset(batch).
layout(local_size_x = 64) in;

void main() {
  uint column_groups = (N + 3u) / 4u;
  uint index = linear_workgroup() * 64u + gl_LocalInvocationID.x;
  if (index >= M * column_groups) return;
  uint batch = gl_WorkGroupID.z;
  uint row = index / column_groups;
  uint col0 = (index % column_groups) * 4u;
  uint base_a = a_offset(batch);
  uint base_b = b_offset(batch);
  vec4 total = vec4(0.0);
  for (uint k = 0u; k < K; ++k) {
#if TRANSPOSE_A
    float a_value = a[base_a + k * M + row];
#else
    float a_value = a[base_a + row * K + k];
#endif
    vec4 b_values;
    for (uint j = 0u; j < 4u; ++j) {
      uint col = min(col0 + j, N - 1u);
#if TRANSPOSE_B
      b_values[j] = b[base_b + col * K + k];
#else
      b_values[j] = b[base_b + k * N + col];
#endif
    }
    total += a_value * b_values;
  }
  uint base_c = batch * M * N + row * N;
  for (uint j = 0u; j < 4u; ++j) {
    if (col0 + j < N) c[base_c + col0 + j] = total[j];
  }
}
