// A session's build report splits its build time into parts that add up, and names where the
// pipelines' time went (docs/RUNTIME.md, `meganeura devices --bench-compile`).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>

#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"
#include "meganeura/switches.hpp"

namespace mg {
namespace {

TEST(BuildReport, PartsAddUpAndTheSlowestKernelIsOneOfTheProgram) {
  Graph graph;
  const Tensor x = input(graph, "x", {64, 48});
  const Tensor w = parameter(graph, "w", {48, 32}, Init::normal(0.0, 0.1));
  graph.set_output("y", relu(matmul(x, w)).id());
  graph.set_output("total", sum_all(exp(x)).id());

  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() /
      ("meganeura-build-report-" + std::to_string(std::random_device{}()));
  SessionOptions options;
  options.switches = Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache.string()}});
  for (const bool warm : {false, true}) {
    const Session session(graph, options);
    const BuildReport& report = session.report();
    const double parts = report.device_seconds + report.plan_seconds + report.allocation_seconds +
                         report.pipeline_seconds + report.record_seconds;
    EXPECT_GT(report.allocation_seconds, 0.0);
    EXPECT_GT(report.pipeline_seconds, 0.0);
    EXPECT_LE(parts, report.build_seconds);
    EXPECT_EQ(report.spirv_cache_hits, warm ? report.pipelines : 0u);
    EXPECT_EQ(report.spirv_seconds > 0.0, !warm);
    EXPECT_GT(report.driver_seconds, 0.0);
    EXPECT_GT(report.slowest_kernel_seconds, 0.0);
    EXPECT_LE(report.slowest_kernel_seconds, report.spirv_seconds + report.driver_seconds);
    EXPECT_NE(report.dispatch_list.find(report.slowest_kernel), std::string::npos)
        << report.slowest_kernel << " is not among\n"
        << report.dispatch_list;
    // The longest builds, longest first, the first the slowest kernel, each one of the program's.
    ASSERT_FALSE(report.slowest_kernels.empty());
    EXPECT_LE(report.slowest_kernels.size(), std::min<size_t>(8, report.pipelines));
    EXPECT_EQ(report.slowest_kernels[0].kernel, report.slowest_kernel);
    for (size_t i = 0; i < report.slowest_kernels.size(); ++i) {
      const BuildReport::KernelBuildTime& kernel = report.slowest_kernels[i];
      EXPECT_NE(report.dispatch_list.find(kernel.kernel), std::string::npos) << kernel.kernel;
      EXPECT_LE(kernel.start_seconds, report.pipeline_seconds) << kernel.kernel;
      if (i > 0) {
        const BuildReport::KernelBuildTime& before = report.slowest_kernels[i - 1];
        EXPECT_GE(before.spirv_seconds + before.driver_seconds,
                  kernel.spirv_seconds + kernel.driver_seconds);
      }
    }
  }
  std::filesystem::remove_all(cache);
}

}  // namespace
}  // namespace mg
