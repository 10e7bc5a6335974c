// `mpirun -np 2 meganeura train` on the Fashion-MNIST CNN and on a ResNet image folder: the same
// losses as one process on the same global batch (for the ResNet, whose batch norm sees each
// rank's share alone, as one process accumulating the shares), a resume by both ranks, and a rank
// that fails ending the job with its error.
#include <gtest/gtest.h>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "cli/cli_runner.hpp"
#include "meganeura/distributed.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;

fs::path scratch(const std::string& name) {
  const fs::path path =
      fs::temp_directory_path() / ("meganeura-mpi-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

Result shell(const std::string& command) {
  Result result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof(buffer), pipe))
    result.output.append(buffer, read);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Two ranks on this machine's one device (Lavapipe in CI), whoever runs the test; `timeout`
// turns a hang into a failure.
std::string mpirun(int ranks) {
  return "timeout 300 mpirun --oversubscribe --allow-run-as-root -np " + std::to_string(ranks) +
         " ";
}

// step -> loss from metrics.jsonl.
std::map<int64_t, double> losses(const fs::path& out) {
  std::map<int64_t, double> result;
  std::ifstream file(out / "metrics.jsonl");
  std::string line;
  while (std::getline(file, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) result[record["step"].get<int64_t>()] = record["loss"];
  }
  return result;
}

// The last step record (one with a loss) of metrics.jsonl.
nlohmann::json last_record(const fs::path& out) {
  std::ifstream file(out / "metrics.jsonl");
  std::string line;
  nlohmann::json last;
  while (std::getline(file, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) last = std::move(record);
  }
  return last;
}

// 50 steps of a global batch of 32 (16 a rank); every step logged; a checkpoint at step 25.
const std::string kRun =
    "train --model cnn --limit 3200 --batch 32 --seed 3 --log-every 1 --checkpoint-every 25 ";

TEST(DistributedCli, TwoRanksTrainAsOneProcessOnTheGlobalBatchAndResume) {
  if (!mg::mpi_available()) GTEST_SKIP() << "built without MPI (DistributedCli.WithoutMpi)";
  const fs::path root = scratch("same");
  const std::string binary = MEGANEURA_BINARY;

  const Result single =
      shell(binary + " " + kRun + "--max-steps 50 --out " + (root / "single").string());
  ASSERT_EQ(single.status, 0) << single.output;

  // The first 25 steps with buckets of 10 KiB, each summed while backward runs on; the last 25
  // resumed by both ranks from rank 0's checkpoint, summing after backward.
  const Result first = shell(mpirun(2) + binary + " " + kRun +
                             "--max-steps 25 --bucket-mb 0.01 --out " + (root / "first").string());
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("rank 1 of 2: device"), std::string::npos) << first.output;
  const Result second =
      shell(mpirun(2) + "-x MEGANEURA_OVERLAP_REDUCTION=0 " + binary + " " + kRun +
            "--max-steps 50 --bucket-mb 0.01 --out " + (root / "second").string() + " --resume " +
            (root / "first" / "checkpoint.safetensors").string());
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;

  const std::map<int64_t, double> expected = losses(root / "single");
  std::map<int64_t, double> distributed = losses(root / "first");
  for (const auto& [step, loss] : losses(root / "second")) distributed[step] = loss;
  ASSERT_EQ(expected.size(), 50u);
  ASSERT_EQ(distributed.size(), 50u);
  for (const auto& [step, loss] : expected) {
    EXPECT_NEAR(distributed.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
  // Rank 0 alone wrote the files: one record a step, not two.
  std::ifstream metrics(root / "first" / "metrics.jsonl");
  EXPECT_EQ(std::count(std::istreambuf_iterator<char>(metrics), {}, '\n'), 25);
  // The first run's sums overlapped backward, the second's did not.
  const nlohmann::json overlapped = last_record(root / "first");
  EXPECT_GT(overlapped.value("segments", 0), 2) << overlapped.dump();
  EXPECT_GT(overlapped.value("sums_during_backward", 0), 0) << overlapped.dump();
  const nlohmann::json blocking = last_record(root / "second");
  EXPECT_EQ(blocking.value("segments", 0), 1) << blocking.dump();
  EXPECT_EQ(blocking.value("sums_during_backward", -1), 0) << blocking.dump();
  fs::remove_all(root);
}

// A tiny ResNet-18 on a Fashion-MNIST image folder: 64 training images, 4 steps an epoch of a
// global batch of 16 (8 a rank). Batch norm normalises each rank's share with that share's
// statistics, so two ranks do not take one process's step on the whole batch of 16 but one
// process's step with --batch 8 --accumulate 2: its two batches are the ranks' two shares (the
// same images, crops and flips), each normalised alone, and their mean gradient makes the one
// update. The constant schedule keeps the learning rate of a run cut in two the same.
const std::string kResNetRun =
    "train --model resnet18 --width 4 --size 32 --seed 5 --lr 3e-3 --schedule constant "
    "--warmup 0 --log-every 1 --workers 2 ";

TEST(DistributedCli, TwoResNetRanksTrainAsOneProcessAccumulatingTheirSharesAndResume) {
  if (!mg::mpi_available()) GTEST_SKIP() << "built without MPI (DistributedCli.WithoutMpi)";
  const fs::path root = scratch("resnet");
  const std::string binary = MEGANEURA_BINARY;
  const fs::path data = root / "fashion";
  const Result written =
      shell(binary + " fashion-folder " + data.string() + " --size 32 --limit 64");
  ASSERT_EQ(written.status, 0) << written.output;
  const std::string run = kResNetRun + "--data " + data.string() + " ";

  const Result single =
      shell(binary + " " + run + "--batch 8 --accumulate 2 --max-steps 12 --out " +
            (root / "single").string());
  ASSERT_EQ(single.status, 0) << single.output;

  // Steps 1-3 summing buckets of 10 KiB while backward runs on, then steps 4-6 (past the epoch's
  // end) resumed by both ranks from rank 0's checkpoint, summing after backward.
  const Result first =
      shell(mpirun(2) + binary + " " + run + "--batch 16 --max-steps 3 --bucket-mb 0.01 --out " +
            (root / "first").string());
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("rank 1 of 2: device"), std::string::npos) << first.output;
  const Result second = shell(mpirun(2) + "-x MEGANEURA_OVERLAP_REDUCTION=0 " + binary + " " + run +
                              "--batch 16 --max-steps 6 --out " + (root / "second").string() +
                              " --resume " + (root / "first" / "checkpoint.safetensors").string());
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  // Rank 0 validated the weights with its running statistics after the epoch and at the end.
  EXPECT_NE(second.output.find("epoch 1: validation accuracy"), std::string::npos) << second.output;

  // A distributed step's loss is the mean of the ranks' losses: the mean of the reference's two
  // batches. The programs differ (one accumulates on the GPU, the other sums on the host), so
  // the rounding may differ; the bound is the CNN's.
  const std::map<int64_t, double> reference = losses(root / "single");
  std::map<int64_t, double> distributed = losses(root / "first");
  for (const auto& [step, loss] : losses(root / "second")) distributed[step] = loss;
  ASSERT_EQ(reference.size(), 12u);
  ASSERT_EQ(distributed.size(), 6u);
  for (const auto& [step, loss] : distributed) {
    const double expected = (reference.at(2 * step - 1) + reference.at(2 * step)) / 2;
    EXPECT_NEAR(loss, expected, 1e-5 * std::abs(expected)) << "step " << step;
  }
  // The losses moved: the comparison is not of six copies of the first step.
  EXPECT_GT(std::abs(distributed.at(6) - distributed.at(1)), 1e-3);
  // Rank 0 alone wrote the files: one record a step and one of the validation, not two.
  std::ifstream metrics(root / "first" / "metrics.jsonl");
  EXPECT_EQ(std::count(std::istreambuf_iterator<char>(metrics), {}, '\n'), 4);
  EXPECT_GT(last_record(root / "first").value("sums_during_backward", 0), 0);
  EXPECT_EQ(last_record(root / "second").value("segments", 0), 1);
  fs::remove_all(root);
}

// Rank 1 cannot open its checkpoint while rank 0 goes on to its first collective: rank 1's error
// ends the job instead of leaving rank 0 waiting.
TEST(DistributedCli, AFailingRankEndsEveryRankWithItsError) {
  if (!mg::mpi_available()) GTEST_SKIP() << "built without MPI (DistributedCli.WithoutMpi)";
  const fs::path root = scratch("fail");
  const std::string binary = MEGANEURA_BINARY;
  const std::string arguments = kRun + "--max-steps 40 --out " + root.string();
  const Result result = shell("timeout 300 mpirun --oversubscribe --allow-run-as-root -np 1 " +
                              binary + " " + arguments + " : -np 1 " + binary + " " + arguments +
                              " --resume " + (root / "missing.safetensors").string());
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_NE(result.status, 124) << "the job hung: " << result.output;
  EXPECT_NE(result.output.find("rank 1 of 2: error:"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("missing.safetensors"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(root / "checkpoint.safetensors"));
  fs::remove_all(root);
}

// A learning rate of 1e30 blows the MLP's weights up with the first update, so the second step's
// forward overflows on both ranks: the job stops non_finite, and --detect-anomaly, each rank
// running its share of the step again, names the op that made the first NaN as the lowest rank
// found it, the same line on both ranks.
TEST(DistributedCli, DetectAnomalyGathersTheRanksFindings) {
  if (!mg::mpi_available()) GTEST_SKIP() << "built without MPI (DistributedCli.WithoutMpi)";
  const fs::path root = scratch("anomaly");
  const Result result =
      shell(mpirun(2) + MEGANEURA_BINARY +
            " train --model mlp --limit 256 --batch 32 --epochs 1 --lr 1e30 --distributed "
            "--detect-anomaly --out " +
            root.string());
  EXPECT_EQ(result.status, 73) << result.output;
  const std::string finding = "on rank 0 (its share of the batch), the first non-finite value is %";
  EXPECT_NE(result.output.find(finding), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(" matmul f32[16, 128] (forward, near 'model.fc2.weight') of "),
            std::string::npos)
      << result.output;
  fs::remove_all(root);
}

// The jobs that train in one process (Whisper, SmolVLA, the U-Net) refuse an MPI launcher in one
// line before reading anything, rather than letting each rank train a copy of its own into the
// same folder. Their folders need only the config key that picks the job.
TEST(DistributedCli, OneProcessJobsRefuseMpirun) {
  if (!mg::mpi_available()) GTEST_SKIP() << "built without MPI (DistributedCli.WithoutMpi)";
  const fs::path root = scratch("one-process");
  for (const auto& [job, config] :
       {std::pair{"Whisper", nlohmann::json{{"model_type", "whisper"}}},
        std::pair{"SmolVLA", nlohmann::json{{"type", "smolvla"}}},
        std::pair{"U-Net", nlohmann::json{{"_class_name", "UNet2DConditionModel"}}}}) {
    SCOPED_TRACE(job);
    const fs::path folder = root / job;
    fs::create_directories(folder);
    std::ofstream(folder / "config.json") << config.dump();
    const Result result =
        shell(mpirun(2) + MEGANEURA_BINARY + " train --model " + folder.string() + " --data " +
              (root / "absent").string() + " --out " + (root / "out").string());
    EXPECT_NE(result.status, 0) << result.output;
    EXPECT_NE(result.output.find("error: the " + std::string(job) +
                                 " job trains in one process; data-parallel training"),
              std::string::npos)
        << result.output;
    EXPECT_FALSE(fs::exists(root / "out"));
  }
  fs::remove_all(root);
}

TEST(DistributedCli, WithoutMpiDistributedSaysWhatIsMissing) {
  if (mg::mpi_available()) GTEST_SKIP() << "built with MPI (the tests above run)";
  const Result result = cli_test::run("train --distributed --max-steps 1");
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("built without MPI"), std::string::npos) << result.output;
}

}  // namespace
