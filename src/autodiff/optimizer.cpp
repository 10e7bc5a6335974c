#include <cmath>
#include <limits>
#include <numbers>

#include "ir/op_names.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/train.hpp"

namespace mg {

std::string optimizer_name(OptimizerConfig::Kind kind) {
  switch (kind) {
    case OptimizerConfig::Kind::sgd:
      return "sgd";
    case OptimizerConfig::Kind::adam:
      return "adam";
    case OptimizerConfig::Kind::adamw:
      return "adamw";
  }
  return "?";
}

OptimizerConfig::Kind parse_optimizer(const std::string& name) {
  for (auto kind :
       {OptimizerConfig::Kind::sgd, OptimizerConfig::Kind::adam, OptimizerConfig::Kind::adamw}) {
    if (optimizer_name(kind) == name) return kind;
  }
  throw Error("unknown optimizer '" + name + "' (expected sgd, adam or adamw)");
}

double learning_rate_at(const OptimizerConfig& config, int64_t step) {
  const double base = config.learning_rate;
  if (config.schedule == OptimizerConfig::Schedule::constant) return base;
  if (step < config.warmup_steps) {
    return base * static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  }
  if (config.schedule == OptimizerConfig::Schedule::linear_warmup) return base;
  const int64_t decay_steps = std::max<int64_t>(1, config.total_steps - config.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - config.warmup_steps) / decay_steps);
  return config.min_learning_rate +
         0.5 * (base - config.min_learning_rate) * (1.0 + std::cos(std::numbers::pi * progress));
}

namespace {

void check_accumulation(const OptimizerConfig& config) {
  if (config.accumulation_steps < 1) {
    throw Error("accumulation_steps must be at least 1, got " +
                std::to_string(config.accumulation_steps));
  }
}

}  // namespace

std::map<std::string, double> optimizer_inputs(const OptimizerConfig& config, int64_t step) {
  check_accumulation(config);
  // Every micro-step of a group sees the values of the update the group makes, so whichever
  // micro-step applies it (the last) uses the right learning rate and bias corrections.
  const int64_t update = step / config.accumulation_steps;
  const double t = static_cast<double>(update + 1);
  std::map<std::string, double> values{
      {kLearningRateInput, learning_rate_at(config, update)},
      {kBiasCorrection1Input, 1.0 / (1.0 - std::pow(config.beta1, t))},
      {kBiasCorrection2Input, 1.0 / (1.0 - std::pow(config.beta2, t))},
  };
  if (config.accumulation_steps > 1) {
    const bool last = step % config.accumulation_steps == config.accumulation_steps - 1;
    values[kApplyUpdateInput] = last ? 1.0 : 0.0;
  }
  return values;
}

namespace {

void check_f32_parameters(const Graph& graph, const std::vector<ValueId>& parameters) {
  for (ValueId parameter : parameters) {
    const Node& node = graph.node(parameter);
    if (node.type.dtype != DType::f32)
      throw Error("training: parameter '" + node.name + "' is " + type_string(node.type) +
                  "; the optimizers update f32 parameters (their small steps vanish in f16): "
                  "declare it f32 and cast it to " +
                  std::string(dtype_name(node.type.dtype)) + " where the graph uses it");
  }
}

Tensor state_like(Graph& graph, const Node& parameter, const std::string& suffix) {
  return {&graph, graph.state("optimizer." + parameter.name + "." + suffix, parameter.type)};
}

}  // namespace

TrainingGraph add_training(Graph& graph, ValueId loss, const OptimizerConfig& config) {
  if (graph.type(loss).elements() != 1) {
    throw Error("training needs a scalar loss, got " + type_string(graph.type(loss)));
  }
  const std::vector<ValueId> parameters = graph.leaves(op::parameter);
  if (parameters.empty()) throw Error("training: the graph has no parameters");
  check_f32_parameters(graph, parameters);
  check_accumulation(config);

  if (config.loss_scaling && !config.skip_non_finite)
    throw Error(
        "training: loss_scaling needs skip_non_finite (a step whose scaled gradients "
        "overflow must be dropped)");

  TrainingGraph training;
  training.loss = loss;
  training.gradients = config.loss_scaling ? scaled_gradients(graph, loss, parameters)
                                           : gradients(graph, loss, parameters);
  graph.set_output("loss", loss);
  training.gradient_norm = add_optimizer_update(graph, training.gradients, config, loss);
  return training;
}

ValueId add_optimizer_update(Graph& graph, const std::map<ValueId, ValueId>& gradients,
                             const OptimizerConfig& config, ValueId loss) {
  if (gradients.empty()) throw Error("optimizer update: no parameters to update");
  check_accumulation(config);
  // Graph order (the map's keys), so that state leaves are created in the order add_training
  // always created them.
  std::vector<ValueId> parameters;
  for (const auto& [parameter, gradient] : gradients) {
    if (graph.node(parameter).op != op::parameter)
      throw Error("optimizer update: %" + std::to_string(parameter) + " is not a parameter");
    if (!(graph.type(gradient) == graph.type(parameter)))
      throw Error("optimizer update: the gradient of '" + graph.node(parameter).name + "' is " +
                  type_string(graph.type(gradient)) + ", the parameter " +
                  type_string(graph.type(parameter)));
    parameters.push_back(parameter);
  }
  check_f32_parameters(graph, parameters);
  if (config.loss_scaling && !config.skip_non_finite)
    throw Error(
        "optimizer update: loss_scaling needs skip_non_finite (a step whose scaled "
        "gradients overflow must be dropped)");
  ValueId gradient_norm = kNoValue;
  // With accumulation the optimizer below sees the mean gradient of the group so far, and every
  // state it writes (parameters, moments) is selected with `apply`: where() copies the old value
  // bit for bit on the micro-steps that do not apply, which a 0/1 blend would not for inf/NaN.
  const bool accumulate = config.accumulation_steps > 1;
  Tensor apply;
  std::map<ValueId, Tensor> optimizer_gradients;  // parameter -> gradient the update uses
  // Accumulation state leaves and their sums with this micro-step's gradient.
  std::vector<std::pair<Tensor, Tensor>> accumulated_sums;
  if (accumulate) apply = input(graph, kApplyUpdateInput, {});
  // One reciprocal of the loss scale for every gradient. With accumulation or clipping, which
  // read every gradient before the update, each gradient is multiplied by it first; otherwise it
  // joins the optimizer's own factors where the update reads the gradient (unscale_in_update),
  // so that a gradient read twice by one kernel (Adam's two moments) is still read straight from
  // backward's buffer: one product read twice would take a kernel of its own.
  Tensor inverse_scale;
  if (config.loss_scaling) {
    ValueId scale_id = graph.find_leaf(kLossScaleInput);
    if (scale_id == kNoValue) scale_id = graph.input(kLossScaleInput, {DType::f32, {}});
    // The seed has the loss's type; the update wants an f32 scalar.
    Tensor scale{&graph, scale_id};
    if (scale.type().dtype != DType::f32) scale = cast(scale, DType::f32);
    if (scale.type().rank() > 0) scale = reshape(scale, {});
    inverse_scale = 1.0 / scale;
  }
  const bool unscale_in_update = inverse_scale.valid() && !accumulate && !(config.clip_norm > 0);
  for (ValueId parameter_id : parameters) {
    Tensor grad{&graph, gradients.at(parameter_id)};
    if (inverse_scale.valid() && !unscale_in_update) grad = grad * inverse_scale;
    if (accumulate) {
      const Node parameter_node = graph.node(parameter_id);
      const Tensor accumulated = state_like(graph, parameter_node, "accumulated_gradient");
      const Tensor total = accumulated + grad;
      accumulated_sums.emplace_back(accumulated, total);
      grad = total / static_cast<double>(config.accumulation_steps);
    }
    optimizer_gradients[parameter_id] = grad;
  }

  // Clipping needs the sum of squared gradients; the finiteness check reuses it, or without
  // clipping takes the plain sum of each gradient (one reduction a parameter, no squares): inf
  // and NaN survive any sum, since inf + -inf is NaN.
  Tensor squared_sum, plain_sum;
  for (ValueId parameter : parameters) {
    const Tensor grad = optimizer_gradients[parameter];
    if (config.clip_norm > 0) {
      const Tensor part = sum_all(square(grad));
      squared_sum = squared_sum.valid() ? squared_sum + part : part;
    } else if (config.skip_non_finite) {
      const Tensor part = sum_all(grad);
      plain_sum = plain_sum.valid() ? plain_sum + part : part;
    }
  }
  // Still scaled: the total is unscaled once.
  if (plain_sum.valid() && unscale_in_update) plain_sum = plain_sum * inverse_scale;
  // 1 where the loss and every gradient are finite: NaN and infinity fail the comparison (as a
  // sum that overflows does, whose update would be no better).
  Tensor finite;
  if (config.skip_non_finite) {
    Tensor magnitude = squared_sum.valid() ? squared_sum : abs(plain_sum);
    if (loss != kNoValue) magnitude = magnitude + abs(cast(Tensor{&graph, loss}, DType::f32));
    finite = less(magnitude, scalar(graph, std::numeric_limits<float>::max()));
    graph.set_output(kNonFiniteOutput, (1.0 - finite).id());
    // The graph's own state (batch norm's running statistics) keeps its value on a dropped step
    // as well: the statistics of a step that overflowed are no better than its update, and a
    // run stopped there checkpoints the state of the last good step.
    const std::vector<std::pair<ValueId, ValueId>> model_updates = graph.updates();
    for (const auto& [leaf, value] : model_updates) {
      graph.reassign(leaf, where(finite, Tensor{&graph, value}, Tensor{&graph, leaf}).id());
    }
  }
  for (const auto& [accumulated, total] : accumulated_sums) {
    Tensor kept = where(apply, scalar(graph, 0.0, graph.type(accumulated.id()).dtype), total);
    if (finite.valid()) kept = where(finite, kept, accumulated);
    graph.assign(accumulated.id(), kept.id());
  }
  // Keeps `current` unless this run applies the update (and, checked, its values are finite).
  const auto select = [&](const Tensor& updated, const Tensor& current) {
    Tensor kept = accumulate ? where(apply, updated, current) : updated;
    return finite.valid() ? where(finite, kept, current) : kept;
  };

  const Tensor learning_rate = input(graph, kLearningRateInput, {});
  Tensor bias_correction1, bias_correction2;
  if (config.kind != OptimizerConfig::Kind::sgd) {
    bias_correction1 = input(graph, kBiasCorrection1Input, {});
    bias_correction2 = input(graph, kBiasCorrection2Input, {});
  }

  Tensor clip_scale;
  if (config.clip_norm > 0) {
    const Tensor norm = sqrt(squared_sum);
    gradient_norm = norm.id();
    graph.set_output("gradient_norm", norm.id());
    clip_scale = minimum(scalar(graph, 1.0), config.clip_norm / (norm + 1e-6));
  }

  // Adam's moment factors with the reciprocal of the loss scale in them (unscale_in_update).
  Tensor first_moment_factor, second_moment_factor;
  if (unscale_in_update && config.kind != OptimizerConfig::Kind::sgd) {
    first_moment_factor = (1.0 - config.beta1) * inverse_scale;
    second_moment_factor = (1.0 - config.beta2) * square(inverse_scale);
  }

  for (ValueId parameter_id : parameters) {
    const Node parameter_node = graph.node(parameter_id);
    const Tensor parameter{&graph, parameter_id};
    Tensor grad = optimizer_gradients[parameter_id];
    bool scaled = unscale_in_update;  // whether `grad` still holds the loss scale
    if (clip_scale.valid()) grad = grad * clip_scale;
    if (config.weight_decay > 0 && config.kind != OptimizerConfig::Kind::adamw) {
      if (scaled) grad = grad * inverse_scale;
      scaled = false;
      grad = grad + parameter * config.weight_decay;
    }
    Tensor updated;
    if (config.kind == OptimizerConfig::Kind::sgd) {
      if (scaled) grad = grad * inverse_scale;
      Tensor direction = grad;
      if (config.momentum > 0) {
        const Tensor buffer = state_like(graph, parameter_node, "momentum");
        // The update reads the kept buffer, so that one kernel writes both (fusion takes the
        // assigned value as an extra output of the parameter's chain); where the buffer is
        // kept, so is the parameter.
        const Tensor new_buffer = select(buffer * config.momentum + grad, buffer);
        graph.assign(buffer.id(), new_buffer.id());
        direction = config.nesterov ? grad + new_buffer * config.momentum : new_buffer;
      }
      updated = parameter - learning_rate * direction;
    } else {
      const Tensor m = state_like(graph, parameter_node, "m");
      const Tensor v = state_like(graph, parameter_node, "v");
      // As for SGD's buffer: the step reads the kept moments.
      const Tensor m_step = scaled ? grad * first_moment_factor : grad * (1.0 - config.beta1);
      const Tensor v_step =
          scaled ? square(grad) * second_moment_factor : square(grad) * (1.0 - config.beta2);
      const Tensor new_m = select(m * config.beta1 + m_step, m);
      const Tensor new_v = select(v * config.beta2 + v_step, v);
      graph.assign(m.id(), new_m.id());
      graph.assign(v.id(), new_v.id());
      const Tensor step =
          (new_m * bias_correction1) / (sqrt(new_v * bias_correction2) + config.eps);
      Tensor decayed = parameter;
      if (config.kind == OptimizerConfig::Kind::adamw && config.weight_decay > 0) {
        decayed = parameter - learning_rate * config.weight_decay * parameter;
      }
      updated = decayed - learning_rate * step;
    }
    graph.assign(parameter_id, select(updated, parameter).id());
  }
  return gradient_norm;
}

std::map<ValueId, ValueId> scaled_gradients(Graph& graph, ValueId loss,
                                            const std::vector<ValueId>& wrt) {
  if (graph.find_leaf(kLossScaleInput) != kNoValue)
    throw Error("scaled_gradients: the graph already has input '" + std::string(kLossScaleInput) +
                "'");
  return gradients(graph, loss, wrt, graph.input(kLossScaleInput, graph.type(loss)));
}

}  // namespace mg
