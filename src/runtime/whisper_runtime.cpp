#include "runtime/whisper_runtime.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>

#include "meganeura/error.hpp"

namespace mg::models {
namespace {

nlohmann::json read_json_or_null(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) return nullptr;
  nlohmann::json value = nlohmann::json::parse(file, nullptr, false);
  if (value.is_discarded() || !value.is_object()) {
    throw Error(path.string() + " is not a JSON object: restore it from the model's source");
  }
  return value;
}

std::vector<int32_t> id_list(const nlohmann::json& config, const char* key,
                             const std::filesystem::path& path) {
  std::vector<int32_t> ids;
  if (!config.contains(key) || config[key].is_null()) return ids;
  const nlohmann::json& value = config[key];
  for (const nlohmann::json& id : value.is_array() ? value : nlohmann::json::array({value})) {
    if (!id.is_number_integer())
      throw Error(path.string() + ": \"" + key + "\" must hold token ids");
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

int32_t required_token(const io::Tokenizer& tokenizer, const std::string& token,
                       const std::filesystem::path& folder) {
  const std::optional<int32_t> id = tokenizer.token_id(token);
  if (!id) {
    throw Error("model folder " + folder.string() + " has no generation_config.json and its " +
                "tokenizer has no " + token + " token");
  }
  return *id;
}

bool holds(const Session& session, const std::string& name) {
  const std::vector<std::string> names = session.persistent_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

void check_whisper_weights(const io::ModelFolder& folder, const WhisperConfig& config) {
  std::map<std::string, Shape> expected;
  for (const auto& [name, shape] : whisper_parameters(config)) expected[name] = shape;
  // Tied models may still carry proj_out.weight (a copy of the token embeddings).
  std::set<std::string> optional;
  if (config.tie_word_embeddings) optional.insert("proj_out.weight");
  io::check_tensors(folder, "WhisperForConditionalGeneration", expected, optional);
}

void load_whisper_weights(const std::vector<Session*>& sessions, const io::ModelFolder& folder,
                          const WhisperConfig& config) {
  check_whisper_weights(folder, config);
  for (const auto& [name, shape] : whisper_parameters(config)) {
    for (Session* session : sessions) {
      if (!holds(*session, name)) continue;
      session->write(name, io::tensor_as_f32(folder.at(name)));
      break;
    }
  }
}

std::vector<io::SavedTensor> whisper_weights(const Session& session, const WhisperConfig& config) {
  std::vector<io::SavedTensor> tensors;
  for (const auto& [name, shape] : whisper_parameters(config))
    tensors.push_back({name, shape, session.read(name)});
  return tensors;
}

data::LogMelConfig load_whisper_features(const std::filesystem::path& folder,
                                         const WhisperConfig& config) {
  const std::filesystem::path path = folder / "preprocessor_config.json";
  const nlohmann::json preprocessor = read_json_or_null(path);
  const data::LogMelConfig features = data::log_mel_config_from_json(
      preprocessor.is_null() ? nlohmann::json::object() : preprocessor);
  if (features.n_mels != config.num_mel_bins || features.frames() != config.input_frames()) {
    throw Error(path.string() + " gives " + std::to_string(features.n_mels) + " mel bins and " +
                std::to_string(features.frames()) + " frames a window, but the model takes " +
                std::to_string(config.num_mel_bins) + " and " +
                std::to_string(config.input_frames()) +
                " (num_mel_bins and 2 * max_source_positions in config.json)");
  }
  return features;
}

WhisperDecoding load_whisper_decoding(const std::filesystem::path& folder,
                                      const WhisperConfig& config, const io::Tokenizer& tokenizer,
                                      const std::string& language, const std::string& task) {
  const std::filesystem::path path = folder / "generation_config.json";
  const nlohmann::json generation = read_json_or_null(path);
  const std::string language_token = language.starts_with("<|") ? language : "<|" + language + "|>";
  WhisperDecoding decoding;
  decoding.max_length = config.max_target_positions;
  if (generation.is_null()) {
    decoding.prompt = {required_token(tokenizer, "<|startoftranscript|>", folder),
                       required_token(tokenizer, language_token, folder),
                       required_token(tokenizer, "<|" + task + "|>", folder),
                       required_token(tokenizer, "<|notimestamps|>", folder)};
    decoding.end_tokens.insert(config.eos_token_ids.begin(), config.eos_token_ids.end());
    if (const auto end = tokenizer.token_id("<|endoftext|>")) decoding.end_tokens.insert(*end);
    return decoding;
  }
  const std::vector<int32_t> start = id_list(generation, "decoder_start_token_id", path);
  decoding.prompt = {start.empty() ? config.decoder_start_token_id : start.front()};
  if (generation.value("is_multilingual", generation.contains("lang_to_id"))) {
    const nlohmann::json languages = generation.value("lang_to_id", nlohmann::json::object());
    const nlohmann::json tasks = generation.value("task_to_id", nlohmann::json::object());
    if (!languages.contains(language_token) || !languages[language_token].is_number_integer()) {
      throw Error(path.string() + " has no language " + language_token +
                  " in lang_to_id: give --language with one of its codes");
    }
    if (!tasks.contains(task) || !tasks[task].is_number_integer()) {
      throw Error(path.string() + " has no task \"" + task +
                  "\" in task_to_id: give --task transcribe or translate");
    }
    decoding.prompt.push_back(languages[language_token].get<int32_t>());
    decoding.prompt.push_back(tasks[task].get<int32_t>());
  }
  const std::vector<int32_t> no_timestamps = id_list(generation, "no_timestamps_token_id", path);
  if (!no_timestamps.empty()) decoding.prompt.push_back(no_timestamps.front());
  for (int32_t id : id_list(generation, "suppress_tokens", path)) decoding.suppress.insert(id);
  for (int32_t id : id_list(generation, "begin_suppress_tokens", path))
    decoding.begin_suppress.insert(id);
  std::vector<int32_t> end = id_list(generation, "eos_token_id", path);
  if (end.empty()) end = config.eos_token_ids;
  decoding.end_tokens.insert(end.begin(), end.end());
  if (generation.contains("max_length") && generation["max_length"].is_number_integer())
    decoding.max_length = std::min(decoding.max_length, generation["max_length"].get<int64_t>());
  return decoding;
}

WhisperTranscriber::WhisperTranscriber(const WhisperConfig& config, const SessionOptions& options,
                                       int64_t cache_length)
    : config_(config),
      cache_length_(cache_length),
      cross_kv_(whisper_cross_kv_graph(config), options),
      decode_(whisper_decode_graph(config, cache_length), options) {
  if (!options.shared_device || !options.shared_tensors) {
    throw Error("WhisperTranscriber needs SessionOptions with shared_device and shared_tensors");
  }
}

std::vector<int32_t> WhisperTranscriber::transcribe(std::span<const float> features,
                                                    const WhisperDecoding& decoding,
                                                    const std::function<void(int32_t)>& on_token) {
  const int64_t prompt = static_cast<int64_t>(decoding.prompt.size());
  const int64_t most = std::min(decoding.max_length, cache_length_);
  if (prompt == 0 || prompt >= most) {
    throw Error("the decoder prompt of " + std::to_string(prompt) +
                " tokens leaves no room in the " + std::to_string(most) + " decoder positions");
  }
  cross_kv_.set_input(whisper_io::kInputFeatures, features);
  cross_kv_.run();
  std::vector<int32_t> generated;
  std::vector<float> logits;
  // A token generated at position p is the sequence's (p + 2)th: it stops at `most` in all.
  for (int64_t position = 0; position + 1 < most; ++position) {
    const int32_t token = position < prompt ? decoding.prompt[position] : generated.back();
    if (token < 0 || token >= config_.vocab_size) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                  std::to_string(config_.vocab_size));
    }
    decode_.set_input(whisper_io::kDecoderInputIds, std::vector<int32_t>{token});
    decode_.set_input(whisper_io::kPosition, std::vector<int32_t>{static_cast<int32_t>(position)});
    decode_.run();
    if (position + 1 < prompt) continue;
    logits = decode_.output(whisper_io::kLogits);
    const float blocked = -std::numeric_limits<float>::infinity();
    for (int32_t id : decoding.suppress)
      if (id >= 0 && id < config_.vocab_size) logits[id] = blocked;
    if (generated.empty()) {
      for (int32_t id : decoding.begin_suppress)
        if (id >= 0 && id < config_.vocab_size) logits[id] = blocked;
    }
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (decoding.end_tokens.count(next)) break;
    generated.push_back(next);
    if (on_token) on_token(next);
  }
  return generated;
}

}  // namespace mg::models
