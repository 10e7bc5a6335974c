#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "meganeura/session.hpp"
#include "models/classifier.hpp"
#include "vk/gpu.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura devices [--bench-compile] [--device SEL]

Lists every Vulkan device, one line each, and marks with '*' the one that would be used
(discrete > integrated > virtual > CPU, or MEGANEURA_DEVICE / --device).

  --bench-compile   build the CNN training program twice on the chosen device, first with an
                    empty kernel cache (cold) then with the cache it filled (warm), and print
                    the build times
  --device SEL      device index or part of its name
)";

void bench_compile(const std::string& device) {
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("meganeura-bench-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(cache);
  ::setenv("MEGANEURA_CACHE_DIR", cache.c_str(), 1);
  const Graph graph =
      models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{});
  SessionOptions options;
  options.device = device;
  for (const char* label : {"cold", "warm"}) {
    Session session(graph, options);
    const BuildReport& report = session.report();
    std::printf("%s build: %.3f s (pipelines %.3f s, %u pipelines, %u SPIR-V cache hits, %zu "
                "dispatches)\n",
                label, report.build_seconds, report.pipeline_seconds, report.pipelines,
                report.spirv_cache_hits, report.dispatches);
  }
  std::filesystem::remove_all(cache);
}

}  // namespace

int devices_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura devices", words, {"device"}, {"bench-compile", "help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const uint32_t chosen = gpu::choose_device(devices, arguments.text("device", ""));
  for (const gpu::DeviceInfo& info : devices) {
    std::printf("%s %s\n", info.index == chosen ? "*" : " ", gpu::describe_device(info).c_str());
  }
  if (arguments.has("bench-compile")) bench_compile(arguments.text("device", ""));
  return 0;
}

}  // namespace mg::cli
