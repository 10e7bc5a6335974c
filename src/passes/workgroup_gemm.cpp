// The workgroup GEMM pass (passes.hpp): a 2-D matmul that suits the workgroup GEMM on the
// target becomes round_to_f16 of each operand (round_to_bf16 in bf16 precision) and a
// half_matmul of the two. The fast GEMMs round their operands to f16 (bfloat16) anyway; here the
// rounding is a launch of its own over each operand, because the workgroup kernel loads its f16
// operands straight from memory. Winograd's products need no such launch: their operands'
// transforms store f16 points (bfloat16 in bf16 precision) themselves.
#include <algorithm>

#include "ir/op_names.hpp"
#include "ops/half_gemm.hpp"
#include "ops/winograd.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"
#include "passes/value_readers.hpp"

namespace mg::passes {
namespace {

// Whether `node`, its inputs values of `graph`, is a 2-D f32 matmul that suits the workgroup GEMM
// on `device`.
bool takes_workgroup_gemm(const Graph& graph, const Node& node, const target::Target& device) {
  const std::optional<WholeProduct> product = whole_f32_product(graph, node);
  return product &&
         device.workgroup_gemm_suits(product->m, product->n, product->k, target::OperandsIn::f32);
}

bool is_winograd_points(const Node& node) {
  return (node.op == op::winograd_tiles || node.op == op::winograd_grad_tiles ||
          node.op == op::winograd_filter) &&
         node.type.dtype == DType::f32;
}

// Whether Winograd's points are stored in 16 bits on `device`: where its products round their
// operands (cooperative matrices with f16 operands, or bfloat16 ones in bf16 precision), so that
// the points' rounding changes no product, and the products then read half the bytes (on the
// workgroup GEMM where a block suits them, else the subgroup GEMM). MEGANEURA_WINOGRAD_F16=0
// keeps them f32.
bool winograd_points_in_half(const target::Target& device) {
  return device.cooperative_matrices() && device.traits().f16_tensors &&
         device.switches().winograd_f16.value_or(true);
}

// The nodes of `graph` that the 16-bit points rewrite: the matmuls of two Winograd transforms, and
// the transforms that only such matmuls read (in every graph the im2col pass writes, all of them).
std::vector<bool> half_winograd_nodes(const Graph& graph) {
  const size_t size = graph.size();
  const ValueReaders values(graph);
  std::vector<bool> chosen(size, false);
  for (size_t i = 0; i < size; ++i) {
    const Node& node = graph.nodes()[i];
    const ValueId id = static_cast<ValueId>(i);
    // A program's results and updates keep their dtype.
    if (is_winograd_points(node))
      chosen[i] = !values.readers(id).empty() && !values.kept(id);
    else if (node.op == op::matmul && !node.attrs.has("k_splits"))
      chosen[i] = std::all_of(node.inputs.begin(), node.inputs.end(),
                              [&](ValueId input) { return is_winograd_points(graph.node(input)); });
  }
  // A product keeps f16 operands only if both are; a transform stores f16 only if every reader
  // is such a product. Dropping one may drop others, until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < size; ++i) {
      if (!chosen[i]) continue;
      const Node& node = graph.nodes()[i];
      const std::vector<ValueId>& readers = values.readers(static_cast<ValueId>(i));
      const bool keeps =
          is_winograd_points(node)
              ? std::all_of(readers.begin(), readers.end(),
                            [&](ValueId reader) { return static_cast<bool>(chosen[reader]); })
              : std::all_of(node.inputs.begin(), node.inputs.end(),
                            [&](ValueId input) { return static_cast<bool>(chosen[input]); });
      if (!keeps) {
        chosen[i] = false;
        changed = true;
      }
    }
  }
  return chosen;
}

}  // namespace

Graph workgroup_gemm(Graph graph, const target::Target& device, std::vector<ValueId>* remap) {
  const std::vector<bool> half_winograd = winograd_points_in_half(device)
                                              ? half_winograd_nodes(graph)
                                              : std::vector<bool>(graph.size(), false);
  const bool any_winograd =
      std::find(half_winograd.begin(), half_winograd.end(), true) != half_winograd.end();
  if (!any_winograd &&
      std::none_of(graph.nodes().begin(), graph.nodes().end(),
                   [&](const Node& node) { return takes_workgroup_gemm(graph, node, device); }))
    return unchanged(std::move(graph), remap);
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&device, &half_winograd](Graph& target, ValueId old_id, Node node) {
        if (half_winograd[old_id]) {
          if (node.op == op::matmul) return target.add(op::half_matmul, node.inputs, node.attrs);
          node.attrs.set(device.traits().bf16_operands ? winograd::kBf16ResultAttribute
                                                       : winograd::kF16ResultAttribute,
                         int64_t{1});
          return target.add(node.op, node.inputs, node.attrs);
        }
        if (!takes_workgroup_gemm(target, node, device)) return target.add_typed(std::move(node));
        // bf16 precision rounds to bfloat16, keeping f32's range.
        const std::string_view rounding =
            rounding_op(device.traits().bf16_operands ? DType::bf16 : DType::f16);
        const ValueId a_half = target.add(rounding, {node.inputs[0]});
        const ValueId b_half = target.add(rounding, {node.inputs[1]});
        return target.add(op::half_matmul, {a_half, b_half}, node.attrs);
      },
      remap);
}

}  // namespace mg::passes
