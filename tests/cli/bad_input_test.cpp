// Bad input to `meganeura` as a new user gives it: each case must end in one error line and a
// non-zero exit status, before anything is built, and never in a crash or a silent full run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

fs::path scratch(const std::string& name) {
  return cli_test::scratch_folder("bad", name);
}

// Exit status `status` (1: bad input; 74: a checkpoint that cannot be resumed), one line naming
// `must_mention`, and no program built.
void expect_refused(const std::string& arguments, const std::string& must_mention, int status = 1) {
  SCOPED_TRACE(arguments);
  const Result result = run(arguments);
  EXPECT_EQ(result.status, status) << result.output;
  const size_t error = result.output.find("error: ");
  ASSERT_NE(error, std::string::npos) << result.output;
  const std::string line = result.output.substr(error);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "error spans several lines: " << result.output;
  EXPECT_NE(line.find(must_mention), std::string::npos) << line;
  EXPECT_EQ(result.output.find("built training program"), std::string::npos) << result.output;
}

std::vector<nlohmann::json> metrics_lines(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(CliBadInput, HelpAndStrayWordsNeverStartARun) {
  const Result help = run("train -h");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_NE(help.output.find("usage: meganeura train"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("device:"), std::string::npos) << help.output;
  expect_refused("train stray", "unexpected argument 'stray'");
  expect_refused("train -x", "unknown option -x");
  expect_refused("devices extra", "unexpected argument 'extra'");
  expect_refused("inspect --model mlp oops", "unexpected argument 'oops'");
}

// Every training job's --help lists exactly the options it takes: of all the options any job's
// help lists, each job takes those its own help lists (with --help after them it prints its
// help) and refuses the others as unknown, naming them. Folders need only the config key that
// picks their job.
TEST(CliBadInput, EveryTrainingJobsHelpListsTheOptionsItTakes) {
  const fs::path root = scratch("help");
  std::vector<std::pair<std::string, std::string>> jobs = {{"classifier", ""},
                                                           {"ResNet", "--model resnet50 "}};
  for (const auto& [job, config] :
       {std::pair{"language model", nlohmann::json{{"model_type", "llama"}}},
        std::pair{"Whisper", nlohmann::json{{"model_type", "whisper"}}},
        std::pair{"SmolVLA", nlohmann::json{{"type", "smolvla"}}},
        std::pair{"U-Net", nlohmann::json{{"_class_name", "UNet2DConditionModel"}}}}) {
    const fs::path folder = root / job;
    fs::create_directories(folder);
    std::ofstream(folder / "config.json") << config.dump();
    jobs.emplace_back(job, "--model '" + folder.string() + "' ");
  }
  // A help line "  --name VALUE  text" or "  --name  text": a value is written in capitals or
  // as choices (cnn|mlp).
  std::map<std::string, std::set<std::string>> listed;
  std::map<std::string, bool> takes_value;
  for (const auto& [job, prefix] : jobs) {
    const Result help = run("train " + prefix + "--help", false);
    ASSERT_EQ(help.status, 0) << job << "\n" << help.output;
    std::istringstream lines(help.output);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string option, value;
      if (!(words >> option) || option.rfind("--", 0) != 0 || line.rfind("  --", 0) != 0) continue;
      words >> value;
      const std::string name = option.substr(2);
      listed[job].insert(name);
      takes_value[name] = !value.empty() && (std::isupper(static_cast<unsigned char>(value[0])) ||
                                             value.find('|') != std::string::npos);
    }
  }
  ASSERT_GT(takes_value.size(), 40u);
  for (const auto& [job, prefix] : jobs) {
    for (const auto& [name, value] : takes_value) {
      if (name == "model") continue;  // it picks the job
      SCOPED_TRACE(job + ": --" + name);
      const Result result =
          run("train " + prefix + "--" + name + (value ? " 1" : "") + " --help", true);
      if (listed[job].count(name)) {
        EXPECT_EQ(result.status, 0) << result.output;
      } else {
        EXPECT_EQ(result.status, 1) << result.output;
        EXPECT_NE(result.output.find("unknown option --" + name), std::string::npos)
            << result.output;
      }
    }
  }
  fs::remove_all(root);
}

TEST(CliBadInput, NumbersOutOfRangeAreRefused) {
  expect_refused("train --epochs 999999999999999999", "--epochs must be from 1 to 1000000");
  expect_refused("train --epochs 99999999999999999999", "--epochs expects an integer");
  expect_refused("train --lr nan", "--lr expects a finite number, got 'nan'");
  expect_refused("train --lr inf", "--lr expects a finite number, got 'inf'");
  expect_refused("train --lr 0", "--lr must be positive");
  expect_refused("train --momentum nan", "--momentum expects a finite number");
  expect_refused("train --momentum 1.5", "--momentum must be from 0 to 1");
  expect_refused("train --weight-decay -1e30", "--weight-decay must be from 0");
  expect_refused("train --clip -1", "--clip must be from 0");
  expect_refused("train --warmup -5", "--warmup must be from 0");
  expect_refused("train --batch 0", "--batch must be from 1");
  expect_refused("train --seed -1", "--seed must be from 0");
}

TEST(CliBadInput, BadSwitchValuesAreRefusedByEveryCommand) {
  for (const char* name : {"MEGANEURA_VALIDATE", "MEGANEURA_NO_CACHE"}) {
    ::setenv(name, "2", 1);
    expect_refused("devices", std::string(name) + "='2': expected 0");
    expect_refused("inspect --ops", std::string(name) + "='2': expected 0");
    ::unsetenv(name);
  }
}

// One short run, then the ways its folder and checkpoint can be misused.
TEST(CliBadInput, UsedOutputFoldersAndInconsistentCheckpoints) {
  const fs::path out = scratch("run");
  const std::string small = " --model mlp --limit 64 --batch 32 --epochs 1 --checkpoint-every 1";
  const Result first = run("train --out " + out.string() + small);
  ASSERT_EQ(first.status, 0) << first.output;
  const fs::path checkpoint = out / "checkpoint.safetensors";
  const mg::io::Checkpoint saved = mg::io::load_checkpoint(checkpoint);
  EXPECT_EQ(saved.step, 2);
  EXPECT_EQ(saved.epoch, 1) << "the epoch field counts epochs completed";

  // Reusing the folder without --resume or --overwrite would overwrite its checkpoint.
  expect_refused("train --out " + out.string() + small, "already holds a run");
  const Result again = run("train --out " + out.string() + small + " --overwrite");
  ASSERT_EQ(again.status, 0) << again.output;
  size_t evaluations = 0;
  for (const nlohmann::json& line : metrics_lines(out / "metrics.jsonl"))
    evaluations += line.contains("test_accuracy");
  EXPECT_EQ(evaluations, 1u) << "--overwrite starts the metrics afresh";

  // A resumed run drops what was logged past the checkpoint's step (here the last step's loss
  // and the evaluation), as it logs it again.
  const fs::path earlier = out / "step1.safetensors";
  mg::io::Checkpoint at_step1 = saved;
  at_step1.step = 1;
  at_step1.epoch = 0;
  at_step1.extra["batcher"]["position"] = 32;
  mg::io::save_checkpoint(earlier, at_step1);
  const Result resumed =
      run("train --out " + out.string() + small + " --resume " + earlier.string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  std::multiset<std::string> logged;
  for (nlohmann::json line : metrics_lines(out / "metrics.jsonl")) {
    const std::string kind = line.contains("test_accuracy") ? "evaluation" : "loss";
    logged.insert(kind + " at step " + line.at("step").dump());
  }
  EXPECT_EQ(logged, (std::multiset<std::string>{"loss at step 2", "evaluation at step 2"}));

  mg::io::Checkpoint bad = saved;
  bad.step = -5;
  mg::io::save_checkpoint(out / "negative.safetensors", bad);
  expect_refused("train --out " + out.string() + small + " --resume " +
                     (out / "negative.safetensors").string(),
                 "\"step\" is -5, outside 0..", 74);
  bad = saved;
  bad.step = 1;  // its batcher is at the end of the epoch
  mg::io::save_checkpoint(out / "inconsistent.safetensors", bad);
  expect_refused("train --out " + out.string() + small + " --resume " +
                     (out / "inconsistent.safetensors").string(),
                 "is inconsistent: it is at step 1", 74);
  bad = saved;
  bad.extra = nlohmann::json::object();
  mg::io::save_checkpoint(out / "no-batcher.safetensors", bad);
  expect_refused("train --out " + out.string() + small + " --resume " +
                     (out / "no-batcher.safetensors").string(),
                 "has no batcher state", 74);
  expect_refused("train --out " + out.string() +
                     " --model mlp --limit 32 --batch 32 --epochs 1 --resume " +
                     checkpoint.string(),
                 "past the 1 steps of this run", 74);
  fs::remove_all(out);
}

// A --resume file that is not a checkpoint stops the classifier, U-Net and SmolVLA jobs with
// the checkpoint error's exit status, as it does the language model, Whisper and ResNet jobs
// (their CLI tests).
TEST(CliBadInput, UnreadableCheckpointsAreCheckpointErrors) {
  const fs::path root = scratch("unreadable");
  cli_test::expect_unreadable_resume_refused(
      "--out " + (root / "mlp").string() + " --model mlp --limit 64 --batch 32 --epochs 1", root);
  cli_test::write_tiny_unet_config(root / "unet");
  cli_test::expect_unreadable_resume_refused("--out " + (root / "unet-run").string() + " --model " +
                                                 (root / "unet").string() +
                                                 " --tokens 4 --batch 2 --limit 64",
                                             root);
  ASSERT_TRUE(cli_test::make_tiny_smolvla(root / "smolvla"));
  cli_test::expect_unreadable_resume_refused("--out " + (root / "smolvla-run").string() +
                                                 " --model " + (root / "smolvla/policy").string() +
                                                 " --data " + (root / "smolvla/data").string() +
                                                 " --batch 4 --validation 0",
                                             root);
  fs::remove_all(root);
}

// A model with fewer classes than the data set's labels: an error, not a read past the
// confusion matrix.
TEST(CliBadInput, InferWithFewerClassesThanTheLabels) {
  const fs::path out = scratch("classes");
  mg::io::Checkpoint checkpoint;
  checkpoint.model_config = {{"architecture", "mlp"}, {"image_size", 28}, {"classes", 5}};
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.fc1.weight", {256, 784}}, {"model.fc1.bias", {256}},
      {"model.fc2.weight", {128, 256}}, {"model.fc2.bias", {128}},
      {"model.fc3.weight", {5, 128}},   {"model.fc3.bias", {5}}};
  for (const auto& [name, shape] : shapes) {
    mg::io::TensorRecord record;
    record.name = name;
    record.dtype = mg::DType::f32;
    record.shape = shape;
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    std::vector<float> values(static_cast<size_t>(count));
    for (float& value : values) value = uniform(random);
    record.bytes.resize(values.size() * sizeof(float));
    std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
    checkpoint.tensors.push_back(std::move(record));
  }
  mg::io::save_checkpoint(out / "five.safetensors", checkpoint);
  expect_refused("infer " + (out / "five.safetensors").string(), "but the model has 5 classes");
  fs::remove_all(out);
}

}  // namespace
