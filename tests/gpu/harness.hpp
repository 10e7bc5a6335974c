#pragma once
// The GPU op harness (like ggml's test-backend-ops): builds a small graph, runs it on the GPU
// through a Session, and compares every output with the f64 reference interpreter using the
// normalised error ||gpu - ref|| / ||ref||.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"
#include "meganeura/switches.hpp"
#include "ops/interpreter.hpp"

namespace mg::testing {

struct HarnessInput {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  double low = -1.0, high = 1.0;  // f32 range; i32 draws integers in [low, high)
};

inline double normalized_error(const std::vector<float>& gpu, const HostTensor& reference) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) return INFINITY;
    difference += std::pow(gpu[i] - reference.data[i], 2);
    norm += std::pow(reference.data[i], 2);
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-30);
}

// The switches a test sets in-process (docs/SWITCHES.md), and how many times what the test built
// has read them (switches()).
struct SwitchOverlay {
  std::vector<std::pair<std::string, std::string>> values;  // innermost last
  size_t reads = 0;
};
inline SwitchOverlay& switch_overlay() {
  static SwitchOverlay overlay;
  return overlay;
}

// The switches for what a test builds: the environment's, with those of every live ScopedSwitch
// in place (the innermost wins). The harness passes them to every session (check_on_gpu) and
// device traits it makes; tests that make their own pass them too.
inline Switches switches() {
  SwitchOverlay& overlay = switch_overlay();
  ++overlay.reads;
  std::map<std::string, std::string, std::less<>> values;
  for (const auto& [name, value] : overlay.values) values[name] = value;
  return Switches::from_environment(values);
}

// Sets a switch for what the test builds during the object's lifetime; the process environment
// stays as it is. Fails the test if nothing read the switches meanwhile (a switch that would
// have changed nothing), unless it is a default for a whole suite (Check::none).
class ScopedSwitch {
 public:
  enum class Check { read, none };
  ScopedSwitch(const char* name, const std::string& value, Check check = Check::read)
      : name_(name), check_(check), reads_at_start_(switch_overlay().reads) {
    switch_overlay().values.emplace_back(name, value);
  }
  ~ScopedSwitch() {
    SwitchOverlay& overlay = switch_overlay();
    overlay.values.pop_back();
    if (check_ == Check::read) {
      EXPECT_GT(overlay.reads, reads_at_start_)
          << name_ << " was set but nothing read the switches";
    }
  }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  const char* name_;
  Check check_;
  size_t reads_at_start_;
};

// `device` (target::DeviceTraits) with the test's switches, as a lowering reads them.
template <typename Traits>
Traits switched(Traits device) {
  device.switches = switches();
  return device;
}

// SessionOptions with switches() in place.
inline SessionOptions session_options() {
  SessionOptions options;
  options.switches = switches();
  return options;
}

// A malformed tuning switch: with `variable` set to `bad`, `build` (which reads switches()) must
// throw an mg::Error that quotes the setting (VARIABLE='bad'), reading the switches or lowering
// with them.
inline void expect_switch_rejected(const char* variable, const std::string& bad,
                                   const std::function<void()>& build) {
  const ScopedSwitch forced(variable, bad);
  try {
    build();
    ADD_FAILURE() << variable << "=" << bad << " was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(std::string(variable) + "='" + bad + "'"),
              std::string::npos)
        << error.what();
  }
}

// Runs `build` (which returns the named outputs it sets on the graph) on the GPU and on the
// reference, checking each output. Returns the worst error; `dispatches` receives the
// session's kernel dispatch count and `dispatch_list` its dispatches, one line each
// (BuildReport::dispatch_list). Validation stays on unless a test needs an extension Debian's
// validation layer predates (KHR cooperative matrices).
inline double check_on_gpu(const std::vector<HarnessInput>& inputs,
                           const std::function<void(Graph&, std::vector<Tensor>&)>& build,
                           double tolerance = 1e-5, uint64_t seed = 7, SessionOptions options = {},
                           size_t* dispatches = nullptr, bool validation = true,
                           std::string* dispatch_list = nullptr) {
  std::mt19937_64 generator(seed);
  Graph graph;
  std::vector<Tensor> tensors;
  Environment environment;
  for (const HarnessInput& spec : inputs) {
    tensors.push_back(input(graph, spec.name, spec.shape, spec.dtype));
    HostTensor value(spec.shape);
    for (double& element : value.data) {
      if (spec.dtype == DType::i32) {
        element =
            std::floor(std::uniform_real_distribution<double>(spec.low, spec.high)(generator));
      } else {
        element = static_cast<float>(
            std::uniform_real_distribution<double>(spec.low, spec.high)(generator));
      }
    }
    environment.leaves[spec.name] = value;
  }
  build(graph, tensors);
  initialise_leaves(graph, environment, options.seed);
  const std::vector<HostTensor> reference = evaluate(graph, environment);

  if (!options.switches) options.switches = switches();
  options.validation = validation;
  options.guard_bytes = 64;  // catches kernels writing past their outputs
  Session session(graph, options);
  for (const HarnessInput& spec : inputs) {
    if (!session.has_input(spec.name)) continue;
    const std::vector<double>& data = environment.leaves[spec.name].data;
    if (spec.dtype == DType::i32) {
      std::vector<int32_t> values(data.begin(), data.end());
      session.set_input(spec.name, values);
    } else {
      std::vector<float> values(data.begin(), data.end());
      session.set_input(spec.name, values);
    }
  }
  session.run();
  if (dispatches) *dispatches = session.report().dispatches;
  if (dispatch_list) *dispatch_list = session.report().dispatch_list;
  double worst = 0;
  for (const auto& [name, id] : graph.outputs()) {
    const double error = normalized_error(session.output(name), reference[id]);
    EXPECT_LT(error, tolerance) << "output '" << name << "' of type "
                                << type_string(graph.type(id));
    worst = std::max(worst, error);
  }
  EXPECT_NO_THROW(session.check_guards());
  EXPECT_EQ(session.validation_messages(), 0u);
  return worst;
}

// Inputs x [2, 13, 24], w [24, 10], bias [10] and v [2, 10, 7] of `dtype` (ragged extents, so
// that conversions' tails run too) and a block of ops of every kernel family over them: outputs
// hidden = relu(x w + bias), mixed = softmax(hidden) v (a batched product) and total, the sum of
// mixed in f32. The 16-bit tensor tests run it against the reference.
inline std::vector<HarnessInput> half_block_inputs(DType dtype) {
  return {{"x", {2, 13, 24}, dtype},
          {"w", {24, 10}, dtype},
          {"bias", {10}, dtype},
          {"v", {2, 10, 7}, dtype}};
}
inline Tensor half_block(Graph& graph, std::vector<Tensor>& in) {
  const Tensor hidden = relu(matmul(in[0], in[1]) + in[2]);
  const Tensor mixed = matmul(softmax(hidden, -1), in[3]);
  graph.set_output("hidden", hidden.id());
  graph.set_output("mixed", mixed.id());
  graph.set_output("total", sum_all(cast(mixed, DType::f32)).id());
  return hidden;
}

}  // namespace mg::testing
