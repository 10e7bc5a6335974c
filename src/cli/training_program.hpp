#pragma once
// The training program of a `meganeura train` job: add_training's single program when the job
// runs alone, a DataParallelTrainer when it is one rank of a distributed run.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <vector>

#include "cli/anomaly_finder.hpp"
#include "cli/distributed_run.hpp"
#include "cli/non_finite_steps.hpp"
#include "io/checkpoint.hpp"
#include "meganeura/distributed.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {

class TrainingProgram {
 public:
  // `loss_graph` has output "loss" (a mean over the batch) and the inputs of this process's
  // share of the batch.
  // `non_finite` (which outlives the program) gives each step's inputs, the loss scale among
  // them. With its --detect-anomaly, find_anomaly() can run a step again value by value (in a
  // distributed run each rank its share, the ranks' findings gathered); steps are then not
  // queued, so that the parameters are still those before the step.
  TrainingProgram(const Graph& loss_graph, const OptimizerConfig& optimizer,
                  const DistributedRun& run, const SessionOptions& options,
                  NonFiniteSteps& non_finite);
  ~TrainingProgram();

  // Whether a step can be queued behind the one in flight (start() returns before it ends).
  bool queues_steps() const { return fused_ != nullptr && !anomaly_; }
  // Parameters and optimizer state: checkpoints and weights are read and written here.
  Session& state();
  // The program that --trace profiles.
  Session& traced();
  // The program holding every leaf of the loss graph, its parameters and its own state (batch
  // norm's running statistics): pretrained weights are written here. In a distributed run the
  // gradient program, whose state is this rank's (each rank updates its running statistics from
  // its share of the batch).
  Session& model();
  // Every parameter and state leaf, the optimizer's and the loss graph's, as checkpoint tensors.
  std::vector<io::TensorRecord> tensors();
  // Writes every one of them from `checkpoint` (read from `path`); throws mg::Error naming the
  // file and a tensor it lacks.
  void load(const io::Checkpoint& checkpoint, const std::filesystem::path& path);
  const BuildReport& report() const;

  void set_input(std::string_view name, std::span<const float> values);
  void set_input(std::string_view name, std::span<const int32_t> values);
  // Starts step `index` (alone: queued behind the one in flight), or in a distributed run runs
  // it, the ranks together.
  void start(int64_t index);
  void finish();        // waits for the step in flight
  double loss() const;  // the last finished step's loss over the global batch
  // The last finished step's kNonFiniteOutput: 1 when its update was dropped; NaN in a
  // distributed run (whose update program gates itself; the loss tells the host).
  double dropped_flag() const;
  // With detect_anomaly: runs the last finished step again, with the inputs it ran with, and
  // describes its first non-finite value (AnomalyFinder::find).
  std::string find_anomaly();
  std::vector<float> output(std::string_view name) const;  // this process's share
  // In a distributed run, where the last step's time went (DataParallelTrainer::StepTimes) as
  // gradients_ms, reduction_ms, update_ms, segments and sums_during_backward in `record`;
  // nothing alone.
  void add_step_times(nlohmann::json& record) const;

 private:
  OptimizerConfig optimizer_;
  NonFiniteSteps* non_finite_;
  std::map<std::string, double> last_inputs_;  // of the last step, with --detect-anomaly
  std::unique_ptr<Session> fused_;
  std::unique_ptr<DataParallelTrainer> parallel_;
  std::unique_ptr<AnomalyFinder> anomaly_;
};

}  // namespace mg::cli
