// Training batch norm as reductions and pointwise ops. The norm kernel gives each statistics
// group one workgroup; a batch norm has one group a channel, each N x H x W elements long (3.2
// million in ResNet-50's first layer at batch 256), so few workgroups walk a tensor several
// times: the statistics, the normalisation, and in the gradient the statistics again and two dot
// products. The running statistics (src/ops/norm.cpp) then read it again for their own mean and
// variance, and the weight gradient recomputes the normalised input in a pass of its own.
//
// Rewritten, every channel reduction is a mean or sum that split_reductions spreads over the
// GPU, and the full-size work is pointwise, fused with what surrounds it (a ReLU after the
// forward):
//   mean = mean(x), var = mean(square(x - mean)) (the running statistics' own nodes, found and
//   shared, so the statistics are computed once for all of them), rstd = rsqrt(var + eps);
//   in one pass (fast precision) var = relu(mean(square(x)) - square(mean)), both means reading
//   x, so that one launch computes them (the mean a sibling of the other's prologue, fusion.cpp)
//   instead of the variance waiting for the mean and reading x again. Its error relative to var
//   is f32's rounding times mean^2 / var (cancellation; the relu keeps it from going negative):
//   under the f16 products' own while a channel's mean is within about 70 standard deviations;
//   forward y = (x - mean) * (rstd * weight) + bias;
//   x_hat (the weight gradient's recomputation) = (x - mean) * rstd;
//   dx = g * A + (x - mean) * B + C with A = rstd * weight, B = -A * rstd * S2 / n,
//   C = -A * S1 / n, where S1 = sum(g) and S2 = sum(g * x_hat) are the bias and weight
//   gradients' sums (found and shared as well).
// Each of the forward, the weight gradient's product and dx subtracts the mean in a node of its
// own: one shared difference would be a full-size value kept from the forward to the gradient.
#include <algorithm>
#include <map>
#include <optional>

#include "ir/op_names.hpp"
#include "meganeura/ops.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

std::vector<int64_t> non_channel_axes(int64_t rank) {
  std::vector<int64_t> axes{0};
  for (int64_t axis = 2; axis < rank; ++axis) axes.push_back(axis);
  return axes;
}

Shape channel_shape(const Shape& x) {
  Shape shape(x.size(), 1);
  shape[1] = x[1];
  return shape;
}

bool is_training_batch_norm(const Node& node) {
  return (node.op == op::batch_norm || node.op == op::batch_norm_grad) &&
         node.attrs.get_int("training", 1) == 1;
}

// Whether `node` reduces its input over every axis but axis 1 without keeping them, with `op`.
bool reduces_to_channels(const Graph& graph, const Node& node, std::string_view reduction) {
  if (node.op != reduction || node.inputs.size() != 1 || node.attrs.get_int("keepdims", 0) != 0)
    return false;
  const int64_t rank = graph.type(node.inputs[0]).rank();
  if (rank < 2) return false;
  std::vector<int64_t> axes = node.attrs.get_ints("axes", {});
  for (int64_t& axis : axes) {
    if (axis < 0) axis += rank;
  }
  std::sort(axes.begin(), axes.end());
  return axes == non_channel_axes(rank);
}

// What the old graph holds around each decomposed batch norm: the running statistics' mean and
// variance of an input x, and the bias and weight gradients' sums of a gradient g.
struct Found {
  std::map<ValueId, ValueId> running_mean_of;  // mean node -> x
  std::map<ValueId, ValueId> running_var_of;   // variance mean node -> x
  std::map<ValueId, ValueId> bias_sum_of;      // sum(g) -> g
  // sum(g * x_hat), x_hat a batch_norm of x without weight and bias.
  struct WeightSum {
    ValueId g = kNoValue, x = kNoValue;
    double eps = 0;
  };
  std::map<ValueId, WeightSum> weight_sum_of;
};

Found find_shared_nodes(const Graph& graph, const std::vector<bool>& decomposed_input,
                        const std::vector<bool>& decomposed_grad) {
  Found found;
  for (ValueId id = 0; id < static_cast<ValueId>(graph.size()); ++id) {
    const Node& node = graph.node(id);
    if (reduces_to_channels(graph, node, op::mean)) {
      const ValueId source = node.inputs[0];
      if (decomposed_input[source]) {
        found.running_mean_of[id] = source;
        continue;
      }
      // mean(square(x - reshape(mean(x))))
      const Node& squared = graph.node(source);
      if (squared.op != op::square) continue;
      const Node& difference = graph.node(squared.inputs[0]);
      if (difference.op != op::sub) continue;
      const ValueId x = difference.inputs[0];
      const Node& centre = graph.node(difference.inputs[1]);
      if (!decomposed_input[x] || centre.op != op::reshape) continue;
      const auto mean = found.running_mean_of.find(centre.inputs[0]);
      if (mean != found.running_mean_of.end() && mean->second == x) found.running_var_of[id] = x;
    } else if (reduces_to_channels(graph, node, op::sum)) {
      const ValueId source = node.inputs[0];
      if (decomposed_grad[source]) {
        found.bias_sum_of[id] = source;
        continue;
      }
      const Node& product = graph.node(source);
      if (product.op != op::mul || !decomposed_grad[product.inputs[0]]) continue;
      const Node& x_hat = graph.node(product.inputs[1]);
      if (x_hat.op == op::batch_norm && is_training_batch_norm(x_hat) && x_hat.inputs.size() == 1 &&
          decomposed_input[x_hat.inputs[0]])
        found.weight_sum_of[id] = {product.inputs[0], x_hat.inputs[0],
                                   x_hat.attrs.get_float("eps")};
    }
  }
  return found;
}

// The decomposition's values in the new graph, made once for each input x and gradient g.
class Decomposition {
 public:
  Decomposition(Graph& target, bool one_pass_variance)
      : target_(target), one_pass_variance_(one_pass_variance) {}

  // The mean and biased variance of x over its non-channel axes, and 1 / sqrt(var + eps) once a
  // batch norm asks for it (the running statistics need no eps).
  struct Statistics {
    ValueId mean = kNoValue, var = kNoValue, rstd = kNoValue;
  };

  Statistics& statistics(ValueId x) {
    Statistics& made = statistics_[x];
    if (made.mean != kNoValue) return made;
    if (one_pass_variance_) {
      // The mean of squares first: the mean, made after it, is then the sibling that the fusion
      // computes in its launch.
      const Tensor squares = mean(square(tensor(x)), axes(x));
      const Tensor plain_mean = mean(tensor(x), axes(x));
      made.mean = plain_mean.id();
      made.var = relu(squares - square(plain_mean)).id();
    } else {
      made.mean = mean(tensor(x), axes(x)).id();
      made.var = mean(square(centred(x, made)), axes(x)).id();
    }
    return made;
  }
  Statistics& statistics(ValueId x, double eps) {
    Statistics& made = statistics(x);
    if (made.rstd == kNoValue) made.rstd = rsqrt(tensor(made.var) + eps).id();
    return made;
  }
  ValueId running_mean(ValueId x) { return statistics(x).mean; }
  ValueId running_var(ValueId x) { return statistics(x).var; }

  // (x - mean) * rstd * weight? + bias? (kNoValue: none).
  ValueId forward(ValueId x, ValueId weight, ValueId bias, double eps) {
    const Statistics& made = statistics(x, eps);
    Tensor scale = tensor(made.rstd);
    if (weight != kNoValue) scale = scale * tensor(weight);
    Tensor y = centred(x, made) * broadcast(x, scale);
    if (bias != kNoValue) y = y + broadcast(x, tensor(bias));
    return y.id();
  }

  ValueId x_hat(ValueId x, double eps) {
    auto it = x_hats_.find(x);
    if (it != x_hats_.end()) return it->second;
    const Statistics& made = statistics(x, eps);
    return x_hats_[x] = (centred(x, made) * broadcast(x, tensor(made.rstd))).id();
  }

  ValueId bias_sum(ValueId g) {
    auto it = bias_sums_.find(g);
    if (it != bias_sums_.end()) return it->second;
    return bias_sums_[g] = sum(tensor(g), axes(g)).id();
  }

  ValueId weight_sum(ValueId g, ValueId x, double eps) {
    auto it = weight_sums_.find({g, x});
    if (it != weight_sums_.end()) return it->second;
    return weight_sums_[{g, x}] = sum(tensor(g) * tensor(x_hat(x, eps)), axes(g)).id();
  }

  ValueId gradient(ValueId x, ValueId weight, ValueId g, double eps) {
    const Statistics& made = statistics(x, eps);
    const double count = static_cast<double>(target_.type(x).elements() / shape(x)[1]);
    Tensor a = tensor(made.rstd);
    if (weight != kNoValue) a = a * tensor(weight);
    const Tensor b = -(a * tensor(made.rstd) * tensor(weight_sum(g, x, eps))) * (1.0 / count);
    const Tensor c = -(a * tensor(bias_sum(g))) * (1.0 / count);
    return (tensor(g) * broadcast(x, a) + centred(x, made) * broadcast(x, b) + broadcast(x, c))
        .id();
  }

 private:
  Tensor tensor(ValueId id) { return Tensor(&target_, id); }
  const Shape& shape(ValueId id) { return target_.type(id).shape; }
  std::vector<int64_t> axes(ValueId id) { return non_channel_axes(target_.type(id).rank()); }
  Tensor broadcast(ValueId x, Tensor channels) {
    return reshape(channels, channel_shape(shape(x)));
  }
  Tensor centred(ValueId x, const Statistics& made) {
    return tensor(x) - broadcast(x, tensor(made.mean));
  }

  Graph& target_;
  const bool one_pass_variance_;
  std::map<ValueId, Statistics> statistics_;
  std::map<ValueId, ValueId> x_hats_, bias_sums_;
  std::map<std::pair<ValueId, ValueId>, ValueId> weight_sums_;
};

}  // namespace

Graph decompose_batch_norm(Graph graph, int64_t min_channel_elements, bool one_pass_variance,
                           std::vector<ValueId>* remap) {
  // The inputs x and gradients g of the training batch norms that are decomposed.
  std::vector<bool> decomposed_input(graph.size(), false), decomposed_grad(graph.size(), false);
  bool any = false;
  for (const Node& node : graph.nodes()) {
    if (!is_training_batch_norm(node)) continue;
    const TensorType& x = graph.type(node.inputs[0]);
    if (x.dtype != DType::f32 || x.rank() < 2 || x.shape[1] == 0 ||
        x.elements() / x.shape[1] < min_channel_elements)
      continue;
    decomposed_input[node.inputs[0]] = true;
    if (node.op == op::batch_norm_grad) decomposed_grad[node.inputs.back()] = true;
    any = true;
  }
  if (!any) return unchanged(std::move(graph), remap);
  const Found found = find_shared_nodes(graph, decomposed_input, decomposed_grad);

  std::vector<ValueId> new_of(graph.size(), kNoValue);
  std::optional<Decomposition> decomposition;
  std::vector<bool> keep(graph.size(), true);
  std::vector<ValueId> rebuilt_remap;
  Graph rebuilt = rebuild(
      graph, keep,
      [&](Graph& target, ValueId old_id, Node node) {
        if (!decomposition) decomposition.emplace(target, one_pass_variance);
        Decomposition& parts = *decomposition;
        ValueId result = kNoValue;
        if (found.running_mean_of.count(old_id)) {
          result = parts.running_mean(node.inputs[0]);
        } else if (auto var = found.running_var_of.find(old_id);
                   var != found.running_var_of.end()) {
          result = parts.running_var(new_of[var->second]);
        } else if (found.bias_sum_of.count(old_id)) {
          result = parts.bias_sum(node.inputs[0]);
        } else if (auto weight = found.weight_sum_of.find(old_id);
                   weight != found.weight_sum_of.end()) {
          const Found::WeightSum& sum = weight->second;
          result = parts.weight_sum(new_of[sum.g], new_of[sum.x], sum.eps);
        } else if (is_training_batch_norm(node) && decomposed_input[graph.node(old_id).inputs[0]]) {
          const double eps = node.attrs.get_float("eps");
          const bool has_weight = node.attrs.get_int("has_weight", 0) != 0;
          const ValueId x = node.inputs[0];
          const ValueId weight = has_weight ? node.inputs[1] : kNoValue;
          if (node.op == op::batch_norm_grad) {
            result = parts.gradient(x, weight, node.inputs.back(), eps);
          } else if (!has_weight && node.attrs.get_int("has_bias", 0) == 0) {
            result = parts.x_hat(x, eps);
          } else {
            const ValueId bias =
                node.attrs.get_int("has_bias", 0) != 0 ? node.inputs[has_weight ? 2 : 1] : kNoValue;
            result = parts.forward(x, weight, bias, eps);
          }
        } else {
          result = target.add_typed(std::move(node));
        }
        new_of[old_id] = result;
        return result;
      },
      &rebuilt_remap);
  // The old nodes around the replaced ones (the running variance's difference and square, the
  // weight gradient's product) are left without readers.
  std::vector<ValueId> dead_code_remap;
  Graph result = eliminate_dead_code(std::move(rebuilt), &dead_code_remap);
  if (remap) *remap = compose(rebuilt_remap, dead_code_remap);
  return result;
}

}  // namespace mg::passes
