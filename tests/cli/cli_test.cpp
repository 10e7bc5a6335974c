// The `meganeura` command as a user runs it: train, kill, resume, infer, and the one-line errors
// for bad checkpoints. Small runs (MLP, few images) keep it fast on Lavapipe.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

fs::path scratch(const std::string& name) {
  return cli_test::scratch_folder("cli", name);
}

const char* kSmallRun = " --model mlp --limit 512 --batch 32 --epochs 2 ";

TEST(Cli, TrainThenInferReportsAccuracy) {
  const fs::path out = scratch("train");
  const Result train = run("train --out " + out.string() + kSmallRun);
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("test accuracy:"), std::string::npos) << train.output;
  EXPECT_TRUE(fs::exists(out / "checkpoint.safetensors"));
  EXPECT_TRUE(fs::exists(out / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(out / "training.png"));
  const Result infer = run("infer " + (out / "checkpoint.safetensors").string());
  ASSERT_EQ(infer.status, 0) << infer.output;
  const size_t at = infer.output.find("test accuracy: ");
  ASSERT_NE(at, std::string::npos) << infer.output;
  // 32 steps of an MLP on 512 images is far from converged, but far above chance (10 %).
  EXPECT_GT(std::stod(infer.output.substr(at + 15)), 40.0) << infer.output;
  // The test set in one batch (nothing queued) and in batches of 333 queued behind each other
  // (the last one partial) give the same confusion matrix and accuracy.
  const auto confusion = [](const std::string& output) {
    return output.substr(0, output.find("evaluated "));
  };
  const Result whole = run("infer " + (out / "checkpoint.safetensors").string() + " --batch 10000");
  const Result queued = run("infer " + (out / "checkpoint.safetensors").string() + " --batch 333");
  ASSERT_EQ(whole.status, 0) << whole.output;
  ASSERT_EQ(queued.status, 0) << queued.output;
  EXPECT_EQ(confusion(whole.output), confusion(queued.output));
  EXPECT_EQ(whole.output.substr(whole.output.find("test accuracy: ")),
            queued.output.substr(queued.output.find("test accuracy: ")));
  // --trace writes the last batch's dispatches, as many as the inference program has, each with
  // its bytes (every dispatch reads or writes some) and FLOPs, and prints the sum of their GPU
  // times.
  const Result traced = run("infer " + (out / "checkpoint.safetensors").string() + " --trace " +
                            (out / "trace.json").string());
  ASSERT_EQ(traced.status, 0) << traced.output;
  const size_t program = traced.output.find("inference program: ");
  const size_t line = traced.output.find("trace: ");
  ASSERT_NE(program, std::string::npos) << traced.output;
  ASSERT_NE(line, std::string::npos) << traced.output;
  const size_t dispatches = std::stoul(traced.output.substr(program + 19));
  const size_t counted = traced.output.find(" (", line);
  EXPECT_EQ(std::stoul(traced.output.substr(counted + 2)), dispatches) << traced.output;
  const double printed_us =
      std::stod(traced.output.substr(traced.output.find("dispatches, ", line) + 12));
  std::ifstream file(out / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(file);
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  size_t spans = 0;
  double total_us = 0;
  for (const nlohmann::json& event : events) {
    if (event.value("ph", "") != "X") continue;
    ++spans;
    total_us += event.at("dur").get<double>();
    EXPECT_GT(event.at("args").at("bytes").get<double>(), 0.0) << event.dump();
    EXPECT_GE(event.at("args").at("flops").get<double>(), 0.0) << event.dump();
  }
  EXPECT_EQ(spans, dispatches);
  EXPECT_NEAR(total_us, printed_us, 0.05 + 1e-3 * total_us) << traced.output;
  fs::remove_all(out);
}

// `train` queues each step behind the one in flight, except before an evaluation or a
// checkpoint; with a checkpoint after every step nothing is queued. Both end in the same
// checkpoint, bit for bit, and the same metrics. The evaluation after the first epoch sees the
// parameters of that epoch's last step, no later one: a one-epoch run, whose evaluation follows
// its last step, measures the same test accuracy.
TEST(Cli, QueuedStepsTrainAsStepsRunOneByOne) {
  std::vector<mg::io::Checkpoint> checkpoints;
  std::vector<std::string> metrics;
  const std::string mlp = " --model mlp --limit 512 --batch 32 ";
  for (const std::string options :
       {"--epochs 2 --checkpoint-every 1000", "--epochs 2 --checkpoint-every 1", "--epochs 1"}) {
    const fs::path out = scratch("queued-" + std::to_string(metrics.size()));
    const Result train = run("train --out " + out.string() + mlp + options);
    ASSERT_EQ(train.status, 0) << train.output;
    checkpoints.push_back(mg::io::load_checkpoint(out / "checkpoint.safetensors"));
    metrics.push_back(cli_test::metrics_without_rates(out, false));
    fs::remove_all(out);
  }
  cli_test::expect_same_checkpoint(checkpoints[0], checkpoints[1]);
  EXPECT_EQ(metrics[0], metrics[1]);
  EXPECT_NE(metrics[0].find("\"loss\""), std::string::npos);
  const auto first_evaluation = [](const std::string& text) {
    const size_t at = text.find("\"test_accuracy\"");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('}', at) - at);
  };
  EXPECT_FALSE(first_evaluation(metrics[2]).empty());
  EXPECT_EQ(first_evaluation(metrics[0]), first_evaluation(metrics[2]));
}

// The jobs whose training program is a Session of their own queue their steps the same way: a
// U-Net (the CI config of scripts/unet_demo.sh) and a SmolVLA policy
// (scripts/smolvla_demo_data.py), each against the same run one step at a time.
TEST(Cli, QueuedUNetAndSmolVLAStepsTrainAsStepsRunOneByOne) {
  const fs::path unet = scratch("queued-unet");
  cli_test::write_tiny_unet_config(unet / "config");
  cli_test::expect_queued_steps_train_as_one_by_one(
      "--model " + (unet / "config").string() +
          " --tokens 4 --batch 2 --limit 64 --max-steps 4 --sample-steps 0",
      unet);
  fs::remove_all(unet);
  const fs::path smolvla = scratch("queued-smolvla");
  ASSERT_TRUE(cli_test::make_tiny_smolvla(smolvla));
  cli_test::expect_queued_steps_train_as_one_by_one("--model " + (smolvla / "policy").string() +
                                                        " --data " + (smolvla / "data").string() +
                                                        " --batch 4 --validation 0 --max-steps 4",
                                                    smolvla);
  fs::remove_all(smolvla);
}

// The U-Net and SmolVLA jobs log every --log-every steps and the last, and --trace writes their
// last step's dispatches. The U-Net accumulates two batches an update: the learning rate it
// logs is the warmup's at the update a step belongs to (steps 2 and 3: updates 0 and 1).
TEST(Cli, UNetAndSmolVLAJobsLogEveryNStepsAndTrace) {
  const auto train_logged = [](const fs::path& root, const std::string& arguments) {
    const Result train =
        run("train --out " + (root / "run").string() + " " + arguments +
            " --max-steps 3 --log-every 2 --trace " + (root / "trace.json").string());
    EXPECT_EQ(train.status, 0) << train.output;
    EXPECT_EQ(cli_test::logged_steps(root / "run"), (std::vector<int64_t>{2, 3}));
    cli_test::expect_trace_of_training_program(train, root / "trace.json");
  };
  const fs::path unet = scratch("log-unet");
  cli_test::write_tiny_unet_config(unet / "config");
  train_logged(unet, "--model " + (unet / "config").string() +
                         " --tokens 4 --batch 2 --limit 64 --sample-steps 0 --accumulate 2"
                         " --schedule warmup --warmup 4 --lr 1e-3");
  std::vector<double> learning_rates;
  std::ifstream lines(unet / "run" / "metrics.jsonl");
  for (std::string line; std::getline(lines, line);)
    learning_rates.push_back(nlohmann::json::parse(line).at("learning_rate").get<double>());
  ASSERT_EQ(learning_rates.size(), 2u);
  EXPECT_DOUBLE_EQ(learning_rates[0], 1e-3 * 1 / 4);
  EXPECT_DOUBLE_EQ(learning_rates[1], 1e-3 * 2 / 4);
  fs::remove_all(unet);

  const fs::path smolvla = scratch("log-smolvla");
  ASSERT_TRUE(cli_test::make_tiny_smolvla(smolvla));
  train_logged(smolvla, "--model " + (smolvla / "policy").string() + " --data " +
                            (smolvla / "data").string() + " --batch 4 --validation 0");
  fs::remove_all(smolvla);
}

// With --accumulate 2 the U-Net's EMA moves once an update, with the warm-up's first decay
// (min(0.999, 1/10)): after the first batch it still holds the starting weights p0, after the
// second (the update to p1) p0 + 0.9 (p1 - p0). The starting weights come from a run of the
// first batch alone, which leaves them as they were.
TEST(Cli, UNetEmaMovesOnceAnUpdate) {
  const fs::path root = scratch("unet-ema");
  cli_test::write_tiny_unet_config(root / "config");
  const std::string arguments = " --model " + (root / "config").string() +
                                " --tokens 4 --batch 2 --limit 64 --sample-steps 0"
                                " --accumulate 2 --schedule constant --lr 1e-3";
  std::vector<mg::io::Checkpoint> checkpoints;
  for (const char* steps : {"1", "2"}) {
    const fs::path out = root / (std::string("steps-") + steps);
    const Result train = run("train --out " + out.string() + arguments + " --max-steps " + steps);
    ASSERT_EQ(train.status, 0) << train.output;
    checkpoints.push_back(mg::io::load_checkpoint(out / "checkpoint.safetensors"));
  }
  const auto values = [](const mg::io::Checkpoint& checkpoint, const std::string& name) {
    const mg::io::TensorRecord* record = checkpoint.find(name);
    EXPECT_NE(record, nullptr) << name;
    std::vector<float> result(record ? record->bytes.size() / 4 : 0);
    if (record) std::memcpy(result.data(), record->bytes.data(), record->bytes.size());
    return result;
  };
  size_t compared = 0;
  for (const mg::io::TensorRecord& tensor : checkpoints[1].tensors) {
    if (!checkpoints[1].find("ema." + tensor.name)) continue;
    SCOPED_TRACE(tensor.name);
    const std::vector<float> start = values(checkpoints[0], tensor.name);
    EXPECT_EQ(values(checkpoints[0], "ema." + tensor.name), start);
    const std::vector<float> trained = values(checkpoints[1], tensor.name);
    const std::vector<float> average = values(checkpoints[1], "ema." + tensor.name);
    ASSERT_EQ(average.size(), start.size());
    bool moved = false;
    double worst = 0;  // the largest error, relative to 1 + |expected|
    for (size_t i = 0; i < start.size(); ++i) {
      const double expected = start[i] + 0.9 * (double(trained[i]) - start[i]);
      worst = std::max(worst, std::abs(average[i] - expected) / (1 + std::abs(expected)));
      moved = moved || trained[i] != start[i];
    }
    EXPECT_LT(worst, 1e-6);
    EXPECT_TRUE(moved);
    ++compared;
  }
  EXPECT_GT(compared, 10u);
  fs::remove_all(root);
}

// The SmolVLA job with --accumulate 2: after the first batch the gradient waits in the
// accumulator and no update has moved Adam's moments; after the second the update is applied and
// the accumulator is empty again.
TEST(Cli, SmolVLAAccumulatesTwoBatchesIntoOneUpdate) {
  const fs::path root = scratch("smolvla-accumulate");
  ASSERT_TRUE(cli_test::make_tiny_smolvla(root));
  const auto all_zero = [](const mg::io::TensorRecord& tensor) {
    return std::all_of(tensor.bytes.begin(), tensor.bytes.end(),
                       [](std::byte byte) { return byte == std::byte{0}; });
  };
  for (const int steps : {1, 2}) {
    SCOPED_TRACE(steps);
    const fs::path out = root / ("steps-" + std::to_string(steps));
    const Result train =
        run("train --out " + out.string() + " --model " + (root / "policy").string() + " --data " +
            (root / "data").string() + " --batch 4 --validation 0 --accumulate 2 --max-steps " +
            std::to_string(steps));
    ASSERT_EQ(train.status, 0) << train.output;
    const mg::io::Checkpoint checkpoint = mg::io::load_checkpoint(out / "checkpoint.safetensors");
    size_t moments = 0, moved_moments = 0, accumulators = 0, held_gradients = 0;
    for (const mg::io::TensorRecord& tensor : checkpoint.tensors) {
      if (tensor.name.ends_with(".m")) {
        ++moments;
        moved_moments += !all_zero(tensor);
      } else if (tensor.name.ends_with(".accumulated_gradient")) {
        ++accumulators;
        held_gradients += !all_zero(tensor);
      }
    }
    ASSERT_GT(moments, 0u);
    EXPECT_EQ(accumulators, moments);
    // A parameter whose gradient happens to be zero leaves both at zero: most do not.
    if (steps == 1) {
      EXPECT_EQ(moved_moments, 0u);
      EXPECT_GT(held_gradients, accumulators / 2);
    } else {
      EXPECT_GT(moved_moments, moments / 2);
      EXPECT_EQ(held_gradients, 0u);
    }
  }
  fs::remove_all(root);
}

TEST(Cli, KillDuringCheckpointingThenResume) {
  const fs::path out = scratch("kill");
  const pid_t child = ::fork();
  if (child == 0) {
    const std::string output = (out / "log.txt").string();
    ::freopen(output.c_str(), "w", stderr);
    ::freopen(output.c_str(), "a", stdout);
    ::execl(MEGANEURA_BINARY, MEGANEURA_BINARY, "train", "--out", out.c_str(), "--model", "mlp",
            "--limit", "4096", "--batch", "32", "--epochs", "50", "--checkpoint-every", "1",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Checkpoints are written after every step, so a kill lands in or near a save.
  const fs::path checkpoint = out / "checkpoint.safetensors";
  for (int i = 0; i < 600 && !fs::exists(checkpoint); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(fs::exists(checkpoint));
  const mg::io::Checkpoint saved = mg::io::load_checkpoint(checkpoint);
  EXPECT_GT(saved.step, 0);
  // Enough epochs of 128 steps to pass the checkpoint's step, and no more.
  const std::string epochs = std::to_string(saved.step / 128 + 1);
  const Result resumed =
      run("train --out " + out.string() + " --model mlp --limit 4096 --batch 32 --epochs " +
          epochs + " --resume " + checkpoint.string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  fs::remove_all(out);
}

void expect_one_line_error(const std::string& arguments, const std::string& must_mention) {
  const Result result = run(arguments);
  EXPECT_NE(result.status, 0) << result.output;
  const size_t error = result.output.find("error: ");
  ASSERT_NE(error, std::string::npos) << result.output;
  const std::string line = result.output.substr(error);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "error spans several lines: " << result.output;
  EXPECT_NE(line.find(must_mention), std::string::npos) << line;
}

TEST(Cli, BadCheckpointsGiveOneLineErrors) {
  const fs::path out = scratch("errors");
  ASSERT_EQ(
      run("train --out " + out.string() + " --model mlp --limit 64 --batch 32 --epochs 1").status,
      0);
  const fs::path good = out / "checkpoint.safetensors";

  expect_one_line_error("infer " + (out / "missing.safetensors").string(), "missing.safetensors");

  const fs::path truncated = out / "truncated.safetensors";
  fs::copy_file(good, truncated);
  fs::resize_file(truncated, fs::file_size(good) / 2);
  expect_one_line_error("infer " + truncated.string(), "truncated");

  const fs::path corrupt = out / "corrupt.safetensors";
  fs::copy_file(good, corrupt);
  {
    std::fstream file(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(20);
    file.write("\x01\x02\x03\x04\x05\x06", 6);
  }
  expect_one_line_error("infer " + corrupt.string(), "corrupt.safetensors");

  expect_one_line_error("train --out " + out.string() + " --model cnn --resume " + good.string(),
                        "saved for model");
  expect_one_line_error("train --epochs many", "--epochs");
  expect_one_line_error("train --limit 0", "--limit must be from 1 to");
  expect_one_line_error("train --epochs 0", "--epochs must be from 1 to");
  expect_one_line_error("train --checkpoint-every -1", "--checkpoint-every must be from 1 to");
  expect_one_line_error("inspect --batch 0", "--batch must be positive");
  // An output directory that cannot be made fails at once, before any loading or building.
  const std::string unwritable = "train --out /proc/meganeura-out --model mlp --limit 64";
  expect_one_line_error(unwritable, "cannot create the output directory /proc/meganeura-out");
  EXPECT_EQ(run(unwritable).output.find("built training program"), std::string::npos);
  // So does a trace file in a directory that does not exist, in training and in inference.
  const std::string missing_dir = (out / "no-such-dir").string();
  expect_one_line_error("train --out " + out.string() +
                            " --overwrite --model mlp --limit 64 --trace " + missing_dir +
                            "/trace.json",
                        "there is no directory " + missing_dir);
  const Result infer_trace = run("infer " + good.string() + " --trace " + missing_dir + "/t.json");
  EXPECT_NE(infer_trace.status, 0);
  EXPECT_NE(infer_trace.output.find("there is no directory " + missing_dir), std::string::npos)
      << infer_trace.output;
  EXPECT_EQ(infer_trace.output.find("test accuracy"), std::string::npos) << infer_trace.output;
  expect_one_line_error("infer " + good.string() + " --precision half", "unknown precision");

  // Fast precision says which path ran: strict, with the reason, on a device without
  // cooperative matrices (Lavapipe, where CI runs this), else the count of dispatches on them.
  const Result fast = run("infer " + good.string() + " --precision fast");
  EXPECT_EQ(fast.status, 0) << fast.output;
  EXPECT_TRUE(fast.output.find("precision: strict (fast was asked for") != std::string::npos ||
              fast.output.find("precision: fast (") != std::string::npos)
      << fast.output;
  // bf16 likewise, naming the bfloat16 matrices a device lacks.
  const Result bf16 = run("infer " + good.string() + " --precision bf16");
  EXPECT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_TRUE(bf16.output.find("precision: strict (bf16 was asked for, but the device has no "
                               "bfloat16 cooperative matrices") != std::string::npos ||
              bf16.output.find("precision: bf16 (") != std::string::npos)
      << bf16.output;
  fs::remove_all(out);
}

// A smoke run of the kernel benchmark: the filter picks cases, rotation replicates small inputs
// (two GEMM inputs of 1.6 MB need 3 copies to pass 4 MiB), every case prints one JSON line.
TEST(Cli, BenchKernelsFilterAndRotation) {
  const Result result =
      run("bench kernels --small --runs 2 --rotate 4 --filter \"smollm q_proj 128x576\"");
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find(R"("case":"smollm q_proj 128x576x576")"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find(R"("copies":3)"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("resnet"), std::string::npos) << result.output;

  // A filter that matches nothing is an error that names the case families.
  const Result none = run("bench kernels --small --filter zzz");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("no case matches --filter 'zzz'; case names start with copy, gemm, "
                             "smollm, pointwise"),
            std::string::npos)
      << none.output;
  const Result no_fast = run("bench kernels --small --no-fast --filter \"4096^3 fast\"");
  EXPECT_NE(no_fast.status, 0);
  EXPECT_NE(no_fast.output.find("without the fast cases"), std::string::npos) << no_fast.output;

  const Result pointwise = run("bench kernels --small --runs 2 --filter \"pointwise add\"");
  ASSERT_EQ(pointwise.status, 0) << pointwise.output;
  EXPECT_NE(pointwise.output.find(R"("case":"pointwise add 64M+2")"), std::string::npos)
      << pointwise.output;
  EXPECT_NE(pointwise.output.find("gbps"), std::string::npos) << pointwise.output;
}

// On a device whose buffers hold less than 256 MiB (Lavapipe: 128), each of the two 64M-element
// cases fails on its own, named with the limit, and the second still runs after the first; the
// exit status says so and the hint names --small. Bad --runs and --rotate values are errors.
TEST(Cli, BenchKernelsReportsCasesTheDeviceCannotRun) {
  const Result bad_runs = run("bench kernels --runs 0");
  EXPECT_NE(bad_runs.status, 0);
  EXPECT_NE(bad_runs.output.find("--runs must be at least 1"), std::string::npos)
      << bad_runs.output;
  const Result bad_rotate = run("bench kernels --small --rotate -1");
  EXPECT_NE(bad_rotate.status, 0);
  EXPECT_NE(bad_rotate.output.find("--rotate must be 0 or more"), std::string::npos)
      << bad_rotate.output;

  const Result devices = run("devices --verbose");
  const size_t range = devices.output.find("max storage buffer range ");
  ASSERT_NE(range, std::string::npos) << devices.output;
  const int64_t range_mib = std::stoll(devices.output.substr(range + 25));
  if (range_mib >= 257) GTEST_SKIP() << "the device binds " << range_mib << " MiB: every case fits";
  const Result result = run("bench kernels --runs 1 --rotate 0 --filter \"pointwise add 64M\"");
  EXPECT_EQ(result.status, 1) << result.output;
  for (const char* name : {"pointwise add 64M'", "pointwise add 64M+2'"}) {
    EXPECT_NE(result.output.find(std::string("case '") + name + " failed: "), std::string::npos)
        << result.output;
  }
  EXPECT_NE(result.output.find("buffer limit"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("failed (see above)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("2 case(s) failed; on a device whose buffers hold less than "
                               "256 MiB, --small shrinks the large cases"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find(R"("case":)"), std::string::npos) << result.output;
}

// --profile times every dispatch in runs of its own and reports each kernel kind per case.
TEST(Cli, BenchKernelsProfile) {
  const Result result =
      run("bench kernels --small --runs 2 --rotate 0 --no-fast --profile --filter \"q_proj dW\"");
  ASSERT_EQ(result.status, 0) << result.output;
  const size_t json = result.output.find(R"({"case":"smollm q_proj dW)");
  ASSERT_NE(json, std::string::npos) << result.output;
  const nlohmann::json record =
      nlohmann::json::parse(result.output.substr(json, result.output.find('\n', json) - json));
  ASSERT_TRUE(record.contains("kernel_ms")) << result.output;
  ASSERT_TRUE(record["kernel_ms"].contains("matmul")) << result.output;
  EXPECT_GT(record["kernel_ms"]["matmul"].get<double>(), 0.0);
  EXPECT_NE(result.output.find("    matmul "), std::string::npos) << result.output;
}

// --dispatches lists every dispatch of the plan once, in order, with the labels that traces and
// profiles show: as many lines as --plan counts, numbered from 0.
// Every device's details say how many compute units the rules plan for (the driver's count,
// or the assumed one where it reports none) and whether it has workgroup-scope cooperative
// matrices.
TEST(Cli, DevicesVerboseNamesComputeUnits) {
  const Result result = run("devices --verbose");
  ASSERT_EQ(result.status, 0) << result.output;
  size_t devices = 0, unit_lines = 0, workgroup_scope_lines = 0;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" | Vulkan ") != std::string::npos) ++devices;
    if (line.find(" compute units (kernels and splits are planned for them)") !=
            std::string::npos ||
        line.find("compute units not reported by the driver (planned as 132") != std::string::npos)
      ++unit_lines;
    if (line.ends_with("workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2): yes") ||
        line.ends_with("workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2): no"))
      ++workgroup_scope_lines;
  }
  EXPECT_GT(devices, 0u) << result.output;
  EXPECT_EQ(unit_lines, devices) << result.output;
  EXPECT_EQ(workgroup_scope_lines, devices) << result.output;
}

TEST(Cli, InspectListsDispatches) {
  const Result result = run("inspect --model mlp --mode infer --batch 4 --plan --dispatches");
  ASSERT_EQ(result.status, 0) << result.output;
  const size_t counted = result.output.find("dispatches: ");
  ASSERT_NE(counted, std::string::npos) << result.output;
  const int dispatches = std::stoi(result.output.substr(counted + 12));
  ASSERT_GT(dispatches, 0);
  const size_t header = result.output.find("   #  kernel");
  ASSERT_NE(header, std::string::npos) << result.output;
  std::istringstream lines(result.output.substr(header));
  std::string line;
  std::getline(lines, line);
  int listed = 0;
  while (std::getline(lines, line)) {
    ASSERT_EQ(std::stoi(line.substr(0, 4)), listed) << line;
    EXPECT_NE(line.find(" %"), std::string::npos) << line;  // a label names its node
    ++listed;
  }
  EXPECT_EQ(listed, dispatches) << result.output;
  EXPECT_NE(result.output.find("matmul %"), std::string::npos) << result.output;
}

}  // namespace
