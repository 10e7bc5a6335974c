#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "meganeura/session.hpp"
#include "models/classifier.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura devices [--verbose] [--bench-compile] [--device SEL]

Lists every Vulkan device, one line each, and marks with '*' the one that would be used
(discrete > integrated > virtual > CPU, or MEGANEURA_DEVICE / --device).

  --verbose         also list each device's limits, compute units (where the driver reports
                    them), cooperative-matrix shapes and whether it has workgroup-scope
                    cooperative matrices (VK_NV_cooperative_matrix2, which the fast GEMM uses
                    for large products), with their limits, granularities and whether they
                    load through tensor addressing
  --bench-compile   build the CNN training program twice on the chosen device, first with an
                    empty kernel cache (cold) then with the cache it filled (warm), and print
                    the build times
  --device SEL      device index or part of its name
)";

std::string_view scalar_name(gpu::ScalarType type) {
  switch (type) {
    case gpu::ScalarType::f16:
      return "f16";
    case gpu::ScalarType::bf16:
      return "bf16";
    case gpu::ScalarType::f32:
      return "f32";
    case gpu::ScalarType::f64:
      return "f64";
    case gpu::ScalarType::i8:
      return "i8";
    case gpu::ScalarType::u8:
      return "u8";
    case gpu::ScalarType::i32:
      return "i32";
    case gpu::ScalarType::u32:
      return "u32";
    case gpu::ScalarType::other:
      break;
  }
  return "other";
}

void print_details(const gpu::DeviceInfo& info) {
  const gpu::DeviceCaps& caps = info.caps;
  std::printf(
      "    max storage buffer range %llu MiB, max allocation %llu MiB, workgroup <= %u "
      "invocations, %u storage buffers per kernel\n",
      static_cast<unsigned long long>(caps.max_storage_buffer_range >> 20),
      static_cast<unsigned long long>(caps.max_memory_allocation_size >> 20),
      caps.max_workgroup_invocations, caps.max_storage_buffers_per_stage);
  if (caps.compute_units > 0)
    std::printf("    %u compute units (kernels and splits are planned for them)\n",
                caps.compute_units);
  else
    std::printf("    compute units not reported by the driver (planned as %lld, an H200's)\n",
                static_cast<long long>(kernels::kAssumedComputeUnits));
  for (const gpu::CoopMatrixConfig& config : caps.coop_matrix) {
    std::printf("    cooperative matrix (%s) %ux%ux%u  %s x %s + %s -> %s\n",
                config.khr ? "KHR" : "NV", config.m, config.n, config.k,
                scalar_name(config.a).data(), scalar_name(config.b).data(),
                scalar_name(config.c).data(), scalar_name(config.result).data());
  }
  const gpu::WorkgroupCoopMatrixCaps& workgroup = caps.workgroup_coop_matrix;
  std::printf("    workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2): %s\n",
              workgroup.available ? "yes" : "no");
  if (!workgroup.available) return;
  std::printf(
      "      workgroups <= %u invocations, matrices <= %u a side, %u bytes of shared memory "
      "reserved, tensor-addressing loads %s\n",
      workgroup.max_workgroup_invocations, workgroup.max_dimension,
      workgroup.reserved_shared_memory_bytes, workgroup.tensor_addressing ? "yes" : "no");
  for (const gpu::WorkgroupCoopMatrixConfig& config : workgroup.configs)
    std::printf("      multiples of %ux%ux%u  %s x %s + %s -> %s, %u invocations\n",
                config.m_granularity, config.n_granularity, config.k_granularity,
                scalar_name(config.a).data(), scalar_name(config.b).data(),
                scalar_name(config.c).data(), scalar_name(config.result).data(),
                config.workgroup_invocations);
}

void bench_compile(const std::string& device) {
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("meganeura-bench-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(cache);
  const Graph graph =
      models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{});
  SessionOptions options;
  options.device = device;
  options.switches = Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache.string()}});
  for (const char* label : {"cold", "warm"}) {
    Session session(graph, options);
    const BuildReport& report = session.report();
    std::printf(
        "%s build: %.3f s (pipelines %.3f s, %u pipelines, %u SPIR-V cache hits, %zu "
        "dispatches)\n",
        label, report.build_seconds, report.pipeline_seconds, report.pipelines,
        report.spirv_cache_hits, report.dispatches);
  }
  std::filesystem::remove_all(cache);
}

}  // namespace

int devices_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura devices", words, {"device"},
                            {"bench-compile", "verbose", "help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  arguments.expect_at_most_positional(0);
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const uint32_t chosen = gpu::choose_device(devices, arguments.text("device", ""));
  for (const gpu::DeviceInfo& info : devices) {
    std::printf("%s %s\n", info.index == chosen ? "*" : " ", gpu::describe_device(info).c_str());
    if (arguments.has("verbose")) print_details(info);
  }
  if (arguments.has("bench-compile")) bench_compile(arguments.text("device", ""));
  return 0;
}

}  // namespace mg::cli
