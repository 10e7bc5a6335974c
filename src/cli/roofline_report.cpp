#include "cli/roofline_report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "backends/vulkan/runtime/cache_file.hpp"
#include "cli/training_support.hpp"
#include "io/atomic_file.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/switches.hpp"

namespace mg::cli {

namespace {

std::filesystem::path cache_file(const std::string& device, const std::string& kind) {
  const std::string folder = Switches::from_environment().cache_dir;
  if (folder.empty()) return {};
  char name[64];
  std::snprintf(name, sizeof name, "%s-%016llx.json", kind.c_str(),
                static_cast<unsigned long long>(gpu::detail::fnv1a64(device)));
  return std::filesystem::path(folder) / name;
}

std::optional<nlohmann::json> read_json(const std::filesystem::path& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream file(path);
  if (!file) return std::nullopt;
  nlohmann::json json = nlohmann::json::parse(file, nullptr, false);
  if (!json.is_object()) return std::nullopt;
  return json;
}

// The fastest of a few profiled runs: the sum of its dispatches' times, in seconds.
double fastest_run_seconds(Session& session, int runs) {
  double best = std::numeric_limits<double>::max();
  for (int run = 0; run < runs; ++run) {
    session.run();
    double total_ms = 0;
    for (const DispatchProfile& dispatch : session.profile()) total_ms += dispatch.duration_ms;
    if (run > 0) best = std::min(best, total_ms / 1e3);  // the first warms caches and clocks
  }
  return std::max(best, 1e-9);
}

DevicePeaks measure_peaks(SessionOptions options, bool cpu_device) {
  options.shared_tensors = nullptr;
  options.profile = true;
  options.time_runs = false;
  DevicePeaks peaks;
  peaks.measured_now = true;
  // Sized to run well past launch overheads yet take a fraction of a second.
  const int64_t n = cpu_device ? 384 : 4096;
  const int64_t copied = cpu_device ? (4 << 20) : (256 << 20);
  {
    Graph graph;
    const Tensor a = input(graph, "a", {n, n});
    const Tensor b = input(graph, "b", {n, n});
    graph.set_output("c", matmul(a, b).id());
    Session session(graph, options);
    peaks.device = session.report().device;
    std::vector<float> values(static_cast<size_t>(n * n));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7) * 0.25f;
    session.set_input("a", values);
    session.set_input("b", values);
    peaks.flops_per_second = 2.0 * n * n * n / fastest_run_seconds(session, 4);
  }
  {
    Graph graph;
    const Tensor x = input(graph, "x", {copied});
    graph.set_output("y", neg(x).id());
    Session session(graph, options);
    session.set_input("x", std::vector<float>(static_cast<size_t>(copied), 1.5f));
    peaks.bytes_per_second =
        2.0 * 4.0 * static_cast<double>(copied) / fastest_run_seconds(session, 4);
  }
  return peaks;
}

std::string si(double value, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int prefix = 0;
  while (value >= 1000 && prefix < 5) {
    value /= 1000;
    ++prefix;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.3g %s%s", value, prefixes[prefix], unit);
  return text;
}

}  // namespace

DevicePeaks device_peaks(const SessionOptions& options, const std::string& device) {
  const std::filesystem::path path = cache_file(device, "roofline");
  if (const std::optional<nlohmann::json> cached = read_json(path);
      cached && cached->value("device", "") == device &&
      cached->value("flops_per_second", 0.0) > 0 && cached->value("bytes_per_second", 0.0) > 0) {
    return {device, (*cached)["flops_per_second"].get<double>(),
            (*cached)["bytes_per_second"].get<double>(), false};
  }
  DevicePeaks peaks = measure_peaks(options, device.find("(cpu)") != std::string::npos);
  peaks.device = device;
  if (!path.empty()) {
    std::error_code error;
    std::filesystem::create_directories(path.parent_path(), error);
    try {
      io::write_file_atomically(path, nlohmann::json{{"device", device},
                                                     {"flops_per_second", peaks.flops_per_second},
                                                     {"bytes_per_second", peaks.bytes_per_second}}
                                          .dump(2));
    } catch (const Error&) {
      // A read-only cache measures again next time; the report itself stands.
    }
  }
  return peaks;
}

std::filesystem::path energy_model_path(const std::string& device) {
  return cache_file(device, "energy");
}

EnergyModel energy_model(const std::string& device) {
  EnergyModel model;
  const std::filesystem::path path = energy_model_path(device);
  const std::optional<nlohmann::json> file = read_json(path);
  if (!file) return model;
  const double static_watts = file->value("static_watts", -1.0);
  const double per_flop = file->value("joules_per_flop", -1.0);
  const double per_byte = file->value("joules_per_byte", -1.0);
  if (static_watts < 0 || per_flop < 0 || per_byte < 0) return model;
  return {static_watts, per_flop, per_byte, path.string()};
}

Roofline roofline(const BuildReport& report, const std::vector<DispatchProfile>* profile,
                  const DevicePeaks& peaks) {
  Roofline result;
  result.peaks = peaks;
  result.energy = energy_model(peaks.device);
  size_t next_timing = 0;
  double measured = 0;
  bool all_measured = profile != nullptr;
  for (const DispatchCost& cost : report.dispatch_costs) {
    Roofline::Row row{cost.label, cost.flops, cost.bytes, -1, 0};
    row.bound_ms = 1e3 * std::max(cost.flops / std::max(peaks.flops_per_second, 1.0),
                                  cost.bytes / std::max(peaks.bytes_per_second, 1.0));
    // The profile lists the run's dispatches in order (the setup's, when it ran, first).
    if (profile) {
      while (next_timing < profile->size() && (*profile)[next_timing].label != cost.label)
        ++next_timing;
      if (next_timing < profile->size()) {
        row.ms = (*profile)[next_timing++].duration_ms;
        measured += row.ms;
      } else {
        all_measured = false;
      }
    }
    result.flops += row.flops;
    result.bytes += row.bytes;
    result.bound_ms += row.bound_ms;
    result.rows.push_back(row);
  }
  if (all_measured) result.measured_ms = measured;
  return result;
}

std::string roofline_table(const Roofline& roofline) {
  std::string text = "device peaks: " + si(roofline.peaks.flops_per_second, "FLOP/s") +
                     " (f32 matrix product), " + si(roofline.peaks.bytes_per_second, "B/s") +
                     " (copy)" + (roofline.peaks.measured_now ? ", measured now" : ", cached") +
                     "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-40s %12s %12s %10s %10s %12s %12s %7s\n", "dispatch", "FLOP",
                "bytes", "ms", "floor ms", "FLOP/s", "B/s", "of roof");
  text += line;
  for (const Roofline::Row& row : roofline.rows) {
    const bool timed = row.ms > 0;
    std::snprintf(line, sizeof line, "%-40.40s %12s %12s %10s %10.4f %12s %12s %6s%%\n",
                  row.label.c_str(), si(row.flops, "").c_str(), si(row.bytes, "").c_str(),
                  timed ? std::to_string(row.ms).substr(0, 8).c_str() : "-", row.bound_ms,
                  timed ? si(row.flops / (row.ms / 1e3), "").c_str() : "-",
                  timed ? si(row.bytes / (row.ms / 1e3), "").c_str() : "-",
                  timed ? std::to_string(100 * row.bound_ms / row.ms).substr(0, 5).c_str() : "-");
    text += line;
  }
  const double seconds = roofline.measured_ms > 0 ? roofline.measured_ms / 1e3 : 0;
  std::snprintf(line, sizeof line,
                "total: %s FLOP, %s bytes, floor %.4f ms%s; energy about %.4g J a run (%s)\n",
                si(roofline.flops, "").c_str(), si(roofline.bytes, "").c_str(), roofline.bound_ms,
                seconds > 0
                    ? (", measured " + std::to_string(roofline.measured_ms).substr(0, 8) + " ms (" +
                       std::to_string(100 * roofline.bound_ms / roofline.measured_ms).substr(0, 5) +
                       " % of the roof)")
                          .c_str()
                    : "",
                roofline.energy.joules(seconds > 0 ? seconds : roofline.bound_ms / 1e3,
                                       roofline.flops, roofline.bytes),
                roofline.energy.source.c_str());
  return text + line;
}

std::string roofline_summary(const Roofline& roofline, double step_seconds) {
  char line[400];
  std::snprintf(line, sizeof line,
                "roofline: %sFLOP and %sB a step, floor %.3g ms at the device's peaks; %.3g ms a "
                "step (%.3g %% of the roof), about %.3g J a step (%s power model)",
                si(roofline.flops, "").c_str(), si(roofline.bytes, "").c_str(), roofline.bound_ms,
                step_seconds * 1e3, 100 * roofline.bound_ms / std::max(step_seconds * 1e3, 1e-9),
                roofline.energy.joules(step_seconds, roofline.flops, roofline.bytes),
                roofline.energy.source == "default (uncalibrated)" ? "uncalibrated" : "calibrated");
  return line;
}

nlohmann::json roofline_json(const Roofline& roofline, double step_seconds) {
  nlohmann::json dispatches = nlohmann::json::array();
  for (const Roofline::Row& row : roofline.rows) {
    nlohmann::json entry = {{"label", row.label},
                            {"flops", row.flops},
                            {"bytes", row.bytes},
                            {"floor_ms", row.bound_ms}};
    if (row.ms > 0) entry["ms"] = row.ms;
    dispatches.push_back(entry);
  }
  nlohmann::json json = {{"device", roofline.peaks.device},
                         {"peak_flops_per_second", roofline.peaks.flops_per_second},
                         {"peak_bytes_per_second", roofline.peaks.bytes_per_second},
                         {"flops_per_step", roofline.flops},
                         {"bytes_per_step", roofline.bytes},
                         {"floor_ms", roofline.bound_ms},
                         {"step_ms", step_seconds * 1e3},
                         {"energy_joules_per_step",
                          roofline.energy.joules(step_seconds, roofline.flops, roofline.bytes)},
                         {"energy_model",
                          {{"static_watts", roofline.energy.static_watts},
                           {"joules_per_flop", roofline.energy.joules_per_flop},
                           {"joules_per_byte", roofline.energy.joules_per_byte},
                           {"source", roofline.energy.source}}},
                         {"dispatches", dispatches}};
  if (roofline.measured_ms > 0) json["measured_dispatch_ms"] = roofline.measured_ms;
  return json;
}

void report_training_roofline(const std::filesystem::path& out_dir, const Session& training,
                              const SessionOptions& options, double step_seconds) {
  std::vector<DispatchProfile> profile;
  bool profiled = false;
  try {
    profile = training.profile();
    profiled = !profile.empty();
  } catch (const Error&) {
    // Not profiled (no --trace): the report has no per-dispatch times.
  }
  const Roofline result = roofline(training.report(), profiled ? &profile : nullptr,
                                   device_peaks(options, training.report().device));
  std::fprintf(stderr, "%s\n", roofline_summary(result, step_seconds).c_str());
  io::write_file_atomically(out_dir / "roofline.json",
                            roofline_json(result, step_seconds).dump(2) + "\n");
}

}  // namespace mg::cli
