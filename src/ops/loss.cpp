// Losses. Cross-entropy is one fused op (a stable log-sum-exp per row, never a C x C
// intermediate) with its own backward op; MSE and BCE are composites of elementwise ops.
#include <algorithm>
#include <cmath>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/shape_rules.hpp"

namespace mg {
namespace {

// Both ops share the attributes {label_smoothing: double in [0, 1], ignore_index: int} and the
// first two inputs logits [N, C] (floating) and labels i32 [N].
void check_cross_entropy_inputs(const Graph& graph, const Node& node, size_t input_count) {
  if (node.inputs.size() != input_count) {
    op_error(
        graph, node,
        input_count == 2 ? "takes inputs (logits, labels)" : "takes inputs (logits, labels, grad)");
  }
  const TensorType& logits = graph.type(node.inputs[0]);
  const TensorType& labels = graph.type(node.inputs[1]);
  if (logits.rank() != 2 || !is_floating(logits.dtype)) {
    op_error(graph, node, "logits must be floating point with shape [N, C]");
  }
  if (labels.dtype != DType::i32 || !(labels.shape == Shape{logits.shape[0]})) {
    op_error(graph, node,
             "labels must be i32 with shape [" + std::to_string(logits.shape[0]) + "]");
  }
  const double smoothing = node.attrs.get_float("label_smoothing", 0.0);
  if (!(smoothing >= 0.0 && smoothing <= 1.0)) {
    op_error(graph, node, "label_smoothing must lie in [0, 1]");
  }
}

// A cross-entropy batch read row by row: labels checked, log-sum-exp per row, rows counted.
struct CrossEntropyRows {
  const HostTensor& logits;
  const HostTensor& labels;
  double smoothing;
  int64_t ignore_index;
  int64_t classes;

  CrossEntropyRows(const Node& node, const HostTensor& logits_in, const HostTensor& labels_in)
      : logits(logits_in),
        labels(labels_in),
        smoothing(node.attrs.get_float("label_smoothing", 0.0)),
        ignore_index(node.attrs.get_int("ignore_index", -100)),
        classes(logits_in.shape[1]) {}

  int64_t rows() const { return logits.shape[0]; }
  const double* row(int64_t n) const { return logits.data.data() + n * classes; }

  // The label of row n, or -1 when the row is ignored; throws for a label outside [0, C).
  int64_t label(std::string_view op, int64_t n) const {
    const double value = labels.data[n];
    if (value == static_cast<double>(ignore_index)) return -1;
    if (!(value >= 0 && value < static_cast<double>(classes))) {
      throw Error(std::string(op) + ": label " + std::to_string(static_cast<int64_t>(value)) +
                  " of row " + std::to_string(n) + " is outside [0, " + std::to_string(classes) +
                  ") and is not ignore_index " + std::to_string(ignore_index));
    }
    return static_cast<int64_t>(value);
  }

  double log_sum_exp(int64_t n) const {
    const double* x = row(n);
    const double peak = *std::max_element(x, x + classes);
    double total = 0;
    for (int64_t c = 0; c < classes; ++c) total += std::exp(x[c] - peak);
    return peak + std::log(total);
  }

  // Rows that count in the mean; an all-ignored batch divides by 1 and so gives 0 (PyTorch
  // gives NaN, which would poison a training run over a fully padded batch).
  double count(std::string_view op) const {
    int64_t counted = 0;
    for (int64_t n = 0; n < rows(); ++n) counted += label(op, n) >= 0 ? 1 : 0;
    return static_cast<double>(std::max<int64_t>(counted, 1));
  }
};

// cross_entropy(logits [N, C], labels i32 [N]) -> scalar: mean over rows whose label is not
// ignore_index of (1 - s) * (-log p[label]) + s * mean_c(-log p[c]), s = label_smoothing
// (PyTorch's semantics). With the attribute per_row = 1 (passes/split_reductions.cpp writes it,
// so that rows reduce in parallel) -> [N, 2]: each row's term and 1, or 0 and 0 for an ignored
// row; the mean is then their column sums' ratio. That form has no gradient: it exists only
// after autodiff.
OpDef cross_entropy_op() {
  return {
      .name = op::cross_entropy,
      .infer =
          [](const Graph& graph, const Node& node) {
            check_cross_entropy_inputs(graph, node, 2);
            const TensorType& logits = graph.type(node.inputs[0]);
            const int64_t per_row = node.attrs.get_int("per_row", 0);
            if (per_row != 0 && per_row != 1) op_error(graph, node, "per_row must be 0 or 1");
            if (per_row) return TensorType{logits.dtype, {logits.shape[0], 2}};
            return TensorType{logits.dtype, {}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const CrossEntropyRows rows(node, *in[0], *in[1]);
            const bool per_row = node.attrs.get_int("per_row", 0) != 0;
            HostTensor per_row_terms(per_row ? Shape{rows.rows(), 2} : Shape{});
            double total = 0;
            for (int64_t n = 0; n < rows.rows(); ++n) {
              const int64_t label = rows.label(op::cross_entropy, n);
              if (label < 0) continue;
              const double lse = rows.log_sum_exp(n);
              const double* x = rows.row(n);
              double mean_negative_log_p = 0;
              for (int64_t c = 0; c < rows.classes; ++c) mean_negative_log_p += lse - x[c];
              mean_negative_log_p /= static_cast<double>(rows.classes);
              const double term =
                  (1.0 - rows.smoothing) * (lse - x[label]) + rows.smoothing * mean_negative_log_p;
              total += term;
              if (per_row) {
                per_row_terms.data[n * 2] = term;
                per_row_terms.data[n * 2 + 1] = 1.0;
              }
            }
            if (per_row) return per_row_terms;
            return HostTensor({}, total / rows.count(op::cross_entropy));
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            if (node.attrs.get_int("per_row", 0) != 0)
              op_error(graph, node, "has no gradient in its per_row form (made after autodiff)");
            return std::vector<ValueId>{
                graph.add(op::cross_entropy_grad, {node.inputs[0], node.inputs[1], grad},
                          node.attrs),
                kNoValue};
          },
  };
}

// cross_entropy_grad(logits [N, C], labels i32 [N], grad scalar) {as cross_entropy} -> [N, C]:
// (softmax(row) - target distribution) * grad / count for counted rows, 0 for ignored rows; the
// target distribution is (1 - s) * onehot(label) + s / C.
OpDef cross_entropy_grad_op() {
  return {
      .name = op::cross_entropy_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            check_cross_entropy_inputs(graph, node, 3);
            const TensorType& logits = graph.type(node.inputs[0]);
            if (!(graph.type(node.inputs[2]) == TensorType{logits.dtype, {}})) {
              op_error(graph, node, "grad must be a scalar of the logits' dtype");
            }
            return logits;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const CrossEntropyRows rows(node, *in[0], *in[1]);
            const double scale = in[2]->data[0] / rows.count(op::cross_entropy_grad);
            const double uniform = rows.smoothing / static_cast<double>(rows.classes);
            HostTensor out(node.type.shape);
            for (int64_t n = 0; n < rows.rows(); ++n) {
              const int64_t label = rows.label(op::cross_entropy_grad, n);
              if (label < 0) continue;
              const double lse = rows.log_sum_exp(n);
              const double* x = rows.row(n);
              double* result = out.data.data() + n * rows.classes;
              for (int64_t c = 0; c < rows.classes; ++c) {
                const double target = uniform + (c == label ? 1.0 - rows.smoothing : 0.0);
                result[c] = (std::exp(x[c] - lse) - target) * scale;
              }
            }
            return out;
          },
  };
}

void require_same_type(std::string_view op, Tensor a, Tensor b) {
  if (!(a.type() == b.type())) {
    builder_error(op, {a, b}, "prediction and target must have one type");
  }
}

}  // namespace

void register_loss_ops(std::vector<OpDef>& registry) {
  registry.push_back(cross_entropy_op());
  registry.push_back(cross_entropy_grad_op());
}

Tensor cross_entropy(Tensor logits, Tensor labels, double label_smoothing, int64_t ignore_index) {
  return apply(op::cross_entropy, {logits, labels},
               {{"label_smoothing", label_smoothing}, {"ignore_index", ignore_index}});
}

Tensor mse_loss(Tensor prediction, Tensor target) {
  require_same_type("mse_loss", prediction, target);
  return mean_all(square(prediction - target));
}

// mean(max(x, 0) - x * t + log(1 + exp(-|x|))): never exponentiates a large positive number.
// maximum (not relu) so that at x = 0 its tie rule gives the exact derivative sigmoid(0) - t.
Tensor bce_with_logits(Tensor logits, Tensor target) {
  require_same_type("bce_with_logits", logits, target);
  const Tensor zero = scalar(logits.graph(), 0.0, logits.dtype());
  return mean_all(maximum(logits, zero) - logits * target + log(1.0 + exp(-abs(logits))));
}

}  // namespace mg
