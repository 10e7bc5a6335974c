// Matrix products with broadcast batch dimensions, and the linear layer built on them.
#include <algorithm>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/k_split.hpp"
#include "ops/op_checks.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

// The last two extents of an operand after its optional transpose: {rows, columns}.
std::pair<int64_t, int64_t> matrix_extents(const Shape& shape, bool transposed) {
  const int64_t rows = shape[shape.size() - 2];
  const int64_t columns = shape[shape.size() - 1];
  return transposed ? std::pair{columns, rows} : std::pair{rows, columns};
}

Shape batch_of(const Shape& shape) {
  return Shape(shape.begin(), shape.end() - 2);
}

// matmul(a, b) {transpose_a: 0|1, transpose_b: 0|1, k_splits}: a [..., M, K] x b [..., K, N]
// -> [..., M, N] after the optional swap of each operand's last two axes; rank >= 2, batch axes
// broadcast (NumPy), one floating dtype. With k_splits = S (only from the split-K pass) the
// result is [S, ..., M, N], partial s summing only K slice s (ops/k_split.hpp).
TensorType infer_matmul(const Graph& graph, const Node& node) {
  if (node.inputs.size() != 2) op_error(graph, node, "takes two inputs");
  const TensorType& a = graph.type(node.inputs[0]);
  const TensorType& b = graph.type(node.inputs[1]);
  const bool transpose_a = flag_attr(graph, node, "transpose_a");
  const bool transpose_b = flag_attr(graph, node, "transpose_b");
  if (a.rank() < 2 || b.rank() < 2) op_error(graph, node, "operands need rank >= 2");
  if (a.dtype != b.dtype) op_error(graph, node, "operands have different dtypes");
  if (!is_floating(a.dtype)) op_error(graph, node, "needs floating-point operands");
  const auto [m, k] = matrix_extents(a.shape, transpose_a);
  const auto [k_b, n] = matrix_extents(b.shape, transpose_b);
  if (k != k_b) {
    op_error(graph, node,
             "inner dimensions differ (" + std::to_string(k) + " vs " + std::to_string(k_b) + ")");
  }
  Shape shape = broadcast_or_error(graph, node, batch_of(a.shape), batch_of(b.shape));
  shape.push_back(m);
  shape.push_back(n);
  return {a.dtype, split_k_shape(graph, node, k, std::move(shape))};
}

HostTensor reference_matmul(const Node& node, const std::vector<const HostTensor*>& in) {
  const HostTensor& a = *in[0];
  const HostTensor& b = *in[1];
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const bool transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  const auto [m, k_extent] = matrix_extents(a.shape, transpose_a);
  const int64_t n = matrix_extents(b.shape, transpose_b).second;
  const bool split = node.attrs.has("k_splits");
  const int64_t splits = node.attrs.get_int("k_splits", 1);
  const int64_t slice = split ? k_slice_length(k_extent, splits) : k_extent;
  HostTensor out(node.type.shape);
  const Shape batch = batch_of(Shape(out.shape.begin() + (split ? 1 : 0), out.shape.end()));
  const int64_t batches = element_count(batch);
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t k_begin = s * slice, k_end = std::min(k_extent, k_begin + slice);
    for (int64_t batch_index = 0; batch_index < batches; ++batch_index) {
      const int64_t a_base =
          broadcast_source_index(batch_of(a.shape), batch, batch_index) * m * k_extent;
      const int64_t b_base =
          broadcast_source_index(batch_of(b.shape), batch, batch_index) * k_extent * n;
      double* result = out.data.data() + (s * batches + batch_index) * m * n;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double total = 0;
          for (int64_t k = k_begin; k < k_end; ++k) {
            const double a_ik = a.data[a_base + (transpose_a ? k * m + i : i * k_extent + k)];
            const double b_kj = b.data[b_base + (transpose_b ? j * k_extent + k : k * n + j)];
            total += a_ik * b_kj;
          }
          result[i * n + j] = total;
        }
      }
    }
  }
  return out;
}

// With A' = op(A), B' = op(B) and C = A'B': dA' = G B'^T and dB' = A'^T G; a transposed
// operand takes the transpose of those, which folds into the flags of one product each.
std::vector<ValueId> matmul_vjp(Graph& graph, ValueId self, ValueId grad) {
  reject_split_gradient(graph, self);
  const Node node = graph.node(self);
  const Tensor a(&graph, node.inputs[0]);
  const Tensor b(&graph, node.inputs[1]);
  const Tensor g(&graph, grad);
  const Shape a_shape = a.shape();  // copies: appending nodes may move the graph's own
  const Shape b_shape = b.shape();
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const bool transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  const Tensor grad_a =
      transpose_a ? matmul(b, g, transpose_b, true) : matmul(g, b, false, !transpose_b);
  const Tensor grad_b =
      transpose_b ? matmul(g, a, true, transpose_a) : matmul(a, g, !transpose_a, false);
  return {reduce_to_shape(graph, grad_a.id(), a_shape),
          reduce_to_shape(graph, grad_b.id(), b_shape)};
}

}  // namespace

void register_matmul_ops(std::vector<OpDef>& registry) {
  registry.push_back(OpDef{
      .name = op::matmul,
      .infer = infer_matmul,
      .reference = reference_matmul,
      .vjp = matmul_vjp,
  });
}

Tensor matmul(Tensor a, Tensor b, bool transpose_a, bool transpose_b) {
  return apply(op::matmul, {a, b},
               {{"transpose_a", int64_t{transpose_a}}, {"transpose_b", int64_t{transpose_b}}});
}

// Leading axes of x fold into the rows of one 2-D product, so that the weight gradient is a
// single GEMM rather than a batch of them summed afterwards.
Tensor linear(Tensor x, Tensor weight, std::optional<Tensor> bias) {
  std::vector<Tensor> operands{x, weight};
  if (bias) operands.push_back(*bias);
  if (x.rank() < 1 || weight.rank() != 2 || x.dim(-1) != weight.dim(1)) {
    builder_error("linear", operands, "needs x [..., in] and weight [out, in]");
  }
  const int64_t out_features = weight.dim(0);
  if (bias && !(bias->shape() == Shape{out_features})) {
    builder_error("linear", operands,
                  "bias must have shape [" + std::to_string(out_features) + "]");
  }
  const Tensor rows = x.rank() == 2 ? x : reshape(x, {-1, x.dim(-1)});
  Tensor result = matmul(rows, weight, false, true);
  if (bias) result = result + *bias;
  if (x.rank() == 2) return result;
  Shape shape = x.shape();
  shape.back() = out_features;
  return reshape(result, shape);
}

}  // namespace mg
