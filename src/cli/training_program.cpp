#include "cli/training_program.hpp"

#include <algorithm>
#include <cmath>

#include "cli/training_run.hpp"

namespace mg::cli {

TrainingProgram::TrainingProgram(const Graph& loss_graph, const OptimizerConfig& optimizer,
                                 const DistributedRun& run, const SessionOptions& options,
                                 NonFiniteSteps& non_finite)
    : optimizer_(optimizer), non_finite_(&non_finite) {
  const ValueId loss = loss_graph.output("loss");
  if (run.distributed()) {
    parallel_ = std::make_unique<DataParallelTrainer>(
        loss_graph, loss, optimizer, run.communicator(), options, run.parallel_options());
    // Each rank checks its own share as one process would train on it: the forward and backward
    // are those of the distributed step, the update (of unsummed gradients) this rank's alone.
    if (non_finite.detects_anomaly()) {
      Graph graph = loss_graph;
      const TrainingGraph training = add_training(graph, loss, optimizer);
      anomaly_ = std::make_unique<AnomalyFinder>(graph, training, options);
    }
  } else {
    Graph graph = loss_graph;
    const TrainingGraph training = add_training(graph, loss, optimizer);
    fused_ = std::make_unique<Session>(graph, options);
    if (non_finite.detects_anomaly())
      anomaly_ = std::make_unique<AnomalyFinder>(graph, training, options);
  }
}

TrainingProgram::~TrainingProgram() = default;

Session& TrainingProgram::state() {
  return fused_ ? *fused_ : parallel_->state();
}

Session& TrainingProgram::traced() {
  return fused_ ? *fused_ : parallel_->gradient_program();
}

Session& TrainingProgram::model() {
  return fused_ ? *fused_ : parallel_->gradient_program();
}

std::vector<io::TensorRecord> TrainingProgram::tensors() {
  std::vector<io::TensorRecord> records = session_tensors(state());
  if (parallel_) {
    // The parameters are shared by both programs; the gradient program adds the loss graph's
    // state.
    const std::vector<std::string> parameters = state().persistent_names();
    for (io::TensorRecord& record : session_tensors(model())) {
      if (std::find(parameters.begin(), parameters.end(), record.name) == parameters.end())
        records.push_back(std::move(record));
    }
  }
  return records;
}

void TrainingProgram::load(const io::Checkpoint& checkpoint, const std::filesystem::path& path) {
  if (parallel_) load_tensors(model(), checkpoint, path, true);
  load_tensors(state(), checkpoint, path, true);
}

const BuildReport& TrainingProgram::report() const {
  return fused_ ? fused_->report() : parallel_->report();
}

void TrainingProgram::set_input(std::string_view name, std::span<const float> values) {
  if (anomaly_) anomaly_->record_input(name, values);
  if (fused_) return fused_->set_input(name, values);
  parallel_->set_input(name, values);
}

void TrainingProgram::set_input(std::string_view name, std::span<const int32_t> values) {
  if (anomaly_) anomaly_->record_input(name, values);
  if (fused_) return fused_->set_input(name, values);
  parallel_->set_input(name, values);
}

void TrainingProgram::start(int64_t index) {
  if (!fused_) {
    if (anomaly_) last_inputs_ = non_finite_->step_inputs(optimizer_, index);
    return parallel_->step(index);
  }
  last_inputs_ = non_finite_->set_step_inputs(*fused_, optimizer_, index);
  fused_->start_run();
}

void TrainingProgram::finish() {
  if (fused_) fused_->finish_run();
}

double TrainingProgram::loss() const {
  return fused_ ? fused_->scalar_output("loss") : parallel_->loss();
}

double TrainingProgram::dropped_flag() const {
  if (fused_ && optimizer_.skip_non_finite) return fused_->scalar_output(kNonFiniteOutput);
  return NAN;
}

std::string TrainingProgram::find_anomaly() {
  if (!anomaly_) return "";
  if (fused_) {
    return anomaly_text(anomaly_->find(
        [this](const std::string& name) { return fused_->read(name); }, last_inputs_));
  }
  // Parameters and the optimizer's state live in the update program, the loss graph's own
  // state (batch norm's running statistics) in the gradient program.
  const std::vector<std::string> updated = parallel_->state().persistent_names();
  return anomaly_text_across_ranks(
      parallel_->communicator(),
      anomaly_->find(
          [&](const std::string& name) {
            const bool in_state = std::find(updated.begin(), updated.end(), name) != updated.end();
            return in_state ? parallel_->state().read(name)
                            : parallel_->gradient_program().read(name);
          },
          last_inputs_));
}

std::vector<float> TrainingProgram::output(std::string_view name) const {
  return fused_ ? fused_->output(name) : parallel_->output(name);
}

void TrainingProgram::add_step_times(nlohmann::json& record) const {
  if (!parallel_) return;
  const DataParallelTrainer::StepTimes times = parallel_->last_step_times();
  record["gradients_ms"] = times.gradients_ms;
  record["reduction_ms"] = times.reduction_ms;
  record["update_ms"] = times.update_ms;
  record["segments"] = times.segments;
  record["sums_during_backward"] = times.sums_started_during_backward;
}

}  // namespace mg::cli
