// `meganeura train --model WHISPER_DIR` and `meganeura transcribe` as a user runs them, on a tiny
// randomly initialised Whisper folder (scripts/make_whisper_folder.py) and speech made by
// espeak-ng: training from a folder of clips into a folder that transcribes, resume, a manifest
// with the decoder alone (the encoder left as it was), --detect-anomaly, and one-line errors for
// bad audio and folders.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/cli_runner.hpp"
#include "io/model_folder.hpp"

namespace {

namespace fs = std::filesystem;

using cli_test::Result;
using cli_test::run;

const char* const kWords[] = {"one", "two", "three", "four", "five", "six"};

struct Workspace {
  fs::path root;
  explicit Workspace(const std::string& name)
      : root(fs::temp_directory_path() /
             ("meganeura-whisper-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(root);
    fs::create_directories(root / "clips");
  }
  ~Workspace() { fs::remove_all(root); }
};

int shell(const std::string& command) {
  return std::system(command.c_str());
}

// Six spoken words with transcripts, and a Whisper folder with windows of 2 s.
void make_speech_and_model(const Workspace& work) {
  std::ofstream corpus(work.root / "corpus.txt");
  for (const char* word : kWords) {
    const fs::path clip = work.root / "clips" / word;
    ASSERT_EQ(shell("espeak-ng -s 200 -w " + clip.string() + ".wav " + word), 0);
    std::ofstream(clip.string() + ".txt") << word << "\n";
    corpus << word << "\n";
  }
  corpus.close();
  ASSERT_EQ(shell("/usr/bin/python3 " + std::string(MEGANEURA_SOURCE_DIR) +
                  "/scripts/make_whisper_folder.py --out " + (work.root / "model").string() +
                  " --corpus " + (work.root / "corpus.txt").string() +
                  " --chunk-seconds 2 --max-target-positions 16 --merges 20 > /dev/null"),
            0);
}

size_t lines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(WhisperCli, TrainsFromClipsResumesAndTranscribes) {
  Workspace work("train");
  make_speech_and_model(work);
  const fs::path out = work.root / "run";
  const std::string common = " --model " + (work.root / "model").string() + " --data " +
                             (work.root / "clips").string() +
                             " --batch 2 --lr 3e-3 --validation 0.3 --checkpoint-every 2";
  const Result train = run("train --out " + out.string() + common + " --max-steps 2");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("validation loss"), std::string::npos) << train.output;
  for (const char* file : {"checkpoint.safetensors", "metrics.jsonl", "training.png",
                           "model/config.json", "model/model.safetensors", "model/tokenizer.json",
                           "model/preprocessor_config.json", "model/generation_config.json"})
    EXPECT_TRUE(fs::exists(out / file)) << file;

  const Result resumed =
      run("train --out " + (work.root / "resumed").string() + common + " --max-steps 3 --resume " +
          (out / "checkpoint.safetensors").string());
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 2"), std::string::npos) << resumed.output;
  cli_test::expect_unreadable_resume_refused("--out " + (work.root / "unread").string() + common,
                                             work.root);

  const Result transcribed =
      run("transcribe " + (work.root / "resumed/model").string() + " " +
              (work.root / "clips/one.wav").string() + " " +
              (work.root / "clips/two.wav").string() + " --json --max-tokens 4",
          false);
  ASSERT_EQ(transcribed.status, 0) << transcribed.output;
  ASSERT_EQ(lines(transcribed.output), 2u) << transcribed.output;
  const nlohmann::json first =
      nlohmann::json::parse(transcribed.output.substr(0, transcribed.output.find('\n')));
  EXPECT_LE(first["tokens"].size(), 4u);
  EXPECT_GT(first["real_time_factor"].get<double>(), 0.0);
  EXPECT_EQ(first["file"], (work.root / "clips/one.wav").string());
}

// Each step is queued behind the one in flight, across the epoch's end (six clips, batches of
// two); the same run one step at a time (a checkpoint after each) trains to the same bits.
TEST(WhisperCli, QueuedStepsTrainAsStepsRunOneByOne) {
  Workspace work("queued");
  make_speech_and_model(work);
  cli_test::expect_queued_steps_train_as_one_by_one(
      "--model " + (work.root / "model").string() + " --data " + (work.root / "clips").string() +
          " --batch 2 --lr 3e-3 --validation 0 --max-steps 4",
      work.root);
}

TEST(WhisperCli, LogsEveryNStepsAndTracesTheLastStep) {
  Workspace work("trace");
  make_speech_and_model(work);
  const Result train =
      run("train --out " + (work.root / "run").string() + " --model " +
          (work.root / "model").string() + " --data " + (work.root / "clips").string() +
          " --batch 2 --validation 0 --max-steps 3 --log-every 2 --trace " +
          (work.root / "trace.json").string());
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_EQ(cli_test::logged_steps(work.root / "run"), (std::vector<int64_t>{2, 3}));
  cli_test::expect_trace_of_training_program(train, work.root / "trace.json");
}

TEST(WhisperCli, DecoderAloneFromAManifestLeavesTheEncoder) {
  Workspace work("decoder");
  make_speech_and_model(work);
  const fs::path manifest = work.root / "clips/manifest.jsonl";
  {
    std::ofstream file(manifest);
    for (const char* word : kWords)
      file << nlohmann::json{{"audio", std::string(word) + ".wav"}, {"text", word}}.dump() << "\n";
  }
  const Result train = run("train --model " + (work.root / "model").string() + " --data " +
                           manifest.string() + " --out " + (work.root / "run").string() +
                           " --batch 3 --max-steps 2 --lr 1e-2 --validation 0 --decoder-only");
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("the decoder alone"), std::string::npos) << train.output;
  const auto before = mg::io::ModelFolder::open(work.root / "model");
  const auto after = mg::io::ModelFolder::open(work.root / "run/model");
  for (const char* name : {"model.encoder.conv1.weight", "model.encoder.layers.1.fc2.weight"}) {
    EXPECT_EQ(mg::io::tensor_as_f32(before.at(name)), mg::io::tensor_as_f32(after.at(name)))
        << name;
  }
  EXPECT_NE(mg::io::tensor_as_f32(before.at("model.decoder.layers.0.fc1.weight")),
            mg::io::tensor_as_f32(after.at("model.decoder.layers.0.fc1.weight")));
}

// A learning rate of 1e30 blows the weights up with the first update; the second step's forward
// overflows, the run stops non_finite and --detect-anomaly names the forward op that made the
// first NaN or infinity.
TEST(WhisperCli, DetectAnomalyNamesTheFirstOp) {
  Workspace work("anomaly");
  make_speech_and_model(work);
  const Result found =
      run("train --model " + (work.root / "model").string() + " --data " +
          (work.root / "clips").string() + " --out " + (work.root / "run").string() +
          " --batch 2 --max-steps 3 --lr 1e30 --warmup 0 --validation 0 "
          "--detect-anomaly");
  EXPECT_EQ(found.status, 73) << found.output;
  EXPECT_NE(found.output.find("the first non-finite value is %"), std::string::npos)
      << found.output;
  EXPECT_NE(found.output.find(" (forward, near '"), std::string::npos) << found.output;
}

// Each refused with one line (the error) and exit status 1.
void expect_one_line_error(const std::string& arguments, const std::string& names) {
  const Result result = run(arguments);
  EXPECT_EQ(result.status, 1) << arguments << "\n" << result.output;
  EXPECT_EQ(lines(result.output), 1u) << arguments << "\n" << result.output;
  EXPECT_NE(result.output.find(names), std::string::npos) << result.output;
}

TEST(WhisperCli, BadAudioAndFoldersGiveOneLine) {
  Workspace work("errors");
  make_speech_and_model(work);
  const std::string model = (work.root / "model").string();
  const fs::path text = work.root / "not_audio.wav";
  std::ofstream(text) << "this is not a WAV file\n";
  const fs::path empty = work.root / "empty.wav";
  std::ofstream{empty};
  // A WAV whose data chunk claims far more bytes than the file holds.
  const fs::path huge = work.root / "huge_header.wav";
  fs::copy_file(work.root / "clips/one.wav", huge);
  {
    std::fstream file(huge, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(file), {});
    const size_t data = bytes.find("data");
    ASSERT_NE(data, std::string::npos);
    const uint32_t claimed = 0x7ffffff0u;
    file.seekp(static_cast<std::streamoff>(data + 4));
    file.write(reinterpret_cast<const char*>(&claimed), 4);
  }
  expect_one_line_error("transcribe " + model + " " + text.string(), "not_audio.wav");
  expect_one_line_error("transcribe " + model + " " + empty.string(), "empty.wav");
  expect_one_line_error("transcribe " + model + " " + huge.string(), "huge_header.wav");
  expect_one_line_error("transcribe " + model + " " + (work.root / "missing.wav").string(),
                        "missing.wav");
  const std::string llama =
      std::string(MEGANEURA_SOURCE_DIR) + "/tests/fixtures/model_folders/llama_tiny_f32";
  expect_one_line_error("transcribe " + llama + " " + (work.root / "clips/one.wav").string(),
                        "is not Whisper's");
  fs::remove(work.root / "clips/three.txt");
  expect_one_line_error("train --model " + model + " --data " + (work.root / "clips").string() +
                            " --out " + (work.root / "run").string(),
                        "three.wav has no transcript");
  EXPECT_FALSE(fs::exists(work.root / "run"));
}

}  // namespace
