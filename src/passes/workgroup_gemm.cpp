// The workgroup GEMM pass (passes.hpp): a 2-D matmul that suits the workgroup GEMM on the
// target becomes round_to_f16 of each operand and a half_matmul of the two. The fast GEMMs round
// their operands to f16 anyway; here the rounding is a launch of its own over each operand,
// because the workgroup kernel loads its f16 operands straight from memory.
#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {

Graph workgroup_gemm(const Graph& graph, const target::Target& device,
                     std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&device](Graph& target, ValueId, Node node) {
        if (node.op != op::matmul || node.attrs.has("k_splits") || node.type.rank() != 2 ||
            node.type.dtype != DType::f32)
          return target.add_typed(std::move(node));
        const TensorType& a = target.type(node.inputs[0]);
        const TensorType& b = target.type(node.inputs[1]);
        if (a.rank() != 2 || b.rank() != 2) return target.add_typed(std::move(node));
        const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
        const int64_t k = a.shape[transpose_a ? 0 : 1];
        if (!device.workgroup_gemm_suits(node.type.shape[0], node.type.shape[1], k,
                                         target::OperandsIn::f32))
          return target.add_typed(std::move(node));
        const ValueId a_half = target.add(op::round_to_f16, {node.inputs[0]});
        const ValueId b_half = target.add(op::round_to_f16, {node.inputs[1]});
        return target.add(op::half_matmul, {a_half, b_half}, node.attrs);
      },
      remap);
}

}  // namespace mg::passes
