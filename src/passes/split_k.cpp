// Split-K: a product whose output is a handful of GEMM tiles but whose K is long (the data
// gradients of a transformer at short sequence length, e.g. 128 x 576 x 49152; convolution
// weight gradients, which sum over batch * OH * OW) runs on a few workgroups of a GPU with many
// compute units, each walking all of K. The pass gives such a node k_splits = S: one GEMM
// dispatch whose workgroups also cover S slices of K and write S partial results [S, ...], then
// one `sum` over the leading axis (a column reduction, one thread per output element). The
// target decides S for the kernel that will run the product (target::Target::gemm_k_splits);
// convolution weight gradients on the direct kernel take that kernel's own splits.
#include <algorithm>
#include <optional>
#include <string>

#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

std::optional<target::GemmProduct> product_of(const Graph& graph, const Node& node,
                                              const target::Target& target) {
  if (node.attrs.has("k_splits")) return std::nullopt;
  // A product of f16 operands splits where the subgroup-scope GEMM runs it (the workgroup GEMM
  // takes products whole).
  const bool half = node.op == op::half_matmul;
  if (half && target.workgroup_gemm_takes_f16_product(graph, node)) return std::nullopt;
  if (node.op == op::matmul || half) {
    const Shape& a_shape = graph.type(node.inputs[0]).shape;
    const Shape& out_shape = node.type.shape;
    const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
    return target::GemmProduct{
        .m = out_shape[out_shape.size() - 2],
        .n = out_shape[out_shape.size() - 1],
        .k = a_shape[a_shape.size() - (transpose_a ? 2 : 1)],
        .entries = element_count(Shape(out_shape.begin(), out_shape.end() - 2)),
        .half_operands = half,
        .winograd_weight_gradient = graph.node(node.inputs[0]).op == op::winograd_grad_tiles,
        .b_transposed = node.attrs.get_int("transpose_b", 0) != 0};
  }
  if (node.op == op::conv2d_grad_weight) {
    // Per group: M = O / groups, N = C / groups * KH * KW, K = N * OH * OW.
    const Shape& grad_out = graph.type(node.inputs[1]).shape;
    const Shape& weight = node.type.shape;
    const int64_t groups = node.attrs.get_int("groups", 1);
    return target::GemmProduct{.m = weight[0] / groups,
                               .n = weight[1] * weight[2] * weight[3],
                               .k = grad_out[0] * grad_out[2] * grad_out[3],
                               .entries = groups,
                               .generated_loads = true};
  }
  return std::nullopt;
}

// The number of K slices of `product`, 1 when it stays whole.
int64_t split_count(const target::GemmProduct& product, const target::Target& target) {
  if (product.k < kMinKToSplit) return 1;
  // MEGANEURA_SPLIT_K_SLICES forces the count (a tuning hook for sweeps).
  if (const std::optional<int64_t> forced = target.switches().split_k_slices) {
    const int64_t wanted = std::min(*forced, ceil_div(product.k, kKSliceAlignment));
    return wanted < 2 ? 1 : nonempty_slices(product.k, wanted);
  }
  return target.gemm_k_splits(product);
}

// The geometry of a conv2d_grad_weight node that runs on the direct kernel, which plans its
// own splits.
std::optional<ConvGeometry> direct_weight_gradient(const Graph& graph, const Node& node,
                                                   const target::Target& target) {
  if (node.op != op::conv2d_grad_weight || node.attrs.has("k_splits")) return std::nullopt;
  const ConvGeometry g = conv_geometry(node.attrs, graph.type(node.inputs[0]).shape,
                                       node.attrs.get_ints("weight_shape"));
  if (!target.direct_weight_gradient_suits(g)) return std::nullopt;
  return g;
}

}  // namespace

Graph split_k(Graph graph, const target::Target& target, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&target](Graph& rebuilt, ValueId, Node node) {
        int64_t splits = 1;
        if (const std::optional<ConvGeometry> direct =
                direct_weight_gradient(rebuilt, node, target)) {
          // The count must also leave every aligned slice of K non-empty, as the node's checks
          // ask of every k_splits, though the kernel divides K into whole chunks of rows instead.
          const int64_t k = direct->batch * direct->out_height * direct->out_width;
          const int64_t wanted = target.switches().split_k_slices.value_or(
              target.direct_weight_gradient_splits(*direct));
          splits = nonempty_slices(k, wanted);
        } else if (const std::optional<target::GemmProduct> product =
                       product_of(rebuilt, node, target)) {
          splits = split_count(*product, target);
        }
        if (splits < 2) return rebuilt.add_typed(std::move(node));
        // Partial results are f32; an f16 product's are summed and rounded in one launch.
        Attrs attrs;
        for (const auto& [name, value] : node.attrs.items())
          if (name != "f16_result") attrs.set(name, value);
        attrs.set("k_splits", splits);
        const ValueId partials = rebuilt.add(node.op, node.inputs, std::move(attrs));
        return node.type.dtype == DType::f16 ? rebuilt.add(op::sum_to_f16, {partials})
                                             : sum_leading_axis(rebuilt, partials);
      },
      remap);
}

}  // namespace mg::passes
