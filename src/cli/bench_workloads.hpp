#pragma once
// The pieces of `meganeura bench workloads`: each workload is a function in its own file
// (bench_<workload>_workload.cpp) that times its cells and returns one JSON record in the format
// of bench/workloads_pytorch.py; bench_workloads.cpp lists them and prints the table.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {

struct WorkloadOptions {
  std::string device;  // --device
  int64_t runs = 20;   // --runs
};

// Wall-clock milliseconds of one run (the host's waits included), median of `runs` after the
// warm-up of bench_timing.hpp.
double median_ms(const std::function<void()>& run, int64_t runs);
// GPU milliseconds of one run of a session built with time_runs, median of max(runs, 3).
double gpu_ms(Session& session, int64_t runs);
// The cold and warm build of `graph`, each on a device opened afresh over a new kernel cache.
std::pair<double, double> compile_seconds(const Graph& graph, SessionOptions options);
std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint64_t seed);
// The device bytes a built program holds: persistent, shared and transient (as placed).
uint64_t device_bytes(const BuildReport& report);
// {"transient_logical_bytes", "transient_physical_bytes", "planner_saving"} of a build.
nlohmann::json planner_json(const BuildReport& report);

// The workloads. Each record: framework, model, mode, device, config, timings (milliseconds as
// *_ms, GPU time as *_gpu_ms, compile_s / compile_warm_s, rates as *_per_second), memory and
// outputs.
nlohmann::json bench_smollm2_135m(Precision precision, const WorkloadOptions& options);
nlohmann::json bench_sd_unet(Precision precision, const WorkloadOptions& options);
// Stable Diffusion 1.5's unet/config.json (the sd-unet workload's model).
nlohmann::json stable_diffusion_15_unet_config();

}  // namespace mg::cli
