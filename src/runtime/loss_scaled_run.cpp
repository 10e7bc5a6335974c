#include "runtime/loss_scaled_run.hpp"

#include <cmath>

#include "meganeura/error.hpp"
#include "meganeura/train.hpp"

namespace mg {

double run_with_loss_scale(Session& session, const std::vector<std::string>& gradient_outputs) {
  const auto all_finite = [&] {
    for (const std::string& name : gradient_outputs) {
      for (float value : session.f32_output(name)) {
        if (!std::isfinite(value)) return false;
      }
    }
    return true;
  };
  LossScaler scaler;
  for (;;) {
    const double scale = scaler.start_step();
    session.set_input(kLossScaleInput, std::vector<float>{static_cast<float>(scale)});
    session.run();
    if (all_finite()) return scale;
    if (scaler.end_step(true) == LossScaler::StepEnd::non_finite)
      throw Error("the gradients are not finite even without loss scaling");
  }
}

}  // namespace mg
