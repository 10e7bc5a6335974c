#include <fstream>

#include <nlohmann/json.hpp>

#include "backends/vulkan/runtime/gpu.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu {

void write_chrome_trace(const std::vector<DispatchTiming>& timings, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  for (const DispatchTiming& timing : timings) {
    nlohmann::json event = {{"name", timing.label},
                            {"ph", "X"},
                            {"ts", timing.start_ms * 1000.0},
                            {"dur", timing.duration_ms * 1000.0},
                            {"pid", 0},
                            {"tid", 0}};
    if (timing.flops >= 0 && timing.bytes >= 0)
      event["args"] = {{"flops", timing.flops}, {"bytes", timing.bytes}};
    events.push_back(std::move(event));
  }
  std::ofstream file(path);
  if (!file) throw Error("cannot write the trace file " + path);
  file << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(1) << "\n";
  if (!file) throw Error("cannot write the trace file " + path);
}

}  // namespace mg::gpu
