#pragma once
// Turning a model graph into a training graph: gradients, optional global-norm clipping and an
// optimizer update expressed as graph ops, with the optimizer's moments as state leaves (so a
// checkpoint holds them and the memory planner places them in the persistent region).
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

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
  // Non-finite steps: the update (parameters, every optimizer state, and the state the graph
  // itself assigns, such as batch norm's running statistics) is kept only where the loss and the
  // gradients are finite, and output kNonFiniteOutput says whether it was dropped.
  // The check reads the sum of squares clipping computes, or without clipping a plain sum of
  // each gradient (one reduction a parameter). A skipped micro-step of an accumulation group
  // adds nothing.
  bool skip_non_finite = false;
  // Loss scaling, for fast precision, whose matrix products round both operands to f16: backward
  // starts from input kLossScaleInput instead of 1, so that cotangents below f16's smallest
  // subnormal still count, and the update multiplies each gradient by the scale's reciprocal
  // before accumulation, clipping, the finiteness check and the optimizer, which all see the
  // true gradients (without accumulation and clipping the reciprocal joins the optimizer's own
  // factors, which fusion keeps in the update's kernels). A scale too large overflows a
  // gradient and drops the step as any non-finite one, so this needs skip_non_finite
  // (add_training and add_optimizer_update throw otherwise); LossScaler picks each step's scale.
  // Off builds exactly the graph without the feature.
  bool loss_scaling = false;
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
// Only with loss_scaling: the factor backward's seed is multiplied by (the loss's type), which
// optimizer_inputs() leaves out: the caller sets it each run (LossScaler::start_step()).
inline constexpr const char* kLossScaleInput = "optimizer.loss_scale";

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
// With loss_scaling, `gradients` are those of the loss times kLossScaleInput (a scalar input,
// created here when the graph has none) and the update divides them by it first.
ValueId add_optimizer_update(Graph& graph, const std::map<ValueId, ValueId>& gradients,
                             const OptimizerConfig& config, ValueId loss = kNoValue);

// Gradients of `loss` for each value in `wrt` as gradients() makes them, but seeded with input
// kLossScaleInput (the loss's type) instead of ones, so each is the true gradient times the
// scale fed. For gradient-only programs in fast precision (parity harnesses): feed
// LossScaler::kInitialScale, divide the fetched gradients by it, and run again at half the scale
// while any of them is non-finite (LossScaler does the bookkeeping).
std::map<ValueId, ValueId> scaled_gradients(Graph& graph, ValueId loss,
                                            const std::vector<ValueId>& wrt);

// The scale of each step with loss scaling, as torch.cuda.amp.GradScaler picks it: start at
// kInitialScale; a step whose update was dropped (some scaled gradient overflowed) halves it; a
// run of kGrowthInterval applied steps doubles it. Steps may be queued one ahead of the one the
// host reads back, so each started step remembers the scale it ran at, and a dropped step halves
// the scale only when it ran at the current one (the step before it may have halved it already).
// The scale never goes below 1: a step dropped at scale 1 has non-finite gradients unscaled, a
// real non-finite step. A fixed scale (dynamic = false) never changes, and every dropped step
// is a real non-finite one.
class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;  // 2^16
  static constexpr double kBackoffFactor = 0.5;
  static constexpr double kGrowthFactor = 2.0;
  static constexpr int64_t kGrowthInterval = 2000;

  // Throws mg::Error when `scale` is below 1 or not finite.
  explicit LossScaler(double scale = kInitialScale, bool dynamic = true);

  double scale() const { return scale_; }  // the scale the next step starts at
  bool dynamic() const { return dynamic_; }

  // A step starts: returns the scale to feed as kLossScaleInput, and remembers it.
  double start_step();

  // How the oldest started step ended.
  enum class StepEnd {
    applied,     // its update was applied
    overflowed,  // dropped for the scale: the scale is halved (or already was), retry or go on
    non_finite,  // dropped with a non-finite loss, at scale 1 or at a fixed scale: a real one
  };
  // The oldest started step ended; `dropped` is its kNonFiniteOutput, `loss_finite` whether its
  // loss was finite (a non-finite loss does not come from the scale, which backward alone sees).
  // Throws mg::Error when no step was started.
  StepEnd end_step(bool dropped, bool loss_finite = true);

 private:
  double scale_;
  bool dynamic_;
  int64_t good_steps_ = 0;      // applied steps in a row at the current scale
  std::deque<double> started_;  // the scale of each step started and not yet ended
};

}  // namespace mg
