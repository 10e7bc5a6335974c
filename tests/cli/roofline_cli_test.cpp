// The roofline report (docs/ROOFLINE.md): `inspect --roofline` and the end of a training run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

TEST(RooflineCli, InspectTimesEveryDispatchAgainstItsCosts) {
  const Result result = run("inspect --model mlp --batch 32 --roofline --json", false);
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json report = nlohmann::json::parse(result.output);
  EXPECT_GT(report["peak_flops_per_second"].get<double>(), 1e8);
  EXPECT_GT(report["peak_bytes_per_second"].get<double>(), 1e7);
  const nlohmann::json& dispatches = report["dispatches"];
  ASSERT_GT(dispatches.size(), 10u);
  // The first layer's product: 32 images of 784 pixels into 256 features, bias and ReLU fused.
  EXPECT_EQ(dispatches[0]["label"].get<std::string>().rfind("matmul %", 0), 0u) << dispatches[0];
  EXPECT_EQ(dispatches[0]["flops"], 2.0 * 32 * 784 * 256);
  double flops = 0;
  for (const nlohmann::json& dispatch : dispatches) {
    EXPECT_GT(dispatch["ms"].get<double>(), 0) << dispatch;
    EXPECT_GT(dispatch["bytes"].get<double>(), 0) << dispatch;
    flops += dispatch["flops"].get<double>();
  }
  EXPECT_EQ(report["flops_per_step"].get<double>(), flops);
  EXPECT_GT(report["measured_dispatch_ms"].get<double>(), 0);
}

TEST(RooflineCli, TrainingEndsWithASummaryAndRooflineJson) {
  const fs::path out =
      fs::temp_directory_path() / ("meganeura-roofline-" + std::to_string(::getpid()));
  fs::remove_all(out);
  const Result result =
      run("train --out " + out.string() + " --model mlp --limit 64 --batch 32 --epochs 1");
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("roofline: "), std::string::npos) << result.output;
  std::ifstream file(out / "roofline.json");
  const nlohmann::json report = nlohmann::json::parse(file);
  EXPECT_GT(report["step_ms"].get<double>(), 0);
  EXPECT_GT(report["energy_joules_per_step"].get<double>(), 0);
  EXPECT_EQ(report["dispatches"][0]["flops"], 2.0 * 32 * 784 * 256);
  fs::remove_all(out);
}

}  // namespace
