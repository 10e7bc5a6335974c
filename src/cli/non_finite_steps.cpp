#include "cli/non_finite_steps.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace mg::cli {

namespace {

// Why the job of this process was asked to stop, and where it saves its checkpoint.
struct NonFiniteStop {
  std::string message;
  std::filesystem::path checkpoint;
};
std::optional<NonFiniteStop> pending_stop;

std::string value_text(double value) {
  return std::isnan(value)   ? "nan"
         : std::isinf(value) ? (value > 0 ? "inf" : "-inf")
                             : std::to_string(value);
}

// --loss-scale: dynamic, off or a fixed scale; unset, dynamic in fast precision alone (bf16
// keeps f32's range).
std::optional<LossScaler> loss_scaler(const Arguments& arguments, bool distributed) {
  const bool fast = parse_precision(arguments.text("precision", "strict")) == Precision::fast;
  const std::string text =
      arguments.text(kLossScaleOption, fast && !distributed ? "dynamic" : "off");
  if (text == "off") return std::nullopt;
  if (text == "dynamic") return LossScaler();
  const auto bad = [&] {
    return Error("bad --loss-scale '" + text +
                 "' (dynamic, off or a fixed scale from 1 to 3.4e38)");
  };
  size_t used = 0;
  double scale = NAN;
  try {
    scale = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  // Fed as an f32 input: past f32's largest value it would be infinite.
  if (used != text.size() || !(scale >= 1 && scale <= std::numeric_limits<float>::max()))
    throw bad();
  return LossScaler(scale, false);
}

}  // namespace

NonFiniteSteps::NonFiniteSteps(const Arguments& arguments, bool distributed)
    : scaler_(loss_scaler(arguments, distributed)),
      detect_anomaly_(arguments.has(kDetectAnomalySwitch)) {
  const std::string policy = arguments.text(kOnNonFiniteOption, "stop");
  if (policy != "stop" && policy != "skip")
    throw Error("unknown --on-nonfinite '" + policy + "' (stop or skip)");
  skip_ = policy == "skip";
}

std::map<std::string, double> NonFiniteSteps::step_inputs(const OptimizerConfig& config,
                                                          int64_t step) {
  std::map<std::string, double> inputs = optimizer_inputs(config, step);
  if (scaler_) inputs[kLossScaleInput] = scaler_->start_step();
  return inputs;
}

std::map<std::string, double> NonFiniteSteps::set_step_inputs(Session& training,
                                                              const OptimizerConfig& config,
                                                              int64_t step) {
  std::map<std::string, double> inputs = step_inputs(config, step);
  for (const auto& [name, value] : inputs) {
    if (training.has_input(name))
      training.set_input(name, std::vector<float>{static_cast<float>(value)});
  }
  return inputs;
}

void NonFiniteSteps::add_loss_scale(nlohmann::json& record) const {
  if (!scaler_) return;
  record["loss_scale"] = scaler_->scale();
  record["loss_scale_overflows"] = loss_scale_overflows_;
}

bool NonFiniteSteps::dropped(double loss, double dropped_flag, int64_t step,
                             const std::filesystem::path& checkpoint, ProgressLine& progress,
                             const std::function<std::string()>& anomaly) {
  const bool flagged = std::isnan(dropped_flag) ? !std::isfinite(loss) : dropped_flag != 0;
  if (scaler_ &&
      scaler_->end_step(flagged, std::isfinite(loss)) == LossScaler::StepEnd::overflowed) {
    ++loss_scale_overflows_;
    return true;
  }
  if (!flagged) return false;
  ++dropped_steps_;
  std::string what = std::isfinite(loss) ? "a gradient became NaN or infinite"
                                         : "the loss became " + value_text(loss);
  what += " at step " + std::to_string(step) + " and its update was not applied";
  // A fixed scale is the user's to lower; a dynamic one got here only at 1.
  if (scaler_ && std::isfinite(loss) && scaler_->scale() > 1)
    what += " (its gradients were scaled by --loss-scale " + value_text(scaler_->scale()) +
            ", which a smaller scale may keep finite)";
  if (anomaly && !anomaly_reported_) {
    anomaly_reported_ = true;
    if (const std::string found = anomaly(); !found.empty()) what += "; " + found;
  }
  if (skip_) {
    progress.finish();
    std::fprintf(stderr, "warning: %s (--on-nonfinite skip: %lld steps skipped so far)\n",
                 what.c_str(), static_cast<long long>(dropped_steps_));
    return true;
  }
  if (!pending_stop) {
    pending_stop = NonFiniteStop{what, checkpoint};
    stop_requested = true;
  }
  return true;
}

void throw_if_stopped_for_non_finite() {
  if (!pending_stop) return;
  const NonFiniteStop stop = *pending_stop;
  pending_stop.reset();
  throw Error(stop.message + "; the run stopped: " + last_checkpoint_text(stop.checkpoint) +
                  ", whose parameters skip the non-finite steps; resume it with a smaller --lr "
                  "(or --on-nonfinite skip)",
              Error::Kind::non_finite);
}

}  // namespace mg::cli
