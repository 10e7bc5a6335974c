// The f16 ops that passes write after differentiation, so they take no gradient: round_to_f16
// (an f32 tensor rounded to f16, stored as f16), round_to_bf16 (the same in bfloat16, the
// workgroup GEMM's operands in bf16 precision, and large activations there), widen_f16 (an f16
// tensor as f32, exactly), widen_bf16 (the same of a bfloat16 tensor),
// half_matmul (the product of two matrices of which at least one is f16, or both bf16,
// accumulated in f32 and returned in f32, or in f16 with f16_result, bf16 with bf16_result) and
// sum_to_f16 (f32 partial results summed over their leading axis and rounded to f16).
// passes/workgroup_gemm.cpp, passes/half_storage.cpp, passes/half_activations.cpp and
// passes/split_k.cpp write them.
#include "ops/half_gemm.hpp"

#include <algorithm>

#include "ir/op_names.hpp"
#include "ops/op_checks.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

std::vector<ValueId> no_gradient(Graph& graph, ValueId self, ValueId) {
  reject_pass_written_gradient(graph, self, "a compile pass", "the graph the pass was given");
}

// round_to_f16 and round_to_bf16: f32 values rounded into a tensor of `rounded`.
template <DType rounded>
TensorType infer_rounding(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  const TensorType& x = graph.type(node.inputs[0]);
  if (x.dtype != DType::f32) op_error(graph, node, "rounds f32 values");
  return TensorType{rounded, x.shape};
}

// widen_f16 and widen_bf16: the values of a tensor of `widened` as f32.
template <DType widened>
TensorType infer_widening(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  const TensorType& x = graph.type(node.inputs[0]);
  if (x.dtype != widened)
    op_error(graph, node, "widens " + std::string(dtype_name(widened)) + " values");
  return TensorType{DType::f32, x.shape};
}

// half_matmul(a, b) {transpose_a, transpose_b, f16_result, bf16_result, k_splits}: a [..., M, K]
// and b [..., K, N] in f16, or both in bf16 (the GEMMs' operands in bf16 precision), or one of
// them in f32 (which the GEMM rounds to the other's format as it loads it: half products,
// passes/half_products.cpp), each stored transposed where its flag says, leading batch axes
// broadcast as matmul's -> [..., M, N] in f32, or rounded to f16 with f16_result (f16 operands)
// or to bf16 with bf16_result (bf16 operands); with k_splits = S (only from the split-K pass)
// the f32 partial results [S, ..., M, N] as matmul's (ops/k_split.hpp).
TensorType infer_half_matmul(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 2);
  const TensorType& a = graph.type(node.inputs[0]);
  const TensorType& b = graph.type(node.inputs[1]);
  // Operands of one 16-bit format, or one of them f32.
  const auto operands_in = [&](DType format) {
    const auto fits = [format](DType dtype) { return dtype == format || dtype == DType::f32; };
    return fits(a.dtype) && fits(b.dtype) && (a.dtype == format || b.dtype == format);
  };
  const bool bfloat16 = a.dtype == DType::bf16 && b.dtype == DType::bf16;
  const bool reads_bf16 = operands_in(DType::bf16);
  if (!operands_in(DType::f16) && !reads_bf16)
    op_error(graph, node,
             "multiplies f16 operands or bf16 ones (round_to_f16, round_to_bf16 give them), or "
             "one of them beside an f32 operand");
  if (reads_bf16 && flag_attr(graph, node, "f16_result"))
    op_error(graph, node, "multiplies bf16 operands into an f32 or bf16 result (no f16_result)");
  const bool bf16_result = flag_attr(graph, node, "bf16_result");
  if (bf16_result && !bfloat16)
    op_error(graph, node, "rounds its result to bf16 (bf16_result) only for bf16 operands");
  if (bf16_result && node.attrs.has("k_splits"))
    op_error(graph, node, "partial results (k_splits) are f32; bf16_result rounds whole products");
  if (a.rank() < 2 || b.rank() < 2) op_error(graph, node, "operands need rank >= 2");
  const bool transpose_a = flag_attr(graph, node, "transpose_a");
  const bool transpose_b = flag_attr(graph, node, "transpose_b");
  const size_t a_rows = a.rank() - 2, b_rows = b.rank() - 2;
  const int64_t m = a.shape[a_rows + (transpose_a ? 1 : 0)];
  const int64_t k = a.shape[a_rows + (transpose_a ? 0 : 1)];
  const int64_t k_b = b.shape[b_rows + (transpose_b ? 1 : 0)];
  const int64_t n = b.shape[b_rows + (transpose_b ? 0 : 1)];
  if (k != k_b)
    op_error(graph, node,
             "inner dimensions differ (" + std::to_string(k) + " vs " + std::to_string(k_b) + ")");
  const bool f16_result = flag_attr(graph, node, "f16_result");
  if (f16_result && node.attrs.has("k_splits"))
    op_error(graph, node, "partial results (k_splits) are f32; f16_result rounds whole products");
  Shape shape = broadcast_or_error(graph, node, Shape(a.shape.begin(), a.shape.end() - 2),
                                   Shape(b.shape.begin(), b.shape.end() - 2));
  shape.push_back(m);
  shape.push_back(n);
  return TensorType{f16_result    ? DType::f16
                    : bf16_result ? DType::bf16
                                  : DType::f32,
                    split_k_shape(graph, node, k, std::move(shape))};
}

// sum_to_f16(x): x [S, d...] in f32 -> the sum over S, rounded to f16, [d...]: the f16 result
// of a product split over K (passes/split_k.cpp), its partials summed and rounded in one launch.
TensorType infer_sum_to_f16(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  const TensorType& x = graph.type(node.inputs[0]);
  if (x.dtype != DType::f32) op_error(graph, node, "sums f32 partial results");
  if (x.rank() < 2) op_error(graph, node, "sums over the leading axis of a tensor of rank >= 2");
  return TensorType{DType::f16, Shape(x.shape.begin() + 1, x.shape.end())};
}

// The reference of an op that rounds each value of its input with `round`.
template <double (*round)(double)>
HostTensor rounded_reference(const Node& node, const std::vector<const HostTensor*>& inputs) {
  HostTensor result(node.type.shape);
  for (size_t i = 0; i < result.data.size(); ++i) result.data[i] = round(inputs[0]->data[i]);
  return result;
}

}  // namespace

bool is_pass_written_f16_op(std::string_view op) {
  return op == op::round_to_f16 || op == op::widen_f16 || op == op::round_to_bf16 ||
         op == op::widen_bf16 || op == op::half_matmul || op == op::sum_to_f16;
}

std::string_view rounding_op(DType format) {
  return format == DType::bf16 ? op::round_to_bf16 : op::round_to_f16;
}

std::string_view widening_op(DType format) {
  return format == DType::bf16 ? op::widen_bf16 : op::widen_f16;
}

void register_half_gemm_ops(std::vector<OpDef>& registry) {
  registry.push_back(OpDef{
      .name = op::round_to_f16,
      .infer = infer_rounding<DType::f16>,
      .reference = rounded_reference<round_to_f16>,
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = op::round_to_bf16,
      .infer = infer_rounding<DType::bf16>,
      .reference = rounded_reference<round_to_bf16>,
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = op::widen_f16,
      .infer = infer_widening<DType::f16>,
      .reference = [](const Node&,
                      const std::vector<const HostTensor*>& inputs) { return *inputs[0]; },
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = op::widen_bf16,
      .infer = infer_widening<DType::bf16>,
      .reference = [](const Node&,
                      const std::vector<const HostTensor*>& inputs) { return *inputs[0]; },
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = op::half_matmul,
      .infer = infer_half_matmul,
      // The product of the f16 values themselves, which is matmul's.
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& inputs) {
            return op_def(op::matmul).reference(node, inputs);
          },
      .vjp = no_gradient,
  });
  registry.push_back(OpDef{
      .name = op::sum_to_f16,
      .infer = infer_sum_to_f16,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& inputs) {
            HostTensor result(node.type.shape);
            const size_t count = result.data.size();
            const size_t slices = inputs[0]->data.size() / std::max<size_t>(count, 1);
            for (size_t i = 0; i < count; ++i) {
              double total = 0;
              for (size_t s = 0; s < slices; ++s) total += inputs[0]->data[s * count + i];
              result.data[i] = round_to_f16(total);
            }
            return result;
          },
      .vjp = no_gradient,
  });
}

}  // namespace mg
