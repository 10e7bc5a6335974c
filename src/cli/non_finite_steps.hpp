#pragma once
// What every training job does with a step whose loss or gradients hold NaN or infinity. The
// training graph never applies such a step's update (OptimizerConfig::skip_non_finite), so the
// parameters stay those of the last finite step; then, as --on-nonfinite says:
//   stop (the default): the job stops as Ctrl-C stops it, after the step in flight, with a
//     checkpoint (of parameters that skip the non-finite steps), and the run ends non_finite;
//   skip: the job warns and goes on; metrics count the skipped steps.
// --detect-anomaly runs the first non-finite step again with every value checked and names the
// op that made the first NaN or infinity (cli/anomaly_finder.hpp).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "cli/arguments.hpp"
#include "cli/training_support.hpp"
#include "meganeura/train.hpp"

namespace mg::cli {

// The options, for each job's Arguments list.
inline constexpr const char* kOnNonFiniteOption = "on-nonfinite";
inline constexpr const char* kDetectAnomalySwitch = "detect-anomaly";
// Their lines in each job's --help (--detect-anomaly: the jobs whose program is a
// TrainingProgram, the classifier and language-model jobs).
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

class NonFiniteSteps {
 public:
  explicit NonFiniteSteps(const Arguments& arguments);  // throws mg::Error on a bad value

  bool detects_anomaly() const { return detect_anomaly_; }
  void configure(OptimizerConfig& config) const { config.skip_non_finite = true; }

  // After finished step `step` (counted from 1) with `loss` and `dropped_flag`, the training
  // program's kNonFiniteOutput (NaN where the program has none: the loss alone decides). Returns
  // whether the step's update was dropped (its loss is then not to be averaged). In stop mode it
  // asks the job to stop (stop_requested) and remembers why for finish_run(); `anomaly`, with
  // --detect-anomaly, describes the first non-finite value.
  bool dropped(double loss, double dropped_flag, int64_t step,
               const std::filesystem::path& checkpoint, ProgressLine& progress,
               const std::function<std::string()>& anomaly = {});
  int64_t dropped_steps() const { return dropped_steps_; }

 private:
  bool skip_ = false;
  bool detect_anomaly_ = false;
  bool anomaly_reported_ = false;
  int64_t dropped_steps_ = 0;
};

// Called when a job returns: a job that stopped for a non-finite step throws its mg::Error
// (kind non_finite), which names the checkpoint the job saved as it stopped.
void throw_if_stopped_for_non_finite();

}  // namespace mg::cli
