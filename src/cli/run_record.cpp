#include "cli/run_record.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <fstream>
#include <sstream>

#include "io/atomic_file.hpp"
#include "io/json_limits.hpp"
#include "meganeura_commit.hpp"

namespace mg::cli {
namespace {

constexpr const char* kRecordName = "run.json";

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat), which
// tells a live run from an unrelated process that reuses its id; empty where unknown.
std::string process_start(long pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');
  if (name_end == std::string::npos) return "";
  std::istringstream fields(text.substr(name_end + 2));
  std::string field;
  // Field 3 (the state) is the first after the name; the start time is field 22.
  for (int index = 3; index <= 22 && fields >> field; ++index) {
    if (index == 22) return field;
  }
  return "";
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "";
}

}  // namespace

std::string_view status_name(RunStatus status) {
  switch (status) {
    case RunStatus::completed:
      return "completed";
    case RunStatus::interrupted:
      return "interrupted";
    case RunStatus::out_of_memory:
      return "out_of_memory";
    case RunStatus::device_lost:
      return "device_lost";
    case RunStatus::non_finite:
      return "non_finite";
    case RunStatus::data_error:
      return "data_error";
    case RunStatus::checkpoint_error:
      return "checkpoint_error";
    case RunStatus::shader_compile:
      return "shader_compile";
    case RunStatus::failed:
      return "failed";
    case RunStatus::killed:
      return "killed";
  }
  return "failed";
}

int exit_status(RunStatus status) {
  switch (status) {
    case RunStatus::completed:
      return 0;
    case RunStatus::failed:
      return 1;
    case RunStatus::data_error:
      return 65;
    case RunStatus::shader_compile:
      return 70;
    case RunStatus::out_of_memory:
      return 71;
    case RunStatus::device_lost:
      return 72;
    case RunStatus::non_finite:
      return 73;
    case RunStatus::checkpoint_error:
      return 74;
    case RunStatus::interrupted:
      return 130;
    case RunStatus::killed:
      return 137;
  }
  return 1;
}

RunStatus status_of(Error::Kind kind) {
  switch (kind) {
    case Error::Kind::input:
      return RunStatus::failed;
    case Error::Kind::data:
      return RunStatus::data_error;
    case Error::Kind::checkpoint:
      return RunStatus::checkpoint_error;
    case Error::Kind::out_of_memory:
      return RunStatus::out_of_memory;
    case Error::Kind::device_lost:
      return RunStatus::device_lost;
    case Error::Kind::shader_compile:
      return RunStatus::shader_compile;
    case Error::Kind::non_finite:
      return RunStatus::non_finite;
  }
  return RunStatus::failed;
}

int exit_status_of(const Error& error) {
  return exit_status(status_of(error.kind()));
}

void RunRecord::start(const std::filesystem::path& out_dir, const std::vector<std::string>& command,
                      const nlohmann::json& config, const std::string& device) {
  path_ = out_dir / kRecordName;
  record_ = {{"command", command},
             {"config", config},
             {"device", device},
             {"commit", MEGANEURA_COMMIT},
             {"host", host_name()},
             {"pid", static_cast<int64_t>(::getpid())},
             {"process_start", process_start(::getpid())},
             {"started", utc_now()},
             {"status", "running"},
             {"last_step", nullptr},
             {"checkpoint", nullptr}};
  write();
}

void RunRecord::checkpoint(int64_t step, const std::filesystem::path& path) {
  if (!path_) return;
  record_["last_step"] = step;
  record_["checkpoint"] = {{"path", path.string()}, {"step", step}};
  write();
}

std::string RunRecord::checkpoint_text() const {
  if (!record_.is_object() || !record_.contains("checkpoint") ||
      !record_.at("checkpoint").is_object())
    return "";
  const nlohmann::json& checkpoint = record_.at("checkpoint");
  return "the last checkpoint is " + checkpoint.at("path").get<std::string>() + " (step " +
         std::to_string(checkpoint.at("step").get<int64_t>()) + ")";
}

void RunRecord::set(const std::string& key, const nlohmann::json& value) {
  if (!path_) return;
  record_[key] = value;
  write();
}

void RunRecord::finish(RunStatus status, const std::string& message) {
  if (!path_) return;
  record_["status"] = status_name(status);
  record_["exit_status"] = exit_status(status);
  record_["finished"] = utc_now();
  if (!message.empty()) record_["message"] = io::shortened(message, 500);
  write();
  path_.reset();
}

void RunRecord::write() {
  io::write_file_atomically(*path_, record_.dump(2) + "\n");
}

RunRecord& current_run() {
  static RunRecord run;
  return run;
}

std::optional<nlohmann::json> read_run_record(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / kRecordName;
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  nlohmann::json record = io::parse_json(text, "run record " + path.string());
  if (!record.is_object()) throw Error("run record " + path.string() + " is not a JSON object");
  if (record.value("status", "") == "running") {
    const long pid = record.value("pid", int64_t{0});
    const bool same_host = record.value("host", "") == host_name();
    const bool alive = pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) &&
                       process_start(pid) == record.value("process_start", "");
    // On another host the process cannot be looked at; the record is reported as it stands.
    if (same_host && !alive) record["status"] = "killed";
  }
  return record;
}

}  // namespace mg::cli
