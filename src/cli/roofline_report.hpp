#pragma once
// Roofline reports (docs/ROOFLINE.md): each dispatch's FLOPs and bytes (from shapes, in
// BuildReport::dispatch_costs) against its measured time and the device's peaks, and an energy
// estimate from a power model. `meganeura inspect --roofline` prints the table; every training
// job ends with a summary line and <out>/roofline.json.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meganeura/session.hpp"

namespace mg::cli {

// The device's compute and copy ceilings, measured with a large f32 matrix product and a copy
// (a fraction of a second) the first time and cached in the kernel cache's folder as
// roofline-<device hash>.json; measured each time where there is no cache folder.
struct DevicePeaks {
  std::string device;
  double flops_per_second = 0;
  double bytes_per_second = 0;
  bool measured_now = false;
};
// `device`: the one-line description (BuildReport::device) of the device `options` open.
DevicePeaks device_peaks(const SessionOptions& options, const std::string& device);

// Energy of a run = static_watts x seconds + joules_per_flop x FLOPs + joules_per_byte x bytes.
// Read from energy-<device hash>.json beside the peaks (bench/energy_h200.sh fits and writes
// it); otherwise the defaults below, which are not calibrated.
struct EnergyModel {
  double static_watts = 120.0;
  double joules_per_flop = 1e-11;
  double joules_per_byte = 3e-11;
  std::string source = "default (uncalibrated)";
  double joules(double seconds, double flops, double bytes) const {
    return static_watts * seconds + joules_per_flop * flops + joules_per_byte * bytes;
  }
};
EnergyModel energy_model(const std::string& device);
std::filesystem::path energy_model_path(const std::string& device);  // empty without a cache

struct Roofline {
  struct Row {
    std::string label;
    double flops = 0, bytes = 0;
    double ms = -1;       // measured (profiled runs); -1 where not
    double bound_ms = 0;  // the roofline's floor: max(flops / peak, bytes / bandwidth)
  };
  std::vector<Row> rows;
  double flops = 0, bytes = 0, bound_ms = 0;
  double measured_ms = -1;  // sum of the rows' times, where profiled
  DevicePeaks peaks;
  EnergyModel energy;
};
// `profile`: the per-dispatch times of a run of the program `report` describes, or none.
Roofline roofline(const BuildReport& report, const std::vector<DispatchProfile>* profile,
                  const DevicePeaks& peaks);

std::string roofline_table(const Roofline& roofline);  // one line per dispatch and a total
// "roofline: 1.2 GFLOP and 34 MB a step, floor 0.12 ms at the device's peaks; 5.0 ms a step
// (2.4 % of the floor's rate), about 0.6 J a step (uncalibrated power model)".
std::string roofline_summary(const Roofline& roofline, double step_seconds);
nlohmann::json roofline_json(const Roofline& roofline, double step_seconds);

// A training job's end: the summary line on stderr and <out>/roofline.json, from the training
// program's report (and its profile where the job traced it) and the measured time a step.
void report_training_roofline(const std::filesystem::path& out_dir, const Session& training,
                              const SessionOptions& options, double step_seconds);

}  // namespace mg::cli
