// `meganeura transcribe MODEL_DIR audio.wav...`: speech to text with a Whisper model folder.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/training_run.hpp"
#include "data/audio.hpp"
#include "data/log_mel.hpp"
#include "io/model_folder.hpp"
#include "io/tokenizer.hpp"
#include "meganeura/error.hpp"
#include "runtime/whisper_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura transcribe MODEL_DIR AUDIO... [options]

Transcribes audio files with a Whisper model folder (WhisperForConditionalGeneration as the
Hugging Face Hub and save_pretrained write it: config.json, model.safetensors or shards in f32,
f16 or bf16, tokenizer.json, preprocessor_config.json, generation_config.json). Each file (WAV,
FLAC, OGG, ...: any rate, mono or stereo) is resampled to 16 kHz and cut into windows of 30 s (the
folder's chunk_length); each window's log-mel features run through the encoder once, which writes
every decoder layer's cross-attention keys and values, then one decode program per token reads
them and the self-attention KV cache: greedy decoding after the prompt <|startoftranscript|>
<|language|> <|task|> <|notimestamps|>, with generation_config.json's suppress_tokens and
begin_suppress_tokens. The text of each file is printed (after "FILE: " when there are several);
the real-time factor (processing time over audio time) goes to stderr.

  --language CODE   spoken language, e.g. en, de (default en; English-only models take none)
  --task NAME       transcribe (default) or translate (into English)
  --max-tokens N    new tokens a window at most (default: as the model's positions allow)
  --json            print one JSON object a file: file, text, tokens, audio_seconds, seconds,
                    real_time_factor
  --device SEL      device index or part of its name (default: best available)
  --precision P     strict (default), fast (f16 operands on cooperative matrices)
                    or bf16 (bfloat16 operands there)
)";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\n") - first + 1);
}

}  // namespace

int transcribe_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura transcribe", words,
                            {"language", "task", "max-tokens", "device", "precision"},
                            {"help", "json"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().size() < 2) {
    throw Error("give a model folder and audio files: meganeura transcribe MODEL_DIR AUDIO...");
  }
  const std::filesystem::path folder_path = arguments.positional()[0];
  const std::string task = arguments.text("task", "transcribe");
  if (task != "transcribe" && task != "translate")
    throw Error("--task must be transcribe or translate, not " + task);

  // Everything is read and checked before the programs are built.
  const models::WhisperConfig config = models::load_whisper_config(folder_path);
  const io::ModelFolder folder = io::ModelFolder::open(folder_path);
  models::check_whisper_weights(folder, config);
  const io::Tokenizer tokenizer = io::Tokenizer::load(folder_path / "tokenizer.json");
  const data::LogMelConfig features_config = models::load_whisper_features(folder_path, config);
  models::WhisperDecoding decoding = models::load_whisper_decoding(
      folder_path, config, tokenizer, arguments.text("language", "en"), task);
  if (arguments.has("max-tokens")) {
    const int64_t most = arguments.integer("max-tokens", 0);
    if (most <= 0) throw Error("--max-tokens must be positive");
    decoding.max_length =
        std::min(decoding.max_length, static_cast<int64_t>(decoding.prompt.size()) + most);
  }
  std::vector<std::pair<std::string, data::Audio>> recordings;
  for (size_t i = 1; i < arguments.positional().size(); ++i) {
    const std::string& path = arguments.positional()[i];
    recordings.emplace_back(path, data::read_audio(path, features_config.sample_rate));
  }

  SessionOptions options;
  options.shared_device = open_shared_device(arguments.text("device", ""));
  options.shared_tensors = make_shared_tensors(options.shared_device);
  // Every tensor is written from the folder before the first run.
  options.initialise_parameters = false;
  options.precision = parse_precision(arguments.text("precision", "strict"));
  models::WhisperTranscriber transcriber(config, options, decoding.max_length);
  models::load_whisper_weights(transcriber.sessions(), folder, config);
  std::fprintf(stderr, "device: %s\n", transcriber.decode_session().report().device.c_str());
  print_precision(options.precision, transcriber.decode_session().report());

  const bool json = arguments.has("json");
  double total_audio = 0, total_seconds = 0;
  for (const auto& [path, audio] : recordings) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<int32_t> tokens;
    for (const std::vector<float>& window : data::whisper_windows(audio.samples, features_config)) {
      const std::vector<float> features = data::whisper_log_mel(window, features_config);
      const std::vector<int32_t> window_tokens = transcriber.transcribe(features, decoding);
      tokens.insert(tokens.end(), window_tokens.begin(), window_tokens.end());
    }
    const std::string text = trimmed(tokenizer.decode(tokens, true));
    const double seconds = seconds_since(start);
    const double audio_seconds =
        static_cast<double>(audio.samples.size()) / static_cast<double>(audio.sample_rate);
    total_audio += audio_seconds;
    total_seconds += seconds;
    if (json) {
      const nlohmann::json result = {
          {"file", path},       {"text", text},
          {"tokens", tokens},   {"audio_seconds", audio_seconds},
          {"seconds", seconds}, {"real_time_factor", seconds / audio_seconds}};
      std::printf("%s\n", result.dump().c_str());
    } else if (recordings.size() > 1) {
      std::printf("%s: %s\n", path.c_str(), text.c_str());
    } else {
      std::printf("%s\n", text.c_str());
    }
    std::fflush(stdout);
  }
  std::fprintf(
      stderr, "transcribed %.1f s of audio in %.2f s: real-time factor %.3f (%.1fx real time)\n",
      total_audio, total_seconds, total_seconds / total_audio, total_audio / total_seconds);
  return 0;
}

}  // namespace mg::cli
