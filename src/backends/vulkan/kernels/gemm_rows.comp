// A product with very few columns (GEMM_N <= 4: the data gradient of a convolution over 3 input
// channels, depthwise convolutions) read through generated loads: one thread per row m of problem
// gl_WorkGroupID.z, walking all of K with the row's GEMM_N sums in registers. A tiled GEMM would
// stage every element of A in shared memory to use it GEMM_N times; here each is loaded once,
// the row's index arithmetic is hoisted out of the K loop, and the B values are the same for a
// whole warp (uniform loads).
// Defines: GEMM_M, GEMM_N, GEMM_K. Generated: float load_a(uint z, uint m, uint k),
// float load_b(uint z, uint k, uint n), void store_c(uint z, uint m, uint n, float value).
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = 128) in;

void main() {
  uint m = linear_workgroup() * 128u + gl_LocalInvocationID.x;
  if (m >= GEMM_M) return;
  uint z = gl_WorkGroupID.z;
  float sums[GEMM_N];
  [[unroll]] for (uint n = 0; n < GEMM_N; ++n) sums[n] = 0.0;
  for (uint k = 0; k < GEMM_K; ++k) {
    float a = load_a(z, m, k);
    [[unroll]] for (uint n = 0; n < GEMM_N; ++n) sums[n] += a * load_b(z, k, n);
  }
  [[unroll]] for (uint n = 0; n < GEMM_N; ++n) store_c(z, m, n, sums[n]);
}
