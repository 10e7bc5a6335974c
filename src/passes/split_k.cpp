// Split-K: a product whose output is a handful of GEMM tiles but whose K is long (the data
// gradients of a transformer at short sequence length, e.g. 128 x 576 x 49152; convolution
// weight gradients, which sum over batch * OH * OW) runs on a few workgroups of a GPU with 132
// compute units, each walking all of K. The pass gives such a node k_splits = S: one GEMM
// dispatch whose workgroups also cover S slices of K and write S partial results [S, ...], then
// one `sum` over the leading axis (a column reduction, one thread per output element). The extra
// traffic is small next to the product, since every slice keeps at least kMinKPerSlice
// multiply-adds per output.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "ops/k_split.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Workgroups wanted in flight: two 128 x 128 GEMM tiles on each compute unit (264 on an H200).
// The slice count rounds down, so the GEMM fills at most two such waves. This also bounds the
// partial results: S * tiles <= 2 * units tiles of 128 x 128 f32 values (16.5 MiB on an H200).
constexpr int64_t kTilesPerUnit = 2;
constexpr int64_t kOutputTile = 128;
// 128 rather than 256: SmolLM's 128 x 576 x 576 product went from 25.6 to 20.7 us and its
// 128 x 1536 x 576 one from 33.0 to 24.9 us on the H200 (64 was faster for the first and its
// data gradient, slower for the other four; docs/BENCHMARKS.md, the sweeps beside run 11).
constexpr int64_t kMinKPerSlice = 128;
// Products with a shorter K stay whole: a split costs a reduction dispatch and the product's
// epilogue fusion, which a 64 x 256 x 256 layer of a small MLP does not win back.
constexpr int64_t kMinKToSplit = 512;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A product the pass may split: the GEMM it runs, C[M, N] for each of `entries` problems
// summed over K.
struct Product {
  int64_t m = 0, n = 0, k = 0, entries = 1;
};

std::optional<Product> product_of(const Graph& graph, const Node& node) {
  if (node.attrs.has("k_splits")) return std::nullopt;
  if (node.op == "matmul") {
    const Shape& a_shape = graph.type(node.inputs[0]).shape;
    const Shape& out_shape = node.type.shape;
    const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
    return Product{.m = out_shape[out_shape.size() - 2],
                   .n = out_shape[out_shape.size() - 1],
                   .k = a_shape[a_shape.size() - (transpose_a ? 2 : 1)],
                   .entries = element_count(Shape(out_shape.begin(), out_shape.end() - 2))};
  }
  if (node.op == "conv2d_grad_weight") {
    // Per group: M = O / groups, N = C / groups * KH * KW, K = N * OH * OW (kernels/conv.cpp).
    const Shape& grad_out = graph.type(node.inputs[1]).shape;
    const Shape& weight = node.type.shape;
    const int64_t groups = node.attrs.get_int("groups", 1);
    return Product{.m = weight[0] / groups,
                   .n = weight[1] * weight[2] * weight[3],
                   .k = grad_out[0] * grad_out[2] * grad_out[3],
                   .entries = groups};
  }
  return std::nullopt;
}

// MEGANEURA_SPLIT_K_SLICES=N: every product the pass may split (K >= kMinKToSplit) takes N
// slices, 1 for none (a tuning hook for sweeps); 0 where unset.
int64_t forced_slices() {
  const char* text = std::getenv("MEGANEURA_SPLIT_K_SLICES");
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 1024)
    throw Error("MEGANEURA_SPLIT_K_SLICES='" + std::string(text) +
                "': expected a whole number of K slices from 1 to 1024 (1: no split); unset it "
                "for the built-in choice");
  return value;
}

// The number of K slices, 1 when the product stays whole.
int64_t split_count(const Product& product, int64_t compute_units) {
  if (product.k < kMinKToSplit) return 1;
  if (const int64_t forced = forced_slices(); forced > 0) {
    const int64_t wanted = std::min(forced, ceil_div(product.k, 16));
    return wanted < 2 ? 1 : ceil_div(product.k, k_slice_length(product.k, wanted));
  }
  const int64_t tiles = std::max<int64_t>(
      1, product.entries * ceil_div(product.m, kOutputTile) * ceil_div(product.n, kOutputTile));
  const int64_t wanted = std::min(kTilesPerUnit * compute_units / tiles, product.k / kMinKPerSlice);
  // Two slices of a product that already fills most compute units cost their sum more than
  // they gain: ResNet's 3x3 convolution as a matmul (100 tiles) took 52 us whole and 50 + 7 us
  // split in two on the H200 (docs/BENCHMARKS.md run 15).
  if (wanted < 3) return 1;
  // Aligned slices may cover K in fewer than `wanted`; count those that are not empty.
  return ceil_div(product.k, k_slice_length(product.k, wanted));
}

}  // namespace

Graph split_k(const Graph& graph, int64_t compute_units, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [compute_units](Graph& target, ValueId, Node node) {
        const std::optional<Product> product = product_of(target, node);
        if (!product) return target.add_typed(std::move(node));
        const int64_t splits = split_count(*product, compute_units);
        if (splits < 2) return target.add_typed(std::move(node));
        Attrs attrs = node.attrs;
        attrs.set("k_splits", splits);
        const ValueId partials = target.add(node.op, node.inputs, std::move(attrs));
        return sum_leading_axis(target, partials);
      },
      remap);
}

}  // namespace mg::passes
