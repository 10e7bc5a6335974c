// The operands of a product on workgroup-scope cooperative matrices (passes/workgroup_gemm.cpp):
// round_to_f16 (a tensor rounded to f16, stored as f16) and half_matmul (the product of two f16
// matrices, accumulated and returned in f32). The pass writes them after differentiation, so
// they take no gradient.
#include <cmath>
#include <limits>

#include "ops/half_gemm.hpp"
#include "ops/op_checks.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

std::vector<ValueId> no_gradient(Graph& graph, ValueId self, ValueId) {
  throw Error(graph.node(self).op + " %" + std::to_string(self) +
              " is written by the workgroup GEMM pass after differentiation and has no "
              "gradient; differentiate the matmul it came from instead");
}

TensorType infer_round_to_f16(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  const TensorType& x = graph.type(node.inputs[0]);
  if (x.dtype != DType::f32) op_error(graph, node, "rounds f32 values");
  return TensorType{DType::f16, x.shape};
}

// half_matmul(a, b) {transpose_a, transpose_b}: a [M, K] and b [K, N] in f16 (each stored
// transposed where its flag says) -> [M, N] in f32.
TensorType infer_half_matmul(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 2);
  const TensorType& a = graph.type(node.inputs[0]);
  const TensorType& b = graph.type(node.inputs[1]);
  if (a.dtype != DType::f16 || b.dtype != DType::f16)
    op_error(graph, node, "multiplies f16 operands (round_to_f16 gives them)");
  if (a.rank() != 2 || b.rank() != 2) op_error(graph, node, "multiplies matrices (rank 2)");
  const bool transpose_a = flag_attr(graph, node, "transpose_a");
  const bool transpose_b = flag_attr(graph, node, "transpose_b");
  const int64_t m = a.shape[transpose_a ? 1 : 0], k = a.shape[transpose_a ? 0 : 1];
  const int64_t k_b = b.shape[transpose_b ? 1 : 0], n = b.shape[transpose_b ? 0 : 1];
  if (k != k_b)
    op_error(graph, node,
             "inner dimensions differ (" + std::to_string(k) + " vs " + std::to_string(k_b) + ")");
  return TensorType{DType::f32, {m, n}};
}

}  // namespace

double round_to_f16(double value) {
  if (!std::isfinite(value)) return value;
  const double magnitude = std::fabs(value);
  // Past the largest half (65504) by half its last step, f16 has only infinity.
  if (magnitude >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), value);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent - 1), 2^exponent)
  // 11 significant bits down to the smallest normal (2^-14), then the subnormals' fixed 2^-24.
  const double step = std::ldexp(1.0, std::max(exponent - 11, -24));
  return std::copysign(std::nearbyint(magnitude / step) * step, value);  // ties to even
}

void register_half_gemm_ops(std::vector<OpDef>& registry) {
  registry.push_back(OpDef{
      .name = "round_to_f16",
      .infer = infer_round_to_f16,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& inputs) {
            HostTensor result(node.type.shape);
            for (size_t i = 0; i < result.data.size(); ++i)
              result.data[i] = round_to_f16(inputs[0]->data[i]);
            return result;
          },
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = "half_matmul",
      .infer = infer_half_matmul,
      // The product of the f16 values themselves, which is matmul's.
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& inputs) {
            return op_def("matmul").reference(node, inputs);
          },
      .vjp = no_gradient,
  });
}

}  // namespace mg
