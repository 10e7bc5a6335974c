// The workgroup GEMM pass (passes.hpp): a 2-D matmul that suits the workgroup GEMM on the
// target becomes round_to_f16 of each operand and a half_matmul of the two. The fast GEMMs round
// their operands to f16 anyway; here the rounding is a launch of its own over each operand,
// because the workgroup kernel loads its f16 operands straight from memory.
#include <algorithm>

#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Whether `node`, its inputs values of `graph`, is a 2-D f32 matmul that suits the workgroup GEMM
// on `device`.
bool takes_workgroup_gemm(const Graph& graph, const Node& node, const target::Target& device) {
  if (node.op != op::matmul || node.attrs.has("k_splits") || node.type.rank() != 2 ||
      node.type.dtype != DType::f32)
    return false;
  const TensorType& a = graph.type(node.inputs[0]);
  const TensorType& b = graph.type(node.inputs[1]);
  if (a.rank() != 2 || b.rank() != 2) return false;
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const int64_t k = a.shape[transpose_a ? 0 : 1];
  return device.workgroup_gemm_suits(node.type.shape[0], node.type.shape[1], k,
                                     target::OperandsIn::f32);
}

}  // namespace

Graph workgroup_gemm(Graph graph, const target::Target& device, std::vector<ValueId>* remap) {
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(),
                   [&](const Node& node) { return takes_workgroup_gemm(graph, node, device); }))
    return unchanged(std::move(graph), remap);
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&device](Graph& target, ValueId, Node node) {
        if (!takes_workgroup_gemm(target, node, device)) return target.add_typed(std::move(node));
        const ValueId a_half = target.add(op::round_to_f16, {node.inputs[0]});
        const ValueId b_half = target.add(op::round_to_f16, {node.inputs[1]});
        return target.add(op::half_matmul, {a_half, b_half}, node.attrs);
      },
      remap);
}

}  // namespace mg::passes
