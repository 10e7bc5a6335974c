// Attention: scaled_dot_product_attention with grouped-query heads, causal and additive masks,
// its flash-attention-2 style backward (attention_lse plus one op per gradient, each
// recomputing the probabilities from the log-sum-exp, so no Sq x Sk matrix is ever stored; on
// the GPU the forward's launch writes the log-sum-exp, see backends/vulkan/kernels/fusion.cpp), and
// rotary position embeddings (rope).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/k_split.hpp"
#include "ops/op_checks.hpp"

namespace mg {
namespace {

struct AttentionDims {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0, value_dim = 0;

  Shape scores_shape() const { return {batch, q_heads, q_len, kv_len}; }
  Shape output_shape() const { return {batch, q_heads, q_len, value_dim}; }
  Shape lse_shape() const { return {batch, q_heads, q_len}; }
};

// Input positions. Forward: q, k, v, mask?. attention_lse: q, k, mask?. Backward ops:
// q, k, v, mask?, out, grad_out, lse, grad_out_max?.
struct AttentionInputs {
  bool with_value = true;
  bool has_mask = false;
  bool backward = false;
  bool has_grad_out_max = false;

  size_t mask_index() const { return with_value ? 3 : 2; }
  size_t out_index() const { return mask_index() + (has_mask ? 1 : 0); }
  size_t grad_out_max_index() const { return out_index() + 3; }
  size_t count() const { return out_index() + (backward ? 3 + (has_grad_out_max ? 1 : 0) : 0); }
};

// attention_combine's rows for partials [S, ..., Dv + 1] in their own order: [..., Dv].
Shape rows_of_partials(const Shape& partials) {
  Shape shape(partials.begin() + 1, partials.end());
  shape.back() -= 1;
  return shape;
}

// attention_combine's result: its rows, or with heads_last [B, Sq, H, Dv].
Shape combined_shape(const Node& node, const Shape& partials) {
  if (node.attrs.get_int("heads_last", 0) != 0)
    return {partials[1], partials[3], partials[2], partials[4] - 1};
  return rows_of_partials(partials);
}

AttentionInputs attention_inputs(const Node& node, bool with_value, bool backward) {
  return {with_value, node.attrs.get_int("has_mask", 0) != 0, backward,
          backward && node.attrs.get_int("has_grad_out_max", 0) != 0};
}

AttentionDims attention_dims(const Shape& q, const Shape& k, const Shape* v) {
  return {q[0], q[1], k[1], q[2], k[2], q[3], v ? (*v)[3] : 0};
}

AttentionDims check_attention(const Graph& graph, const Node& node, bool with_value,
                              bool backward) {
  const AttentionInputs layout = attention_inputs(node, with_value, backward);
  expect_input_count(graph, node, layout.count());
  for (size_t i = 0; i < node.inputs.size(); ++i) expect_floating(graph, node, i);
  expect_same_dtype(graph, node);
  const size_t operands = with_value ? 3 : 2;
  for (size_t i = 0; i < operands; ++i) expect_floating(graph, node, i, 4);
  const Shape& q = graph.type(node.inputs[0]).shape;
  const Shape& k = graph.type(node.inputs[1]).shape;
  const Shape* v = with_value ? &graph.type(node.inputs[2]).shape : nullptr;
  if (q[0] != k[0] || q[3] != k[3]) {
    op_error(graph, node,
             "q " + shape_string(q) + " and k " + shape_string(k) +
                 " must agree in batch (axis 0) and head_dim (axis 3)");
  }
  if (q[1] % k[1] != 0) {
    op_error(graph, node,
             "q heads " + std::to_string(q[1]) + " must be a multiple of k/v heads " +
                 std::to_string(k[1]));
  }
  if (v && ((*v)[0] != k[0] || (*v)[1] != k[1] || (*v)[2] != k[2])) {
    op_error(graph, node,
             "v " + shape_string(*v) + " must match k " + shape_string(k) +
                 " in batch, heads and sequence length");
  }
  const AttentionDims dims = attention_dims(q, k, v);
  if (layout.has_mask) {
    const Shape& mask = graph.type(node.inputs[layout.mask_index()]).shape;
    const Shape scores = dims.scores_shape();
    bool fits = mask.size() <= scores.size();
    for (size_t i = 0; fits && i < mask.size(); ++i) {
      const int64_t target = scores[scores.size() - mask.size() + i];
      fits = mask[i] == 1 || mask[i] == target;
    }
    if (!fits) {
      op_error(graph, node,
               "mask " + shape_string(mask) + " does not broadcast to the scores " +
                   shape_string(scores));
    }
  }
  if (backward) {
    const size_t out = layout.out_index();
    const std::pair<size_t, Shape> expected[] = {
        {out, dims.output_shape()}, {out + 1, dims.output_shape()}, {out + 2, dims.lse_shape()}};
    const char* names[] = {"out", "grad_out", "lse"};
    for (size_t i = 0; i < 3; ++i) {
      const Shape& actual = graph.type(node.inputs[expected[i].first]).shape;
      if (actual != expected[i].second) {
        op_error(graph, node,
                 std::string(names[i]) + " " + shape_string(actual) + " should be " +
                     shape_string(expected[i].second));
      }
    }
    if (layout.has_grad_out_max && node.attrs.get_int("own_grad_out_scale", 0) != 0)
      op_error(graph, node, "has_grad_out_max and own_grad_out_scale exclude each other");
    if (layout.has_grad_out_max) {
      const Shape& actual = graph.type(node.inputs[layout.grad_out_max_index()]).shape;
      if (actual != Shape{dims.batch, 1, 1, 1} &&
          actual != Shape{dims.batch, dims.kv_heads, 1, 1}) {
        op_error(graph, node,
                 "grad_out_max " + shape_string(actual) + " should be " +
                     shape_string(Shape{dims.batch, 1, 1, 1}) + " or " +
                     shape_string(Shape{dims.batch, dims.kv_heads, 1, 1}) +
                     " (one per batch entry, or per key/value head)");
      }
    }
  }
  return dims;
}

// A half-open range of queries or keys.
struct Range {
  int64_t begin = 0, end = std::numeric_limits<int64_t>::max();
};

// The reference evaluation of one attention node: scores, probabilities and their gradients.
struct AttentionReference {
  AttentionDims dims;
  double scale = 1;
  bool causal = false;
  const HostTensor *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;

  AttentionReference(const Node& node, const std::vector<const HostTensor*>& in, bool with_value)
      : dims(attention_dims(in[0]->shape, in[1]->shape, with_value ? &in[2]->shape : nullptr)),
        scale(node.attrs.get_float("scale", 1.0 / std::sqrt(static_cast<double>(dims.head_dim)))),
        causal(node.attrs.get_int("causal", 0) != 0),
        q(in[0]),
        k(in[1]),
        v(with_value ? in[2] : nullptr) {
    const AttentionInputs layout = attention_inputs(node, with_value, false);
    if (layout.has_mask) mask = in[layout.mask_index()];
  }

  // Index of query row (b, h, i) in [B, Hq, Sq]; q, out and grad_out rows are multiples of it.
  int64_t row(int64_t b, int64_t h, int64_t i) const {
    return (b * dims.q_heads + h) * dims.q_len + i;
  }
  // Index of key row j of the kv head that query head h reads (grouped-query attention).
  int64_t key_row(int64_t b, int64_t h, int64_t j) const {
    const int64_t kv_head = h / (dims.q_heads / dims.kv_heads);
    return (b * dims.kv_heads + kv_head) * dims.kv_len + j;
  }

  // Scaled, masked score; causal masking is top-left aligned (key j visible to query i when
  // j <= i), as torch.nn.functional.scaled_dot_product_attention(is_causal=True) does.
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (causal && j > i) return -std::numeric_limits<double>::infinity();
    const double* query = &q->data[row(b, h, i) * dims.head_dim];
    const double* key = &k->data[key_row(b, h, j) * dims.head_dim];
    double dot = 0;
    for (int64_t d = 0; d < dims.head_dim; ++d) dot += query[d] * key[d];
    double result = dot * scale;
    if (mask) {
      result += mask->data[broadcast_source_index(mask->shape, dims.scores_shape(),
                                                  row(b, h, i) * dims.kv_len + j)];
    }
    return result;
  }

  double log_sum_exp(int64_t b, int64_t h, int64_t i) const {
    double largest = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < dims.kv_len; ++j) largest = std::max(largest, score(b, h, i, j));
    double total = 0;
    for (int64_t j = 0; j < dims.kv_len; ++j) total += std::exp(score(b, h, i, j) - largest);
    return largest + std::log(total);
  }

  // Calls visit(b, h, i, j, probability) for every query/key pair (within `queries` and `keys`),
  // with the probabilities of a row recomputed from its log-sum-exp.
  // `group_heads`: only the query heads whose index within their group of grouped-query
  // attention lies in the range (the head-split backward's partials).
  template <class Visit>
  void for_each_probability(const HostTensor* lse, Visit visit, Range queries = {}, Range keys = {},
                            Range group_heads = {}) const {
    const int64_t group = dims.q_heads / dims.kv_heads;
    for (int64_t b = 0; b < dims.batch; ++b) {
      for (int64_t h = 0; h < dims.q_heads; ++h) {
        if (h % group < group_heads.begin || h % group >= group_heads.end) continue;
        for (int64_t i = queries.begin; i < std::min(queries.end, dims.q_len); ++i) {
          const double row_lse = lse ? lse->data[row(b, h, i)] : log_sum_exp(b, h, i);
          for (int64_t j = keys.begin; j < std::min(keys.end, dims.kv_len); ++j) {
            visit(b, h, i, j, std::exp(score(b, h, i, j) - row_lse));
          }
        }
      }
    }
  }

  // The partial results of kv_splits = `splits` (ops/k_split.hpp): for each slice of the keys,
  // every query row's output over that slice alone (normalised by the slice's own sum) and,
  // in column Dv, the slice's log-sum-exp; a row that sees no key of a slice gets zeros and
  // -inf there.
  HostTensor partials(int64_t splits) const {
    const int64_t slice = attention_slice_length(dims.kv_len, splits);
    const int64_t rows = element_count(dims.lse_shape()), width = dims.value_dim + 1;
    HostTensor out(split_attention_shape(dims, splits));
    for (int64_t s = 0; s < splits; ++s) {
      const int64_t begin = s * slice, end = std::min(dims.kv_len, begin + slice);
      for (int64_t b = 0; b < dims.batch; ++b) {
        for (int64_t h = 0; h < dims.q_heads; ++h) {
          for (int64_t i = 0; i < dims.q_len; ++i) {
            double* result = &out.data[(s * rows + row(b, h, i)) * width];
            double largest = -std::numeric_limits<double>::infinity();
            for (int64_t j = begin; j < end; ++j) largest = std::max(largest, score(b, h, i, j));
            result[dims.value_dim] = largest;
            if (largest == -std::numeric_limits<double>::infinity()) continue;
            double total = 0;
            for (int64_t j = begin; j < end; ++j) total += std::exp(score(b, h, i, j) - largest);
            for (int64_t j = begin; j < end; ++j) {
              const double p = std::exp(score(b, h, i, j) - largest) / total;
              const double* value = &v->data[key_row(b, h, j) * dims.value_dim];
              for (int64_t e = 0; e < dims.value_dim; ++e) result[e] += p * value[e];
            }
            result[dims.value_dim] += std::log(total);
          }
        }
      }
    }
    return out;
  }

  static Shape split_attention_shape(const AttentionDims& dims, int64_t splits) {
    return {splits, dims.batch, dims.q_heads, dims.q_len, dims.value_dim + 1};
  }

  HostTensor forward() const {
    HostTensor out(dims.output_shape());
    for_each_probability(nullptr, [&](int64_t b, int64_t h, int64_t i, int64_t j, double p) {
      const double* value = &v->data[key_row(b, h, j) * dims.value_dim];
      double* result = &out.data[row(b, h, i) * dims.value_dim];
      for (int64_t e = 0; e < dims.value_dim; ++e) result[e] += p * value[e];
    });
    return out;
  }

  struct Gradients {
    HostTensor q, k, v;
  };

  // D_i = dO_i . O_i of every query row.
  std::vector<double> row_deltas(const HostTensor& out, const HostTensor& grad_out) const {
    std::vector<double> row_delta(element_count(dims.lse_shape()), 0.0);
    for (size_t r = 0; r < row_delta.size(); ++r) {
      for (int64_t e = 0; e < dims.value_dim; ++e) {
        row_delta[r] += grad_out.data[r * dims.value_dim + e] * out.data[r * dims.value_dim + e];
      }
    }
    return row_delta;
  }

  // dS_ij = P_ij * (dO_i . v_j - D_i) with D_i = dO_i . O_i; dq_i = scale * sum_j dS_ij k_j,
  // dk_j = scale * sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i (summed over a group's q heads); the
  // sums only over the pairs within `queries` and `keys`, and the heads within `group_heads` of
  // their group (the split backward's partials).
  Gradients backward(const HostTensor& out, const HostTensor& grad_out, const HostTensor& lse,
                     Range queries = {}, Range keys = {}, Range group_heads = {}) const {
    Gradients grads{HostTensor(q->shape), HostTensor(k->shape), HostTensor(v->shape)};
    const std::vector<double> row_delta = row_deltas(out, grad_out);
    for_each_probability(
        &lse,
        [&](int64_t b, int64_t h, int64_t i, int64_t j, double p) {
          const int64_t query_row = row(b, h, i);
          const int64_t kv_row = key_row(b, h, j);
          const double* d_out = &grad_out.data[query_row * dims.value_dim];
          const double* value = &v->data[kv_row * dims.value_dim];
          double d_probability = 0;
          for (int64_t e = 0; e < dims.value_dim; ++e) {
            d_probability += d_out[e] * value[e];
            grads.v.data[kv_row * dims.value_dim + e] += p * d_out[e];
          }
          const double d_score = p * (d_probability - row_delta[query_row]) * scale;
          for (int64_t d = 0; d < dims.head_dim; ++d) {
            grads.q.data[query_row * dims.head_dim + d] +=
                d_score * k->data[kv_row * dims.head_dim + d];
            grads.k.data[kv_row * dims.head_dim + d] +=
                d_score * q->data[query_row * dims.head_dim + d];
          }
        },
        queries, keys, group_heads);
    return grads;
  }

  // scale * dS [B, Hq, Sq, Sk], computed on its own from q, k, v, dO and O (dQ = this . k).
  HostTensor score_gradients(const HostTensor& out, const HostTensor& grad_out,
                             const HostTensor& lse) const {
    HostTensor result(dims.scores_shape());
    const std::vector<double> row_delta = row_deltas(out, grad_out);
    for_each_probability(&lse, [&](int64_t b, int64_t h, int64_t i, int64_t j, double p) {
      const int64_t query_row = row(b, h, i);
      const double* d_out = &grad_out.data[query_row * dims.value_dim];
      const double* value = &v->data[key_row(b, h, j) * dims.value_dim];
      double d_probability = 0;
      for (int64_t e = 0; e < dims.value_dim; ++e) d_probability += d_out[e] * value[e];
      result.data[query_row * dims.kv_len + j] = p * (d_probability - row_delta[query_row]) * scale;
    });
    return result;
  }
};

// The number of slices of a node split over `length` queries or keys by attribute `split`
// (ops/k_split.hpp), 1 without it; throws unless every slice is non-empty.
int64_t attention_splits(const Graph& graph, const Node& node, const char* split, int64_t length,
                         const char* what) {
  if (!node.attrs.has(split)) return 1;
  const int64_t splits = node.attrs.get_int(split);
  if (splits < 1 || (splits - 1) * attention_slice_length(length, splits) >= length) {
    op_error(graph, node,
             std::string(split) + " " + std::to_string(splits) +
                 " must be >= 1 and leave every slice of the " + std::to_string(length) + " " +
                 what + " (multiples of " + std::to_string(kAttentionSliceAlignment) +
                 ") non-empty");
  }
  return splits;
}

// The head_splits of a dK or dV node (ops/k_split.hpp), 1 without it; throws unless it divides
// the query heads of a group.
int64_t attention_head_splits(const Graph& graph, const Node& node, const AttentionDims& dims) {
  if (!node.attrs.has("head_splits")) return 1;
  const int64_t splits = node.attrs.get_int("head_splits");
  const int64_t group = dims.q_heads / dims.kv_heads;
  if (splits < 1 || group % splits != 0) {
    op_error(graph, node,
             "head_splits " + std::to_string(splits) + " must divide the " + std::to_string(group) +
                 " query heads of a key/value head's group");
  }
  return splits;
}

// One backward op: same inputs, one of the three gradients. With attribute `split` (kv_splits
// for dQ, q_splits for dK and dV; only from passes/split_attention.cpp) the result is [S, ...]:
// partial s sums only over the keys (queries) of slice s. dK and dV may also take head_splits
// = H: the result is [H * S, ...] and partial h * S + s sums over slice s of the queries of
// the h-th part of each group's query heads.
void register_attention_grad(std::vector<OpDef>& registry, std::string_view name,
                             HostTensor AttentionReference::Gradients::*pick,
                             Shape (*result_shape)(const Graph&, const Node&), const char* split) {
  const bool over_keys = std::string_view(split) == "kv_splits";
  registry.push_back(OpDef{
      .name = name,
      .infer =
          [result_shape, split, over_keys](const Graph& graph, const Node& node) {
            const AttentionDims dims = check_attention(graph, node, true, true);
            Shape shape = result_shape(graph, node);
            if (over_keys && node.attrs.has("head_splits"))
              op_error(graph, node, "head_splits splits dK and dV only");
            const int64_t head_splits = attention_head_splits(graph, node, dims);
            if (node.attrs.has(split) || head_splits > 1) {
              shape.insert(shape.begin(),
                           head_splits * attention_splits(graph, node, split,
                                                          over_keys ? dims.kv_len : dims.q_len,
                                                          over_keys ? "keys" : "queries"));
            }
            return TensorType{graph.type(node.inputs[0]).dtype, shape};
          },
      .reference =
          [pick, split, over_keys](const Node& node, const std::vector<const HostTensor*>& in) {
            const AttentionReference attention(node, in, true);
            const size_t out = attention_inputs(node, true, true).out_index();
            const int64_t head_splits = node.attrs.get_int("head_splits", 1);
            if (!node.attrs.has(split) && head_splits == 1)
              return std::move(attention.backward(*in[out], *in[out + 1], *in[out + 2]).*pick);
            const int64_t splits = node.attrs.get_int(split, 1);
            const int64_t length = over_keys ? attention.dims.kv_len : attention.dims.q_len;
            const int64_t slice = attention_slice_length(length, splits);
            const int64_t heads = attention.dims.q_heads / attention.dims.kv_heads / head_splits;
            std::vector<HostTensor> partials;
            for (int64_t part = 0; part < head_splits; ++part) {
              for (int64_t s = 0; s < splits; ++s) {
                const Range range{s * slice, (s + 1) * slice};
                const Range group_heads{part * heads, (part + 1) * heads};
                AttentionReference::Gradients grads =
                    over_keys ? attention.backward(*in[out], *in[out + 1], *in[out + 2], {}, range)
                              : attention.backward(*in[out], *in[out + 1], *in[out + 2], range, {},
                                                   group_heads);
                partials.push_back(std::move(grads.*pick));
              }
            }
            Shape shape = partials[0].shape;
            shape.insert(shape.begin(), static_cast<int64_t>(partials.size()));
            HostTensor stacked(shape);
            for (size_t p = 0; p < partials.size(); ++p) {
              std::copy(partials[p].data.begin(), partials[p].data.end(),
                        stacked.data.begin() + static_cast<int64_t>(p) * partials[p].elements());
            }
            return stacked;
          },
  });
}

Shape input_shape(const Graph& graph, const Node& node, size_t index) {
  return graph.type(node.inputs[index]).shape;
}

// Rotates pairs (x[d], x[d + D/2]) of x [..., S, D] by angle (position_offset + s) *
// theta^(-2d/D); inverse rotates the other way (the transpose, hence the VJP).
HostTensor rotate(const Node& node, const HostTensor& x, const HostTensor* positions) {
  const double theta = node.attrs.get_float("theta");
  const int64_t offset = node.attrs.get_int("position_offset", 0);
  const double direction = node.attrs.get_int("inverse", 0) != 0 ? -1.0 : 1.0;
  const int64_t dim = x.shape.back();
  const int64_t half = dim / 2;
  const int64_t length = x.shape[x.shape.size() - 2];
  const int64_t rows_per_batch = x.elements() / (dim * x.shape[0]);
  HostTensor out(x.shape);
  for (int64_t row = 0; row < x.elements() / dim; ++row) {
    const int64_t s = row % length;
    const int64_t position =
        offset +
        (positions ? static_cast<int64_t>(positions->data[row / rows_per_batch * length + s]) : s);
    const double* in = &x.data[row * dim];
    double* result = &out.data[row * dim];
    for (int64_t d = 0; d < half; ++d) {
      const double angle =
          direction * static_cast<double>(position) *
          std::pow(theta, -2.0 * static_cast<double>(d) / static_cast<double>(dim));
      const double cosine = std::cos(angle), sine = std::sin(angle);
      result[d] = in[d] * cosine - in[d + half] * sine;
      result[d + half] = in[d + half] * cosine + in[d] * sine;
    }
  }
  return out;
}

}  // namespace

void register_attention_ops(std::vector<OpDef>& registry) {
  // scaled_dot_product_attention(q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv],
  //   mask? broadcastable to [B, Hq, Sq, Sk], added to the scores) -> [B, Hq, Sq, Dv].
  //   Query head h reads kv head h / (Hq / Hkv). attrs: causal (0/1, top-left aligned: key j
  //   visible to query i when j <= i), scale (default 1/sqrt(D)), has_mask (0/1).
  registry.push_back(OpDef{
      .name = op::scaled_dot_product_attention,
      .infer =
          [](const Graph& graph, const Node& node) {
            const AttentionDims dims = check_attention(graph, node, true, false);
            const DType dtype = graph.type(node.inputs[0]).dtype;
            if (!node.attrs.has("kv_splits")) return TensorType{dtype, dims.output_shape()};
            const int64_t splits = attention_splits(graph, node, "kv_splits", dims.kv_len, "keys");
            return TensorType{dtype, AttentionReference::split_attention_shape(dims, splits)};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const AttentionReference attention(node, in, true);
            if (node.attrs.has("kv_splits"))
              return attention.partials(node.attrs.get_int("kv_splits"));
            return attention.forward();
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            reject_split_gradient(graph, self);
            const Node node = graph.node(self);
            const AttentionInputs layout = attention_inputs(node, true, false);
            std::vector<ValueId> lse_inputs{node.inputs[0], node.inputs[1]};
            std::vector<ValueId> grad_inputs{node.inputs[0], node.inputs[1], node.inputs[2]};
            if (layout.has_mask) {
              lse_inputs.push_back(node.inputs[layout.mask_index()]);
              grad_inputs.push_back(node.inputs[layout.mask_index()]);
            }
            const ValueId lse = graph.add(op::attention_lse, lse_inputs, node.attrs);
            grad_inputs.insert(grad_inputs.end(), {self, grad, lse});
            std::vector<ValueId> grads{graph.add(op::attention_grad_q, grad_inputs, node.attrs),
                                       graph.add(op::attention_grad_k, grad_inputs, node.attrs),
                                       graph.add(op::attention_grad_v, grad_inputs, node.attrs)};
            if (layout.has_mask) grads.push_back(kNoValue);  // masks take no gradient
            return grads;
          },
  });

  // With kv_splits = S (only from passes/split_attention.cpp) the forward gives S partial
  // results [S, B, Hq, Sq, Dv + 1] (AttentionReference::partials), and
  // attention_combine(partials [S, ..., Dv + 1]) -> [..., Dv] joins them: with M the largest
  // log-sum-exp of a row and w_s = exp(lse_s - M), out = sum_s w_s O_s / sum_s w_s. attrs:
  // heads_last (0/1): partials [S, B, H, Sq, Dv + 1] give out [B, Sq, H, Dv], the heads moved
  // after the queries as a multi-head layer's output projection reads them.
  registry.push_back(OpDef{
      .name = op::attention_combine,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0);
            const TensorType& partials = graph.type(node.inputs[0]);
            if (partials.rank() < 2 || partials.shape.back() < 2) {
              op_error(graph, node,
                       "partials " + shape_string(partials.shape) +
                           " need rank >= 2 ([S, ..., Dv + 1]) and Dv >= 1");
            }
            if (node.attrs.get_int("heads_last", 0) != 0 && partials.rank() != 5) {
              op_error(graph, node,
                       "heads_last needs partials [S, B, H, Sq, Dv + 1], not " +
                           shape_string(partials.shape));
            }
            return TensorType{partials.dtype, combined_shape(node, partials.shape)};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const HostTensor& partials = *in[0];
            const int64_t splits = partials.shape[0], width = partials.shape.back();
            const int64_t rows = partials.elements() / splits / width;
            const Shape shape = rows_of_partials(partials.shape);
            HostTensor out(shape);
            for (int64_t r = 0; r < rows; ++r) {
              double largest = -std::numeric_limits<double>::infinity();
              for (int64_t s = 0; s < splits; ++s)
                largest = std::max(largest, partials.data[(s * rows + r) * width + width - 1]);
              double total = 0;
              for (int64_t s = 0; s < splits; ++s) {
                const double* part = &partials.data[(s * rows + r) * width];
                const double weight = std::exp(part[width - 1] - largest);
                total += weight;
                for (int64_t e = 0; e + 1 < width; ++e)
                  out.data[r * (width - 1) + e] += weight * part[e];
              }
              for (int64_t e = 0; e + 1 < width; ++e) out.data[r * (width - 1) + e] /= total;
            }
            if (node.attrs.get_int("heads_last", 0) == 0) return out;
            HostTensor moved(combined_shape(node, partials.shape));
            const int64_t batch = shape[0], heads = shape[1], queries = shape[2];
            const int64_t dim = width - 1;
            for (int64_t b = 0; b < batch; ++b)
              for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < queries; ++i)
                  for (int64_t e = 0; e < dim; ++e)
                    moved.data[((b * queries + i) * heads + h) * dim + e] =
                        out.data[((b * heads + h) * queries + i) * dim + e];
            return moved;
          },
  });

  // attention_lse(q, k, mask?) -> [B, Hq, Sq]: log-sum-exp over keys of the scaled, masked
  //   scores. attrs: those of scaled_dot_product_attention.
  registry.push_back(OpDef{
      .name = op::attention_lse,
      .infer =
          [](const Graph& graph, const Node& node) {
            const AttentionDims dims = check_attention(graph, node, false, false);
            return TensorType{graph.type(node.inputs[0]).dtype, dims.lse_shape()};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const AttentionReference attention(node, in, false);
            const AttentionDims& dims = attention.dims;
            HostTensor lse(dims.lse_shape());
            for (int64_t b = 0; b < dims.batch; ++b) {
              for (int64_t h = 0; h < dims.q_heads; ++h) {
                for (int64_t i = 0; i < dims.q_len; ++i) {
                  lse.data[attention.row(b, h, i)] = attention.log_sum_exp(b, h, i);
                }
              }
            }
            return lse;
          },
  });

  // attention_grad_q / _k / _v(q, k, v, mask?, out, grad_out, lse, grad_out_max?) -> the
  //   gradient of q [B, Hq, Sq, D], k [B, Hkv, Sk, D] or v [B, Hkv, Sk, Dv] (k and v summed over
  //   the query heads of their group). attrs: those of scaled_dot_product_attention, and
  //   has_grad_out_max (0/1): grad_out_max [B, 1, 1, 1] or [B, Hkv, 1, 1] is the largest
  //   |grad_out| of each batch entry (and key/value head's group of query heads), which kernels
  //   that round grad_out to a narrow type use to scale it into that type's range
  //   (passes/scale_attention_gradients.cpp); own_grad_out_scale (0/1, not with
  //   has_grad_out_max): such kernels find the largest |grad_out| of the rows they read
  //   themselves. The gradients are linear in grad_out, so the result is the same either way;
  //   the reference leaves both unread.
  register_attention_grad(
      registry, op::attention_grad_q, &AttentionReference::Gradients::q,
      [](const Graph& graph, const Node& node) { return input_shape(graph, node, 0); },
      "kv_splits");
  register_attention_grad(
      registry, op::attention_grad_k, &AttentionReference::Gradients::k,
      [](const Graph& graph, const Node& node) { return input_shape(graph, node, 1); }, "q_splits");
  register_attention_grad(
      registry, op::attention_grad_v, &AttentionReference::Gradients::v,
      [](const Graph& graph, const Node& node) { return input_shape(graph, node, 2); }, "q_splits");

  // attention_grad_scores(q, k, v, mask?, out, grad_out, lse, grad_out_max?) -> [B, Hq, Sq, Sk]:
  //   scale * dS, the scores' gradient (attention_grad_q is this times k), for the GPU's route of
  //   dQ as a matmul (passes/attention_grad_q_gemm.cpp). attrs: those of the gradient ops.
  registry.push_back(OpDef{
      .name = op::attention_grad_scores,
      .infer =
          [](const Graph& graph, const Node& node) {
            const AttentionDims dims = check_attention(graph, node, true, true);
            return TensorType{graph.type(node.inputs[0]).dtype, dims.scores_shape()};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const AttentionReference attention(node, in, true);
            const size_t out = attention_inputs(node, true, true).out_index();
            return attention.score_gradients(*in[out], *in[out + 1], *in[out + 2]);
          },
  });

  // rope(x [..., S, D], positions?) -> x's type, Llama "rotate half" form: with
  //   x1 = x[..., :D/2], x2 = x[..., D/2:], out = [x1 cos - x2 sin, x2 cos + x1 sin] at angle
  //   p * theta^(-2i/D), where p is position_offset + s, or with positions (i32 [B, S], x of rank
  //   >= 3 [B, ..., S, D]: each sample's own positions, such as those of a padded prefix)
  //   position_offset + positions[b, s]. attrs: theta, position_offset, inverse (0/1: rotate by
  //   the negative angle), has_positions (0/1).
  registry.push_back(OpDef{
      .name = op::rope,
      .infer =
          [](const Graph& graph, const Node& node) {
            const bool has_positions = node.attrs.get_int("has_positions", 0) != 0;
            expect_input_count(graph, node, has_positions ? 2 : 1);
            expect_floating(graph, node, 0);
            const TensorType& x = graph.type(node.inputs[0]);
            if (x.rank() < 2 || x.shape.back() % 2 != 0) {
              op_error(graph, node,
                       "input " + shape_string(x.shape) +
                           " needs rank >= 2 ([..., S, D]) and an even D");
            }
            if (!node.attrs.has("theta") || node.attrs.get_float("theta") <= 0) {
              op_error(graph, node, "attribute 'theta' must be given and positive");
            }
            if (has_positions) {
              const TensorType& positions = graph.type(node.inputs[1]);
              const Shape expected{x.shape.front(), x.shape[x.shape.size() - 2]};
              if (x.rank() < 3 || positions.dtype != DType::i32 || positions.shape != expected) {
                op_error(graph, node,
                         "positions must be i32 " + shape_string(expected) +
                             " (one per sample and position) for x [B, ..., S, D] of rank >= 3");
              }
            }
            return x;
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            return rotate(node, *in[0], in.size() > 1 ? in[1] : nullptr);
          },
      .vjp =
          [](Graph& graph, ValueId self, ValueId grad) {
            const Node node = graph.node(self);
            Attrs attrs = node.attrs;
            attrs.set("inverse", int64_t{attrs.get_int("inverse", 0) == 0});
            if (node.inputs.size() == 1)
              return std::vector<ValueId>{graph.add(op::rope, {grad}, attrs)};
            return std::vector<ValueId>{graph.add(op::rope, {grad, node.inputs[1]}, attrs),
                                        kNoValue};
          },
  });
}

Tensor scaled_dot_product_attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& options) {
  std::vector<Tensor> inputs{q, k, v};
  if (options.mask) inputs.push_back(*options.mask);
  const double head_dim = q.rank() == 4 ? static_cast<double>(q.dim(3)) : 1.0;
  return apply(op::scaled_dot_product_attention, inputs,
               {{"causal", int64_t{options.causal}},
                {"scale", options.scale.value_or(1.0 / std::sqrt(head_dim))},
                {"has_mask", int64_t{options.mask.has_value()}}});
}

Tensor rope(Tensor x, double theta, int64_t position_offset) {
  return apply(op::rope, {x},
               {{"theta", theta}, {"position_offset", position_offset}, {"inverse", int64_t{0}}});
}

Tensor rope(Tensor x, Tensor positions, double theta, int64_t position_offset) {
  return apply(op::rope, {x, positions},
               {{"theta", theta},
                {"position_offset", position_offset},
                {"inverse", int64_t{0}},
                {"has_positions", int64_t{1}}});
}

}  // namespace mg
