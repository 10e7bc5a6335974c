#pragma once
// What every training job does with a step whose loss or gradients hold NaN or infinity. The
// training graph never applies such a step's update (OptimizerConfig::skip_non_finite), so the
// parameters stay those of the last finite step; then, as --on-nonfinite says:
//   stop (the default): the job stops as Ctrl-C stops it, after the step in flight, with a
//     checkpoint (of parameters that skip the non-finite steps), and the run ends non_finite;
//   skip: the job warns and goes on; metrics count the skipped steps.
// --detect-anomaly runs the first non-finite step again with every value checked and names the
// op that made the first NaN or infinity (cli/anomaly_finder.hpp).
// --loss-scale (OptimizerConfig::loss_scaling, LossScaler) belongs here too: a step whose scaled
// gradients overflow is dropped by the same gate, and told apart from a non-finite one by its
// finite loss at a scale above 1; it is counted as loss_scale_overflows and the job goes on.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/arguments.hpp"
#include "cli/training_support.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"

namespace mg::cli {

// The options, for each job's Arguments list.
inline constexpr const char* kOnNonFiniteOption = "on-nonfinite";
inline constexpr const char* kDetectAnomalySwitch = "detect-anomaly";
inline constexpr const char* kLossScaleOption = "loss-scale";
// Their lines in each job's --help.
inline constexpr const char* kOnNonFiniteHelp =
    R"(  --on-nonfinite P      a step whose loss or gradients hold NaN or infinity never updates
                        the parameters; then stop (the default: the run stops after the
                        step in flight with a checkpoint and ends non_finite, exit status 73)
                        or skip (warn, go on, count skipped_steps in metrics.jsonl)
)";
inline constexpr const char* kDetectAnomalyHelp =
    R"(  --detect-anomaly      on the first such step, run it again with every value checked and
                        name the op that made the first NaN or infinity (its node, op, type,
                        forward/backward/update and the nearest parameter); steps are not
                        queued behind each other in this mode
)";
inline constexpr const char* kLossScaleHelp =
    R"(  --loss-scale S        dynamic, off or a fixed scale (1 to 3.4e38): backward starts from
                        the loss times S, so that gradients too small for the f16 operands
                        of --precision fast survive, and the update divides them back.
                        dynamic (the default with --precision fast, except --distributed,
                        which has no loss scaling yet) starts at 65536, halves it on a step
                        whose scaled gradients overflow (that step's update is dropped and
                        counted as loss_scale_overflows, not skipped_steps) and doubles it
                        after 2000 applied steps; off is the default with strict and bf16
                        precision (bfloat16 keeps f32's range).
                        metrics.jsonl holds loss_scale and loss_scale_overflows
)";

class NonFiniteSteps {
 public:
  // Reads --on-nonfinite, --detect-anomaly, --loss-scale and --precision (for the default loss
  // scale; `distributed` turns that default off). Throws mg::Error on a bad value.
  explicit NonFiniteSteps(const Arguments& arguments, bool distributed = false);

  bool detects_anomaly() const { return detect_anomaly_; }
  void configure(OptimizerConfig& config) const {
    config.skip_non_finite = true;
    config.loss_scaling = scaler_.has_value();
  }
  // The inputs of training-graph run `step` (0-based): optimizer_inputs() and, with loss
  // scaling, kLossScaleInput, whose value the scaler remembers for this step until dropped()
  // reads its end. Call it once a run, in the order the runs start.
  std::map<std::string, double> step_inputs(const OptimizerConfig& config, int64_t step);
  // Sets those of them `training` has; returns them all (what an anomaly re-run needs).
  std::map<std::string, double> set_step_inputs(Session& training, const OptimizerConfig& config,
                                                int64_t step);

  // After finished step `step` (counted from 1) with `loss` and `dropped_flag`, the training
  // program's kNonFiniteOutput (NaN where the program has none: the loss alone decides). Returns
  // whether the step's update was dropped (its loss is then not to be averaged). A step dropped
  // for the loss scale is only counted (loss_scale_overflows); for any other, in stop mode it
  // asks the job to stop (stop_requested) and remembers why for finish_run(); `anomaly`, with
  // --detect-anomaly, describes the first non-finite value.
  bool dropped(double loss, double dropped_flag, int64_t step,
               const std::filesystem::path& checkpoint, ProgressLine& progress,
               const std::function<std::string()>& anomaly = {});
  int64_t dropped_steps() const { return dropped_steps_; }  // not counting scale overflows
  // With loss scaling: loss_scale (the scale of the next step) and loss_scale_overflows in a
  // metrics.jsonl record.
  void add_loss_scale(nlohmann::json& record) const;

 private:
  std::optional<LossScaler> scaler_;
  int64_t loss_scale_overflows_ = 0;
  bool skip_ = false;
  bool detect_anomaly_ = false;
  bool anomaly_reported_ = false;
  int64_t dropped_steps_ = 0;
};

// Called when a job returns: a job that stopped for a non-finite step throws its mg::Error
// (kind non_finite), which names the checkpoint the job saved as it stopped.
void throw_if_stopped_for_non_finite();

}  // namespace mg::cli
