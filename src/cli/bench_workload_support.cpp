// What every workload of `meganeura bench workloads` times and reports with.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "meganeura/switches.hpp"

namespace mg::cli {

double median_ms(const std::function<void()>& run, int64_t runs) {
  warm_up(run);
  std::vector<double> times;
  for (int64_t i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return median(std::move(times));
}

double gpu_ms(Session& session, int64_t runs) {
  warm_up([&] { session.run(); });
  std::vector<double> times;
  for (int64_t i = 0; i < std::max<int64_t>(runs, 3); ++i) {
    session.run();
    times.push_back(session.last_run_gpu_ms());
  }
  return median(std::move(times));
}

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(count);
  for (int32_t& id : tokens) id = token(generator);
  return tokens;
}

std::pair<BuildReport, BuildReport> compile_reports(const Graph& graph, SessionOptions options) {
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("meganeura-workload-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(cache);
  options.switches = Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache.string()}});
  options.shared_device.reset();
  options.shared_tensors.reset();
  // The build alone: random weights would take time in proportion to the model's size.
  options.initialise_parameters = false;
  BuildReport cold = Session(graph, options).report();
  BuildReport warm = Session(graph, options).report();
  std::filesystem::remove_all(cache);
  return {std::move(cold), std::move(warm)};
}

double compile_seconds(const BuildReport& report) {
  return report.build_seconds - report.device_seconds;
}

namespace {

nlohmann::json slowest_kernels_json(const BuildReport& report) {
  nlohmann::json list = nlohmann::json::array();
  for (const BuildReport::KernelBuildTime& kernel : report.slowest_kernels)
    list.push_back({{"kernel", kernel.kernel},
                    {"start_s", kernel.start_seconds},
                    {"spirv_s", kernel.spirv_seconds},
                    {"driver_s", kernel.driver_seconds}});
  return list;
}

}  // namespace

nlohmann::json compile_parts_json(const std::pair<BuildReport, BuildReport>& builds) {
  const auto parts = [](const BuildReport& report) {
    return nlohmann::json{{"total_s", report.build_seconds},
                          {"device_s", report.device_seconds},
                          {"plan_s", report.plan_seconds},
                          {"pipelines_s", report.pipeline_seconds},
                          {"record_s", report.record_seconds},
                          {"allocation_s", report.allocation_seconds},
                          {"pipelines", report.pipelines},
                          {"spirv_s", report.spirv_seconds},
                          {"driver_s", report.driver_seconds},
                          {"slowest_kernel", report.slowest_kernel},
                          {"slowest_kernel_s", report.slowest_kernel_seconds},
                          {"slowest_kernels", slowest_kernels_json(report)}};
  };
  return {{"cold", parts(builds.first)}, {"warm", parts(builds.second)}};
}

void write_workload_trace(const WorkloadOptions& options, const std::string& name,
                          const Graph& graph, SessionOptions session_options,
                          const std::function<void(Session&)>& prepare) {
  if (options.trace_dir.empty()) return;
  std::filesystem::create_directories(options.trace_dir);
  session_options.profile = true;
  session_options.time_runs = false;
  Session session(graph, session_options);
  prepare(session);
  // At full clocks, as the timed runs are (bench_timing.hpp).
  warm_up([&] { session.run(); });
  const std::filesystem::path base = std::filesystem::path(options.trace_dir) / name;
  session.write_trace(base.string() + ".json");
  std::ofstream(base.string() + ".dispatches.txt") << session.report().dispatch_list;
}

uint64_t device_bytes(const BuildReport& report) {
  return report.persistent_bytes + report.shared_bytes + report.transient_physical_bytes;
}

nlohmann::json planner_json(const BuildReport& report) {
  return {{"transient_logical_bytes", report.transient_logical_bytes},
          {"transient_physical_bytes", report.transient_physical_bytes},
          {"planner_saving", report.transient_logical_bytes
                                 ? 1.0 - static_cast<double>(report.transient_physical_bytes) /
                                             static_cast<double>(report.transient_logical_bytes)
                                 : 0.0}};
}

}  // namespace mg::cli
