// Where the fast GEMM's time goes: cooperative-matrix rates of the device, from the bare
// multiply-add up to a whole staged GEMM, and the workgroup-scope GEMM the library took
// instead (runs 47 to 50 in git's history of docs/BENCHMARKS.md, docs/KERNELS.md).
//
//   build/bench/coop_probe [rates|gemm|workgroup|split|staged-workgroup|all]
//
// rates: register-resident fragments (the multiply-add rate alone), then fragments read from
//        shared memory every step, with the stores and the workgroup barrier of a staged GEMM
//        added one at a time (no global memory).
// gemm:  C = A B at 4096^3, A and B row-major, staged through shared memory as
//        gemm_coopmat.comp does (128 x 256 or 128 x 128 blocks, 16-deep slices, slices fetched
//        ahead into registers). Variants: operands f32 (rounded on their way into shared
//        memory, as the library reads them) or f16 in memory; two slots with a barrier a slice,
//        or three slots whose readiness warps count in shared memory instead (a bounded spin:
//        a measuring device, not a kernel for the library); loads that stay in the caches
//        (every block reads the same rows; results wrong, timing only); one, two or all B
//        fragments of a step live at once. Each variant is first checked against an f64
//        product at 512 x 1024 x 768.
// workgroup: the same product on workgroup-scope matrices (VK_NV_cooperative_matrix2), where
//        the driver stages the operands through shared memory itself: one BM x BN accumulator
//        a workgroup, BM x BK and BK x BN operands loaded straight from memory (f16, or f32
//        converted in the kernel; B row-major or transposed), one, two or four steps a loop
//        iteration, or the next step's operands loaded before this step's multiply-add; plain
//        or tensor-addressing loads (gpu::MatrixLoads); the block held as two or four
//        accumulators; the result stored as f16. Blocks that do not divide 4096 run at the
//        largest multiple below it. Needs the extension; also prints the f32 -> f16 rounding of
//        one 4096^2 operand.
// split: only workgroup's split forms (several accumulators, f16 results, grouped workgroup
//        orders).
// staged-workgroup: the workgroup-scope product with its operands staged through shared memory
//        by the kernel (registers a step ahead, padded tiles, one to three slots), checked
//        against f64 like the rest.
// Needs a device with f16 cooperative matrices of 16 x 16 x 16 and 16 x 8 x 16 and 32-wide
// subgroups; prints one line a case, milliseconds and TFLOP/s, the median of 20 runs after
// 500 ms of warm-up (clocks drop while the host checks results).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"

namespace {

using namespace mg::gpu;
using Defines = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kExtensions = R"(
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
)";

// FM x FN accumulators of 16 x BN per subgroup, multiplied ITERS times by fragments that stay
// in registers.
constexpr const char* kRegisterRate = R"(
layout(local_size_x = THREADS) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
shared uvec4 tile[1024];
void main() {
  for (uint i = gl_LocalInvocationID.x; i < 1024; i += THREADS)
    tile[i] = uvec4(packHalf2x16(vec2(0.001 * float(i % 7), 0.002)),
                    packHalf2x16(vec2(0.003, -0.001)),
                    packHalf2x16(vec2(0.0005, 0.001 * float(i % 3))),
                    packHalf2x16(vec2(-0.002, 0.001)));
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[FM];
  fcoopmatNV<16, gl_ScopeSubgroup, 16, BN> b[FN];
  [[unroll]] for (uint i = 0; i < FM; ++i) coopMatLoadNV(a[i], tile, i * 32, 2, false);
  [[unroll]] for (uint j = 0; j < FN; ++j) coopMatLoadNV(b[j], tile, 512 + j * 32, BN / 8, false);
  fcoopmatNV<32, gl_ScopeSubgroup, 16, BN> acc[FM][FN];
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j)
      acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, BN>(0.0);
  for (uint it = 0; it < ITERS; ++it) {
    [[unroll]] for (uint i = 0; i < FM; ++i)
      [[unroll]] for (uint j = 0; j < FN; ++j)
        acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
  }
  uint warp = gl_WorkGroupID.x * (THREADS / 32) + gl_LocalInvocationID.x / 32;
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j)
      coopMatStoreNV(acc[i][j], result, ((warp * FM + i) * FN + j) * 16 * BN, BN, false);
}
)";

// gemm_coopmat.comp's inner loop without global memory: 8 subgroups of 4 x 8 accumulators of
// 16 x 8 read their fragments from two padded shared slots every step; STORES adds each
// invocation's three 16-byte stores of a slice, BARRIER the barrier a slice.
constexpr const char* kSharedRate = R"(
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
#define A_STRIDE 3
#define B_STRIDE 33
#define A_SLOT (128 * A_STRIDE)
#define B_SLOT (16 * B_STRIDE)
shared uvec4 tile_a[2 * A_SLOT];
shared uvec4 tile_b[2 * B_SLOT];
void main() {
  uint thread = gl_LocalInvocationID.x, warp = thread / 32;
  for (uint i = thread; i < 2 * A_SLOT; i += 256)
    tile_a[i] = uvec4(packHalf2x16(vec2(0.001 * float(i % 7), 0.002)));
  for (uint i = thread; i < 2 * B_SLOT; i += 256)
    tile_b[i] = uvec4(packHalf2x16(vec2(0.002, 0.001 * float(i % 5))));
  barrier();
  uint warp_row = (warp % 2) * 64, warp_col = (warp / 2) * 64;
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc[4][8];
  [[unroll]] for (uint i = 0; i < 4; ++i)
    [[unroll]] for (uint j = 0; j < 8; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  for (uint it = 0; it < ITERS; ++it) {
    uint slot = it & 1;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[4];
    [[unroll]] for (uint i = 0; i < 4; ++i)
      coopMatLoadNV(a[i], tile_a, slot * A_SLOT + (warp_row + i * 16) * A_STRIDE, A_STRIDE, false);
    [[unroll]] for (uint j = 0; j < 8; ++j) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
      coopMatLoadNV(b, tile_b, slot * B_SLOT + (warp_col + j * 8) / 8, B_STRIDE, false);
      [[unroll]] for (uint i = 0; i < 4; ++i) acc[i][j] = coopMatMulAddNV(a[i], b, acc[i][j]);
    }
#if STORES
    tile_a[(1 - slot) * A_SLOT + (thread / 2) * A_STRIDE + thread % 2] = uvec4(it);
    tile_b[(1 - slot) * B_SLOT + (thread / 32) * B_STRIDE + thread % 32] = uvec4(it);
    tile_b[(1 - slot) * B_SLOT + (thread / 32 + 8) * B_STRIDE + thread % 32] = uvec4(it);
#endif
#if BARRIER
    barrier();
#endif
  }
  uint w = gl_WorkGroupID.x * 8 + warp;
  [[unroll]] for (uint i = 0; i < 4; ++i)
    [[unroll]] for (uint j = 0; j < 8; ++j)
      coopMatStoreNV(acc[i][j], result, ((w * 4 + i) * 8 + j) * 128, 8, false);
}
)";

// C [GEMM_M, GEMM_N] = A [GEMM_M, GEMM_K] B [GEMM_K, GEMM_N], all row-major: a workgroup of
// WARPS_M x WARPS_N subgroups, each FM x FN accumulators of 16 x 8, 16-deep slices staged
// through shared memory in units of 8 halves (rows padded by one unit), PREFETCH slices held
// in registers. F16: operands are f16 in memory (one uvec4 a unit), else f32 (two vec4s a unit,
// rounded on their way into shared memory). COUNTED: three slots whose readiness the subgroups
// count in shared memory, else two slots and a barrier a slice. CACHED: every block reads the
// first rows and columns, and k wraps every 4 slices (timing only).
constexpr const char* kStagedGemm = R"(
layout(local_size_x = THREADS) in;
#if F16
layout(set = 0, binding = 0) readonly buffer A { uvec4 a_data[]; };
layout(set = 0, binding = 1) readonly buffer B { uvec4 b_data[]; };
#define UNIT_VECTORS 1
#else
layout(set = 0, binding = 0) readonly buffer A { vec4 a_data[]; };
layout(set = 0, binding = 1) readonly buffer B { vec4 b_data[]; };
#define UNIT_VECTORS 2
#endif
layout(set = 0, binding = 2) writeonly buffer C { float c_data[]; };
#define BK 16
#define BLOCK_M (WARPS_M * FM * 16)
#define BLOCK_N (WARPS_N * FN * 8)
#define WARPS (WARPS_M * WARPS_N)
#define SLICES (GEMM_K / BK)
#define SLOTS (2 + COUNTED)
#define A_ROW_UNITS (BK / 8)
#define B_ROW_UNITS (BLOCK_N / 8)
#define A_STRIDE (A_ROW_UNITS + 1)
#define B_STRIDE (B_ROW_UNITS + 1)
#define A_SLOT (BLOCK_M * A_STRIDE)
#define B_SLOT (BK * B_STRIDE)
#define A_TOTAL (BLOCK_M * A_ROW_UNITS)
#define B_TOTAL (BK * B_ROW_UNITS)
#define A_UNITS ((A_TOTAL + THREADS - 1) / THREADS)
#define B_UNITS ((B_TOTAL + THREADS - 1) / THREADS)
shared uvec4 tile_a[SLOTS * A_SLOT];
shared uvec4 tile_b[SLOTS * B_SLOT];
#if F16
uvec4 a_next[PREFETCH][A_UNITS];
uvec4 b_next[PREFETCH][B_UNITS];
#else
vec4 a_next[PREFETCH][2 * A_UNITS];
vec4 b_next[PREFETCH][2 * B_UNITS];
#endif
fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc[FM][FN];

// As in gemm_coopmat.comp: 8 invocations of one 16-byte store wavefront take rows that the odd
// stride keeps in disjoint banks.
uvec2 tile_unit(uint v, uint row_units) {
  if (row_units >= 8 || 8 % row_units != 0) return uvec2(v / row_units, v % row_units);
  uint group = v / (8 * row_units), wave = (v / 8) % row_units, lane = v % 8;
  return uvec2(group * 8 + wave + row_units * (lane / row_units), lane % row_units);
}

uvec4 halves(vec4 low, vec4 high) {
  return uvec4(packFloat2x16(f16vec2(low.xy)), packFloat2x16(f16vec2(low.zw)),
               packFloat2x16(f16vec2(high.xy)), packFloat2x16(f16vec2(high.zw)));
}

void fetch_slice(uint row0, uint col0, uint k0, uint thread, uint set) {
#if CACHED
  row0 = 0;
  col0 = 0;
  k0 = k0 % (4 * BK);
#endif
  [[unroll]] for (uint i = 0; i < A_UNITS; ++i) {
    if (A_TOTAL % THREADS != 0 && thread + i * THREADS >= A_TOTAL) break;
    uvec2 u = tile_unit(thread + i * THREADS, A_ROW_UNITS);
    uint at = ((row0 + u.x) * GEMM_K + k0 + u.y * 8) / (8 / UNIT_VECTORS);
#if F16
    a_next[set][i] = a_data[at];
#else
    a_next[set][2 * i] = a_data[at];
    a_next[set][2 * i + 1] = a_data[at + 1];
#endif
  }
  [[unroll]] for (uint i = 0; i < B_UNITS; ++i) {
    if (B_TOTAL % THREADS != 0 && thread + i * THREADS >= B_TOTAL) break;
    uvec2 u = tile_unit(thread + i * THREADS, B_ROW_UNITS);
    uint at = ((k0 + u.x) * GEMM_N + col0 + u.y * 8) / (8 / UNIT_VECTORS);
#if F16
    b_next[set][i] = b_data[at];
#else
    b_next[set][2 * i] = b_data[at];
    b_next[set][2 * i + 1] = b_data[at + 1];
#endif
  }
}

void store_slice(uint slot, uint thread, uint set) {
  [[unroll]] for (uint i = 0; i < A_UNITS; ++i) {
    if (A_TOTAL % THREADS != 0 && thread + i * THREADS >= A_TOTAL) break;
    uvec2 u = tile_unit(thread + i * THREADS, A_ROW_UNITS);
#if F16
    tile_a[slot * A_SLOT + u.x * A_STRIDE + u.y] = a_next[set][i];
#else
    tile_a[slot * A_SLOT + u.x * A_STRIDE + u.y] = halves(a_next[set][2 * i], a_next[set][2 * i + 1]);
#endif
  }
  [[unroll]] for (uint i = 0; i < B_UNITS; ++i) {
    if (B_TOTAL % THREADS != 0 && thread + i * THREADS >= B_TOTAL) break;
    uvec2 u = tile_unit(thread + i * THREADS, B_ROW_UNITS);
#if F16
    tile_b[slot * B_SLOT + u.x * B_STRIDE + u.y] = b_next[set][i];
#else
    tile_b[slot * B_SLOT + u.x * B_STRIDE + u.y] = halves(b_next[set][2 * i], b_next[set][2 * i + 1]);
#endif
  }
}

void multiply_slice(uint slot, uint warp_row, uint warp_col) {
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[FM];
  [[unroll]] for (uint i = 0; i < FM; ++i)
    coopMatLoadNV(a[i], tile_a, slot * A_SLOT + (warp_row + i * 16) * A_STRIDE, A_STRIDE, false);
#if B_FRAGMENTS == 1
  [[unroll]] for (uint j = 0; j < FN; ++j) {
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
    coopMatLoadNV(b, tile_b, slot * B_SLOT + (warp_col + j * 8) / 8, B_STRIDE, false);
    [[unroll]] for (uint i = 0; i < FM; ++i) acc[i][j] = coopMatMulAddNV(a[i], b, acc[i][j]);
  }
#elif B_FRAGMENTS == 2
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b[2];
  coopMatLoadNV(b[0], tile_b, slot * B_SLOT + warp_col / 8, B_STRIDE, false);
  [[unroll]] for (uint j = 0; j < FN; ++j) {
    if (j + 1 < FN)
      coopMatLoadNV(b[(j + 1) % 2], tile_b, slot * B_SLOT + (warp_col + (j + 1) * 8) / 8, B_STRIDE, false);
    [[unroll]] for (uint i = 0; i < FM; ++i) acc[i][j] = coopMatMulAddNV(a[i], b[j % 2], acc[i][j]);
  }
#else
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b[FN];
  [[unroll]] for (uint j = 0; j < FN; ++j)
    coopMatLoadNV(b[j], tile_b, slot * B_SLOT + (warp_col + j * 8) / 8, B_STRIDE, false);
  [[unroll]] for (uint j = 0; j < FN; ++j)
    [[unroll]] for (uint i = 0; i < FM; ++i) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
#endif
}

#if COUNTED
// Subgroups that have stored a slice into a slot, and that have read one out of it, counted
// over the whole K loop: slice s is the (s / 3)-th use of slot s % 3.
shared uint stored[3];
shared uint read_out[3];

void count(bool storing, uint slot) {
  memoryBarrierShared();
  subgroupBarrier();
  if (subgroupElect()) {
    if (storing)
      atomicAdd(stored[slot], 1u, gl_ScopeWorkgroup, gl_StorageSemanticsShared, gl_SemanticsRelease);
    else
      atomicAdd(read_out[slot], 1u, gl_ScopeWorkgroup, gl_StorageSemanticsShared, gl_SemanticsRelease);
  }
}

// Bounded, so that a lost count shows as wrong results rather than a hung device.
void wait_for(bool storing, uint slot, uint target) {
  for (uint tries = 0; tries < (1u << 20); ++tries) {
    uint seen = storing ? atomicLoad(stored[slot], gl_ScopeWorkgroup, gl_StorageSemanticsShared, gl_SemanticsAcquire)
                        : atomicLoad(read_out[slot], gl_ScopeWorkgroup, gl_StorageSemanticsShared, gl_SemanticsAcquire);
    if (seen >= target) break;
  }
}

// Slice s: multiply it once every subgroup has stored it, then store slice s + 2 into the slot
// that slice s - 1 held once every subgroup has read that one. Register set `fetch_set`
// receives slice s + 1 + PREFETCH, `store_set` holds slice s + 2.
void step(uint row0, uint col0, uint thread, uint warp_row, uint warp_col, uint s, uint fetch_set,
          uint store_set) {
  wait_for(true, s % 3, WARPS * (s / 3 + 1));
  if (s + 1 + PREFETCH < SLICES) fetch_slice(row0, col0, (s + 1 + PREFETCH) * BK, thread, fetch_set);
  multiply_slice(s % 3, warp_row, warp_col);
  count(false, s % 3);
  if (s + 2 < SLICES) {
    if (s >= 1) wait_for(false, (s - 1) % 3, WARPS * ((s - 1) / 3 + 1));
    store_slice((s + 2) % 3, thread, store_set);
    count(true, (s + 2) % 3);
  }
}

void k_loop(uint row0, uint col0, uint thread, uint warp_row, uint warp_col) {
  if (thread < 3) {
    stored[thread] = 0;
    read_out[thread] = 0;
  }
  barrier();
  [[unroll]] for (uint s = 0; s < 2; ++s) {
    fetch_slice(row0, col0, s * BK, thread, 0);
    store_slice(s, thread, 0);
    count(true, s);
  }
  [[unroll]] for (uint p = 0; p < PREFETCH; ++p)
    fetch_slice(row0, col0, (2 + p) * BK, thread, (2 + p) % PREFETCH);
  // Stepping by PREFETCH keeps every register set's index a constant.
  for (uint s = 0; s < SLICES; s += PREFETCH) {
    step(row0, col0, thread, warp_row, warp_col, s, (1 + PREFETCH) % PREFETCH, 2 % PREFETCH);
#if PREFETCH >= 2
    if (s + 1 < SLICES)
      step(row0, col0, thread, warp_row, warp_col, s + 1, (2 + PREFETCH) % PREFETCH, 3 % PREFETCH);
#endif
  }
}
#else
// Slice s: fetch slice s + PREFETCH into the set that held slice s, multiply slot s % 2, store
// slice s + 1 into the other slot, barrier (gemm_coopmat.comp's `advance`).
void advance(uint row0, uint col0, uint thread, uint warp_row, uint warp_col, uint s, uint set) {
  if (s + PREFETCH < SLICES) fetch_slice(row0, col0, (s + PREFETCH) * BK, thread, set);
  multiply_slice(s % 2, warp_row, warp_col);
  if (s + 1 < SLICES) {
    store_slice(1 - s % 2, thread, (set + 1) % PREFETCH);
    barrier();
  }
}

void k_loop(uint row0, uint col0, uint thread, uint warp_row, uint warp_col) {
  [[unroll]] for (uint p = 0; p < PREFETCH; ++p) fetch_slice(row0, col0, p * BK, thread, p);
  store_slice(0, thread, 0);
  barrier();
  for (uint s = 0; s < SLICES; s += PREFETCH) {
    advance(row0, col0, thread, warp_row, warp_col, s, 0);
#if PREFETCH >= 2
    if (s + 1 < SLICES) advance(row0, col0, thread, warp_row, warp_col, s + 1, 1);
#endif
  }
}
#endif

void main() {
  uint thread = gl_LocalInvocationID.x, warp = thread / 32;
  uint row0 = gl_WorkGroupID.y * BLOCK_M, col0 = gl_WorkGroupID.x * BLOCK_N;
  uint warp_row = (warp % WARPS_M) * FM * 16, warp_col = (warp / WARPS_M) * FN * 8;
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j)
      acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  k_loop(row0, col0, thread, warp_row, warp_col);
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j)
      coopMatStoreNV(acc[i][j], c_data,
                     (row0 + warp_row + i * 16) * GEMM_N + col0 + warp_col + j * 8, GEMM_N, false);
}
)";

// C = A B on workgroup-scope matrices: one BM x BN accumulator a workgroup, operands loaded
// from memory every BK-deep step. B_TRANSPOSED: B is stored as [GEMM_N, GEMM_K]. F32: operands
// are f32 in memory and converted to f16 in the kernel.
constexpr const char* kWorkgroupGemm = R"(
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = THREADS) in;
#if F32
#define OPERAND float
#define WIDTH 32
#else
#define OPERAND float16_t
#define WIDTH 16
#endif
layout(set = 0, binding = 0) readonly buffer A { OPERAND a_data[]; };
layout(set = 0, binding = 1) readonly buffer B { OPERAND b_data[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c_data[]; };
#if B_TRANSPOSED
#define LOAD_B(b, k) coopMatLoadNV(b, b_data, col0 * GEMM_K + (k), GEMM_K, true)
#else
#define LOAD_B(b, k) coopMatLoadNV(b, b_data, (k) * GEMM_N + col0, GEMM_N, false)
#endif
#if F32
#define MULTIPLY(a, b) \
  acc = coopMatMulAddNV(fcoopmatNV<16, gl_ScopeWorkgroup, BM, BK>(a), \
                        fcoopmatNV<16, gl_ScopeWorkgroup, BK, BN>(b), acc)
#else
#define MULTIPLY(a, b) acc = coopMatMulAddNV(a, b, acc)
#endif
#define STEP(k)                                                   \
  {                                                               \
    fcoopmatNV<WIDTH, gl_ScopeWorkgroup, BM, BK> a;               \
    fcoopmatNV<WIDTH, gl_ScopeWorkgroup, BK, BN> b;               \
    coopMatLoadNV(a, a_data, row0 * GEMM_K + (k), GEMM_K, false); \
    LOAD_B(b, k);                                                 \
    MULTIPLY(a, b);                                               \
  }
void main() {
#if M_FASTEST
  uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
#else
  uint row0 = gl_WorkGroupID.y * BM, col0 = gl_WorkGroupID.x * BN;
#endif
  fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN> acc = fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN>(0.0);
#if PIPELINED
  // The next step's operands load before this step's multiply-add (an even step count).
  fcoopmatNV<WIDTH, gl_ScopeWorkgroup, BM, BK> a_now, a_next;
  fcoopmatNV<WIDTH, gl_ScopeWorkgroup, BK, BN> b_now, b_next;
  coopMatLoadNV(a_now, a_data, row0 * GEMM_K, GEMM_K, false);
  LOAD_B(b_now, 0);
  for (uint k = BK; k < GEMM_K; k += 2 * BK) {
    coopMatLoadNV(a_next, a_data, row0 * GEMM_K + k, GEMM_K, false);
    LOAD_B(b_next, k);
    MULTIPLY(a_now, b_now);
    if (k + BK < GEMM_K) {
      coopMatLoadNV(a_now, a_data, row0 * GEMM_K + k + BK, GEMM_K, false);
      LOAD_B(b_now, k + BK);
    }
    MULTIPLY(a_next, b_next);
  }
#else
  for (uint k = 0; k < GEMM_K; k += BK * UNROLL) {
    STEP(k)
#if UNROLL > 1
    STEP(k + BK)
#endif
#if UNROLL > 2
    STEP(k + 2 * BK)
    STEP(k + 3 * BK)
#endif
  }
#endif
  coopMatStoreNV(acc, c_data, row0 * GEMM_N + col0, GEMM_N, false);
}
)";

// The workgroup GEMM with its BM x BN block held as FM x FN accumulators of (BM/FM) x (BN/FN)
// (FM up to 3 where FN is 1, else up to 2), each fed by its own operand slices (the driver
// spreads each matrix over the whole workgroup), STEPS steps (1, 2 or 4) a loop iteration.
// F16_OUT: C is stored as f16. A_FIRST (FM 2, FN 1): both halves of A loaded before B.
constexpr const char* kWorkgroupSplitGemm = R"(
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer A { float16_t a_data[]; };
layout(set = 0, binding = 1) readonly buffer B { float16_t b_data[]; };
#if F16_OUT
layout(set = 0, binding = 2) writeonly buffer C { float16_t c_data[]; };
#else
layout(set = 0, binding = 2) writeonly buffer C { float c_data[]; };
#endif
#define SM (BM / FM)
#define SN (BN / FN)
#define ACC fcoopmatNV<32, gl_ScopeWorkgroup, SM, SN>
#define LOAD_A(m, i, k) coopMatLoadNV(m, a_data, (row0 + (i) * SM) * GEMM_K + (k), GEMM_K, false)
#define LOAD_B(m, j, k) coopMatLoadNV(m, b_data, (k) * GEMM_N + col0 + (j) * SN, GEMM_N, false)
#if F16_OUT
#define STORE(m, i, j)                                                                     \
  coopMatStoreNV(fcoopmatNV<16, gl_ScopeWorkgroup, SM, SN>(m), c_data,                      \
                 (row0 + (i) * SM) * GEMM_N + col0 + (j) * SN, GEMM_N, false)
#else
#define STORE(m, i, j) \
  coopMatStoreNV(m, c_data, (row0 + (i) * SM) * GEMM_N + col0 + (j) * SN, GEMM_N, false)
#endif
#if A_FIRST
#define STEP(k)                                             \
  {                                                         \
    fcoopmatNV<16, gl_ScopeWorkgroup, SM, BK> a0, a1;       \
    fcoopmatNV<16, gl_ScopeWorkgroup, BK, SN> b0;           \
    LOAD_A(a0, 0, k);                                       \
    LOAD_A(a1, 1, k);                                       \
    LOAD_B(b0, 0, k);                                       \
    acc00 = coopMatMulAddNV(a0, b0, acc00);                 \
    acc10 = coopMatMulAddNV(a1, b0, acc10);                 \
  }
#else
#define STEP(k)                                             \
  {                                                         \
    fcoopmatNV<16, gl_ScopeWorkgroup, SM, BK> a0, a1, a2;   \
    fcoopmatNV<16, gl_ScopeWorkgroup, BK, SN> b0, b1;       \
    LOAD_A(a0, 0, k);                                       \
    LOAD_B(b0, 0, k);                                       \
    acc00 = coopMatMulAddNV(a0, b0, acc00);                 \
    if (FN > 1) {                                           \
      LOAD_B(b1, 1, k);                                     \
      acc01 = coopMatMulAddNV(a0, b1, acc01);               \
    }                                                       \
    if (FM > 1) {                                           \
      LOAD_A(a1, 1, k);                                     \
      acc10 = coopMatMulAddNV(a1, b0, acc10);               \
      if (FN > 1) acc11 = coopMatMulAddNV(a1, b1, acc11);   \
    }                                                       \
    if (FM > 2) {                                           \
      LOAD_A(a2, 2, k);                                     \
      acc20 = coopMatMulAddNV(a2, b0, acc20);               \
    }                                                       \
  }
#endif
void main() {
#if GROUP_ROWS
  // Workgroups in groups of GROUP_ROWS row blocks, column by column, so that the blocks running
  // at once share their rows of A and columns of B in the L2 cache.
  const uint blocks_m = GEMM_M / BM, blocks_n = GEMM_N / BN;
  const uint group = gl_WorkGroupID.x / (uint(GROUP_ROWS) * blocks_n);
  const uint rows = min(uint(GROUP_ROWS), blocks_m - group * uint(GROUP_ROWS));
  const uint within = gl_WorkGroupID.x % (uint(GROUP_ROWS) * blocks_n);
  const uint row0 = (group * uint(GROUP_ROWS) + within % rows) * BM, col0 = within / rows * BN;
#else
  const uint row0 = gl_WorkGroupID.y * BM, col0 = gl_WorkGroupID.x * BN;
#endif
  ACC acc00 = ACC(0.0), acc01 = ACC(0.0), acc10 = ACC(0.0), acc11 = ACC(0.0), acc20 = ACC(0.0);
  for (uint k = 0; k < GEMM_K; k += STEPS * BK) {
    STEP(k)
#if STEPS > 1
    STEP(k + BK)
#endif
#if STEPS > 2
    STEP(k + 2 * BK)
    STEP(k + 3 * BK)
#endif
  }
  STORE(acc00, 0, 0);
  if (FN > 1) STORE(acc01, 0, 1);
  if (FM > 1) STORE(acc10, 1, 0);
  if (FM > 1 && FN > 1) STORE(acc11, 1, 1);
  if (FM > 2) STORE(acc20, 2, 0);
}
)";

// The workgroup GEMM with its operands staged through shared memory by the kernel itself: every
// step the workgroup copies the BM x BK and BK x BN f16 tiles (8 halves a uvec4, rows padded by
// PAD uvec4s against bank conflicts) into one of SLOTS slots, the next step's tiles waiting in
// registers meanwhile, and loads its workgroup-scope matrices from there. With two slots one
// barrier a step suffices: a slot is written again only after every invocation has passed the
// barrier of the step that read it last.
constexpr const char* kWorkgroupStagedGemm = R"(
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer A { uvec4 a_quads[]; };
layout(set = 0, binding = 1) readonly buffer B { uvec4 b_quads[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c_data[]; };
#define A_ROW (BK / 8 + PAD)
#define B_ROW (BN / 8 + PAD)
#define A_SLOT (BM * A_ROW)
#define B_SLOT (BK * B_ROW)
#define A_EACH (BM * BK / 8 / 256)
#define B_EACH (BK * BN / 8 / 256)
shared uvec4 tile_a[SLOTS * A_SLOT];
shared uvec4 tile_b[SLOTS * B_SLOT];
void main() {
  const uint row0 = gl_WorkGroupID.y * BM, col0 = gl_WorkGroupID.x * BN;
  const uint t = gl_LocalInvocationID.x;
  fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN> acc = fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN>(0.0);
  uvec4 next_a[A_EACH], next_b[B_EACH];
  [[unroll]] for (uint i = 0; i < A_EACH; ++i) {
    const uint q = t + i * 256u, r = q / (BK / 8), c = q % (BK / 8);
    next_a[i] = a_quads[(row0 + r) * (GEMM_K / 8) + c];
  }
  [[unroll]] for (uint i = 0; i < B_EACH; ++i) {
    const uint q = t + i * 256u, r = q / (BN / 8), c = q % (BN / 8);
    next_b[i] = b_quads[r * (GEMM_N / 8) + col0 / 8 + c];
  }
  uint slot = 0;
  for (uint k = 0; k < GEMM_K; k += BK) {
    [[unroll]] for (uint i = 0; i < A_EACH; ++i) {
      const uint q = t + i * 256u;
      tile_a[slot * A_SLOT + (q / (BK / 8)) * A_ROW + q % (BK / 8)] = next_a[i];
    }
    [[unroll]] for (uint i = 0; i < B_EACH; ++i) {
      const uint q = t + i * 256u;
      tile_b[slot * B_SLOT + (q / (BN / 8)) * B_ROW + q % (BN / 8)] = next_b[i];
    }
    barrier();
    if (k + BK < GEMM_K) {
      [[unroll]] for (uint i = 0; i < A_EACH; ++i) {
        const uint q = t + i * 256u, r = q / (BK / 8), c = q % (BK / 8);
        next_a[i] = a_quads[(row0 + r) * (GEMM_K / 8) + (k + BK) / 8 + c];
      }
      [[unroll]] for (uint i = 0; i < B_EACH; ++i) {
        const uint q = t + i * 256u, r = q / (BN / 8), c = q % (BN / 8);
        next_b[i] = b_quads[(k + BK + r) * (GEMM_N / 8) + col0 / 8 + c];
      }
    }
    fcoopmatNV<16, gl_ScopeWorkgroup, BM, BK> a;
    fcoopmatNV<16, gl_ScopeWorkgroup, BK, BN> b;
    coopMatLoadNV(a, tile_a, slot * A_SLOT, A_ROW, false);
    coopMatLoadNV(b, tile_b, slot * B_SLOT, B_ROW, false);
    acc = coopMatMulAddNV(a, b, acc);
#if SLOTS == 1
    barrier();
#else
    slot = (slot + 1) % SLOTS;
#endif
  }
  coopMatStoreNV(acc, c_data, row0 * GEMM_N + col0, GEMM_N, false);
}
)";

// One f32 operand of 4096^2 rounded to f16: what f16 operands in memory would cost up front.
constexpr const char* kToHalf = R"(
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer In { vec4 x[]; };
layout(set = 0, binding = 1) writeonly buffer Out { uvec2 y[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < COUNT4) y[i] = uvec2(packHalf2x16(x[i].xy), packHalf2x16(x[i].zw));
}
)";

KernelSpec kernel(std::string label, const char* body, Defines defines, uint32_t bindings,
                  bool khr) {
  KernelSpec spec;
  spec.label = std::move(label);
  spec.source = std::string(kExtensions) + body;
  spec.defines = std::move(defines);
  spec.binding_count = bindings;
  spec.khr_cooperative_matrix = khr;
  return spec;
}

// The median of `runs` dispatches after 300 ms of warm-up, in ms.
double time_ms(Device& device, const KernelSpec& spec, std::vector<BufferRange> bindings,
               std::array<uint32_t, 3> groups, int runs = 20) {
  const PipelineId pipeline = device.create_pipelines(std::span(&spec, 1))[0];
  std::vector<Command> commands(1);
  commands[0].kind = Command::Kind::dispatch;
  commands[0].dispatch = {pipeline, std::move(bindings), {}, groups, spec.label};
  const RecordingId recording = device.record(commands, Timing::whole);
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500))
    device.submit(recording);
  std::vector<double> times;
  for (int run = 0; run < runs; ++run) {
    device.submit(recording);
    times.push_back(device.timings(recording)[0].duration_ms);
  }
  device.destroy_recording(recording);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// f16 rounding through the device's own conversion would hide a wrong kernel; inputs are drawn
// as multiples of 2^-10 in [-1, 1], which f16 holds exactly.
float exact_half_value(std::mt19937& random) {
  return static_cast<float>(std::uniform_int_distribution<int>(-1024, 1024)(random)) / 1024.0f;
}

uint16_t half_bits(float value) {  // exact for the values above
  if (value == 0.0f) return 0;
  const uint16_t sign = value < 0 ? 0x8000 : 0;
  int exponent = 0;
  const float fraction = std::frexp(std::fabs(value), &exponent);  // value = fraction 2^exponent
  const auto mantissa = static_cast<uint16_t>(std::lround((fraction * 2.0f - 1.0f) * 1024.0f));
  return static_cast<uint16_t>(sign | ((exponent - 1 + 15) << 10) | mantissa);
}

void register_rates(Device& device, BufferId out, uint32_t units) {
  struct Case {
    uint32_t threads, frags_m, frags_n, fragment_n;
    bool khr;
    uint32_t groups_per_unit;
  };
  // 16 x 16 B fragments only through NV: the KHR rewrite tells A from B by their shapes.
  const Case cases[] = {{256, 4, 8, 8, true, 1},   {256, 4, 8, 8, false, 1},
                        {256, 4, 4, 16, false, 1}, {128, 4, 8, 8, true, 2},
                        {512, 2, 4, 8, true, 1},   {128, 2, 2, 8, true, 4}};
  constexpr uint32_t kIterations = 2048;
  for (const Case& c : cases) {
    const uint32_t groups = units * c.groups_per_unit * 8;
    const KernelSpec spec = kernel("register rate", kRegisterRate,
                                   {{"THREADS", std::to_string(c.threads)},
                                    {"FM", std::to_string(c.frags_m)},
                                    {"FN", std::to_string(c.frags_n)},
                                    {"BN", std::to_string(c.fragment_n)},
                                    {"ITERS", std::to_string(kIterations)}},
                                   1, c.khr);
    const double ms = time_ms(device, spec, {{out, 0, uint64_t{256} << 20}}, {groups, 1, 1});
    const double flops = double(groups) * (c.threads / 32) * kIterations * c.frags_m * c.frags_n *
                         2.0 * 16 * c.fragment_n * 16;
    std::printf(
        "registers: %u invocations, %ux%u accumulators of 16x%u, %s, %u groups a unit: "
        "%.3f ms, %.1f TFLOP/s\n",
        c.threads, c.frags_m, c.frags_n, c.fragment_n, c.khr ? "KHR" : "NV", c.groups_per_unit, ms,
        flops / ms / 1e9);
  }
  const char* names[] = {"fragment loads", "fragment loads + slice stores",
                         "fragment loads + slice stores + barrier"};
  for (int variant = 0; variant < 3; ++variant) {
    const uint32_t groups = units * 8;
    const KernelSpec spec = kernel("shared rate", kSharedRate,
                                   {{"ITERS", std::to_string(kIterations)},
                                    {"STORES", variant >= 1 ? "1" : "0"},
                                    {"BARRIER", variant >= 2 ? "1" : "0"}},
                                   1, true);
    const double ms = time_ms(device, spec, {{out, 0, uint64_t{256} << 20}}, {groups, 1, 1});
    const double flops = double(groups) * 8 * kIterations * 32 * 2.0 * 16 * 8 * 16;
    std::printf("shared memory, KHR: %s: %.3f ms, %.1f TFLOP/s\n", names[variant], ms,
                flops / ms / 1e9);
  }
}

struct GemmCase {
  uint32_t warps_m, warps_n, frags_m, frags_n, prefetch;
  bool f16, counted, cached;
  uint32_t b_fragments = 1;  // B fragments live at once: 1, 2 (the next one loading) or all
};

// A product kernel to time: its spec for m x n x k and its workgroup grid.
struct ProductKernel {
  KernelSpec spec;
  std::array<uint32_t, 3> groups;
};

// Runs C = A B (B stored transposed where `b_transposed`) at m x n x k through `make`; returns
// the time, and the largest error against the f64 product over a sample of C (checked = false:
// timing only).
template <typename Make>
double run_product(Device& device, Make make, bool f16, bool b_transposed, uint32_t m, uint32_t n,
                   uint32_t k, bool checked, double& worst_error, uint64_t offset = 0) {
  std::mt19937 random(7 + m);
  std::vector<float> a(size_t{m} * k), b(size_t{k} * n);
  for (float& x : a) x = exact_half_value(random);
  for (float& x : b) x = exact_half_value(random);
  const auto b_at = [&](uint32_t row, uint32_t col) {
    return b_transposed ? b[size_t{col} * k + row] : b[size_t{row} * n + col];
  };
  const size_t element_bytes = f16 ? 2 : 4;
  const BufferId a_buffer =
      device.create_buffer(offset + a.size() * element_bytes, BufferUse::device, "a");
  const BufferId b_buffer =
      device.create_buffer(offset + b.size() * element_bytes, BufferUse::device, "b");
  const BufferId c_buffer =
      device.create_buffer(offset + size_t{m} * n * 4, BufferUse::device, "c");
  auto upload = [&](BufferId buffer, const std::vector<float>& values) {
    if (!f16) return device.write_buffer(buffer, offset, std::as_bytes(std::span(values)));
    std::vector<uint16_t> bits(values.size());
    std::transform(values.begin(), values.end(), bits.begin(), half_bits);
    device.write_buffer(buffer, offset, std::as_bytes(std::span(bits)));
  };
  upload(a_buffer, a);
  upload(b_buffer, b);
  const ProductKernel product_kernel = make(m, n, k);
  const double ms = time_ms(device, product_kernel.spec,
                            {{a_buffer, offset, a.size() * element_bytes},
                             {b_buffer, offset, b.size() * element_bytes},
                             {c_buffer, offset, size_t{m} * n * 4}},
                            product_kernel.groups, checked ? 1 : 20);
  worst_error = 0;
  if (checked) {
    std::vector<float> product(size_t{m} * n);
    device.read_buffer(c_buffer, offset, std::as_writable_bytes(std::span(product)));
    for (uint32_t row = 0; row < m; row += 7)
      for (uint32_t col = 0; col < n; col += 5) {
        double sum = 0;
        for (uint32_t i = 0; i < k; ++i) sum += double{a[size_t{row} * k + i]} * b_at(i, col);
        worst_error = std::max(worst_error, std::abs(sum - product[size_t{row} * n + col]));
      }
  }
  device.destroy_buffer(a_buffer);
  device.destroy_buffer(b_buffer);
  device.destroy_buffer(c_buffer);
  return ms;
}

// Checks the product at 512 x 1024 x 768 (unless `timing_only`), then times it at 4096^3 and
// prints one line. Blocks that do not divide those extents check at four blocks a side and time
// at the largest multiple below 4096.
template <typename Make>
void check_and_time(Device& device, const char* name, Make make, bool f16, bool b_transposed,
                    bool timing_only, uint32_t block_m = 128, uint32_t block_n = 256) {
  try {
    double error = 0;
    const bool even = 512 % block_m == 0 && 1024 % block_n == 0;
    if (!timing_only) {
      const uint32_t m = even ? 512 : 4 * block_m, n = even ? 1024 : 4 * block_n;
      run_product(device, make, f16, b_transposed, m, n, 768, true, error);
      // Products of multiples of 2^-10 summed in f32: far below 1e-2 unless the kernel is wrong.
      if (error > 1e-2) {
        std::printf("gemm %s: WRONG, largest error %.3g at %ux%ux768\n", name, error, m, n);
        return;
      }
    }
    const uint32_t m = 4096 / block_m * block_m, n = 4096 / block_n * block_n;
    const double ms = run_product(device, make, f16, b_transposed, m, n, 4096, false, error);
    std::printf("gemm %ux%ux4096 %s: %.4f ms, %.1f TFLOP/s\n", m, n, name, ms,
                2.0 * m * n * 4096 / ms / 1e9);
  } catch (const std::exception& failure) {
    std::printf("gemm %s: %s\n", name, failure.what());
  }
}

// The staged subgroup-scope GEMM of `c` at m x n x k.
ProductKernel staged_kernel(const GemmCase& c, uint32_t m, uint32_t n, uint32_t k) {
  const uint32_t block_m = c.warps_m * c.frags_m * 16, block_n = c.warps_n * c.frags_n * 8;
  const KernelSpec spec = kernel("staged gemm", kStagedGemm,
                                 {{"THREADS", std::to_string(c.warps_m * c.warps_n * 32)},
                                  {"WARPS_M", std::to_string(c.warps_m)},
                                  {"WARPS_N", std::to_string(c.warps_n)},
                                  {"FM", std::to_string(c.frags_m)},
                                  {"FN", std::to_string(c.frags_n)},
                                  {"PREFETCH", std::to_string(c.prefetch)},
                                  {"F16", c.f16 ? "1" : "0"},
                                  {"COUNTED", c.counted ? "1" : "0"},
                                  {"CACHED", c.cached ? "1" : "0"},
                                  {"B_FRAGMENTS", std::to_string(c.b_fragments)},
                                  {"GEMM_M", std::to_string(m) + "u"},
                                  {"GEMM_N", std::to_string(n) + "u"},
                                  {"GEMM_K", std::to_string(k) + "u"}},
                                 3, true);
  return {spec, {n / block_n, m / block_m, 1}};
}

void half_conversion(Device& device) {
  constexpr uint32_t kCount = 4096 * 4096;
  const BufferId x = device.create_buffer(uint64_t{kCount} * 4, BufferUse::device, "x");
  const BufferId y = device.create_buffer(uint64_t{kCount} * 2, BufferUse::device, "y");
  const KernelSpec spec =
      kernel("to half", kToHalf, {{"COUNT4", std::to_string(kCount / 4) + "u"}}, 2, false);
  const double ms =
      time_ms(device, spec, {{x, 0, uint64_t{kCount} * 4}, {y, 0, uint64_t{kCount} * 2}},
              {kCount / 4 / 256, 1, 1});
  std::printf("f32 -> f16 of 4096^2: %.4f ms, %.0f GB/s\n", ms, kCount * 6.0 / ms / 1e6);
}

void staged_gemms(Device& device) {
  // warps m, n; fragments m, n; slices ahead; f16 operands; counted; cached; B fragments.
  const GemmCase cases[] = {
      {2, 4, 4, 8, 2, false, false, false, 1}, {2, 4, 4, 8, 2, false, false, false, 2},
      {2, 4, 4, 8, 2, false, false, false, 8}, {2, 4, 4, 8, 2, true, false, false, 1},
      {2, 4, 4, 8, 2, true, false, false, 2},  {2, 4, 4, 8, 2, true, false, false, 8},
      {2, 4, 4, 8, 1, true, false, false, 1},  {2, 2, 4, 8, 2, true, false, false, 1},
      {4, 4, 2, 8, 2, true, false, false, 1},  {2, 4, 4, 8, 2, true, false, true, 1},
      {2, 4, 4, 8, 2, true, false, true, 8},   {2, 2, 4, 8, 2, true, false, true, 1},
      {2, 4, 4, 8, 2, false, false, true, 1},  {2, 4, 4, 8, 1, true, true, false, 1},
      {2, 4, 4, 8, 2, true, true, false, 1},   {2, 4, 4, 8, 1, false, true, false, 1}};
  for (const GemmCase& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name,
                  "%ux%u block of %ux%u subgroups, %u slices ahead, %u B fragments live, %s, %s%s",
                  c.warps_m * c.frags_m * 16, c.warps_n * c.frags_n * 8, c.warps_m, c.warps_n,
                  c.prefetch, c.b_fragments, c.f16 ? "f16 operands" : "f32 operands",
                  c.counted ? "3 slots counted" : "2 slots + barrier",
                  c.cached ? ", loads from cache (timing only)" : "");
    check_and_time(
        device, name, [&](uint32_t m, uint32_t n, uint32_t k) { return staged_kernel(c, m, n, k); },
        c.f16, false, c.cached);
  }
  half_conversion(device);
}

const char* loads_name(MatrixLoads loads) {
  switch (loads) {
    case MatrixLoads::plain:
      return "plain loads";
    case MatrixLoads::tensor_at_element:
      return "tensor loads at the element";
    case MatrixLoads::tensor_at_buffer_start:
      return "tensor loads from the buffer start";
  }
  return "?";
}

// The workgroup GEMM's block split into several accumulators, and its result stored as f16
// (timed only: the check reads f32), with plain and tensor loads.
void split_gemms(Device& device) {
  if (!device.info().caps.workgroup_coop_matrix.available) {
    std::printf("workgroup-scope cooperative matrices: not available on this device\n");
    return;
  }
  struct Case {
    uint32_t block_m, block_n, block_k, frags_m, frags_n;
    bool f16_out;
    MatrixLoads loads;
    uint32_t group_rows = 0;  // workgroups in groups of this many row blocks (0: a 2-D grid)
    uint32_t steps = 2;       // a loop iteration
    bool a_first = false;
  };
  constexpr auto plain = MatrixLoads::plain, at_element = MatrixLoads::tensor_at_element;
  // Run 49's forms (git's history of docs/BENCHMARKS.md), then run 51's: the block split into rows
  // (256 x 128 as two 128 x 128 accumulators, the library's form with tensor loads; 384 x 128 as
  // three), into both (256 x 256 and 256 x 128 as four), grouped workgroup orders, one or four
  // steps a loop iteration, and both halves of A loaded first.
  const Case cases[] = {{128, 256, 64, 1, 1, false, plain},
                        {128, 256, 64, 1, 2, true, at_element},
                        {256, 128, 64, 2, 1, true, at_element},
                        {256, 128, 64, 2, 1, false, at_element},
                        {256, 128, 64, 2, 1, true, plain},
                        {256, 128, 64, 2, 1, false, plain},
                        {256, 128, 64, 2, 1, true, at_element, 4},
                        {256, 128, 64, 2, 1, false, at_element, 4},
                        {256, 128, 64, 2, 2, true, at_element},
                        {256, 256, 64, 2, 2, true, at_element},
                        {256, 128, 64, 2, 1, true, at_element, 0, 4},
                        {256, 128, 64, 2, 1, true, at_element, 0, 1},
                        {256, 128, 64, 2, 1, true, at_element, 0, 2, true},
                        {256, 128, 64, 2, 1, false, at_element, 0, 2, true},
                        {384, 128, 64, 3, 1, false, at_element},
                        {384, 128, 64, 3, 1, true, at_element},
                        {256, 128, 64, 2, 1, true, at_element}};
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(
        name, sizeof name,
        "workgroup scope %ux%u block as %ux%u accumulators, %u deep x%u%s, %s out, %s%s", c.block_m,
        c.block_n, c.frags_m, c.frags_n, c.block_k, c.steps, c.a_first ? " A first" : "",
        c.f16_out ? "f16" : "f32", loads_name(c.loads),
        c.group_rows ? (", groups of " + std::to_string(c.group_rows) + " rows").c_str() : "");
    if (c.loads != plain && !device.info().caps.workgroup_coop_matrix.tensor_addressing) {
      std::printf("gemm %s: the device has no tensor addressing\n", name);
      continue;
    }
    const auto make = [&](uint32_t m, uint32_t n, uint32_t k) {
      KernelSpec spec = kernel("split workgroup gemm", kWorkgroupSplitGemm,
                               {{"BM", std::to_string(c.block_m)},
                                {"BN", std::to_string(c.block_n)},
                                {"BK", std::to_string(c.block_k)},
                                {"FM", std::to_string(c.frags_m)},
                                {"FN", std::to_string(c.frags_n)},
                                {"F16_OUT", c.f16_out ? "1" : "0"},
                                {"GROUP_ROWS", std::to_string(c.group_rows)},
                                {"STEPS", std::to_string(c.steps)},
                                {"A_FIRST", c.a_first ? "1" : "0"},
                                {"GEMM_M", std::to_string(m) + "u"},
                                {"GEMM_N", std::to_string(n) + "u"},
                                {"GEMM_K", std::to_string(k) + "u"}},
                               3, true);
      spec.matrix_loads = c.loads;
      if (c.group_rows) return ProductKernel{spec, {n / c.block_n * (m / c.block_m), 1, 1}};
      return ProductKernel{spec, {n / c.block_n, m / c.block_m, 1}};
    };
    check_and_time(device, name, make, true, false, c.f16_out, c.block_m, c.block_n);
  }
}

// The workgroup GEMM staged through shared memory by the kernel (kWorkgroupStagedGemm): blocks,
// depths and slots that fit the shared memory the driver leaves (48 KiB less its reservation).
void staged_workgroup_gemms(Device& device) {
  if (!device.info().caps.workgroup_coop_matrix.available) {
    std::printf("workgroup-scope cooperative matrices: not available on this device\n");
    return;
  }
  struct Case {
    uint32_t block_m, block_n, block_k, slots, pad;
  };
  const Case cases[] = {{128, 256, 32, 1, 1}, {128, 256, 16, 2, 1}, {128, 256, 16, 3, 1},
                        {128, 128, 64, 1, 1}, {128, 128, 32, 2, 1}, {256, 128, 32, 1, 1},
                        {256, 128, 16, 2, 1}, {128, 256, 32, 1, 0}, {128, 128, 32, 2, 0}};
  for (const Case& c : cases) {
    char name[160];
    std::snprintf(name, sizeof name,
                  "workgroup scope staged by the kernel %ux%u block, %u deep, %u slot%s, pad %u",
                  c.block_m, c.block_n, c.block_k, c.slots, c.slots > 1 ? "s" : "", c.pad);
    const auto make = [&](uint32_t m, uint32_t n, uint32_t k) {
      const KernelSpec spec = kernel("staged workgroup gemm", kWorkgroupStagedGemm,
                                     {{"BM", std::to_string(c.block_m) + "u"},
                                      {"BN", std::to_string(c.block_n) + "u"},
                                      {"BK", std::to_string(c.block_k) + "u"},
                                      {"SLOTS", std::to_string(c.slots)},
                                      {"PAD", std::to_string(c.pad) + "u"},
                                      {"GEMM_M", std::to_string(m) + "u"},
                                      {"GEMM_N", std::to_string(n) + "u"},
                                      {"GEMM_K", std::to_string(k) + "u"}},
                                     3, true);
      return ProductKernel{spec, {n / c.block_n, m / c.block_m, 1}};
    };
    check_and_time(device, name, make, true, false, false, c.block_m, c.block_n);
  }
}

void workgroup_gemms(Device& device) {
  const WorkgroupCoopMatrixCaps& caps = device.info().caps.workgroup_coop_matrix;
  if (!caps.available) {
    std::printf("workgroup-scope cooperative matrices: not available on this device\n");
    return;
  }
  std::printf("workgroup scope: <= %u invocations, <= %u a side, %u bytes reserved\n",
              caps.max_workgroup_invocations, caps.max_dimension,
              caps.reserved_shared_memory_bytes);
  struct Case {
    uint32_t block_m, block_n, block_k, threads;
    bool b_transposed = false, f32 = false;
    uint32_t unroll = 2;
    bool pipelined = false;
    MatrixLoads loads = MatrixLoads::plain;
    bool m_fastest = false;  // consecutive workgroups take consecutive row blocks
  };
  constexpr auto at_element = MatrixLoads::tensor_at_element;
  constexpr auto from_start = MatrixLoads::tensor_at_buffer_start;
  // The library's kernel (backends/vulkan/kernels/gemm_workgroup.hpp) first, then what it was
  // chosen over (runs 48 and 49 in git's history of docs/BENCHMARKS.md): one or four steps a loop
  // iteration, other blocks and depths, B stored transposed, f32 operands converted in the kernel,
  // the next step's operands loaded before this step's multiply-add, tensor-addressing loads and
  // another workgroup order.
  const Case cases[] = {{128, 256, 64, 256},
                        {128, 256, 64, 256, false, false, 1},
                        {128, 128, 64, 128},
                        {256, 128, 64, 256},
                        {128, 256, 32, 256},
                        {128, 128, 32, 256, false, false, 1},
                        {64, 256, 64, 256},
                        {64, 256, 64, 128},
                        {96, 256, 64, 256},
                        {128, 192, 64, 256},
                        {128, 384, 32, 256},
                        {64, 512, 64, 256},
                        {128, 256, 128, 256, false, false, 1},
                        {128, 256, 64, 256, true},
                        {128, 256, 64, 256, false, true},
                        {128, 256, 32, 256, false, true},
                        {128, 256, 16, 256, false, true},
                        {128, 256, 16, 256, false, true, 2, false, at_element},
                        {128, 256, 64, 256, false, false, 1, true},
                        {128, 128, 32, 128, false, false, 1, true},
                        {128, 256, 64, 256, false, false, 2, false, at_element},
                        {128, 256, 64, 256, false, false, 2, false, from_start},
                        {128, 256, 64, 256, true, false, 2, false, at_element},
                        {128, 256, 64, 256, true, false, 2, false, from_start},
                        {128, 256, 64, 256, false, false, 4, false, at_element},
                        {128, 256, 64, 256, false, false, 4, false, from_start},
                        {128, 256, 32, 256, false, false, 4, false, from_start},
                        {128, 256, 64, 256, false, false, 2, false, MatrixLoads::plain, true}};
  for (const Case& c : cases) {
    char name[200];
    std::snprintf(name, sizeof name,
                  "workgroup scope %ux%u block, %u deep x%u%s, %u invocations, %s operands, B %s, "
                  "%s%s",
                  c.block_m, c.block_n, c.block_k, c.unroll, c.pipelined ? " pipelined" : "",
                  c.threads, c.f32 ? "f32" : "f16", c.b_transposed ? "transposed" : "row-major",
                  loads_name(c.loads), c.m_fastest ? ", row blocks first" : "");
    const bool fits = std::any_of(caps.configs.begin(), caps.configs.end(), [&](const auto& g) {
      return g.a == ScalarType::f16 && g.c == ScalarType::f32 && c.block_m % g.m_granularity == 0 &&
             c.block_n % g.n_granularity == 0 && c.block_k % g.k_granularity == 0 &&
             (g.workgroup_invocations == 0 || g.workgroup_invocations == c.threads);
    });
    if (!fits || c.threads > caps.max_workgroup_invocations) {
      std::printf("gemm %s: no configuration allows it\n", name);
      continue;
    }
    if (c.loads != MatrixLoads::plain && !caps.tensor_addressing) {
      std::printf("gemm %s: the device has no tensor addressing\n", name);
      continue;
    }
    const auto make = [&](uint32_t m, uint32_t n, uint32_t k) {
      KernelSpec spec = kernel("workgroup gemm", kWorkgroupGemm,
                               {{"THREADS", std::to_string(c.threads)},
                                {"BM", std::to_string(c.block_m)},
                                {"BN", std::to_string(c.block_n)},
                                {"BK", std::to_string(c.block_k)},
                                {"B_TRANSPOSED", c.b_transposed ? "1" : "0"},
                                {"F32", c.f32 ? "1" : "0"},
                                {"UNROLL", std::to_string(c.unroll)},
                                {"PIPELINED", c.pipelined ? "1" : "0"},
                                {"M_FASTEST", c.m_fastest ? "1" : "0"},
                                {"GEMM_M", std::to_string(m) + "u"},
                                {"GEMM_N", std::to_string(n) + "u"},
                                {"GEMM_K", std::to_string(k) + "u"}},
                               3, true);
      spec.matrix_loads = c.loads;
      if (c.m_fastest) return ProductKernel{spec, {m / c.block_m, n / c.block_n, 1}};
      return ProductKernel{spec, {n / c.block_n, m / c.block_m, 1}};
    };
    check_and_time(device, name, make, !c.f32, c.b_transposed, false, c.block_m, c.block_n);
  }
  split_gemms(device);
  half_conversion(device);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode != "all" && mode != "rates" && mode != "gemm" && mode != "workgroup" &&
      mode != "staged-workgroup" && mode != "split") {
    std::fprintf(stderr, "usage: coop_probe [rates|gemm|workgroup|split|staged-workgroup|all]\n");
    return 2;
  }
  try {
    std::unique_ptr<Device> device = Device::open();
    const DeviceInfo& info = device->info();
    std::printf("%s\n", describe_device(info).c_str());
    const bool has_shapes = std::any_of(info.caps.coop_matrix.begin(), info.caps.coop_matrix.end(),
                                        [](const CoopMatrixConfig& c) {
                                          return c.m == 16 && c.n == 8 && c.k == 16 &&
                                                 c.a == ScalarType::f16 && c.c == ScalarType::f32;
                                        });
    if (!has_shapes || info.caps.subgroup_size != 32) {
      std::fprintf(stderr,
                   "coop_probe: '%s' has no f16 cooperative matrices of 16x8x16 with f32 "
                   "accumulators on 32-wide subgroups; run it on a GPU that has them\n",
                   info.name.c_str());
      return 1;
    }
    const uint32_t units = std::max(1u, info.caps.compute_units);
    if (mode == "all" || mode == "rates") {
      const BufferId out = device->create_buffer(uint64_t{256} << 20, BufferUse::device, "out");
      register_rates(*device, out, units);
      device->destroy_buffer(out);
    }
    if (mode == "all" || mode == "gemm") staged_gemms(*device);
    if (mode == "all" || mode == "workgroup") workgroup_gemms(*device);
    if (mode == "split") split_gemms(*device);
    if (mode == "all" || mode == "staged-workgroup") staged_workgroup_gemms(*device);
  } catch (const std::exception& failure) {
    std::fprintf(stderr, "coop_probe: %s\n", failure.what());
    return 1;
  }
  return 0;
}
