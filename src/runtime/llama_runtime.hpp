#pragma once
// The runtime side of models/llama.hpp, running a Llama model folder: its weights into (and out of)
// a Session's shared tensors, and generation as a prefill program and a one-token decode program
// over one copy of the weights and one KV cache.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "io/model_folder.hpp"
#include "meganeura/session.hpp"
#include "models/llama.hpp"
#include "models/sampling.hpp"

namespace mg::models {

// Checks the folder's tensors against the config: one mg::Error listing every missing,
// unexpected or mis-shaped tensor by name.
void check_llama_weights(const io::ModelFolder& folder, const LlamaConfig& config);

// Checks the folder's tensors against the config (one error listing every missing, unexpected
// or mis-shaped tensor by name) and writes them into `session`'s parameters, converted to f32.
void load_llama_weights(Session& session, const io::ModelFolder& folder, const LlamaConfig& config);

// The parameters of `session` under transformers' names, for io::save_model_folder (no
// lm_head.weight when the embeddings are tied, as save_pretrained writes it).
std::vector<io::SavedTensor> llama_weights(const Session& session, const LlamaConfig& config);

struct Generation {
  std::vector<int32_t> tokens;  // generated, without the prompt
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
  bool ended_by_eos = false;
};

class LlamaGenerator {
 public:
  // `options` must carry a shared device and shared tensors holding (or about to hold) the
  // weights; the KV caches of `cache_length` rows join them.
  LlamaGenerator(const LlamaConfig& config, const SessionOptions& options, int64_t cache_length);

  // Generates up to `max_new_tokens` after `prompt` (stopping at an end-of-sequence token of
  // the config), calling `on_token` with each as it comes. The prefill program for the prompt's
  // length is built on first use.
  Generation generate(std::span<const int32_t> prompt, int64_t max_new_tokens,
                      const SamplingOptions& sampling,
                      const std::function<void(int32_t)>& on_token = {});

  Session& decode_session() { return decode_; }
  Session& prefill_session(int64_t prompt_length);
  int64_t cache_length() const { return cache_length_; }

 private:
  LlamaConfig config_;
  SessionOptions options_;
  int64_t cache_length_;
  Session decode_;
  std::map<int64_t, std::unique_ptr<Session>> prefills_;
};

}  // namespace mg::models
