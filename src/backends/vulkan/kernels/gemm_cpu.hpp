#pragma once
// The GEMM lowerings shared by matmul and the convolutions: gemm.comp over buffers, and the GEMMs
// that read their operands through generated load functions (the CPU-device GEMM gemm_cpu.comp
// on Lavapipe, gemm.comp's GENERATED_LOADS form and the cooperative-matrix GEMM in
// gemm_coopmat.hpp), with the split-K form of the load functions that they and
// conv_igemm.comp read through.
#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"

namespace mg::kernels {

// True when `device` is a CPU implementation whose subgroup the CPU kernels can use, unless
// MEGANEURA_NO_CPU_KERNELS=1 (DeviceTraits::switches) forces the GPU kernels, so that both paths
// can be tested on Lavapipe.
bool use_cpu_kernels(const DeviceTraits& device);

// Whether the convolution columns `columns` (an im2col node) are stored as packed f16 pairs, so
// that the gather writes and the GEMM reads half the bytes: with MEGANEURA_PACKED_COLUMNS=1,
// where their one consumer, a matmul taking them as B, reads them through generated load
// functions, on cooperative matrices (which round them to f16 anyway) or on the CPU-device GEMM
// (gemm_cpu.comp, so that Lavapipe tests both ends), and the gather writes vec4 rows (output
// width a multiple of 4); never for bfloat16 operands (DeviceTraits::bf16_operands). Off by
// default: it sped some fast convolutions up and slowed others down. lower_im2col and the matmul's
// lowering both ask, so they agree.
bool packed_columns(const Graph& graph, ValueId columns, const DeviceTraits& device);

// The attention_combine (a split attention's join, passes/split_attention.cpp) whose result the
// matmul `node` reads as A through reshapes, where its GEMM joins the slices' partials itself as
// it loads A (join_slices_functions), so that it need not wait for the combine's launch: f32
// operands on the cooperative-matrix, CPU-device or tiled buffer GEMM (not gemm_few_rows.comp,
// which reads buffers alone). Else kNoValue. Fusion gives the combine no launch where every
// reader is such a product and nothing else needs its result or log-sum-exp (inference).
// MEGANEURA_JOIN_SLICES=0 or MEGANEURA_NO_FUSION=1 turns it off.
ValueId joined_split_attention(const Graph& graph, const Node& node, const DeviceTraits& device);

// Whether `node` is a product that emit_matmul's GEMMs compute and store as f32 through
// store_c: a matmul, or a half_matmul of an f32 result that the workgroup GEMM does not take
// (half products, passes/half_products.cpp). Epilogues, moved stores and joined slices take
// these.
bool stores_f32_product(const Graph& graph, const Node& node, const DeviceTraits& device);

// C[m, n] = sum_k A[m, k] B[k, n] for each of `entries` independent problems (grid z).
// `functions` defines load_a(z, m, k), load_b(z, k, n) and store_c(z, m, n, value) over the
// launch's operands (see gemm_cpu.comp).
struct CpuGemm {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  std::string functions;
};

void emit_cpu_gemm(LoweringContext& context, const CpuGemm& gemm, std::vector<Operand> operands);

// C[m, n] = sum over k of A[m, k] B[k, n] for each of `entries` problems (grid z), read through
// generated functions: `functions` defines load_a(z, m, k), load_b(z, k, n) and
// store_c(z, m, n, value) over the launch's operands; kernels call them with in-range indices
// only. The contiguity flags say which index is adjacent in memory, so that neighbouring
// invocations load neighbouring words. Run on gemm.comp (GENERATED_LOADS, its tile chosen as for
// matmul) or on cooperative matrices (gemm_coopmat.hpp).
struct GeneratedGemm {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  bool a_m_contiguous = false;  // else A's k is the fastest index
  bool b_k_contiguous = false;  // else B's n is the fastest index
  // Cooperative-matrix GEMM only: `functions` also define vec4 load_a4(z, m, k) (vector_a) and
  // load_b4(z, k, n) (vector_b), four consecutive elements along the operand's contiguous index
  // from a multiple of 4.
  bool vector_a = false, vector_b = false;
  // store_c(z, m, n, value) writes value to c[(z M + m) N + n] and nothing else (a matmul without
  // an epilogue), so whole fragments may be stored there at once.
  bool row_major_c = false;
  // That operand's buffer holds f16 (Launch::f16_operands), or bfloat16 with bfloat16_operands:
  // `functions` read it as such, and with half_a_units (half_b_units) also define uvec4
  // load_a8(z, m, k) (load_b8(z, k, n)), 8 consecutive halves along the contiguous index from a
  // multiple of 8.
  bool half_a = false, half_b = false, half_a_units = false, half_b_units = false;
  // The 16-bit operands are bfloat16 (bf16 precision only), stored as bfloat16 fragments: the
  // kernel's f16 type and 16-bit buffers become bfloat16 (Launch::bf16_buffers).
  bool bfloat16_operands = false;
  std::string functions;
};

// op(A)[m, k] op(B)[k, n] on gemm.comp, both operands in buffers: operands 0 and 1 of `launch`
// ("a" and "b", each also read through a vec4 view where its contiguous extent allows), whose
// body must define uint a_offset(uint batch) and b_offset(uint batch) (element offsets of batch
// entry `batch`'s matrices, a multiple of 4 wherever the vec4 views apply) and
// store_c(z, m, n, value). Matmul runs so, and the 1x1 convolutions (conv.cpp), whose channels
// are a plain matrix per image. `splits` > 0 makes `splits` split-K partial products
// (ops/k_split.hpp); batch entry z % batches, K slice z / batches.
struct BufferGemm {
  int64_t m = 0, n = 0, k = 0, batches = 1, splits = 0;
  bool transpose_a = false, transpose_b = false;
  // store_c(z, m, n, value) writes value to operand 2, c, at (z M + m) N + n and nothing else (a
  // matmul without an epilogue): rows of a multiple of 4 floats are then stored a vec4 at a time.
  bool row_major_c = false;
  // Where A is a split attention's joined result (joined_split_attention): the GLSL of
  // joined_a(e) and joined_a4(e), reading the partials bound as operand 0, instead of A's buffer.
  std::string joined_a;
};

void emit_buffer_gemm(LoweringContext& context, const BufferGemm& gemm, Launch launch);

// Whether a whole (unsplit) buffer product of m rows over k, B stored [N, K] where
// b_transposed, runs on gemm_few_rows.comp instead of gemm.comp: at most 8 rows against B's rows
// (a decode step's or a short decoder's y = x W^T), at least 32 along K, unless
// MEGANEURA_FEW_ROWS_GEMM=0 or MEGANEURA_GEMM_TILE forces gemm.comp's tiles.
bool few_rows_gemm_suits(int64_t m, int64_t k, bool b_transposed, const DeviceTraits& device);

// Whether gemm.comp's tiles suit a convolution GEMM (else conv_igemm.comp runs it);
// MEGANEURA_GEMM_TILE, when it forces a tile (an ignored override does not), also forces this
// route for every product of at least 32 x 32.
bool simt_gemm_suits(const GeneratedGemm& gemm, const DeviceTraits& device);

void emit_simt_gemm(LoweringContext& context, const GeneratedGemm& gemm,
                    std::vector<Operand> operands);

// How gemm.comp runs an M x N product for `entries` problems (batch entries times split-K
// slices) whose workgroups each sum over `k` (`whole_k` as its lowering passes it: the whole K
// for buffer products, the slice for generated loads; `generated_loads` for operands read through
// load functions, the implicit-GEMM convolutions): the workgroups it launches, and the chain of
// TILE_K slices each k-group of a workgroup walks. The split-K pass weighs slice counts by it.
struct SimtGemmLaunch {
  int64_t workgroups = 0;
  int64_t chain = 0;
  bool four_by_four = false;  // 4 x 4 outputs a thread (the 64 and 32 tiles)
};

SimtGemmLaunch simt_gemm_launch(int64_t m, int64_t n, int64_t k, int64_t whole_k, int64_t entries,
                                bool generated_loads, const DeviceTraits& device);

// Split-K over GEMM load functions (ops/k_split.hpp): `functions` defines load_a(z, m, k) and
// load_b(z, k, n) (and, with `vector_a` and `vector_b`, the vec4 load_a4 and load_b4, `k` then
// a multiple of 4 where the operand is contiguous along it; with `half_a_units` and
// `half_b_units`, the uvec4 load_a8 and load_b8 of 8 halves, `k` a multiple of 8 where the
// operand is contiguous along it) for
// `entries` problems summing all of `k`; the result defines them for entries * splits
// problems of one K slice each (GEMM K = k_slice_length(k, splits)). Problem z is slice
// z / entries of problem z % entries: loads shift k into the slice and read zero past `k`.
// store_c is left as it is: it receives z itself, the flat index over [splits, entries] and so
// over the leading axes of the [splits, ...] partial results.
std::string split_k_functions(const std::string& functions, int64_t entries, int64_t k,
                              int64_t splits, bool vector_a, bool vector_b,
                              bool half_a_units = false, bool half_b_units = false);

}  // namespace mg::kernels
