#pragma once
// Llama-family causal language models (LlamaForCausalLM: SmolLM2, TinyLlama, Llama 2/3) built
// from a Hugging Face config.json, with transformers' parameter names, as four graphs over the
// same weights: logits of a batch of sequences, the causal-LM loss for training, the prefill of
// a prompt into the KV cache, and one decode step that appends to the cache.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::models {

// How rotary frequencies are derived from rope_theta (transformers' rope_type): "default",
// "linear" (positions divided by factor) or "llama3" (low frequencies divided by factor, a smooth
// band between low_freq_factor and high_freq_factor).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_positions = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
};

// Reads a LlamaForCausalLM config.json (the Hub's layout and transformers 5's rope_parameters).
// Throws mg::Error naming `where` and the key on a missing or unsupported entry (another
// model_type, an activation other than silu, a rope type it cannot compute).
LlamaConfig llama_config_from_json(const nlohmann::json& config, const std::string& where);

// The config of the model folder `folder`, read before its weights so that a folder of another
// kind is named as such: mg::Error for a missing folder, a missing or malformed config.json or
// a config that llama_config_from_json refuses.
LlamaConfig load_llama_config(const std::filesystem::path& folder);

// The rotary inverse frequencies (head_dim / 2 of them) as transformers computes them.
std::vector<double> rope_inverse_frequencies(const LlamaConfig& config);

// Every parameter's name and shape, in the order the graphs declare them.
std::vector<std::pair<std::string, Shape>> llama_parameters(const LlamaConfig& config);

// The KV cache of one layer: state [1, kv_heads, cache_length, head_dim].
std::string kv_cache_name(int64_t layer, bool values);

inline constexpr const char* kInputIds = "input_ids";  // i32
inline constexpr const char* kLabels = "labels";       // i32, -100 is ignored
inline constexpr const char* kPosition = "position";   // i32 [1]
inline constexpr const char* kLogits = "logits";
inline constexpr const char* kLoss = "loss";
inline constexpr int64_t kIgnoredLabel = -100;

// input_ids [batch, seq] -> logits [batch, seq, vocab].
Graph llama_logits_graph(const LlamaConfig& config, int64_t batch, int64_t seq);
// input_ids [batch, seq] -> "next_tokens" i32 [batch, seq]: the most likely token after each
// position (the logits' argmax), for scoring and verifying drafts without moving the logits to
// the host.
Graph llama_next_token_graph(const LlamaConfig& config, int64_t batch, int64_t seq);
inline constexpr const char* kNextTokens = "next_tokens";
// input_ids and labels [batch, seq] (labels[t] is the token after input_ids[t]) -> the mean
// cross-entropy "loss" over labels that are not kIgnoredLabel, and "logits" when
// `with_logits`. Add mg::add_training to train it.
Graph llama_loss_graph(const LlamaConfig& config, int64_t batch, int64_t seq,
                       bool with_logits = false);
// input_ids [1, prompt] -> the last position's logits [1, vocab]; every layer's KV cache holds
// the prompt's keys and values in rows [0, prompt) and zeros after.
Graph llama_prefill_graph(const LlamaConfig& config, int64_t prompt, int64_t cache_length);
// input_ids [1, 1] at `position` (i32 [1], < cache_length) -> logits [1, vocab]; the token's
// keys and values are written to row `position` of the caches, and attention reads rows
// [0, position].
Graph llama_decode_graph(const LlamaConfig& config, int64_t cache_length);

}  // namespace mg::models
