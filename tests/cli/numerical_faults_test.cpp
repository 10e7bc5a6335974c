// Numerical faults in training (docs/RELIABILITY.md): a step whose loss or gradients are not
// finite never updates the parameters; the run stops with a checkpoint of finite parameters
// (--on-nonfinite stop, the default), or skips the step and goes on (skip), and
// --detect-anomaly names the op that made the first NaN. A learning rate of 1e30 blows the MLP's
// weights up (finite, near 1e30) with its first update, so the second step's forward overflows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

fs::path scratch(const std::string& name) {
  const fs::path path = fs::temp_directory_path() /
                        ("meganeura-nonfinite-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);
}

// Every record of a run's metrics.jsonl that reports a step (not the evaluations).
std::vector<nlohmann::json> metrics_lines(const fs::path& folder) {
  std::ifstream file(folder / "metrics.jsonl");
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(file, line)) {
    if (line.find("\"skipped_steps\"") != std::string::npos)
      records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

nlohmann::json last_metrics_line(const fs::path& folder) {
  return metrics_lines(folder).back();
}

const std::string kDiverging = " --model mlp --limit 256 --batch 32 --epochs 1 --lr 1e30";

TEST(NumericalFaults, StopKeepsACheckpointOfFiniteParameters) {
  const fs::path root = scratch("stop");
  const fs::path out = root / "run";
  const Result stopped = run("train --out " + out.string() + kDiverging + " --checkpoint-every 1");
  EXPECT_EQ(stopped.status, 73) << stopped.output;
  EXPECT_NE(stopped.output.find("the loss became nan at step 2 and its update was not applied"),
            std::string::npos)
      << stopped.output;
  EXPECT_NE(stopped.output.find("the last checkpoint is " +
                                (out / "checkpoint.safetensors").string() + " (step 2)"),
            std::string::npos)
      << stopped.output;
  const nlohmann::json record = read_json(out / "run.json");
  EXPECT_EQ(record["status"], "non_finite");
  EXPECT_EQ(record["exit_status"], 73);
  EXPECT_EQ(record["checkpoint"]["step"], 2);

  // The checkpoint holds the state after the first update and nothing of the second: every
  // tensor (parameters and Adam's moments) equals, bit for bit, that of a run stopped after one
  // step.
  const Result one_step =
      run("train --out " + (root / "one").string() + kDiverging + " --max-steps 1");
  ASSERT_EQ(one_step.status, 0) << one_step.output;
  const mg::io::Checkpoint kept = mg::io::load_checkpoint(out / "checkpoint.safetensors");
  const mg::io::Checkpoint reference =
      mg::io::load_checkpoint(root / "one" / "checkpoint.safetensors");
  ASSERT_EQ(kept.tensors.size(), reference.tensors.size());
  EXPECT_GE(kept.tensors.size(), 12u);  // four parameters, their m and v, and more
  for (const mg::io::TensorRecord& tensor : reference.tensors) {
    const mg::io::TensorRecord* same = kept.find(tensor.name);
    ASSERT_NE(same, nullptr) << tensor.name;
    EXPECT_TRUE(same->bytes == tensor.bytes) << tensor.name;
  }
  fs::remove_all(root);
}

TEST(NumericalFaults, SkipGoesOnAndCountsTheSkippedSteps) {
  const fs::path root = scratch("skip");
  const Result skipped =
      run("train --out " + root.string() + kDiverging + " --on-nonfinite skip --log-every 1");
  EXPECT_EQ(skipped.status, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("warning: the loss became nan at step 2 and its update was not "
                                "applied (--on-nonfinite skip: 1 steps skipped so far)"),
            std::string::npos)
      << skipped.output;
  // Every step after the first meets the same blown-up weights, since no update of theirs lands.
  EXPECT_EQ(last_metrics_line(root)["step"], 8);
  EXPECT_EQ(last_metrics_line(root)["skipped_steps"], 7);
  EXPECT_EQ(read_json(root / "run.json")["status"], "completed");
  EXPECT_EQ(run("train --out " + root.string() + " --overwrite --on-nonfinite maybe").status, 1);
  fs::remove_all(root);
}

// --loss-scale: dynamic by default in fast precision (Lavapipe has no f16 cooperative matrices,
// so the products stay f32 and 65536 never overflows), off in strict; a fixed power of two
// trains as off does (f32 rounding commutes with it); a bad value is one line.
TEST(NumericalFaults, LossScaleShowsInMetrics) {
  const fs::path root = scratch("loss-scale");
  const std::string job = " --model mlp --limit 128 --batch 32 --epochs 1 --log-every 1";
  const Result fast = run("train --out " + (root / "fast").string() + job + " --precision fast");
  ASSERT_EQ(fast.status, 0) << fast.output;
  const nlohmann::json dynamic = last_metrics_line(root / "fast");
  EXPECT_EQ(dynamic["step"], 4);
  EXPECT_EQ(dynamic["loss_scale"], 65536.0);
  EXPECT_EQ(dynamic["loss_scale_overflows"], 0);
  EXPECT_EQ(dynamic["skipped_steps"], 0);

  const Result strict = run("train --out " + (root / "strict").string() + job);
  ASSERT_EQ(strict.status, 0) << strict.output;
  const Result fixed =
      run("train --out " + (root / "fixed").string() + job + " --loss-scale 1048576");
  ASSERT_EQ(fixed.status, 0) << fixed.output;
  const std::vector<nlohmann::json> unscaled = metrics_lines(root / "strict");
  const std::vector<nlohmann::json> scaled = metrics_lines(root / "fixed");
  ASSERT_EQ(unscaled.size(), 4u);
  ASSERT_EQ(scaled.size(), 4u);
  for (size_t i = 0; i < unscaled.size(); ++i) {
    EXPECT_FALSE(unscaled[i].contains("loss_scale"));
    EXPECT_EQ(scaled[i]["loss_scale"], 1048576.0);
    const double loss = unscaled[i]["loss"];
    EXPECT_NEAR(scaled[i]["loss"], loss, 1e-6 * loss) << "step " << i + 1;
  }

  for (const char* bad : {"0.5", "huge", "1e39", "dynamicx"}) {
    const Result refused =
        run("train --out " + (root / "bad").string() + job + " --loss-scale " + bad);
    EXPECT_EQ(refused.status, 1) << bad;
    EXPECT_EQ(refused.output, "meganeura train: error: bad --loss-scale '" + std::string(bad) +
                                  "' (dynamic, off or a fixed scale from 1 to 3.4e38)\n")
        << refused.output;
  }
  EXPECT_NE(run("train --help").output.find("--loss-scale S"), std::string::npos);
  fs::remove_all(root);
}

TEST(NumericalFaults, DetectAnomalyNamesTheFirstOp) {
  const fs::path root = scratch("anomaly");
  const Result found = run("train --out " + root.string() + kDiverging + " --detect-anomaly");
  EXPECT_EQ(found.status, 73) << found.output;
  // The second layer's product of huge weights and activations overflows: inf - inf = NaN.
  EXPECT_NE(found.output.find("the first non-finite value is %"), std::string::npos)
      << found.output;
  EXPECT_NE(found.output.find(" matmul f32[32, 128] (forward, near 'model.fc2.weight') of "),
            std::string::npos)
      << found.output;
  EXPECT_EQ(read_json(root / "run.json")["status"], "non_finite");
  fs::remove_all(root);
}

// The jobs whose training program is a Session of their own record its inputs too: a U-Net (the
// CI config of scripts/unet_demo.sh) and a SmolVLA policy (scripts/smolvla_demo_data.py) blown
// up the same way, with --detect-anomaly (`arguments`, the run going to root/run), stop
// non_finite and name a forward op and the parameter nearest it.
void expect_forward_anomaly(const fs::path& root, const std::string& arguments) {
  const Result found = run("train --out " + (root / "run").string() + " " + arguments +
                           " --max-steps 3 --lr 1e30 --warmup 0 --detect-anomaly");
  EXPECT_EQ(found.status, 73) << found.output;
  EXPECT_NE(found.output.find("the first non-finite value is %"), std::string::npos)
      << found.output;
  EXPECT_NE(found.output.find(" (forward, near '"), std::string::npos) << found.output;
  EXPECT_EQ(read_json(root / "run" / "run.json")["status"], "non_finite");
}

TEST(NumericalFaults, DetectAnomalyInTheUNetJob) {
  const fs::path root = scratch("anomaly-unet");
  cli_test::write_tiny_unet_config(root / "config");
  expect_forward_anomaly(
      root, "--model " + (root / "config").string() + " --tokens 4 --batch 2 --limit 64");
  fs::remove_all(root);
}

TEST(NumericalFaults, DetectAnomalyInTheSmolVLAJob) {
  const fs::path root = scratch("anomaly-smolvla");
  ASSERT_TRUE(cli_test::make_tiny_smolvla(root));
  expect_forward_anomaly(root, "--model " + (root / "policy").string() + " --data " +
                                   (root / "data").string() + " --batch 4 --validation 0");
  fs::remove_all(root);
}

}  // namespace
