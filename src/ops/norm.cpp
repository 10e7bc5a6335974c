// Normalisation: layer_norm, rms_norm, group_norm and batch_norm, each with one backward op for
// the x-gradient (one row-reduction kernel later); weight and bias gradients are sums of
// grad * x_hat and grad over the non-channel axes, built from primitive ops.
//
// All four share one description: every element belongs to a statistics group (whose mean and
// variance normalise it) and to a channel (which picks its weight and bias):
//   layer_norm, rms_norm: group = row of the last axis, channel = position in the last axis;
//   group_norm:           group = (sample, channel group), channel = axis 1;
//   batch_norm:           group = channel = axis 1 (over batch and spatial axes).
// rms_norm does not subtract the mean; batch_norm in eval mode takes its statistics from the
// running_mean/running_var inputs instead of computing them.
#include <cmath>

#include "ir/op_names.hpp"
#include "ops/apply.hpp"
#include "ops/op_checks.hpp"

namespace mg {
namespace {

enum class NormKind { layer, rms, group, batch };

std::string_view forward_name(NormKind kind) {
  switch (kind) {
    case NormKind::layer:
      return op::layer_norm;
    case NormKind::rms:
      return op::rms_norm;
    case NormKind::group:
      return op::group_norm;
    case NormKind::batch:
      return op::batch_norm;
  }
  return "";
}

std::string_view grad_name(NormKind kind) {
  switch (kind) {
    case NormKind::layer:
      return op::layer_norm_grad;
    case NormKind::rms:
      return op::rms_norm_grad;
    case NormKind::group:
      return op::group_norm_grad;
    case NormKind::batch:
      return op::batch_norm_grad;
  }
  return "";
}

// Attributes and input positions of a norm node. Forward inputs: x, weight?, bias?,
// running_mean?, running_var?; backward inputs: x, weight?, running_mean?, running_var?,
// grad_out (the bias does not influence the x-gradient).
struct NormConfig {
  NormKind kind = NormKind::layer;
  bool backward = false;
  double eps = 0;
  bool has_weight = false, has_bias = false;
  int64_t groups = 1;          // group_norm
  bool training = true;        // batch_norm
  bool running_stats = false;  // batch_norm in eval mode

  bool centred() const { return kind != NormKind::rms; }
  size_t weight_index() const { return 1; }
  size_t bias_index() const { return has_weight ? 2 : 1; }
  size_t running_index() const { return 1 + has_weight + has_bias; }
  size_t grad_index() const { return running_index() + (running_stats ? 2 : 0); }
  size_t input_count() const { return grad_index() + (backward ? 1 : 0); }

  // Attributes of a node of this kind; without bias for backward ops and for x_hat nodes.
  Attrs attrs(bool weight, bool bias) const {
    Attrs result{{"eps", eps}, {"has_weight", int64_t{weight}}};
    if (kind != NormKind::rms) result.set("has_bias", int64_t{bias});
    if (kind == NormKind::group) result.set("groups", groups);
    if (kind == NormKind::batch) result.set("training", int64_t{training});
    return result;
  }
};

NormConfig read_config(NormKind kind, bool backward, const Attrs& attrs) {
  NormConfig config;
  config.kind = kind;
  config.backward = backward;
  config.eps = attrs.get_float("eps");
  config.has_weight = attrs.get_int("has_weight", 0) != 0;
  config.has_bias = !backward && kind != NormKind::rms && attrs.get_int("has_bias", 0) != 0;
  config.groups = attrs.get_int("groups", 1);
  config.training = attrs.get_int("training", 1) != 0;
  config.running_stats = kind == NormKind::batch && !config.training;
  return config;
}

struct NormLayout {
  std::vector<int64_t> group;    // statistics group of each element
  std::vector<int64_t> channel;  // weight/bias index of each element
  int64_t group_count = 0;
  int64_t channels = 0;
};

int64_t channel_count(NormKind kind, const Shape& x) {
  return kind == NormKind::layer || kind == NormKind::rms ? x.back() : x[1];
}

NormLayout norm_layout(const NormConfig& config, const Shape& x) {
  NormLayout layout;
  const int64_t elements = element_count(x);
  layout.channels = channel_count(config.kind, x);
  layout.group.resize(elements);
  layout.channel.resize(elements);
  const bool last_axis = config.kind == NormKind::layer || config.kind == NormKind::rms;
  const int64_t inner = last_axis ? 1 : elements / (x[0] * x[1]);  // spatial extent
  const int64_t per_group = layout.channels / config.groups;
  for (int64_t i = 0; i < elements; ++i) {
    const int64_t c = (i / inner) % layout.channels;
    const int64_t sample = i / (inner * layout.channels);
    layout.channel[i] = c;
    switch (config.kind) {
      case NormKind::layer:
      case NormKind::rms:
        layout.group[i] = sample;
        break;
      case NormKind::group:
        layout.group[i] = sample * config.groups + c / per_group;
        break;
      case NormKind::batch:
        layout.group[i] = c;
        break;
    }
  }
  layout.group_count = last_axis                        ? elements / layout.channels
                       : config.kind == NormKind::group ? x[0] * config.groups
                                                        : layout.channels;
  return layout;
}

struct NormStatistics {
  std::vector<double> mean, rstd;  // per statistics group
};

NormStatistics statistics(const NormConfig& config, const NormLayout& layout, const HostTensor& x,
                          const std::vector<const HostTensor*>& in) {
  NormStatistics stats;
  stats.mean.assign(layout.group_count, 0.0);
  stats.rstd.assign(layout.group_count, 0.0);
  if (config.running_stats) {
    const HostTensor& running_mean = *in[config.running_index()];
    const HostTensor& running_var = *in[config.running_index() + 1];
    for (int64_t g = 0; g < layout.group_count; ++g) {
      stats.mean[g] = running_mean.data[g];
      stats.rstd[g] = 1.0 / std::sqrt(running_var.data[g] + config.eps);
    }
    return stats;
  }
  std::vector<double> count(layout.group_count, 0.0), variance(layout.group_count, 0.0);
  for (int64_t i = 0; i < x.elements(); ++i) count[layout.group[i]] += 1;
  if (config.centred()) {
    for (int64_t i = 0; i < x.elements(); ++i) stats.mean[layout.group[i]] += x.data[i];
    for (int64_t g = 0; g < layout.group_count; ++g) stats.mean[g] /= count[g];
  }
  for (int64_t i = 0; i < x.elements(); ++i) {
    variance[layout.group[i]] += std::pow(x.data[i] - stats.mean[layout.group[i]], 2);
  }
  for (int64_t g = 0; g < layout.group_count; ++g) {
    stats.rstd[g] = 1.0 / std::sqrt(variance[g] / count[g] + config.eps);
  }
  return stats;
}

HostTensor norm_forward(NormKind kind, const Node& node, const std::vector<const HostTensor*>& in) {
  const NormConfig config = read_config(kind, false, node.attrs);
  const HostTensor& x = *in[0];
  const NormLayout layout = norm_layout(config, x.shape);
  const NormStatistics stats = statistics(config, layout, x, in);
  HostTensor out(x.shape);
  for (int64_t i = 0; i < x.elements(); ++i) {
    const int64_t g = layout.group[i];
    const int64_t c = layout.channel[i];
    double value = (x.data[i] - stats.mean[g]) * stats.rstd[g];
    if (config.has_weight) value *= in[config.weight_index()]->data[c];
    if (config.has_bias) value += in[config.bias_index()]->data[c];
    out.data[i] = value;
  }
  return out;
}

// dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat)) per group, with gw = grad * weight;
// rms_norm drops the mean(gw) term, and fixed (running) statistics leave only rstd * gw.
HostTensor norm_backward(NormKind kind, const Node& node,
                         const std::vector<const HostTensor*>& in) {
  const NormConfig config = read_config(kind, true, node.attrs);
  const HostTensor& x = *in[0];
  const HostTensor& grad_out = *in[config.grad_index()];
  const NormLayout layout = norm_layout(config, x.shape);
  const NormStatistics stats = statistics(config, layout, x, in);
  std::vector<double> scaled_grad(x.elements()), x_hat(x.elements());
  std::vector<double> count(layout.group_count, 0.0), grad_sum(layout.group_count, 0.0),
      grad_dot_x_hat(layout.group_count, 0.0);
  for (int64_t i = 0; i < x.elements(); ++i) {
    const int64_t g = layout.group[i];
    scaled_grad[i] = grad_out.data[i];
    if (config.has_weight) scaled_grad[i] *= in[config.weight_index()]->data[layout.channel[i]];
    x_hat[i] = (x.data[i] - stats.mean[g]) * stats.rstd[g];
    count[g] += 1;
    grad_sum[g] += scaled_grad[i];
    grad_dot_x_hat[g] += scaled_grad[i] * x_hat[i];
  }
  HostTensor grad(x.shape);
  for (int64_t i = 0; i < x.elements(); ++i) {
    const int64_t g = layout.group[i];
    double value = scaled_grad[i];
    if (!config.running_stats) {
      if (config.centred()) value -= grad_sum[g] / count[g];
      value -= x_hat[i] * grad_dot_x_hat[g] / count[g];
    }
    grad.data[i] = value * stats.rstd[g];
  }
  return grad;
}

void expect_channel_vector(const Graph& graph, const Node& node, size_t index, const char* what,
                           int64_t channels) {
  const Shape& shape = graph.type(node.inputs[index]).shape;
  if (shape != Shape{channels}) {
    op_error(graph, node,
             std::string(what) + " " + shape_string(shape) + " should have shape [" +
                 std::to_string(channels) + "]");
  }
}

TensorType infer_norm(NormKind kind, bool backward, const Graph& graph, const Node& node) {
  if (!node.attrs.has("eps")) op_error(graph, node, "attribute 'eps' is missing");
  const NormConfig config = read_config(kind, backward, node.attrs);
  expect_input_count(graph, node, config.input_count());
  for (size_t i = 0; i < node.inputs.size(); ++i) expect_floating(graph, node, i);
  expect_same_dtype(graph, node);
  const TensorType& x = graph.type(node.inputs[0]);
  const bool channel_axis_1 = kind == NormKind::group || kind == NormKind::batch;
  if (x.rank() < (channel_axis_1 ? 2 : 1)) {
    op_error(graph, node,
             "input " + shape_string(x.shape) +
                 (channel_axis_1 ? " needs rank >= 2 ([N, C, ...])" : " needs rank >= 1"));
  }
  if (config.eps < 0) op_error(graph, node, "eps must be >= 0");
  const int64_t channels = channel_count(kind, x.shape);
  if (kind == NormKind::group && (config.groups < 1 || channels % config.groups != 0)) {
    op_error(graph, node,
             "groups " + std::to_string(config.groups) + " must divide the " +
                 std::to_string(channels) + " channels of " + shape_string(x.shape));
  }
  if (config.has_weight)
    expect_channel_vector(graph, node, config.weight_index(), "weight", channels);
  if (config.has_bias) expect_channel_vector(graph, node, config.bias_index(), "bias", channels);
  if (config.running_stats) {
    expect_channel_vector(graph, node, config.running_index(), "running_mean", channels);
    expect_channel_vector(graph, node, config.running_index() + 1, "running_var", channels);
  }
  if (backward && graph.type(node.inputs[config.grad_index()]).shape != x.shape) {
    op_error(graph, node,
             "grad_out " + shape_string(graph.type(node.inputs[config.grad_index()]).shape) +
                 " should have the shape of x " + shape_string(x.shape));
  }
  return x;
}

// Sums `value` (shaped like x) over every axis but the channel axis, giving [channels].
ValueId sum_to_channels(Graph& graph, NormKind kind, ValueId value) {
  const int64_t rank = graph.type(value).rank();
  const int64_t channel_axis = kind == NormKind::layer || kind == NormKind::rms ? rank - 1 : 1;
  std::vector<int64_t> axes;
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (axis != channel_axis) axes.push_back(axis);
  }
  if (axes.empty()) return value;
  return graph.add(op::sum, {value}, {{"axes", axes}, {"keepdims", int64_t{0}}});
}

std::vector<ValueId> norm_vjp(NormKind kind, Graph& graph, ValueId self, ValueId grad) {
  const Node node = graph.node(self);
  const NormConfig config = read_config(kind, false, node.attrs);
  const ValueId x = node.inputs[0];
  std::vector<ValueId> statistics_inputs{x};  // what x_hat depends on besides the affine part
  if (config.running_stats) {
    statistics_inputs.push_back(node.inputs[config.running_index()]);
    statistics_inputs.push_back(node.inputs[config.running_index() + 1]);
  }
  std::vector<ValueId> backward_inputs{x};
  if (config.has_weight) backward_inputs.push_back(node.inputs[config.weight_index()]);
  backward_inputs.insert(backward_inputs.end(), statistics_inputs.begin() + 1,
                         statistics_inputs.end());
  backward_inputs.push_back(grad);

  std::vector<ValueId> grads(node.inputs.size(), kNoValue);  // none for running statistics
  grads[0] = graph.add(grad_name(kind), backward_inputs, config.attrs(config.has_weight, false));
  if (config.has_weight) {
    const ValueId x_hat =
        graph.add(forward_name(kind), statistics_inputs, config.attrs(false, false));
    grads[config.weight_index()] = sum_to_channels(graph, kind, graph.add(op::mul, {grad, x_hat}));
  }
  if (config.has_bias) grads[config.bias_index()] = sum_to_channels(graph, kind, grad);
  return grads;
}

void register_norm(std::vector<OpDef>& registry, NormKind kind) {
  registry.push_back(OpDef{
      .name = forward_name(kind),
      .infer = [kind](const Graph& graph,
                      const Node& node) { return infer_norm(kind, false, graph, node); },
      .reference =
          [kind](const Node& node, const std::vector<const HostTensor*>& in) {
            return norm_forward(kind, node, in);
          },
      .vjp = [kind](Graph& graph, ValueId self,
                    ValueId grad) { return norm_vjp(kind, graph, self, grad); },
  });
  registry.push_back(OpDef{
      .name = grad_name(kind),
      .infer = [kind](const Graph& graph,
                      const Node& node) { return infer_norm(kind, true, graph, node); },
      .reference =
          [kind](const Node& node, const std::vector<const HostTensor*>& in) {
            return norm_backward(kind, node, in);
          },
  });
}

std::vector<Tensor> with_affine(Tensor x, const std::optional<Tensor>& weight,
                                const std::optional<Tensor>& bias) {
  std::vector<Tensor> inputs{x};
  if (weight) inputs.push_back(*weight);
  if (bias) inputs.push_back(*bias);
  return inputs;
}

}  // namespace

void register_norm_ops(std::vector<OpDef>& registry) {
  // layer_norm(x [..., D], weight? [D], bias? [D]) -> x's type, over the last axis.
  //   attrs: eps, has_weight, has_bias.
  // layer_norm_grad(x, weight?, grad_out) -> dx. attrs: eps, has_weight.
  register_norm(registry, NormKind::layer);
  // rms_norm(x [..., D], weight? [D]) -> x * rsqrt(mean(x^2) + eps) * weight.
  //   attrs: eps, has_weight.
  // rms_norm_grad(x, weight?, grad_out) -> dx. attrs: eps, has_weight.
  register_norm(registry, NormKind::rms);
  // group_norm(x [N, C, ...], weight? [C], bias? [C]): statistics per sample and group of
  //   C / groups channels. attrs: groups, eps, has_weight, has_bias.
  // group_norm_grad(x, weight?, grad_out) -> dx. attrs: groups, eps, has_weight.
  register_norm(registry, NormKind::group);
  // batch_norm(x [N, C, ...], weight? [C], bias? [C], running_mean? [C], running_var? [C]):
  //   training=1 normalises with the batch statistics (biased variance) over N and the spatial
  //   axes and takes no running inputs; training=0 takes both running inputs and uses them.
  //   attrs: training, eps, has_weight, has_bias.
  // batch_norm_grad(x, weight?, running_mean?, running_var?, grad_out) -> dx (running inputs
  //   when training=0). attrs: training, eps, has_weight.
  register_norm(registry, NormKind::batch);
}

Tensor layer_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, double eps) {
  return apply(op::layer_norm, with_affine(x, weight, bias),
               {{"eps", eps},
                {"has_weight", int64_t{weight.has_value()}},
                {"has_bias", int64_t{bias.has_value()}}});
}

Tensor rms_norm(Tensor x, std::optional<Tensor> weight, double eps) {
  return apply(op::rms_norm, with_affine(x, weight, std::nullopt),
               {{"eps", eps}, {"has_weight", int64_t{weight.has_value()}}});
}

Tensor group_norm(Tensor x, int64_t groups, std::optional<Tensor> weight,
                  std::optional<Tensor> bias, double eps) {
  return apply(op::group_norm, with_affine(x, weight, bias),
               {{"groups", groups},
                {"eps", eps},
                {"has_weight", int64_t{weight.has_value()}},
                {"has_bias", int64_t{bias.has_value()}}});
}

Tensor batch_norm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
                  Tensor running_mean, Tensor running_var, bool training, double momentum,
                  double eps) {
  std::vector<Tensor> inputs = with_affine(x, weight, bias);
  const Attrs attrs{{"training", int64_t{training}},
                    {"eps", eps},
                    {"has_weight", int64_t{weight.has_value()}},
                    {"has_bias", int64_t{bias.has_value()}}};
  if (!training) {
    inputs.push_back(running_mean);
    inputs.push_back(running_var);
    return apply(op::batch_norm, inputs, attrs);
  }
  const Tensor out = apply(op::batch_norm, inputs, attrs);
  // Running statistics follow PyTorch: momentum weighs the new batch value, and the variance
  // stored is the unbiased one even though the normalisation used the biased one.
  std::vector<int64_t> axes{0};
  Shape channel_shape(x.rank(), 1);
  channel_shape[1] = x.dim(1);
  for (int64_t axis = 2; axis < x.rank(); ++axis) axes.push_back(axis);
  const int64_t count = x.type().elements() / x.dim(1);
  if (count < 2) {
    throw Error("batch_norm: input " + type_string(x.type()) +
                " has one value per channel; training needs more to estimate a variance");
  }
  const Tensor batch_mean = mean(x, axes);
  const Tensor biased_var = mean(square(x - reshape(batch_mean, channel_shape)), axes);
  const Tensor unbiased_var = biased_var * (static_cast<double>(count) / (count - 1));
  Graph& graph = x.graph();
  graph.assign(running_mean.id(), (running_mean * (1 - momentum) + batch_mean * momentum).id());
  graph.assign(running_var.id(), (running_var * (1 - momentum) + unbiased_var * momentum).id());
  return out;
}

}  // namespace mg
