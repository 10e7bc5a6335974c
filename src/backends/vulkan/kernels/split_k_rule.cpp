// The split-K rule (VulkanTarget::gemm_k_splits): how many K slices a product runs fastest on
// with these kernels. passes/split_k.cpp asks it of products with a long K and writes the split.
//
// Products that run on gemm.comp take the slice count its launch runs fastest with, by a model
// of that launch (simt_gemm_launch). These products are bound by latency: every workgroup waits
// on its chain of K slices, and a compute unit given a second workgroup runs the two in about
// the time of two. So a launch takes about `waves` (its workgroups over the compute units,
// rounded up) times (the chain + a fixed cost per workgroup), and a split pays off where it
// shortens the chain without adding a wave: a product runs best on the slice count whose
// workgroups still fit one wave, not on more slices that spill into a second.
#include <algorithm>
#include <optional>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/split_k_rule.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

// A slice keeps at least two 16-deep steps of gemm.comp, so that fetching one overlaps
// multiplying the other.
constexpr int64_t kMinKPerSlice = 32;
// At most this many slices, which bounds the partial results.
constexpr int64_t kMostSlices = 256;
// The launch model's fixed cost of a workgroup, in K slices of its chain (its first fetch, its
// epilogue and the partial result it writes and the sum reads back), and the weight of a slice
// of the 4 x 4 tiles, whose slices take longer than the 8 x 8 tiles' (both fitted to sweeps of
// the slice counts).
constexpr double kWorkgroupCost = 5.0, kFourByFourSliceCost = 1.25;
// Through generated loads (conv2d_grad_weight's implicit GEMM) every element of a slice is a
// call of the load functions, so a slice costs the same on every tile and outweighs the fixed
// cost of a workgroup more than in the buffer GEMMs.
constexpr double kGeneratedLoadsWorkgroupCost = 2.0;

// Products on conv_igemm.comp, and convolution weight gradients on cooperative matrices, keep a
// coarse rule: two 128 x 128 tiles in flight on each compute unit, at least 128 of K a slice,
// and no split into fewer than three (two slices of a product that already fills most compute
// units cost their sum more than they gain). On cooperative matrices slices of at least 64 and
// one tile a compute unit where that makes three slices or more, two where it does not: their
// vector loads keep short slices fast.
constexpr int64_t kTilesPerUnit = 2, kCoopTilesPerUnit = 1, kOutputTile = 128,
                  kMinKPerCoarseSlice = 128, kMinKPerCoopSlice = 64;

// A Winograd weight gradient's product (U [P, O, T] V [P, C, T]^T, passes/im2col.cpp) needs no
// sum launch when split: the filter transform, which reads the product anyway, sums the partials
// (merge_leading_sums). Where the model keeps it whole because it already has many workgroups,
// two slices of at least 256 tiles still pay: each workgroup's chain halves at no other cost.
constexpr int64_t kMinKPerWinogradSlice = 256;

// The slice count of the coarse rule above, `tiles_per_unit` 128 x 128 tiles a compute unit and
// at most `slices_by_k` slices.
int64_t coarse_split_count(const target::GemmProduct& product, int64_t compute_units,
                           int64_t tiles_per_unit, int64_t slices_by_k) {
  const int64_t tiles = std::max<int64_t>(
      1, product.entries * ceil_div(product.m, kOutputTile) * ceil_div(product.n, kOutputTile));
  const int64_t wanted = std::min(tiles_per_unit * compute_units / tiles, slices_by_k);
  if (wanted < 3) return 1;
  return nonempty_slices(product.k, wanted);
}

int64_t coarse_coop_split_count(const target::GemmProduct& product, int64_t compute_units) {
  const int64_t slices_by_k = product.k / kMinKPerCoopSlice;
  const int64_t splits = coarse_split_count(product, compute_units, kCoopTilesPerUnit, slices_by_k);
  return splits > 1 ? splits
                    : coarse_split_count(product, compute_units, kTilesPerUnit, slices_by_k);
}

// A cooperative-matrix matmul's slice count (MEGANEURA_COOP_SPLIT_MODEL, on unless 0): the one
// that balances each workgroup's chain of 32-deep K steps against the partial results: every
// slice writes M x N of them and the sum reads them back, which costs a small fast product more
// than its multiplies (the K-loop diagnostic, docs/KERNELS.md). It takes at most the coarse
// rule's count, whose splits of large products were measured, and ties keep fewer slices.
constexpr int64_t kCoopStepK = 32;
// What writing and summing one partial element costs, in 32-deep K steps of a workgroup's chain.
constexpr double kPartialElementCost = 5.7e-6;

int64_t modelled_coop_split_count(const target::GemmProduct& product, int64_t compute_units) {
  const int64_t most = coarse_coop_split_count(product, compute_units);
  const double partial_elements = static_cast<double>(product.m * product.n * product.entries);
  int64_t best_splits = 1;
  double best_cost = static_cast<double>(ceil_div(product.k, kCoopStepK));
  for (int64_t wanted = 2; wanted <= most; ++wanted) {
    const int64_t splits = nonempty_slices(product.k, wanted);
    if (splits != wanted) continue;  // aligned slices reach this count from another `wanted`
    const double cost =
        static_cast<double>(ceil_div(k_slice_length(product.k, splits), kCoopStepK)) +
        static_cast<double>(splits) * partial_elements * kPartialElementCost;
    if (cost < best_cost) {
      best_cost = cost;
      best_splits = splits;
    }
  }
  return best_splits;
}

// The launch of `product` over `splits` slices where gemm.comp runs it, or nothing where
// conv_igemm.comp does.
std::optional<SimtGemmLaunch> simt_launch(const target::GemmProduct& product, int64_t splits,
                                          const DeviceTraits& device) {
  const int64_t k = splits > 1 ? k_slice_length(product.k, splits) : product.k;
  const int64_t entries = product.entries * splits;
  if (!product.generated_loads)
    return simt_gemm_launch(product.m, product.n, k, product.k, entries, false, device);
  // conv2d_grad_weight's implicit GEMM (conv.cpp): gemm.comp where its tiles suit.
  if (!simt_gemm_suits({.m = product.m, .n = product.n, .k = k, .entries = entries}, device))
    return std::nullopt;
  return simt_gemm_launch(product.m, product.n, k, k, entries, true, device);
}

double launch_cost(const SimtGemmLaunch& launch, const target::GemmProduct& product,
                   int64_t compute_units) {
  const double slice_cost =
      launch.four_by_four && !product.generated_loads ? kFourByFourSliceCost : 1.0;
  const double workgroup_cost =
      product.generated_loads ? kGeneratedLoadsWorkgroupCost : kWorkgroupCost;
  return static_cast<double>(ceil_div(launch.workgroups, compute_units)) *
         (static_cast<double>(launch.chain) * slice_cost + workgroup_cost);
}

bool runs_on_simt_gemm(const target::GemmProduct& product, const DeviceTraits& device) {
  if (use_cpu_kernels(device)) return false;
  if (!use_coop_gemm(device)) return true;
  if (product.half_operands) return false;
  // Matmuls this small stay on gemm.comp (gemm.cpp); convolutions all take the coop GEMM.
  return !product.generated_loads &&
         !coop_gemm_suits(product.m, product.m * product.n * product.k * product.entries, product.k,
                          product.b_transposed, device);
}

}  // namespace

int64_t gemm_k_splits(const target::GemmProduct& product, const DeviceTraits& device) {
  const bool simt = runs_on_simt_gemm(product, device);
  // A product of few rows over a K of at most kMostFewRowsWholeK takes no slices: its own
  // kernel reads B once, 32 lanes a column, each lane at most a few dozen vec4s of a row, with no
  // partial sums to add. Longer rows are sliced, as the lanes of few columns would walk them
  // alone.
  constexpr int64_t kMostFewRowsWholeK = 4096;
  if (simt && !product.generated_loads && product.k <= kMostFewRowsWholeK &&
      few_rows_gemm_suits(product.m, product.k, product.b_transposed, device))
    return 1;
  const std::optional<SimtGemmLaunch> whole = simt ? simt_launch(product, 1, device) : std::nullopt;
  if (!whole) {
    if (!use_coop_gemm(device))
      return coarse_split_count(product, device.compute_units, kTilesPerUnit,
                                product.k / kMinKPerCoarseSlice);
    if (!product.generated_loads && device.switches.coop_split_model)
      return modelled_coop_split_count(product, device.compute_units);
    return coarse_coop_split_count(product, device.compute_units);
  }
  int64_t best_splits = 1;
  double best_cost = launch_cost(*whole, product, device.compute_units);
  // Slice counts from few to many; a count that only ties keeps the fewer slices, which write
  // and sum fewer partial results.
  const int64_t most_slices = std::min(kMostSlices, product.k / kMinKPerSlice);
  for (int64_t wanted = 2; wanted <= most_slices; ++wanted) {
    const int64_t splits = nonempty_slices(product.k, wanted);
    if (splits != wanted) continue;  // aligned slices reach this count from another `wanted`
    const std::optional<SimtGemmLaunch> launch = simt_launch(product, splits, device);
    if (!launch) continue;
    const double cost = launch_cost(*launch, product, device.compute_units);
    if (cost < best_cost) {
      best_cost = cost;
      best_splits = splits;
    }
  }
  if (best_splits == 1 && product.winograd_weight_gradient &&
      product.k >= 2 * kMinKPerWinogradSlice)
    return nonempty_slices(product.k, 2);
  return best_splits;
}

}  // namespace mg::kernels
