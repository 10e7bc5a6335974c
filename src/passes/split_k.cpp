// Split-K: a product whose output is a handful of GEMM tiles but whose K is long (the data
// gradients of a transformer at short sequence length, e.g. 128 x 576 x 49152; convolution
// weight gradients, which sum over batch * OH * OW) runs on a few workgroups of a GPU with 132
// compute units, each walking all of K. The pass gives such a node k_splits = S: one GEMM
// dispatch whose workgroups also cover S slices of K and write S partial results [S, ...], then
// one `sum` over the leading axis (a column reduction, one thread per output element).
//
// Products that run on gemm.comp take the slice count its launch runs fastest with, by a model
// of that launch (kernels::simt_gemm_launch). These products are bound by latency: every
// workgroup waits on its chain of K slices, and a compute unit given a second workgroup runs the
// two in about the time of two. So a launch takes about `waves` (its workgroups over the compute
// units, rounded up) times (the chain + a fixed cost per workgroup), and a split pays off where it
// shortens the chain without adding a wave. On the H200 this ordered the measured slice counts of
// every split product of the benchmarks (ResNet's weight gradients and strided forward, SmolLM's
// projections, Whisper's dQ matmul; docs/BENCHMARKS.md run 28): ResNet's 3x3 weight gradient
// (4 products of 64 x 576 x 3136) runs best on 6 slices, one wave of 120 workgroups of 64 x 128,
// not on 13 (two waves) or 8 (160 workgroups: a second wave for 28 units).
#include <algorithm>
#include <optional>
#include <string>

#include "ir/op_names.hpp"
#include "kernels/conv_weight_grad.hpp"
#include "kernels/gemm_coopmat.hpp"
#include "kernels/gemm_cpu.hpp"
#include "kernels/gemm_workgroup.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// A slice keeps at least two 16-deep steps of gemm.comp, so that fetching one overlaps
// multiplying the other (SmolLM's 128 x 576 x 576 ran best on 48-deep slices, 12 of them).
constexpr int64_t kMinKPerSlice = 32;
// At most this many slices, which bounds the partial results.
constexpr int64_t kMostSlices = 256;
// The launch model's fixed cost of a workgroup, in K slices of its chain (its first fetch, its
// epilogue and the partial result it writes and the sum reads back), and the weight of a slice
// of the 4 x 4 tiles, which took about 1.25 times as long a slice as the 64 x 128 tile in the
// H200 sweep of run 28 (docs/BENCHMARKS.md; 64 x 64 tiles with 2 k-groups on ResNet's 3x3
// weight gradient and SmolLM's lm_head data gradient).
constexpr double kWorkgroupCost = 5.0, kFourByFourSliceCost = 1.25;
// Through generated loads (conv2d_grad_weight's implicit GEMM) every element of a slice is a
// call of the load functions, and a slice took 2.5-3 us on every tile of the H200 sweep (ResNet's
// 1x1 weight gradient: 32 x 32, 64 x 64 and 64 x 128 tiles), against about 1 us for the buffer
// GEMMs' 64 x 128 tile: the tiles weigh alike and the fixed cost is fewer slices.
constexpr double kGeneratedLoadsWorkgroupCost = 2.0;

// Products on another GEMM (cooperative matrices, conv_igemm.comp) keep the rule the pass had
// before the model: two 128 x 128 tiles in flight on each compute unit (264 on an H200), at
// least 128 of K a slice, and no split into fewer than three. On cooperative matrices slices of
// at least 64 and one tile a compute unit where that makes three slices or more, two where it
// does not: with vector loads over K slices (kernels/gemm_coopmat.cpp) SmolLM's 128 x 576 x 576
// ran 9.8 us on 9 slices of 64 against 13.5 on 4 of 144, 128 x 1536 x 576 13.9 against 14.8
// (docs/BENCHMARKS.md run 32); every partial result is written and read back once more, and
// ResNet's strided 3x3 convolution as 4 products over 36 tiles ran 0.0324 ms on 4 slices
// against 0.0366 on the 9 of two tiles a unit, its weight gradient 0.0322 on 3 against 0.0379
// on 7, while U-Net's 320-channel 32 x 32 convolution (48 tiles) ran its block in 0.0862 ms on
// 5 slices and 0.0940 whole (run 34).
constexpr int64_t kTilesPerUnit = 2, kCoopTilesPerUnit = 1, kOutputTile = 128,
                  kMinKPerCoarseSlice = 128, kMinKPerCoopSlice = 64;

// A Winograd weight gradient's product (U [P, O, T] V [P, C, T]^T, passes/im2col.cpp) needs no
// sum launch when split: the filter transform, which reads the product anyway, sums the partials
// (merge_leading_sums). Where the model above keeps it whole because it already has many
// workgroups, two slices of at least 256 tiles still ran faster on the H200: U-Net's F(4 x 4)
// gradient at 64 x 64 (36 products of 320 x 320 over K = 512 on 900 64 x 64 workgroups) took
// 0.1265 ms for the product on two slices against 0.1377 whole, and 0.0102 ms for the transform
// against 0.0066 (three slices: 0.1371 and 0.0170; docs/BENCHMARKS.md run 52).
constexpr int64_t kMinKPerWinogradSlice = 256;

// The slices that are not empty when K is cut for `wanted` of them (aligned slices may cover K
// in fewer).
int64_t nonempty_slices(int64_t k, int64_t wanted) {
  return ceil_div(k, k_slice_length(k, wanted));
}

// A product the pass may split: the GEMM it runs, C[M, N] for each of `entries` problems
// summed over K.
struct Product {
  int64_t m = 0, n = 0, k = 0, entries = 1;
  bool generated_loads = false;  // conv2d_grad_weight's implicit GEMM, not a matmul's buffers
  bool half_operands = false;    // a half_matmul: the cooperative-matrix GEMM runs it, any size
  bool winograd_weight_gradient = false;  // U V^T of transformed tiles (kMinKPerWinogradSlice)
};

std::optional<Product> product_of(const Graph& graph, const Node& node,
                                  const kernels::DeviceTraits& device) {
  if (node.attrs.has("k_splits")) return std::nullopt;
  // A product of f16 operands splits where the subgroup-scope GEMM runs it (the workgroup GEMM
  // takes products whole).
  const bool half = node.op == op::half_matmul;
  if (half && kernels::workgroup_gemm_takes_f16_product(graph, node, device)) return std::nullopt;
  if (node.op == op::matmul || half) {
    const Shape& a_shape = graph.type(node.inputs[0]).shape;
    const Shape& out_shape = node.type.shape;
    const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
    return Product{
        .m = out_shape[out_shape.size() - 2],
        .n = out_shape[out_shape.size() - 1],
        .k = a_shape[a_shape.size() - (transpose_a ? 2 : 1)],
        .entries = element_count(Shape(out_shape.begin(), out_shape.end() - 2)),
        .half_operands = half,
        .winograd_weight_gradient = graph.node(node.inputs[0]).op == op::winograd_grad_tiles};
  }
  if (node.op == op::conv2d_grad_weight) {
    // Per group: M = O / groups, N = C / groups * KH * KW, K = N * OH * OW (kernels/conv.cpp).
    const Shape& grad_out = graph.type(node.inputs[1]).shape;
    const Shape& weight = node.type.shape;
    const int64_t groups = node.attrs.get_int("groups", 1);
    return Product{.m = weight[0] / groups,
                   .n = weight[1] * weight[2] * weight[3],
                   .k = grad_out[0] * grad_out[2] * grad_out[3],
                   .entries = groups,
                   .generated_loads = true};
  }
  return std::nullopt;
}

// The slice count of the coarse rule above, `tiles_per_unit` 128 x 128 tiles a compute unit and
// slices of at least `min_k_per_slice`.
int64_t coarse_split_count(const Product& product, int64_t compute_units, int64_t tiles_per_unit,
                           int64_t min_k_per_slice) {
  const int64_t tiles = std::max<int64_t>(
      1, product.entries * ceil_div(product.m, kOutputTile) * ceil_div(product.n, kOutputTile));
  const int64_t wanted =
      std::min(tiles_per_unit * compute_units / tiles, product.k / min_k_per_slice);
  // Two slices of a product that already fills most compute units cost their sum more than
  // they gain: ResNet's 3x3 convolution as a matmul (100 tiles) took 52 us whole and 50 + 7 us
  // split in two on the H200 (docs/BENCHMARKS.md run 15).
  if (wanted < 3) return 1;
  return nonempty_slices(product.k, wanted);
}

// The launch of `product` over `splits` slices where gemm.comp runs it (see the top of the file),
// or nothing where conv_igemm.comp does.
std::optional<kernels::SimtGemmLaunch> simt_launch(const Product& product, int64_t splits,
                                                   const kernels::DeviceTraits& device) {
  const int64_t k = splits > 1 ? k_slice_length(product.k, splits) : product.k;
  const int64_t entries = product.entries * splits;
  if (!product.generated_loads)
    return kernels::simt_gemm_launch(product.m, product.n, k, product.k, entries, false, device);
  // conv2d_grad_weight's implicit GEMM (kernels/conv.cpp): gemm.comp where its tiles suit.
  if (!kernels::simt_gemm_suits({.m = product.m, .n = product.n, .k = k, .entries = entries},
                                device))
    return std::nullopt;
  return kernels::simt_gemm_launch(product.m, product.n, k, k, entries, true, device);
}

double launch_cost(const kernels::SimtGemmLaunch& launch, const Product& product,
                   int64_t compute_units) {
  const double slice_cost =
      launch.four_by_four && !product.generated_loads ? kFourByFourSliceCost : 1.0;
  const double workgroup_cost =
      product.generated_loads ? kGeneratedLoadsWorkgroupCost : kWorkgroupCost;
  return static_cast<double>(ceil_div(launch.workgroups, compute_units)) *
         (static_cast<double>(launch.chain) * slice_cost + workgroup_cost);
}

bool runs_on_simt_gemm(const Product& product, const kernels::DeviceTraits& device) {
  if (kernels::use_cpu_kernels(device)) return false;
  if (!kernels::use_coop_gemm(device)) return true;
  if (product.half_operands) return false;
  // Matmuls this small stay on gemm.comp (kernels/gemm.cpp); convolutions all take the coop GEMM.
  return !product.generated_loads &&
         !kernels::coop_gemm_suits(product.m * product.n * product.k * product.entries, product.k,
                                   device);
}

// The number of K slices, 1 when the product stays whole.
int64_t split_count(const Product& product, const kernels::DeviceTraits& device) {
  if (product.k < kMinKToSplit) return 1;
  // MEGANEURA_SPLIT_K_SLICES forces the count (a tuning hook for sweeps).
  if (const std::optional<int64_t> forced = device.switches.split_k_slices) {
    const int64_t wanted = std::min(*forced, ceil_div(product.k, kKSliceAlignment));
    return wanted < 2 ? 1 : nonempty_slices(product.k, wanted);
  }
  const std::optional<kernels::SimtGemmLaunch> whole =
      runs_on_simt_gemm(product, device) ? simt_launch(product, 1, device) : std::nullopt;
  if (!whole) {
    if (!kernels::use_coop_gemm(device))
      return coarse_split_count(product, device.compute_units, kTilesPerUnit, kMinKPerCoarseSlice);
    const int64_t splits =
        coarse_split_count(product, device.compute_units, kCoopTilesPerUnit, kMinKPerCoopSlice);
    return splits > 1 ? splits
                      : coarse_split_count(product, device.compute_units, kTilesPerUnit,
                                           kMinKPerCoopSlice);
  }
  int64_t best_splits = 1;
  double best_cost = launch_cost(*whole, product, device.compute_units);
  // Slice counts from few to many; a count that only ties keeps the fewer slices, which write
  // and sum fewer partial results.
  const int64_t most_slices = std::min(kMostSlices, product.k / kMinKPerSlice);
  for (int64_t wanted = 2; wanted <= most_slices; ++wanted) {
    const int64_t splits = nonempty_slices(product.k, wanted);
    if (splits != wanted) continue;  // aligned slices reach this count from another `wanted`
    const std::optional<kernels::SimtGemmLaunch> launch = simt_launch(product, splits, device);
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

// The geometry of a conv2d_grad_weight node that runs on the direct kernel, which plans its
// own splits.
std::optional<ConvGeometry> direct_weight_gradient(const Graph& graph, const Node& node,
                                                   const kernels::DeviceTraits& device) {
  if (node.op != op::conv2d_grad_weight || node.attrs.has("k_splits")) return std::nullopt;
  const ConvGeometry g = conv_geometry(node.attrs, graph.type(node.inputs[0]).shape,
                                       node.attrs.get_ints("weight_shape"));
  if (!kernels::direct_weight_gradient_suits(g, device)) return std::nullopt;
  return g;
}

}  // namespace

Graph split_k(const Graph& graph, const kernels::DeviceTraits& device,
              std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&device](Graph& target, ValueId, Node node) {
        int64_t splits = 1;
        if (const std::optional<ConvGeometry> direct =
                direct_weight_gradient(target, node, device)) {
          // The count must also leave every aligned slice of K non-empty, as the node's checks
          // ask of every k_splits, though the kernel divides K into whole chunks of rows instead.
          const int64_t k = direct->batch * direct->out_height * direct->out_width;
          const int64_t wanted = device.switches.split_k_slices.value_or(
              kernels::direct_weight_gradient_splits(*direct, device));
          splits = nonempty_slices(k, wanted);
        } else if (const std::optional<Product> product = product_of(target, node, device)) {
          splits = split_count(*product, device);
        }
        if (splits < 2) return target.add_typed(std::move(node));
        // Partial results are f32; an f16 product's are summed and rounded in one launch.
        Attrs attrs;
        for (const auto& [name, value] : node.attrs.items())
          if (name != "f16_result") attrs.set(name, value);
        attrs.set("k_splits", splits);
        const ValueId partials = target.add(node.op, node.inputs, std::move(attrs));
        return node.type.dtype == DType::f16 ? target.add(op::sum_to_f16, {partials})
                                             : sum_leading_axis(target, partials);
      },
      remap);
}

}  // namespace mg::passes
