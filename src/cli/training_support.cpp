#include "cli/training_support.hpp"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <limits>

#include <fstream>

#include "backends/vulkan/runtime/gpu.hpp"
#include "cli/non_finite_steps.hpp"
#include "cli/run_record.hpp"
#include "io/atomic_file.hpp"
#include "io/checkpoint.hpp"

namespace mg::cli {

std::atomic<bool> stop_requested{false};

namespace {

void request_stop(int) {
  stop_requested = true;
}

}  // namespace

void install_stop_handlers() {
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
}

std::string default_out_dir() {
  const std::time_t now = std::time(nullptr);
  char buffer[64];
  std::strftime(buffer, sizeof(buffer), "runs/%Y%m%d-%H%M%S", std::localtime(&now));
  return buffer;
}

void prepare_out_dir(const std::filesystem::path& out_dir) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) {
    throw Error("cannot create the output directory " + out_dir.string() + " (" + error.message() +
                "): pass --out with a directory you can write");
  }
  if (::access(out_dir.c_str(), W_OK) != 0) {
    throw Error("the output directory " + out_dir.string() +
                " is not writable: pass --out with a directory you can write");
  }
}

void claim_out_dir(const std::filesystem::path& out_dir, const Arguments& arguments) {
  const std::filesystem::path checkpoint = out_dir / "checkpoint.safetensors";
  const std::filesystem::path metrics = out_dir / "metrics.jsonl";
  std::error_code error;
  const bool used =
      std::filesystem::exists(checkpoint, error) || std::filesystem::exists(metrics, error);
  if (!used || arguments.has("resume")) return;
  if (!arguments.has("overwrite")) {
    throw Error("--out " + out_dir.string() + " already holds a run (" +
                (std::filesystem::exists(checkpoint, error) ? checkpoint : metrics).string() +
                "): pass --resume " + checkpoint.string() +
                " to continue it, --overwrite to replace it, or another --out");
  }
  std::filesystem::remove(metrics, error);
  if (error)
    throw Error("cannot remove " + metrics.string() + " for --overwrite: " + error.message());
}

void drop_metrics_after(const std::filesystem::path& metrics_path, int64_t step) {
  std::ifstream in(metrics_path, std::ios::binary);
  if (!in) return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    // A torn last line (a kill mid-write) goes too.
    if (!record.is_object() ||
        (record.contains("step") && record["step"].is_number() && record["step"] > step)) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped) io::write_file_atomically(metrics_path, kept);
}

void start_run_record(const std::filesystem::path& out_dir, const std::vector<std::string>& words,
                      const nlohmann::json& config, const std::string& device) {
  std::vector<std::string> command = {"meganeura", "train"};
  command.insert(command.end(), words.begin(), words.end());
  current_run().start(out_dir, command, config, device);
}

void open_run(const std::filesystem::path& out_dir, const Arguments& arguments,
              const std::vector<std::string>& words, const nlohmann::json& config) {
  prepare_out_dir(out_dir);
  claim_out_dir(out_dir, arguments);
  start_run_record(out_dir, words, config, arguments.text("device", ""));
}

std::optional<io::Checkpoint> resumed_checkpoint(const Arguments& arguments) {
  const std::optional<std::string> path = arguments.value("resume");
  if (!path) return std::nullopt;
  return with_kind(Error::Kind::checkpoint, [&] { return io::load_checkpoint(*path); });
}

std::optional<io::Checkpoint> resumed_checkpoint(const Arguments& arguments,
                                                 const nlohmann::json& model_json) {
  std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments);
  if (resumed) io::check_same_model(model_json, resumed->model_config, *arguments.value("resume"));
  return resumed;
}

void save_run_checkpoint(const std::filesystem::path& path, const io::Checkpoint& checkpoint) {
  with_kind(Error::Kind::checkpoint, [&] { io::save_checkpoint(path, checkpoint); });
  current_run().checkpoint(checkpoint.step, path);
}

std::string last_checkpoint_text(const std::filesystem::path& checkpoint_path) {
  std::error_code error;
  if (!std::filesystem::exists(checkpoint_path, error)) return "no checkpoint was saved yet";
  try {
    return "the last checkpoint is " + checkpoint_path.string() + " (step " +
           std::to_string(io::load_checkpoint(checkpoint_path).step) + ")";
  } catch (const Error&) {
    return "the checkpoint " + checkpoint_path.string() + " cannot be read";
  }
}

Arguments training_arguments(const std::vector<std::string>& words,
                             const std::set<std::string>& job_options,
                             const std::set<std::string>& job_switches) {
  std::set<std::string> options{"model",
                                "data",
                                "out",
                                "batch",
                                "epochs",
                                "max-steps",
                                "lr",
                                "optimizer",
                                "momentum",
                                "weight-decay",
                                "schedule",
                                "warmup",
                                "clip",
                                "seed",
                                "device",
                                "precision",
                                "resume",
                                "checkpoint-every",
                                "accumulate",
                                "log-every",
                                "trace",
                                kOnNonFiniteOption,
                                kLossScaleOption};
  options.insert(job_options.begin(), job_options.end());
  std::set<std::string> switches{"help", "overwrite", kDetectAnomalySwitch};
  switches.insert(job_switches.begin(), job_switches.end());
  return Arguments("meganeura train", words, options, switches);
}

void print_training_help(const char* job_help) {
  std::fputs(job_help, stdout);
  std::fputs(kOnNonFiniteHelp, stdout);
  std::fputs(kDetectAnomalyHelp, stdout);
  std::fputs(kLossScaleHelp, stdout);
}

std::string format_duration(double seconds) {
  const int64_t total = static_cast<int64_t>(std::max(0.0, seconds));
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%lld:%02lld", static_cast<long long>(total / 60),
                static_cast<long long>(total % 60));
  return buffer;
}

OptimizerConfig optimizer_from(const Arguments& arguments, int64_t total_steps,
                               const OptimizerDefaults& defaults) {
  OptimizerConfig config;
  config.kind = parse_optimizer(arguments.text("optimizer", defaults.optimizer));
  constexpr double kLargest = std::numeric_limits<double>::max();
  config.learning_rate = arguments.real("lr", defaults.learning_rate, 0.0, kLargest);
  config.weight_decay = arguments.real("weight-decay", defaults.weight_decay, 0.0, kLargest);
  config.momentum = arguments.real("momentum", 0.9, 0.0, 1.0);
  config.clip_norm = arguments.real("clip", 0.0, 0.0, kLargest);
  config.warmup_steps = arguments.integer("warmup", 0, 0, INT64_MAX);
  config.accumulation_steps = arguments.integer("accumulate", 1, 1, 1'000'000);
  // The schedule runs over optimizer updates, and a final incomplete group never applies.
  config.total_steps = std::max<int64_t>(1, total_steps / config.accumulation_steps);
  const std::string schedule = arguments.text("schedule", defaults.schedule);
  if (schedule == "constant") {
    config.schedule = OptimizerConfig::Schedule::constant;
  } else if (schedule == "warmup") {
    config.schedule = OptimizerConfig::Schedule::linear_warmup;
  } else if (schedule == "cosine") {
    config.schedule = OptimizerConfig::Schedule::cosine;
  } else {
    throw Error("unknown --schedule '" + schedule + "' (constant, warmup or cosine)");
  }
  if (config.learning_rate <= 0) throw Error("--lr must be positive");
  return config;
}

nlohmann::json optimizer_json(const OptimizerConfig& config) {
  return {{"kind", optimizer_name(config.kind)},
          {"learning_rate", config.learning_rate},
          {"weight_decay", config.weight_decay},
          {"momentum", config.momentum},
          {"clip_norm", config.clip_norm},
          {"warmup_steps", config.warmup_steps},
          {"total_steps", config.total_steps},
          {"schedule", static_cast<int>(config.schedule)},
          {"accumulation_steps", config.accumulation_steps}};
}

ProgressLine::ProgressLine() : terminal_(::isatty(STDERR_FILENO) != 0) {}

void ProgressLine::update(const std::string& text, bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (!force && since < (terminal_ ? 0.2 : 5.0)) return;
  last_ = now;
  std::fprintf(stderr, terminal_ ? "\r\033[K%s" : "%s\n", text.c_str());
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (terminal_) std::fputc('\n', stderr);
}

std::string bar(double fraction) {
  const int width = 20;
  const int filled = static_cast<int>(std::round(std::clamp(fraction, 0.0, 1.0) * width));
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

bool running_on_cpu_device(const std::string& selector) {
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  return devices[gpu::choose_device(devices, selector)].kind == gpu::DeviceKind::cpu;
}

double StepPace::steps_per_second(int64_t step) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return static_cast<double>(step - first_step_) / std::max(elapsed, 1e-9);
}

double StepPace::seconds_per_step(int64_t step) const {
  return 1 / steps_per_second(step);
}

double moving_average(double average, double value, double weight) {
  return std::isnan(average) ? value : (1 - weight) * average + weight * value;
}

std::string rate_text(double per_second, int decimals, const std::string& unit) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f %s", decimals, per_second, unit.c_str());
  return text;
}

std::string accuracy_rate_text(double accuracy, double images_per_second) {
  char text[64];
  std::snprintf(text, sizeof(text), "acc %.1f%% ", 100 * accuracy);
  return text + rate_text(images_per_second, 0, "img/s");
}

std::string step_line(int64_t epoch, int64_t epochs, int64_t step, int64_t total_steps,
                      double smoothed_loss, const std::string& rate, double steps_per_second) {
  char line[320];
  std::snprintf(
      line, sizeof(line), "epoch %lld/%lld %s step %lld/%lld loss %.4f %s ETA %s",
      static_cast<long long>(epoch), static_cast<long long>(epochs),
      bar(static_cast<double>(step) / static_cast<double>(total_steps)).c_str(),
      static_cast<long long>(step), static_cast<long long>(total_steps), smoothed_loss,
      rate.c_str(),
      format_duration(static_cast<double>(total_steps - step) / std::max(steps_per_second, 1e-9))
          .c_str());
  return line;
}

nlohmann::json step_record(int64_t steps_done, int64_t epoch, double loss, double smoothed_loss,
                           const OptimizerConfig& optimizer, const NonFiniteSteps& non_finite) {
  nlohmann::json record = {
      {"step", steps_done},
      {"epoch", epoch},
      {"loss", loss},
      {"smoothed_loss", smoothed_loss},
      {"learning_rate",
       learning_rate_at(optimizer, (steps_done - 1) / optimizer.accumulation_steps)},
      {"skipped_steps", non_finite.dropped_steps()}};
  non_finite.add_loss_scale(record);
  return record;
}

bool run_steps(int64_t& step, int64_t total_steps, bool queues, bool stopping,
               const StepLoop& loop) {
  int slot = 0;
  bool in_flight = step < total_steps && !stopping;
  if (in_flight) loop.start(step, slot);
  while (in_flight) {
    in_flight = queues && step + 1 < total_steps && !stopping && !stop_requested &&
                !loop.ends_a_stretch(step + 1);
    if (in_flight) {
      loop.start(step + 1, 1 - slot);
    } else {
      loop.finish();
    }
    ++step;
    stopping = loop.finished(step, slot) || stopping;
    slot = 1 - slot;
    if (!in_flight && step < total_steps && !stopping) {
      in_flight = true;
      loop.start(step, slot);
    }
  }
  return stopping || stop_requested;
}

}  // namespace mg::cli
