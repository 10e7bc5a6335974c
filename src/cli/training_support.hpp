#pragma once
// What the training jobs of `meganeura train` (the Fashion-MNIST classifiers and the language
// models) share: the output folder, the optimizer options, the progress line and Ctrl-C.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/arguments.hpp"
#include "meganeura/train.hpp"

namespace mg::cli {

// Set by SIGINT and SIGTERM once install_stop_handlers() ran: the job stops after the current
// step and saves a checkpoint.
extern std::atomic<bool> stop_requested;
void install_stop_handlers();

std::string default_out_dir();  // runs/<timestamp>
// Creates the output directory, or says why it cannot be written, before the data is loaded and
// the programs are built rather than after.
void prepare_out_dir(const std::filesystem::path& out_dir);
std::string format_duration(double seconds);  // m:ss

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

// Every training job's stop on a loss that is NaN or infinite after `step`: closes the progress
// line and throws the one-line error naming the last checkpoint.
void require_finite_loss(double loss, int64_t step, const std::filesystem::path& checkpoint,
                         ProgressLine& progress);

// The progress line of a training step: "epoch E/N [bar] step S/T loss L RATE ETA m:ss", with
// `rate` the job's throughput ("1234 tokens/s") and the ETA from `steps_per_second`.
std::string step_line(int64_t epoch, int64_t epochs, int64_t step, int64_t total_steps,
                      double smoothed_loss, const std::string& rate, double steps_per_second);

bool running_on_cpu_device(const std::string& selector);

}  // namespace mg::cli
