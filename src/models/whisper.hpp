#pragma once
// Whisper (WhisperForConditionalGeneration: tiny, base, small, ... as the Hugging Face Hub and
// transformers' save_pretrained write it) built from config.json, with transformers' parameter
// names. The encoder: two convolutions (the second of stride 2) with GELU, the sinusoidal
// positions stored in the folder, pre-LayerNorm self-attention layers. The decoder: token and
// learned position embeddings, causal self-attention, cross-attention over the encoder's output,
// proj_out tied to the token embeddings. Graphs over the same weights: the encoder alone, the
// teacher-forced logits and loss, and generation as a "cross kv" program (encoder, then every
// layer's cross-attention keys and values into state tensors, once per utterance) and a one-token
// decode step with a self-attention KV cache.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meganeura/graph.hpp"

namespace mg::models {

struct WhisperConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t encoder_layers = 0;
  int64_t encoder_heads = 0;
  int64_t encoder_ffn_dim = 0;
  int64_t decoder_layers = 0;
  int64_t decoder_heads = 0;
  int64_t decoder_ffn_dim = 0;
  int64_t num_mel_bins = 0;
  int64_t max_source_positions = 0;  // encoder positions: half the input frames
  int64_t max_target_positions = 0;  // decoder positions
  bool tie_word_embeddings = true;
  double init_std = 0.02;
  int32_t decoder_start_token_id = 0;
  int32_t pad_token_id = 0;  // its embedding gets no gradient from the lookup (padding_idx)
  std::vector<int32_t> eos_token_ids;

  // Frames of the log-mel input the encoder takes: 2 * max_source_positions (3000 for 30 s).
  int64_t input_frames() const { return 2 * max_source_positions; }
};

// Reads a WhisperForConditionalGeneration config.json. Throws mg::Error naming `where` and the
// key on a missing or unsupported entry (another model_type, an activation other than gelu,
// heads that do not divide d_model). scale_embedding is accepted and, as in transformers'
// Whisper, not applied.
WhisperConfig whisper_config_from_json(const nlohmann::json& config, const std::string& where);

// The config of the model folder `folder`: mg::Error for a missing folder, a missing or malformed
// config.json, or a folder that is not Whisper's (named as such).
WhisperConfig load_whisper_config(const std::filesystem::path& folder);

// Every tensor's name and shape in transformers' order, the encoder's sinusoidal positions
// included (kEncoderPositions, a state leaf in every graph: transformers never trains it).
std::vector<std::pair<std::string, Shape>> whisper_parameters(const WhisperConfig& config);
bool is_whisper_encoder_tensor(const std::string& name);

// transformers' sinusoids(length, channels): [length, channels], sin then cos of
// position * exp(-log(10000) / (channels / 2 - 1) * i).
std::vector<float> whisper_sinusoids(int64_t length, int64_t channels);

// The decoder's self-attention KV cache of one layer, [1, heads, cache_length, head_dim], and the
// cross-attention keys and values of one layer, [1, heads, max_source_positions, head_dim].
std::string whisper_self_cache_name(int64_t layer, bool values);
std::string whisper_cross_cache_name(int64_t layer, bool values);

inline constexpr const char* kEncoderPositions = "model.encoder.embed_positions.weight";

namespace whisper_io {
inline constexpr const char* kInputFeatures = "input_features";       // f32 [B, mels, frames]
inline constexpr const char* kDecoderInputIds = "decoder_input_ids";  // i32 [B, T]
inline constexpr const char* kLabels = "labels";                      // i32 [B, T], -100 ignored
inline constexpr const char* kPosition = "position";                  // i32 [1]
inline constexpr const char* kEncoderHiddenStates = "encoder_hidden_states";
inline constexpr const char* kLogits = "logits";
inline constexpr const char* kLoss = "loss";
inline constexpr int32_t kIgnoredLabel = -100;
}  // namespace whisper_io

// input_features [batch, mels, frames] -> encoder_hidden_states [batch, max_source_positions, d].
Graph whisper_encoder_graph(const WhisperConfig& config, int64_t batch);

// input_features and decoder_input_ids [batch, tokens] -> logits [batch, tokens, vocab].
Graph whisper_logits_graph(const WhisperConfig& config, int64_t batch, int64_t tokens);

// input_features, decoder_input_ids and labels [batch, tokens] (labels[t]: the token after
// decoder_input_ids[t]) -> the mean cross-entropy "loss" over labels that are not -100, as
// WhisperForConditionalGeneration computes it, and "logits" when `with_logits`. With
// `train_encoder` false the encoder's weights are state leaves (add_training leaves them as they
// are) and only the decoder trains.
Graph whisper_loss_graph(const WhisperConfig& config, int64_t batch, int64_t tokens,
                         bool train_encoder = true, bool with_logits = false);

// input_features [1, mels, frames] -> every decoder layer's cross-attention keys and values in
// the state tensors whisper_cross_cache_name names (no outputs): run once per utterance.
Graph whisper_cross_kv_graph(const WhisperConfig& config);

// decoder_input_ids [1, 1] at `position` (i32 [1], < cache_length) -> logits [1, vocab]; the
// token's keys and values go to row `position` of the self-attention caches, attention reads
// rows [0, position] and the cross caches.
Graph whisper_decode_graph(const WhisperConfig& config, int64_t cache_length);

}  // namespace mg::models
