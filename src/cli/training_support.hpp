#pragma once
// What the training jobs of `meganeura train` (the classifiers, the ResNets, the language models,
// Whisper, SmolVLA and the U-Net) share: their options, the output folder, the progress line,
// Ctrl-C, the metrics record of a step and the step loop.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/arguments.hpp"
#include "io/checkpoint.hpp"
#include "meganeura/error.hpp"
#include "meganeura/train.hpp"

namespace mg::cli {

class NonFiniteSteps;

// Set by SIGINT and SIGTERM once install_stop_handlers() ran: the job stops after the current
// step and saves a checkpoint.
extern std::atomic<bool> stop_requested;
void install_stop_handlers();

// The options and switches every `meganeura train` job reads (model and data, output folder,
// batch and step loop, optimizer and schedule, clipping, seed, device, precision, checkpoints,
// metrics, trace, non-finite steps, loss scale): a job's Arguments are these and its own. An option
// belongs here only while every job reads it, since a job that ignored it would accept it silently.
Arguments training_arguments(const std::vector<std::string>& words,
                             const std::set<std::string>& job_options,
                             const std::set<std::string>& job_switches);
// A job's --help: its own text, then the lines of the shared non-finite, anomaly and loss-scale
// options.
void print_training_help(const char* job_help);

std::string default_out_dir();  // runs/<timestamp>
// Creates the output directory, or says why it cannot be written, before the data is loaded and
// the programs are built rather than after.
void prepare_out_dir(const std::filesystem::path& out_dir);
// A folder that already holds a run (a checkpoint or metrics) is refused unless --resume
// continues it or --overwrite replaces it; with --overwrite (and no --resume) its metrics are
// removed so the new run's log starts empty.
void claim_out_dir(const std::filesystem::path& out_dir, const Arguments& arguments);
// On resume: drops the metrics lines logged past the checkpoint's step (a run killed between an
// evaluation and its checkpoint logged them, and will log them again).
void drop_metrics_after(const std::filesystem::path& metrics_path, int64_t step);
std::string format_duration(double seconds);  // m:ss

// Runs `action`; an mg::Error of the default kind (input) it throws is rethrown as `kind`, so
// that the run monitor can tell a data or checkpoint failure from bad usage.
template <typename Action>
auto with_kind(Error::Kind kind, Action action) {
  try {
    return action();
  } catch (const Error& error) {
    if (error.kind() != Error::Kind::input) throw;
    throw Error(error.what(), kind);
  }
}

// Starts this process's run record (cli/run_record.hpp) in `out_dir`: the command is
// "meganeura train" and `words`.
void start_run_record(const std::filesystem::path& out_dir, const std::vector<std::string>& words,
                      const nlohmann::json& config, const std::string& device);
// A single-process job's start: prepare_out_dir, claim_out_dir, and the run record with `config`
// and the --device option.
void open_run(const std::filesystem::path& out_dir, const Arguments& arguments,
              const std::vector<std::string>& words, const nlohmann::json& config);
// The checkpoint --resume names, or nothing without --resume. One that cannot be read is a
// checkpoint error (exit status 74); with `model_json`, one that holds another model is bad input.
std::optional<io::Checkpoint> resumed_checkpoint(const Arguments& arguments);
std::optional<io::Checkpoint> resumed_checkpoint(const Arguments& arguments,
                                                 const nlohmann::json& model_json);
// Saves a checkpoint (a failure is a checkpoint error for the run monitor) and notes it in the
// run record.
void save_run_checkpoint(const std::filesystem::path& path, const io::Checkpoint& checkpoint);
// "the last checkpoint is P (step N)", or that there is none yet.
std::string last_checkpoint_text(const std::filesystem::path& checkpoint_path);

// --optimizer, --lr, --weight-decay, --momentum, --clip, --warmup, --accumulate and --schedule,
// with the given defaults where the option is absent.
struct OptimizerDefaults {
  std::string optimizer = "adam";
  double learning_rate = 2e-3;
  double weight_decay = 0.0;
  std::string schedule = "constant";
};
OptimizerConfig optimizer_from(const Arguments& arguments, int64_t total_steps,
                               const OptimizerDefaults& defaults = {});
nlohmann::json optimizer_json(const OptimizerConfig& config);

// One status line, redrawn in place on a terminal and printed every few seconds otherwise.
class ProgressLine {
 public:
  ProgressLine();
  void update(const std::string& text, bool force);
  void finish();

 private:
  bool terminal_;
  std::chrono::steady_clock::time_point last_{};
};

std::string bar(double fraction);  // [#####...............]

// A training loop's pace in this process, from the step it started at (after a resume, the
// checkpoint's).
class StepPace {
 public:
  explicit StepPace(int64_t first_step)
      : first_step_(first_step), start_(std::chrono::steady_clock::now()) {}

  // Over the steps done since the start, `step` being the count done so far.
  double steps_per_second(int64_t step) const;
  bool ran_steps(int64_t step) const { return step > first_step_; }
  double seconds_per_step(int64_t step) const;

 private:
  int64_t first_step_;
  std::chrono::steady_clock::time_point start_;
};

// An exponential moving average: `average` moved toward `value` by `weight`, or `value` itself
// while there is no average yet (NaN).
double moving_average(double average, double value, double weight);

// A throughput for the progress line, "12.3 clips/s" with `decimals` digits after the point.
std::string rate_text(double per_second, int decimals, const std::string& unit);

// The classifiers' rate: their smoothed accuracy and throughput, "acc 91.2% 1234 img/s".
std::string accuracy_rate_text(double accuracy, double images_per_second);

// The progress line of a training step: "epoch E/N [bar] step S/T loss L RATE ETA m:ss", with
// `rate` the job's throughput ("1234 tokens/s") and the ETA from `steps_per_second`.
std::string step_line(int64_t epoch, int64_t epochs, int64_t step, int64_t total_steps,
                      double smoothed_loss, const std::string& rate, double steps_per_second);

bool running_on_cpu_device(const std::string& selector);

// What every job's metrics.jsonl record of step `steps_done` (counted from 1) holds: step, epoch
// (counted from 1), loss, smoothed_loss, learning_rate (the schedule's at the update the step
// belongs to, --accumulate steps an update), skipped_steps and, where the job scales the loss,
// loss_scale and loss_scale_overflows. The job adds its rate and its own fields.
nlohmann::json step_record(int64_t steps_done, int64_t epoch, double loss, double smoothed_loss,
                           const OptimizerConfig& optimizer, const NonFiniteSteps& non_finite);

// A training job's steps. Each step's batch is prepared (assembled, its noise drawn), its inputs
// set and the step started while the step before it is still on the GPU, so that the GPU does not
// wait for the host between steps; except after a step that an evaluation or a checkpoint
// follows, since they read its parameters, and where `queues` is false (--detect-anomaly, whose
// re-run needs the parameters from before the step; a distributed step, which runs the ranks
// together).
struct StepLoop {
  // Prepares step `index` (counted from 0), sets its inputs and starts it. `slot` alternates
  // between 0 and 1 from step to step: host data that handling the finished step reads (its
  // labels) is kept per slot, as the next step's is prepared before that.
  std::function<void(int64_t index, int slot)> start;
  std::function<void()> finish;  // waits for the step in flight
  // Whether an evaluation or a checkpoint follows step `steps_done` (counted from 1).
  std::function<bool(int64_t steps_done)> ends_a_stretch;
  // Handles step `steps_done` (counted from 1, its host data in `slot`) once it has finished, the
  // next one running: its loss, progress line, metrics, evaluation and checkpoint. Returns
  // whether the job stops (every rank deciding together); a step queued behind it still runs.
  std::function<bool(int64_t steps_done, int slot)> finished;
};
// Runs `loop` from `step` (updated as each step finishes) until `total_steps`, or until the job
// stops: `stopping` at the start, finished() or Ctrl-C. Returns whether it stopped.
bool run_steps(int64_t& step, int64_t total_steps, bool queues, bool stopping,
               const StepLoop& loop);

}  // namespace mg::cli
