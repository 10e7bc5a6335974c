#pragma once
// Runs a gradient-only program (a parity harness's) whose gradients come from scaled_gradients
// (include/meganeura/train.hpp): in fast precision the matrix products round their operands to
// f16, where an untrained model's cotangents underflow, so the program runs at
// LossScaler::kInitialScale and, while any gradient is non-finite, again at half the scale, as
// torch.cuda.amp.GradScaler does it. The caller divides the gradients it reads by the scale.
#include <string>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/session.hpp"

namespace mg {

// Runs `session` (whose graph has input kLossScaleInput) until every output named in
// `gradient_outputs` is finite and returns the scale of that run. Throws mg::Error when they are
// non-finite at scale 1, i.e. without scaling.
double run_with_loss_scale(Session& session, const std::vector<std::string>& gradient_outputs);

// A parity harness's gradients: the gradient of `loss` for every parameter of `graph` as output
// "grad.<parameter name>", from scaled_gradients when `scaled` (fast precision), else from
// gradients. Returns the output names, in parameter order.
std::vector<std::string> add_parameter_gradient_outputs(Graph& graph, ValueId loss, bool scaled);

// Runs `session`: with `scaled`, run_with_loss_scale over `gradient_outputs`, returning its
// scale; otherwise once, returning 1.
double run_gradients(Session& session, const std::vector<std::string>& gradient_outputs,
                     bool scaled);

}  // namespace mg
