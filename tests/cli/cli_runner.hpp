#pragma once
// Runs the `meganeura` binary as a user would, with its exit status and output.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace cli_test {

struct Result {
  int status = -1;
  std::string output;
};

// `arguments` after the binary; stderr joins stdout unless `with_stderr` is false (then it is
// dropped, for commands whose stdout is parsed).
inline Result run(const std::string& arguments, bool with_stderr = true) {
  Result result;
  const std::string command =
      std::string(MEGANEURA_BINARY) + " " + arguments + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof(buffer), pipe))
    result.output.append(buffer, read);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// An empty folder meganeura-<suite>-<name>-<pid> under the temporary directory, one a process
// since ctest runs a suite's tests side by side.
inline std::filesystem::path scratch_folder(const std::string& suite, const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("meganeura-" + suite + "-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

// `meganeura train ARGUMENTS --resume FILE`, FILE bytes that are not a checkpoint (written in
// `folder`): exit status 74 (checkpoint_error, docs/RELIABILITY.md) and one line naming FILE.
inline void expect_unreadable_resume_refused(const std::string& arguments,
                                             const std::filesystem::path& folder) {
  SCOPED_TRACE(arguments);
  const std::filesystem::path garbage = folder / "not-a-checkpoint.safetensors";
  std::ofstream(garbage) << "these bytes are not a checkpoint";
  const Result result = run("train " + arguments + " --resume " + garbage.string());
  EXPECT_EQ(result.status, 74) << result.output;
  const size_t error = result.output.find("error: ");
  ASSERT_NE(error, std::string::npos) << result.output;
  const std::string line = result.output.substr(error);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "error spans several lines: " << result.output;
  EXPECT_NE(line.find(garbage.string()), std::string::npos) << line;
}

// metrics.jsonl in `out`, a record a line, with the rates left out (they differ from run to
// run); with `steps_only`, only the steps' records (those with a loss), not the evaluations'.
inline std::string metrics_without_rates(const std::filesystem::path& out, bool steps_only) {
  std::ifstream lines(out / "metrics.jsonl");
  std::string text, line;
  while (std::getline(lines, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (steps_only && !record.contains("loss")) continue;
    for (auto field = record.begin(); field != record.end();)
      field = field.key().ends_with("_per_second") ? record.erase(field) : std::next(field);
    text += record.dump() + "\n";
  }
  return text;
}

// Two checkpoints of the same step with the same tensors, bit for bit.
inline void expect_same_checkpoint(const mg::io::Checkpoint& a, const mg::io::Checkpoint& b) {
  EXPECT_EQ(a.step, b.step);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    SCOPED_TRACE(a.tensors[t].name);
    EXPECT_EQ(a.tensors[t].name, b.tensors[t].name);
    // Not EXPECT_EQ, which would print every byte of both.
    EXPECT_TRUE(a.tensors[t].bytes == b.tensors[t].bytes);
  }
}

// `meganeura train ARGUMENTS` twice, into folders in `folder`: with --checkpoint-every 1000, each
// step queued behind the one in flight (cli::StepLoop), and with --checkpoint-every 1, after
// which no step is queued. Both must end in the same checkpoint, bit for bit, and log the same
// steps in metrics.jsonl.
inline void expect_queued_steps_train_as_one_by_one(const std::string& arguments,
                                                    const std::filesystem::path& folder) {
  SCOPED_TRACE(arguments);
  std::vector<mg::io::Checkpoint> checkpoints;
  std::vector<std::string> steps;
  for (const std::string every : {"1000", "1"}) {
    const std::filesystem::path out = folder / ("checkpoint-every-" + every);
    const Result train =
        run("train --out " + out.string() + " " + arguments + " --checkpoint-every " + every);
    ASSERT_EQ(train.status, 0) << train.output;
    checkpoints.push_back(mg::io::load_checkpoint(out / "checkpoint.safetensors"));
    steps.push_back(metrics_without_rates(out, true));
  }
  EXPECT_NE(steps[0].find("\"loss\""), std::string::npos) << steps[0];
  EXPECT_EQ(steps[0], steps[1]);
  expect_same_checkpoint(checkpoints[0], checkpoints[1]);
}

// The steps whose records (those with a loss) metrics.jsonl in `out` holds, in order.
inline std::vector<int64_t> logged_steps(const std::filesystem::path& out) {
  std::vector<int64_t> steps;
  std::ifstream lines(out / "metrics.jsonl");
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) steps.push_back(record.at("step").get<int64_t>());
  }
  return steps;
}

// A training job's --trace file: one span a dispatch of the training program (the count its
// "training program in S s (N dispatches" line prints), each with the bytes it reads or writes
// and its FLOPs.
inline void expect_trace_of_training_program(const Result& train,
                                             const std::filesystem::path& trace) {
  const size_t built = train.output.find("training program in ");
  ASSERT_NE(built, std::string::npos) << train.output;
  const size_t dispatches = std::stoul(train.output.substr(train.output.find('(', built) + 1));
  std::ifstream file(trace);
  ASSERT_TRUE(file) << trace;
  const nlohmann::json parsed = nlohmann::json::parse(file);
  const nlohmann::json& events = parsed.is_object() ? parsed.at("traceEvents") : parsed;
  size_t spans = 0;
  for (const nlohmann::json& event : events) {
    if (event.value("ph", "") != "X") continue;
    ++spans;
    EXPECT_GT(event.at("args").at("bytes").get<double>(), 0.0) << event.dump();
    EXPECT_GE(event.at("args").at("flops").get<double>(), 0.0) << event.dump();
  }
  EXPECT_EQ(spans, dispatches) << train.output;
}

// The U-Net config of scripts/unet_demo.sh's CI size in `folder`/config.json (one channel,
// 32 x 32 latents, two blocks).
inline void write_tiny_unet_config(const std::filesystem::path& folder) {
  std::filesystem::create_directories(folder);
  std::ofstream(folder / "config.json")
      << nlohmann::json{{"_class_name", "UNet2DConditionModel"},
                        {"in_channels", 1},
                        {"out_channels", 1},
                        {"sample_size", 32},
                        {"block_out_channels", {32, 64}},
                        {"down_block_types", {"DownBlock2D", "CrossAttnDownBlock2D"}},
                        {"up_block_types", {"CrossAttnUpBlock2D", "UpBlock2D"}},
                        {"mid_block_type", "UNetMidBlock2DCrossAttn"},
                        {"layers_per_block", 1},
                        {"attention_head_dim", 4},
                        {"cross_attention_dim", 64},
                        {"norm_num_groups", 8}};
}

// A tiny SmolVLA policy in `root`/policy and its synthetic episodes in `root`/data
// (scripts/smolvla_demo_data.py); false where the script failed.
inline bool make_tiny_smolvla(const std::filesystem::path& root) {
  return std::system(("/usr/bin/python3 " + std::string(MEGANEURA_SOURCE_DIR) +
                      "/scripts/smolvla_demo_data.py " + root.string() +
                      " --episodes 4 --image 16 --width 64 --layers 2 > /dev/null")
                         .c_str()) == 0;
}

}  // namespace cli_test
