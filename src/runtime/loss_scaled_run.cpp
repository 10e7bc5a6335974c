#include "runtime/loss_scaled_run.hpp"

#include <cmath>
#include <map>

#include "meganeura/autodiff.hpp"
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

std::vector<std::string> add_parameter_gradient_outputs(Graph& graph, ValueId loss, bool scaled) {
  const std::vector<ValueId> parameters = graph.leaves("parameter");
  const std::map<ValueId, ValueId> grads =
      scaled ? scaled_gradients(graph, loss, parameters) : gradients(graph, loss, parameters);
  std::vector<std::string> names;
  for (const auto& [parameter, grad] : grads) {
    names.push_back("grad." + graph.node(parameter).name);
    graph.set_output(names.back(), grad);
  }
  return names;
}

double run_gradients(Session& session, const std::vector<std::string>& gradient_outputs,
                     bool scaled) {
  if (scaled) return run_with_loss_scale(session, gradient_outputs);
  session.run();
  return 1.0;
}

}  // namespace mg
