#pragma once
// The run monitor of `meganeura train`: <out>/run.json records what a run is (command, config,
// device, commit) before it starts, durably (written atomically and synced), then its progress
// at each checkpoint and finally its status with a classified cause. A record left "running" by
// a process that no longer exists is a run that was killed (SIGKILL, power loss), which
// `meganeura runs` reports as such.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meganeura/error.hpp"

namespace mg::cli {

// How a run ended; each has its own exit status (exit_status).
enum class RunStatus {
  completed,
  interrupted,  // Ctrl-C or SIGTERM: stopped after a step with a checkpoint
  out_of_memory,
  device_lost,
  non_finite,  // NaN or infinity in the loss: stopped, the last checkpoint kept
  data_error,
  checkpoint_error,
  shader_compile,
  failed,  // bad input or usage, or anything unclassified
  killed,  // found afterwards: the process died without a final status
};

std::string_view status_name(RunStatus status);
int exit_status(RunStatus status);
RunStatus status_of(Error::Kind kind);
// The exit status for an error that ends a command (main uses it for every command).
int exit_status_of(const Error& error);

// One run's record. start() writes it; the job notes each checkpoint; finish() writes the end.
class RunRecord {
 public:
  void start(const std::filesystem::path& out_dir, const std::vector<std::string>& command,
             const nlohmann::json& config, const std::string& device);
  void checkpoint(int64_t step, const std::filesystem::path& path);
  void set(const std::string& key, const nlohmann::json& value);
  void finish(RunStatus status, const std::string& message);
  bool started() const { return path_.has_value(); }
  // "the last checkpoint is P (step N)" for the last checkpoint noted; "" before any.
  std::string checkpoint_text() const;

 private:
  void write();

  std::optional<std::filesystem::path> path_;
  nlohmann::json record_;
};

// The record of the `meganeura train` running in this process (a job starts it once its output
// folder is claimed; train_command finishes it).
RunRecord& current_run();

// Reads <folder>/run.json; a "running" record whose process is gone reads as "killed".
// nullopt where the folder has no record.
std::optional<nlohmann::json> read_run_record(const std::filesystem::path& folder);

}  // namespace mg::cli
