#include "backends/vulkan/kernels/gemm_coopmat.hpp"

#include <array>
#include <optional>

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "config/integer_list.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

// A workgroup of warps_m x warps_n subgroups, each frags_m x frags_n accumulator fragments of
// 16 x 8, over K slices of block_k, fetching prefetch_slices slices ahead (gemm_coopmat.comp).
// With bfloat16 operands the fragments are 16 x 16, frags_n / 2 of them: the same block.
struct BlockShape {
  int64_t warps_m, warps_n, frags_m, frags_n, block_k, prefetch_slices = 1;
  constexpr int64_t rows() const { return warps_m * frags_m * 16; }
  constexpr int64_t cols() const { return warps_n * frags_n * 8; }
  int64_t threads() const { return warps_m * warps_n * 32; }
};

// Candidates from the largest, each with its relative time per output element when the GPU is
// full (from a sweep of block shapes): 64 x 64 subgroup tiles read the fewest fragment bytes
// from shared memory per multiply-add; at 128 x 256 only 16-deep slices fit two slots in 48 KiB.
// The 64 x 64 blocks' weight is raised above the largest products' so that it also fits the
// smaller products of the sweep. The last fits any device's 16 KiB.
// 128 x 192 fits 48 KiB only with A contiguous along m and B along n (a weight gradient, dY^T X):
// SmolLM's lm_head weight gradient (49152 x 576 over K = 128) covers N in 3 columns of it instead
// of 5 of 128 x 128; weighed as 128 x 256, it takes the products where its waves cost less.
struct Candidate {
  BlockShape block;
  double weight;
};
constexpr std::array<Candidate, 5> kCandidates{{{{2, 4, 4, 8, 16}, 1.0},
                                                {{2, 4, 4, 6, 32}, 1.0},
                                                {{2, 4, 4, 4, 32}, 1.08},
                                                {{2, 2, 2, 4, 32}, 1.8},
                                                {{2, 2, 2, 4, 16}, 2.0}}};
static_assert(kCandidates[0].block.cols() == kWidestSubgroupBlockColumns);

// The columns of the kernel's B and accumulator fragments: 16 for bfloat16 operands (f32 ones
// rounded to bfloat16, or bf16 ones), whose devices offer the 16 x 16 x 16 shape only, else 8.
int64_t fragment_columns(const GeneratedGemm& gemm, const DeviceTraits& device) {
  const bool f16_operands = (gemm.half_a || gemm.half_b) && !gemm.bfloat16_operands;
  return device.bf16_operands && !f16_operands ? 16 : 8;
}

// Shared tile bytes of one slot of an operand: `rows` rows of `row_halves` contiguous halves,
// padded by 8 halves.
int64_t tile_bytes(int64_t rows, int64_t row_halves) {
  return rows * (row_halves + 8) * 2;
}

// Why `block` cannot run `gemm` on `device`, or nothing when it can. The kernel needs whole
// 8-half units along both tiles' rows, the same number of units for every invocation and its
// two slots of both tiles plus the staging fragments in shared memory.
std::optional<std::string> block_misfit(const BlockShape& block, const GeneratedGemm& gemm,
                                        const DeviceTraits& device) {
  // The bound keeps the products below from overflowing on a mistyped override.
  constexpr int64_t kMostExtent = 4096;
  for (const int64_t extent :
       {block.warps_m, block.warps_n, block.frags_m, block.frags_n, block.block_k}) {
    if (extent < 1 || extent > kMostExtent)
      return "every extent must lie in [1, " + std::to_string(kMostExtent) + "]";
  }
  if (block.block_k % 16 != 0) return "block_k must be a multiple of 16";
  const int64_t columns = fragment_columns(gemm, device);
  if (block.frags_n * 8 % columns != 0)
    return "frags_n must be even for the 16-column fragments of bfloat16 operands";
  if (block.prefetch_slices != 1 && block.prefetch_slices != 2)
    return "prefetch_slices must be 1 or 2";
  if (block.threads() > device.max_workgroup_invocations)
    return std::to_string(block.threads()) + " invocations exceed the device's " +
           std::to_string(device.max_workgroup_invocations);
  const int64_t a_halves = block.rows() * block.block_k, b_halves = block.block_k * block.cols();
  if (a_halves % (8 * block.threads()) != 0 || b_halves % (8 * block.threads()) != 0)
    return "the tiles do not split into 8 halves per invocation evenly";
  const int64_t a_bytes = gemm.a_m_contiguous ? tile_bytes(block.block_k, block.rows())
                                              : tile_bytes(block.rows(), block.block_k);
  const int64_t b_bytes = gemm.b_k_contiguous ? tile_bytes(block.cols(), block.block_k)
                                              : tile_bytes(block.block_k, block.cols());
  const int64_t staging_bytes = block.warps_m * block.warps_n * 16 * columns * 4;
  const int64_t shared_bytes = 2 * (a_bytes + b_bytes) + staging_bytes;
  if (shared_bytes > device.max_shared_memory_bytes)
    return std::to_string(shared_bytes) + " bytes of shared memory exceed the device's " +
           std::to_string(device.max_shared_memory_bytes);
  return std::nullopt;
}

// Slices fetched ahead: two where the 128 x 256 block walks a long K. Its multiplies between
// barriers then outlast the global reads' latency, which one slice of 16 does not cover; the
// extra set of registers still fits one workgroup per compute unit. Smaller blocks and short K
// ran no faster or slower with two.
int64_t prefetch_slices_for(const BlockShape& block, const GeneratedGemm& gemm) {
  constexpr int64_t kLongK = 1024;
  return block.rows() * block.cols() >= 128 * 256 && gemm.k >= kLongK ? 2 : 1;
}

// MEGANEURA_COOP_BLOCK=warps_m,warps_n,frags_m,frags_n,block_k[,prefetch_slices] forces the
// block (tuning sweeps); a malformed value or a shape the device cannot run is ignored with a
// warning.
std::optional<BlockShape> forced_block(const GeneratedGemm& gemm, const DeviceTraits& device) {
  const std::optional<std::string>& text = device.switches.coop_block;
  if (!text) return std::nullopt;
  const std::string prefix = "ignoring MEGANEURA_COOP_BLOCK=" + *text + ": ";
  std::optional<std::vector<int64_t>> values = config::parse_integers(*text, 5);
  if (!values) values = config::parse_integers(*text, 6);
  if (!values) {
    warn_once(prefix + "expected warps_m,warps_n,frags_m,frags_n,block_k[,prefetch_slices]");
    return std::nullopt;
  }
  BlockShape block{(*values)[0], (*values)[1], (*values)[2], (*values)[3], (*values)[4]};
  block.prefetch_slices = values->size() == 6 ? (*values)[5] : prefetch_slices_for(block, gemm);
  if (const std::optional<std::string> misfit = block_misfit(block, gemm, device)) {
    warn_once(prefix + *misfit + " (" + device.name + ")");
    return std::nullopt;
  }
  return block;
}

// The candidate with the least estimated time: waves of one block per compute unit (a partial wave
// costs a whole one) times a block's outputs and weight. Large blocks win on big products; on
// the rest a last, partly filled wave of them costs more than smaller blocks (128 x 49152:
// 192 blocks of 128 x 256 take two waves, 384 of 128 x 128 three of half the work).
BlockShape choose_block(const GeneratedGemm& gemm, const DeviceTraits& device) {
  if (const std::optional<BlockShape> forced = forced_block(gemm, device)) return *forced;
  std::optional<Candidate> best;
  double best_cost = 0;
  for (const Candidate& candidate : kCandidates) {
    const BlockShape& block = candidate.block;
    if (block_misfit(block, gemm, device)) continue;
    const int64_t blocks = ((gemm.m + block.rows() - 1) / block.rows()) *
                           ((gemm.n + block.cols() - 1) / block.cols()) * gemm.entries;
    const int64_t waves = (blocks + device.compute_units - 1) / device.compute_units;
    const double cost = static_cast<double>(waves * block.rows() * block.cols()) * candidate.weight;
    if (!best || cost < best_cost) {
      best = candidate;
      best_cost = cost;
    }
  }
  BlockShape chosen = best ? best->block : kCandidates.back().block;
  chosen.prefetch_slices = prefetch_slices_for(chosen, gemm);
  return chosen;
}

}  // namespace

bool use_coop_gemm(const DeviceTraits& device) {
  const bool has_shape = device.bf16_operands
                             ? device.coop_matrix_bf16_khr
                             : device.coop_matrix_f16_nv || device.coop_matrix_f16_khr;
  return device.fast_precision && has_shape && device.subgroup_size == 32 &&
         device.max_workgroup_invocations >= 256 && !device.switches.no_coopmat;
}

bool coop_gemm_suits(int64_t m, int64_t multiply_adds, int64_t k, bool b_transposed,
                     const DeviceTraits& device) {
  // The bound's reasons are in the header.
  constexpr int64_t kMinMultiplyAddsPerUnit = 1 << 16, kMinK = 16;
  if (const std::optional<int64_t> forced = device.switches.coop_gemm_min)
    return multiply_adds >= *forced * device.compute_units;
  if (k < kMinK || few_rows_gemm_suits(m, k, b_transposed, device)) return false;
  return multiply_adds >= kMinMultiplyAddsPerUnit * device.compute_units;
}

bool coop_wants_khr(const DeviceTraits& device) {
  if (device.bf16_operands || !device.coop_matrix_f16_nv) return true;
  if (!device.coop_matrix_f16_khr) return false;
  return device.switches.coopmat != Switches::CoopMatrixExtension::nv;
}

void emit_coop_gemm(LoweringContext& context, const GeneratedGemm& gemm,
                    std::vector<Operand> operands) {
  const BlockShape block = choose_block(gemm, context.device());
  const bool whole_blocks =
      gemm.m % block.rows() == 0 && gemm.n % block.cols() == 0 && gemm.k % block.block_k == 0;
  const int64_t columns = fragment_columns(gemm, context.device());
  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm_coopmat";
  launch.body = gemm.functions;
  launch.files = {kernel_source("gemm_coopmat.comp")};
  launch.defines = {{"GEMM_M", glsl_uint(gemm.m)},
                    {"GEMM_N", glsl_uint(gemm.n)},
                    {"GEMM_K", glsl_uint(gemm.k)},
                    {"WARPS_M", glsl_uint(block.warps_m)},
                    {"WARPS_N", glsl_uint(block.warps_n)},
                    {"FRAGS_M", glsl_uint(block.frags_m)},
                    {"FRAGS_N", glsl_uint(block.frags_n * 8 / columns)},
                    {"BLOCK_K", glsl_uint(block.block_k)},
                    {"PREFETCH_SLICES", std::to_string(block.prefetch_slices)},
                    {"A_M_CONTIGUOUS", gemm.a_m_contiguous ? "1" : "0"},
                    {"B_K_CONTIGUOUS", gemm.b_k_contiguous ? "1" : "0"},
                    {"VECTOR_A", gemm.vector_a ? "1" : "0"},
                    {"VECTOR_B", gemm.vector_b ? "1" : "0"},
                    {"HALF_A_UNITS", gemm.half_a_units ? "1" : "0"},
                    {"HALF_B_UNITS", gemm.half_b_units ? "1" : "0"},
                    {"WHOLE_BLOCKS", whole_blocks ? "1" : "0"},
                    {"DIRECT_STORE", gemm.row_major_c && gemm.n % 4 == 0 ? "1" : "0"},
                    {"BFLOAT16_FRAGMENTS", columns == 16 ? "1" : "0"}};
  launch.operands = std::move(operands);
  launch.f16_operands = gemm.half_a || gemm.half_b;
  launch.khr_cooperative_matrix = coop_wants_khr(context.device());
  // Products of f16 tensors read or write f16 memory: their operands stay f16.
  launch.bf16_operands = columns == 16;
  launch.bf16_buffers = gemm.bfloat16_operands;
  launch.groups = tiled_grid(launch.label, gemm.n, block.cols(), gemm.m, block.rows(), gemm.entries,
                             context.device());
  context.emit(std::move(launch));
}

}  // namespace mg::kernels
