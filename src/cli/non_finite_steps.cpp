#include "cli/non_finite_steps.hpp"

#include <cmath>
#include <cstdio>

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

}  // namespace

NonFiniteSteps::NonFiniteSteps(const Arguments& arguments)
    : detect_anomaly_(arguments.has(kDetectAnomalySwitch)) {
  const std::string policy = arguments.text(kOnNonFiniteOption, "stop");
  if (policy != "stop" && policy != "skip")
    throw Error("unknown --on-nonfinite '" + policy + "' (stop or skip)");
  skip_ = policy == "skip";
}

bool NonFiniteSteps::dropped(double loss, double dropped_flag, int64_t step,
                             const std::filesystem::path& checkpoint, ProgressLine& progress,
                             const std::function<std::string()>& anomaly) {
  const bool flagged = std::isnan(dropped_flag) ? !std::isfinite(loss) : dropped_flag != 0;
  if (!flagged) return false;
  ++dropped_steps_;
  std::string what = std::isfinite(loss) ? "a gradient became NaN or infinite"
                                         : "the loss became " + value_text(loss);
  what += " at step " + std::to_string(step) + " and its update was not applied";
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
