#include <algorithm>
#include <cmath>

#include "meganeura/error.hpp"
#include "meganeura/train.hpp"

namespace mg {

LossScaler::LossScaler(double scale, bool dynamic) : scale_(scale), dynamic_(dynamic) {
  if (!std::isfinite(scale) || scale < 1)
    throw Error("loss scale " + std::to_string(scale) +
                " is out of range: give a finite scale of at least 1");
}

double LossScaler::start_step() {
  started_.push_back(scale_);
  return scale_;
}

LossScaler::StepEnd LossScaler::end_step(bool dropped, bool loss_finite) {
  if (started_.empty()) throw Error("LossScaler: a step ended that was never started");
  const double used = started_.front();
  started_.pop_front();
  if (!dropped) {
    // An applied step at an older scale (queued before the last halving) says nothing of the
    // current one.
    if (dynamic_ && used == scale_ && ++good_steps_ == kGrowthInterval) {
      scale_ *= kGrowthFactor;
      good_steps_ = 0;
    }
    return StepEnd::applied;
  }
  if (!dynamic_ || !loss_finite || used <= 1) return StepEnd::non_finite;
  if (used == scale_) {
    scale_ = std::max(1.0, scale_ * kBackoffFactor);
    good_steps_ = 0;
  }
  return StepEnd::overflowed;
}

}  // namespace mg
