#pragma once
// Turning a model graph into a training graph: gradients, optional global-norm clipping and an
// optimizer update expressed as graph ops, with the optimizer's moments as state leaves (so a
// checkpoint holds them and the memory planner places them in the persistent region).
#include <map>
#include <string>

#include "meganeura/graph.hpp"

namespace mg {

struct OptimizerConfig {
  enum class Kind { sgd, adam, adamw } kind = Kind::adam;
  double learning_rate = 1e-3;
  double momentum = 0.0;                          // SGD
  bool nesterov = false;                          // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
  double weight_decay = 0.0;  // L2 added to the gradient (SGD, Adam); decoupled (AdamW)
  double clip_norm = 0.0;     // global gradient-norm clipping; 0 turns it off
  enum class Schedule { constant, linear_warmup, cosine } schedule = Schedule::constant;
  int64_t warmup_steps = 0;  // linear warmup length (linear_warmup and cosine)
  int64_t total_steps = 0;   // cosine: steps until min_learning_rate
  double min_learning_rate = 0.0;
  // Gradient accumulation: each run of the training graph is one micro-step; gradients are summed
  // over `accumulation_steps` micro-steps and their mean is applied as one optimizer update on
  // the last of them (clipping sees that mean, as in PyTorch with a loss scaled by 1/N). The
  // graph stays static: every run computes the update and kApplyUpdateInput selects whether it
  // is kept. 1 turns it off and builds exactly the graph without the feature.
  int64_t accumulation_steps = 1;
  // Non-finite steps: the update (parameters and every optimizer state) is kept only where the
  // loss and the gradients are finite, and output kNonFiniteOutput says whether it was dropped.
  // The check reads the sum of squares clipping computes, or without clipping a plain sum of
  // each gradient (one reduction a parameter). A skipped micro-step of an accumulation group
  // adds nothing.
  bool skip_non_finite = false;
};

std::string optimizer_name(OptimizerConfig::Kind kind);          // "sgd", "adam", "adamw"
OptimizerConfig::Kind parse_optimizer(const std::string& name);  // throws mg::Error

// The learning rate of optimizer update `step` (0 for the first update). With gradient
// accumulation this counts updates, not micro-steps (warmup_steps and total_steps too).
double learning_rate_at(const OptimizerConfig& config, int64_t step);

// Scalar inputs the training graph reads each step; fill them with optimizer_inputs().
inline constexpr const char* kLearningRateInput = "optimizer.learning_rate";
inline constexpr const char* kBiasCorrection1Input = "optimizer.bias_correction1";
inline constexpr const char* kBiasCorrection2Input = "optimizer.bias_correction2";
// Only when accumulation_steps > 1: 1 on the micro-step that applies the accumulated update,
// 0 on the others.
inline constexpr const char* kApplyUpdateInput = "optimizer.apply_update";
// With skip_non_finite: 1 when this run's loss or gradients held NaN or infinity, so that its
// update was not applied, 0 otherwise.
inline constexpr const char* kNonFiniteOutput = "optimizer.non_finite";

// Values of those inputs for run `step` (0-based) of the training graph: name -> value. `step`
// counts graph runs, i.e. micro-steps; with accumulation_steps == N, run `step` belongs to
// optimizer update step / N (which drives the schedule and Adam's bias corrections) and applies
// it when step % N == N - 1. Without accumulation runs and updates are the same.
std::map<std::string, double> optimizer_inputs(const OptimizerConfig& config, int64_t step);

struct TrainingGraph {
  ValueId loss = kNoValue;
  std::map<ValueId, ValueId> gradients;  // parameter -> gradient
  // Set when clipping is on. With accumulation: the norm of the mean gradient of the group so
  // far, which is the clipped one on the micro-step that applies the update.
  ValueId gradient_norm = kNoValue;
};

// Appends gradients of `loss` (a scalar) for every parameter, clipping, and the update of every
// parameter and optimizer state (Graph::assign). Marks `loss` as output "loss".
TrainingGraph add_training(Graph& graph, ValueId loss, const OptimizerConfig& config);

// The second half of add_training on its own: clipping and the update of every parameter in
// `gradients` (parameter -> its gradient, any value of the parameter's type: an input when the
// gradients come from elsewhere, as in data-parallel training). Returns the gradient norm when
// clipping is on (also output "gradient_norm"), kNoValue otherwise. With skip_non_finite, `loss`
// (a scalar, when given) joins the gradients in the finiteness check.
ValueId add_optimizer_update(Graph& graph, const std::map<ValueId, ValueId>& gradients,
                             const OptimizerConfig& config, ValueId loss = kNoValue);

}  // namespace mg
