// Resource faults (docs/RELIABILITY.md), injected through MEGANEURA_INJECT_FAULT on Lavapipe: an
// allocation that fails, a device lost mid-run. Each ends on one line with its own exit status
// and run.json cause, and the last checkpoint stays loadable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

fs::path scratch(const std::string& name) {
  const fs::path path =
      fs::temp_directory_path() / ("meganeura-faults-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

nlohmann::json record_of(const fs::path& folder) {
  std::ifstream file(folder / "run.json");
  return nlohmann::json::parse(file);
}

// The last line of the output (the error).
std::string last_line(const std::string& output) {
  const size_t end = output.find_last_not_of('\n');
  return output.substr(output.rfind('\n', end) + 1, end - output.rfind('\n', end));
}

const std::string kSmallRun =
    " --model mlp --limit 256 --batch 32 --epochs 1 --checkpoint-every 1 --out ";

// Runs the command with MEGANEURA_INJECT_FAULT=`fault` (inherited by the child).
Result run_with_fault(const std::string& fault, const std::string& arguments) {
  ::setenv("MEGANEURA_INJECT_FAULT", fault.c_str(), 1);
  Result result = run(arguments);
  ::unsetenv("MEGANEURA_INJECT_FAULT");
  return result;
}

// The first allocation is the arena of the MLP's parameters and Adam's moments, made while the
// program is planned (on another thread): its failure still ends the run on one line.
TEST(ResourceFaults, AFailedAllocationIsOutOfMemory) {
  const fs::path root = scratch("alloc");
  const Result failed = run_with_fault("alloc:1", "train" + kSmallRun + root.string());
  EXPECT_EQ(failed.status, 71) << failed.output;
  EXPECT_EQ(last_line(failed.output),
            "meganeura train: error: cannot allocate 2822184 bytes (2.7 MiB) for buffer "
            "'persistent arena 0': out of device memory (the heap holds 2.0 GiB)")
      << failed.output;
  const nlohmann::json record = record_of(root);
  EXPECT_EQ(record["status"], "out_of_memory");
  EXPECT_EQ(record["exit_status"], 71);

  const Result bad = run_with_fault("alloc:0", "train" + kSmallRun + root.string());
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("MEGANEURA_INJECT_FAULT='alloc:0': expected alloc:N or device_lost:N"),
            std::string::npos)
      << bad.output;
  fs::remove_all(root);
}

TEST(ResourceFaults, ADeviceLostMidRunKeepsTheLastCheckpoint) {
  const fs::path root = scratch("lost");
  // The 80th submission comes a few steps in (uploads, steps and checkpoint reads submit).
  const Result lost = run_with_fault("device_lost:80", "train" + kSmallRun + root.string());
  EXPECT_EQ(lost.status, 72) << lost.output;
  const nlohmann::json record = record_of(root);
  EXPECT_EQ(record["status"], "device_lost");
  EXPECT_EQ(record["exit_status"], 72);
  const int64_t step = record["checkpoint"]["step"].get<int64_t>();
  EXPECT_GE(step, 1);
  EXPECT_LT(step, 8);
  const fs::path checkpoint = root / "checkpoint.safetensors";
  EXPECT_EQ(last_line(lost.output),
            "meganeura train: error: submitting a buffer transfer: device lost (driver reset or "
            "GPU crash); the last checkpoint is " +
                checkpoint.string() + " (step " + std::to_string(step) + ")")
      << lost.output;
  EXPECT_EQ(mg::io::load_checkpoint(checkpoint).step, step);
  // And it resumes to the end.
  const Result resumed =
      run("train" + kSmallRun + root.string() + " --resume " + checkpoint.string());
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(record_of(root)["status"], "completed");
  fs::remove_all(root);
}

}  // namespace
