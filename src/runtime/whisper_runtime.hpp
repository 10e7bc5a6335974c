#pragma once
// The runtime side of models/whisper.hpp, running a Whisper model folder: its weights into (and
// out of) Sessions' shared tensors, the decoder prompt and token suppression of its
// generation_config.json, and greedy transcription as a cross kv program (once per window of
// audio) and a one-token decode program over one copy of the weights and one KV cache.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "data/log_mel.hpp"
#include "io/model_folder.hpp"
#include "io/tokenizer.hpp"
#include "meganeura/session.hpp"
#include "models/whisper.hpp"

namespace mg::models {

// Checks the folder's tensors against the config: one mg::Error listing every missing,
// unexpected or mis-shaped tensor by name.
void check_whisper_weights(const io::ModelFolder& folder, const WhisperConfig& config);

// Checks the folder's tensors, then writes each, converted to f32, through the first of
// `sessions` whose program uses it (programs over shared tensors: a tensor written through one
// is the others' too). A tensor no program uses is skipped.
void load_whisper_weights(const std::vector<Session*>& sessions, const io::ModelFolder& folder,
                          const WhisperConfig& config);

// The tensors of `session` (which must hold them all: a training program) under transformers'
// names, for io::save_model_folder (no proj_out.weight when tied, as save_pretrained writes it).
std::vector<io::SavedTensor> whisper_weights(const Session& session, const WhisperConfig& config);

// The log-mel settings of the folder's preprocessor_config.json (transformers' defaults without
// one), checked against the config: its mel bins and 2 * max_source_positions frames a window.
data::LogMelConfig load_whisper_features(const std::filesystem::path& folder,
                                         const WhisperConfig& config);

// What greedy decoding needs from generation_config.json (or, without one, the tokenizer's
// special tokens): the decoder prompt <|startoftranscript|> [<|language|> <|task|>]
// <|notimestamps|>, the tokens never produced (suppress_tokens) and not produced first
// (begin_suppress_tokens), the end tokens and the most tokens a window may hold (max_length).
struct WhisperDecoding {
  std::vector<int32_t> prompt;
  std::set<int32_t> suppress;
  std::set<int32_t> begin_suppress;
  std::set<int32_t> end_tokens;
  int64_t max_length = 0;
};

// `language` is a code ("en") or a token ("<|en|>"); `task` is "transcribe" or "translate".
// English-only models (is_multilingual false) take neither. Throws mg::Error naming the folder
// and the language or task it lacks.
WhisperDecoding load_whisper_decoding(const std::filesystem::path& folder,
                                      const WhisperConfig& config, const io::Tokenizer& tokenizer,
                                      const std::string& language, const std::string& task);

class WhisperTranscriber {
 public:
  // `options` must carry a shared device and shared tensors holding (or about to hold) the
  // weights; the caches of `cache_length` decoder positions join them.
  WhisperTranscriber(const WhisperConfig& config, const SessionOptions& options,
                     int64_t cache_length);

  // Greedy tokens (without the prompt, without the end token) of one window's log-mel features
  // [mels, frames]: the cross kv program, then a decode step per prompt token and new token,
  // stopping at an end token or at min(decoding.max_length, cache_length) tokens in all.
  std::vector<int32_t> transcribe(std::span<const float> features, const WhisperDecoding& decoding,
                                  const std::function<void(int32_t)>& on_token = {});

  Session& cross_kv_session() { return cross_kv_; }
  Session& decode_session() { return decode_; }
  std::vector<Session*> sessions() { return {&cross_kv_, &decode_}; }

 private:
  WhisperConfig config_;
  int64_t cache_length_;
  Session cross_kv_;
  Session decode_;
};

}  // namespace mg::models
