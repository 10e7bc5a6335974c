// `meganeura generate` and `meganeura train --model MODEL_DIR` as a user runs them on a tiny
// LlamaForCausalLM folder written by transformers (tests/fixtures/model_folders), with a
// tokenizer trained by the tokenizers library: generation, fine-tuning into a folder that opens
// again, resume, and one-line errors for broken folders that leave nothing written.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_runner.hpp"
#include "io/checkpoint.hpp"
#include "io/model_folder.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

// A copy of the tiny transformers folder with the SmolLM2-style tokenizer beside its weights.
fs::path model_folder(const std::string& name) {
  const fs::path source = fs::path(MEGANEURA_SOURCE_DIR) / "tests/fixtures";
  const fs::path folder =
      fs::temp_directory_path() / ("meganeura-lm-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(folder);
  fs::create_directories(folder);
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
    fs::copy_file(source / "model_folders/llama_tiny_f32" / file, folder / file);
  fs::copy_file(source / "tokenizer/smollm2_like/tokenizer.json", folder / "tokenizer.json");
  return folder;
}

fs::path text_data(const fs::path& folder) {
  const fs::path path = folder / "data.jsonl";
  std::ofstream file(path);
  for (int i = 0; i < 60; ++i)
    file << nlohmann::json{{"text", "Entry " + std::to_string(i) + ": the dragonfly flew " +
                                        std::to_string(i % 5) + " times."}}
                .dump()
         << "\n";
  return path;
}

size_t lines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(LanguageModelCli, GenerateGreedyJsonIsDeterministicAndStopsAtMaxTokens) {
  const fs::path folder = model_folder("generate");
  const std::string command = "generate " + folder.string() +
                              " --prompt 'The dragonfly' --max-tokens 12 --temperature 0 --json";
  const Result first = run(command, false);
  ASSERT_EQ(first.status, 0) << first.output;
  const nlohmann::json result = nlohmann::json::parse(first.output);
  EXPECT_EQ(result["generated_ids"].size(), 12u);
  EXPECT_FALSE(result["prompt_ids"].empty());
  EXPECT_GT(result["decode_tokens_per_second"].get<double>(), 0);
  EXPECT_EQ(nlohmann::json::parse(run(command, false).output)["generated_ids"],
            result["generated_ids"])
      << "greedy decoding must not change between runs";
  const Result streamed =
      run("generate " + folder.string() + " --prompt 'The dragonfly' --max-tokens 12");
  ASSERT_EQ(streamed.status, 0) << streamed.output;
  EXPECT_NE(streamed.output.find("tokens/s"), std::string::npos) << streamed.output;
  fs::remove_all(folder);
}

TEST(LanguageModelCli, FineTunesIntoAFolderThatOpensAgainAndResumes) {
  const fs::path folder = model_folder("train");
  const fs::path out = folder / "run";
  const std::string common = " --model " + folder.string() + " --data " +
                             text_data(folder).string() +
                             " --seq 16 --batch 2 --lr 3e-3 --checkpoint-every 4";
  const Result train = run("train --out " + out.string() + common + " --max-steps 8");
  ASSERT_EQ(train.status, 0) << train.output;
  for (const char* file : {"checkpoint.safetensors", "metrics.jsonl", "training.png",
                           "model/config.json", "model/model.safetensors", "model/tokenizer.json"})
    EXPECT_TRUE(fs::exists(out / file)) << file;
  EXPECT_NE(train.output.find("validation loss"), std::string::npos) << train.output;

  // The folder holds the trained weights: those of the checkpoint, not the starting ones.
  const mg::io::Checkpoint checkpoint = mg::io::load_checkpoint(out / "checkpoint.safetensors");
  EXPECT_EQ(checkpoint.step, 8);
  const mg::io::ModelFolder saved = mg::io::ModelFolder::open(out / "model");
  const mg::io::ModelFolder start = mg::io::ModelFolder::open(folder);
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const std::vector<float> trained = mg::io::tensor_as_f32(saved.at(name));
  const mg::io::TensorRecord* in_checkpoint = checkpoint.find(name);
  ASSERT_NE(in_checkpoint, nullptr);
  std::vector<float> expected(trained.size());
  std::memcpy(expected.data(), in_checkpoint->bytes.data(), expected.size() * 4);
  EXPECT_EQ(trained, expected);
  EXPECT_NE(trained, mg::io::tensor_as_f32(start.at(name)));
  EXPECT_EQ(saved.find("lm_head.weight"), nullptr) << "tied embeddings are saved once";

  const Result generate =
      run("generate " + (out / "model").string() + " --prompt Entry --max-tokens 4");
  EXPECT_EQ(generate.status, 0) << generate.output;

  const Result resumed =
      run("train --out " + (folder / "resumed").string() + common + " --max-steps 12 --resume " +
          (out / "checkpoint.safetensors").string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_EQ(mg::io::load_checkpoint(folder / "resumed/checkpoint.safetensors").step, 12);
  cli_test::expect_unreadable_resume_refused("--out " + (folder / "unread").string() + common,
                                             folder);
  fs::remove_all(folder);
}

// Each step is queued behind the one in flight; the same run one step at a time (a checkpoint
// after each) trains to the same bits.
TEST(LanguageModelCli, QueuedStepsTrainAsStepsRunOneByOne) {
  const fs::path folder = model_folder("queued");
  cli_test::expect_queued_steps_train_as_one_by_one(
      "--model " + folder.string() + " --data " + text_data(folder).string() +
          " --seq 16 --batch 2 --lr 3e-3 --validation 0 --max-steps 4 --log-every 1",
      folder);
  fs::remove_all(folder);
}

TEST(LanguageModelCli, LogsEveryNStepsAndTracesTheLastStep) {
  const fs::path folder = model_folder("trace");
  const Result train =
      run("train --out " + (folder / "run").string() + " --model " + folder.string() + " --data " +
          text_data(folder).string() +
          " --seq 16 --batch 2 --validation 0 --max-steps 5 --log-every 2 --trace " +
          (folder / "trace.json").string());
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_EQ(cli_test::logged_steps(folder / "run"), (std::vector<int64_t>{2, 4, 5}));
  cli_test::expect_trace_of_training_program(train, folder / "trace.json");
  fs::remove_all(folder);
}

// Each broken folder gives one line naming what is wrong, a non-zero exit, and no --out folder.
TEST(LanguageModelCli, BrokenFoldersGiveOneLineAndWriteNothing) {
  const auto expect_refused = [](const fs::path& folder, const std::string& expected) {
    const fs::path out = folder.parent_path() / (folder.filename().string() + "-out");
    const fs::path data = text_data(folder.parent_path());
    for (const std::string& command : {"train --model " + folder.string() + " --data " +
                                           data.string() + " --out " + out.string(),
                                       "generate " + folder.string() + " --prompt hello"}) {
      const Result result = run(command);
      EXPECT_EQ(result.status, 1) << command << "\n" << result.output;
      EXPECT_EQ(lines(result.output), 1u) << result.output;
      EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
      EXPECT_FALSE(fs::exists(out)) << command;
    }
  };
  const fs::path base = model_folder("broken");
  expect_refused(base / "missing", "no model folder at");

  const fs::path bert = model_folder("bert");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(bert / "config.json"));
  config["model_type"] = "bert";
  std::ofstream(bert / "config.json") << config.dump();
  expect_refused(bert, "model_type \"bert\"");

  const fs::path tokenizer = model_folder("tokenizer");
  std::ofstream(tokenizer / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": ";
  expect_refused(tokenizer, "tokenizer.json");

  const fs::path shape = model_folder("shape");
  config = nlohmann::json::parse(std::ifstream(shape / "config.json"));
  config["intermediate_size"] = 96;
  std::ofstream(shape / "config.json") << config.dump();
  expect_refused(shape, "model.layers.0.mlp.up_proj.weight is [128, 64], expected [96, 64]");

  const fs::path shard = model_folder("shard");
  fs::remove(shard / "model.safetensors");
  std::ofstream(shard / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})";
  expect_refused(shard, "model-00001-of-00002.safetensors");
  for (const fs::path& folder : {base, bert, tokenizer, shape, shard}) fs::remove_all(folder);
}

}  // namespace
