// The run monitor: every `meganeura train` writes <out>/run.json before it starts and its end
// with a classified cause and exit status; `meganeura runs` lists runs and recognises a run that
// was killed (its record still says running, its process is gone).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli_runner.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

fs::path scratch(const std::string& name) {
  return cli_test::scratch_folder("runs", name);
}

nlohmann::json record_of(const fs::path& folder) {
  std::ifstream file(folder / "run.json");
  return nlohmann::json::parse(file);
}

std::string source_head() {
  FILE* pipe = ::popen(
      ("git -C " + std::string(MEGANEURA_SOURCE_DIR) + " rev-parse --short=12 HEAD 2>/dev/null")
          .c_str(),
      "r");
  if (!pipe) return "";
  char buffer[64] = {};
  const size_t read = std::fread(buffer, 1, sizeof(buffer) - 1, pipe);
  ::pclose(pipe);
  std::string head(buffer, read);
  while (!head.empty() && (head.back() == '\n' || head.back() == '\r')) head.pop_back();
  return head;
}

TEST(RunMonitor, CompletedAndFailedRunsAreRecordedWithTheirCauseAndExitStatus) {
  const fs::path root = scratch("ends");
  const Result done = run("train --out " + (root / "done").string() +
                          " --model mlp --limit 64 --batch 32 --epochs 1");
  ASSERT_EQ(done.status, 0) << done.output;
  const nlohmann::json completed = record_of(root / "done");
  EXPECT_EQ(completed["status"], "completed");
  EXPECT_EQ(completed["exit_status"], 0);
  EXPECT_EQ(completed["last_step"], 2);
  EXPECT_EQ(completed["config"]["model"]["architecture"], "mlp");
  EXPECT_EQ(completed["command"][1], "train");
  EXPECT_NE(completed["device"].get<std::string>().find("llvmpipe"), std::string::npos)
      << completed.dump();
  // The commit the binary was built from: the source tree's HEAD, empty outside a git tree.
  EXPECT_EQ(completed["commit"], source_head()) << completed.dump();

  // A data folder that does not exist: a data error, exit status 65.
  const Result missing = run("train --out " + (root / "nodata").string() +
                             " --model mlp --limit 64 --data " + (root / "absent").string());
  EXPECT_EQ(missing.status, 65) << missing.output;
  EXPECT_EQ(record_of(root / "nodata")["status"], "data_error");

  // A learning rate that makes the loss overflow: stopped as non_finite, exit status 73, the
  // last checkpoint (of a finite step) kept and named.
  const Result diverged = run("train --out " + (root / "nan").string() +
                              " --model mlp --limit 256 --batch 32 --epochs 1 --lr 1e30 "
                              "--checkpoint-every 1");
  EXPECT_EQ(diverged.status, 73) << diverged.output;
  EXPECT_NE(diverged.output.find("the last checkpoint is"), std::string::npos) << diverged.output;
  const nlohmann::json non_finite = record_of(root / "nan");
  EXPECT_EQ(non_finite["status"], "non_finite");
  EXPECT_EQ(non_finite["exit_status"], 73);

  const Result listed = run("runs " + root.string(), false);
  ASSERT_EQ(listed.status, 0);
  EXPECT_NE(listed.output.find((root / "done").string() + "  completed  step 2  checkpoint " +
                               (root / "done" / "checkpoint.safetensors").string() + " (step 2)"),
            std::string::npos)
      << listed.output;
  EXPECT_NE(listed.output.find("nodata  data_error"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("nan  non_finite"), std::string::npos) << listed.output;
  fs::remove_all(root);
}

TEST(RunMonitor, ASigkilledRunIsListedAsKilled) {
  const fs::path root = scratch("killed");
  const fs::path out = root / "run";
  const pid_t child = ::fork();
  if (child == 0) {
    const std::string log = (root / "log.txt").string();
    ::freopen(log.c_str(), "w", stderr);
    ::freopen(log.c_str(), "a", stdout);
    ::execl(MEGANEURA_BINARY, MEGANEURA_BINARY, "train", "--out", out.c_str(), "--model", "mlp",
            "--limit", "4096", "--batch", "32", "--epochs", "50", "--checkpoint-every", "5",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 600 && !fs::exists(out / "checkpoint.safetensors"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const Result running = run("runs " + root.string(), false);
  EXPECT_NE(running.output.find("  running  "), std::string::npos) << running.output;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const Result listed = run("runs " + root.string(), false);
  ASSERT_EQ(listed.status, 0);
  EXPECT_NE(listed.output.find(out.string() + "  killed  step "), std::string::npos)
      << listed.output;
  const Result json = run("runs " + root.string() + " --json", false);
  const nlohmann::json line = nlohmann::json::parse(json.output.substr(0, json.output.find('\n')));
  EXPECT_EQ(line["status"], "killed");
  EXPECT_GE(line["last_step"].get<int64_t>(), 5);
  fs::remove_all(root);
}

}  // namespace
