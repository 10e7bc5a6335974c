#pragma once
// --detect-anomaly: re-runs a training step whose loss or gradients were not finite with every
// value of the training graph kept and fetched, and names the first node that made NaN or
// infinity out of finite inputs (its op, where it sits, its type), as PyTorch's anomaly mode
// names the backward function. The step's inputs are recorded as they are set (a copy a step,
// only in this mode) and the parameters are read from the training program, whose update the
// non-finite step did not apply.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/distributed.hpp"
#include "meganeura/graph.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"

namespace mg::cli {

class NonFiniteSteps;

class AnomalyFinder {
 public:
  // `training_graph` with its optimizer update and `training` what add_training returned for
  // it (the loss and gradients divide forward, backward and update). `options` as the training
  // program's (device and precision).
  AnomalyFinder(const Graph& training_graph, const TrainingGraph& training,
                const SessionOptions& options);
  ~AnomalyFinder();

  void record_input(std::string_view name, std::span<const float> values);
  void record_input(std::string_view name, std::span<const int32_t> values);

  // Runs the recorded step (`step_inputs`: the optimizer's scalar inputs of that step) from the
  // parameters and state that `read` gives by name, and describes the first non-finite value on
  // one line; none where every value is finite this time. The checking program is built on the
  // first call.
  using PersistentReader = std::function<std::vector<float>(const std::string& name)>;
  std::optional<std::string> find(const PersistentReader& read,
                                  const std::map<std::string, double>& step_inputs);

 private:
  Graph graph_;
  ValueId loss_;
  ValueId last_gradient_ = 0;
  std::vector<bool> live_;
  SessionOptions options_;
  std::map<std::string, std::vector<float>, std::less<>> float_inputs_;
  std::map<std::string, std::vector<int32_t>, std::less<>> int_inputs_;
  std::unique_ptr<Session> checker_;
};

// The line for NonFiniteSteps::dropped from one process's finding (AnomalyFinder::find).
std::string anomaly_text(const std::optional<std::string>& finding);

// In a distributed run, every rank with its finding on its own share of the batch: the finding
// of the lowest rank that has one, the same line on every rank. Every rank must call it.
std::string anomaly_text_across_ranks(Communicator& communicator,
                                      const std::optional<std::string>& finding);

// For the jobs whose training program is a Session of their own (Whisper, SmolVLA, U-Net): sets
// that Session's inputs and, with a finder (--detect-anomaly), records them and the step's
// optimizer inputs so that the finder can run the step again.
class RecordedInputs {
 public:
  explicit RecordedInputs(Session& session, std::unique_ptr<AnomalyFinder> finder = nullptr);
  ~RecordedInputs();

  void set(std::string_view name, std::span<const float> values);
  void set(std::string_view name, std::span<const int32_t> values);
  // NonFiniteSteps::set_step_inputs, remembered.
  void set_step(NonFiniteSteps& non_finite, const OptimizerConfig& config, int64_t step);
  // What NonFiniteSteps::dropped takes as `anomaly`: empty without a finder.
  std::function<std::string()> anomaly();

 private:
  Session* session_;
  std::unique_ptr<AnomalyFinder> finder_;
  std::map<std::string, double> step_inputs_;
};

}  // namespace mg::cli
