#pragma once
// SmolVLA (LeRobot's vision-language-action policy): a SmolVLM2 backbone (SigLIP vision encoder,
// pixel-shuffle connector, the first num_vlm_layers layers of its Llama text model) and an
// action expert, a narrower Llama stack whose layers attend to the backbone's keys and values,
// trained by flow matching to produce a chunk of future actions. Built from LeRobot's
// config.json ("type": "smolvla") and the SmolVLM config.json, with the tensor names of a
// LeRobot SmolVLA checkpoint ("model.vlm_with_expert.lm_expert.layers.0...",
// "model.state_proj...").
//
// The prefix is [images, language, state]: image and language tokens see each other, the state
// token sees the whole prefix, and the action tokens see the prefix and the earlier actions
// (LeRobot's make_att_2d_masks). The graphs take that mask and the rotary positions as inputs
// (smolvla_masks builds them), so padded language works as in LeRobot.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "models/llama.hpp"

namespace mg::models {

// SmolVLM's SigLIP vision tower (vision_config).
struct SmolVLMVisionConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t patch_size = 0;
  int64_t image_size = 0;
  int64_t channels = 3;
  double layer_norm_eps = 1e-6;
  bool gelu_tanh = true;  // gelu_pytorch_tanh; false = exact gelu
};

struct SmolVLAConfig {
  SmolVLMVisionConfig vision;
  int64_t scale_factor = 0;  // the connector's pixel shuffle
  LlamaConfig text;          // cut to num_vlm_layers layers
  int64_t expert_hidden_size = 0;
  int64_t expert_intermediate_size = 0;
  int64_t expert_layers = 0;
  bool cross_attention = true;           // attention_mode "cross_attn"
  int64_t self_attn_every_n_layers = 2;  // <= 0: every layer cross-attends
  int64_t chunk_size = 50;
  int64_t max_state_dim = 32;
  int64_t max_action_dim = 32;
  int64_t num_steps = 10;
  double min_period = 4e-3;
  double max_period = 4.0;
  std::vector<std::string> camera_keys;  // input_features of type VISUAL, in order
  int64_t state_dim = 0;                 // observation.state's width (<= max_state_dim)
  int64_t action_dim = 0;                // action's width (<= max_action_dim)
  std::optional<std::pair<int64_t, int64_t>> resize_with_padding;  // width, height
  int64_t tokenizer_max_length = 48;
  bool train_expert_only = true;
  bool freeze_vision_encoder = true;
  bool train_state_proj = true;

  int64_t cameras() const { return static_cast<int64_t>(camera_keys.size()); }
  int64_t image_tokens() const;  // per camera, after the pixel shuffle
  // A VLM layer's expert layer (the expert may have fewer layers), or -1 when it has none.
  int64_t expert_layer_of(int64_t vlm_layer) const;
  bool is_cross_layer(int64_t vlm_layer) const;
};

// `policy` is LeRobot's config.json, `vlm` the SmolVLM config.json (SmolVLMConfig: vision_config,
// text_config, scale_factor). Throws mg::Error naming `where` and the key on a missing,
// malformed or unsupported entry (a type other than "smolvla", add_image_special_tokens,
// empty_cameras, prefix_length, an expert layer count that does not divide the VLM's).
SmolVLAConfig smolvla_config_from_json(const nlohmann::ordered_json& policy,
                                       const nlohmann::json& vlm, const std::string& where);

// LeRobot's get_intermediate_size: two thirds of 4x the width, rounded up to a multiple of 256.
int64_t smolvla_expert_intermediate_size(int64_t width);

inline constexpr const char* kSmolVLAVisionPrefix = "model.vlm_with_expert.vlm.model.vision_model.";
inline constexpr const char* kSmolVLAConnectorWeight =
    "model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight";
inline constexpr const char* kSmolVLATextPrefix = "model.vlm_with_expert.vlm.model.text_model.";
inline constexpr const char* kSmolVLAExpertPrefix = "model.vlm_with_expert.lm_expert.";

enum class SmolVLAPart { vision, connector, text, expert, projections };
struct SmolVLAParameter {
  std::string name;
  Shape shape;
  SmolVLAPart part;
};
// Every weight's LeRobot name and shape, in the order the graphs declare them.
std::vector<SmolVLAParameter> smolvla_parameters(const SmolVLAConfig& config);

// The last VLM layer that has an expert layer: the expert reads nothing of the layers after it.
int64_t smolvla_last_expert_layer(const SmolVLAConfig& config);
// Whether the flow-matching loss depends on the text model's weight `name` (the final norm and
// what follows the last layer's keys and values do not reach it); other weights always do.
bool smolvla_loss_reaches(const SmolVLAConfig& config, const std::string& name);

// Graph inputs (f32 unless noted).
inline constexpr const char* kPixelValues =
    "pixel_values";  // [B, cameras, C, S, S], SigLIP-normalised
inline constexpr const char* kLanguageIds = "input_ids";         // i32 [B, L]
inline constexpr const char* kState = "state";                   // [B, max_state_dim], zero-padded
inline constexpr const char* kAttentionMask = "attention_mask";  // additive [B, 1, T, T]
inline constexpr const char* kPositionIds = "position_ids";      // i32 [B, T]
inline constexpr const char* kNoise = "noise";                   // [B, chunk, max_action_dim]
inline constexpr const char* kActions = "actions";               // [B, chunk, max_action_dim]
inline constexpr const char* kFlowTime = "time";                 // [B]
inline constexpr const char* kTimeEmbedding = "time_embedding";  // [B, expert_hidden_size]
// Graph outputs.
inline constexpr const char* kVelocity = "velocity";           // [B, chunk, max_action_dim]
inline constexpr const char* kPrefixHidden = "prefix_hidden";  // [B, P, text hidden]
inline constexpr const char* kActionChunk = "action_chunk";    // [B, chunk, max_action_dim]
// (the loss output is kLoss of llama.hpp)

// The number of prefix tokens: image tokens of every camera, `language` tokens, one state token.
int64_t smolvla_prefix_length(const SmolVLAConfig& config, int64_t language);

// LeRobot's attention masks and positions for `batch` prefixes of `language` tokens each
// (language_valid[b * language + i] false for padding) followed by the action chunk:
// the additive mask [B, 1, T, T] (0 visible, -1e30 hidden) and position ids [B, T]
// (cumsum of the valid tokens minus one).
struct SmolVLAMasks {
  std::vector<float> attention_mask;
  std::vector<int32_t> position_ids;
};
SmolVLAMasks smolvla_masks(const SmolVLAConfig& config, int64_t batch, int64_t language,
                           const std::vector<bool>& language_valid);

// The sinusoidal embedding of flow time t (LeRobot's create_sinusoidal_pos_embedding, in double
// precision as there): [sin(2 pi t / period_i), cos(...)] over periods min_period..max_period.
std::vector<float> smolvla_time_embedding(const SmolVLAConfig& config,
                                          const std::vector<float>& times);

struct SmolVLALossOptions {
  bool train_backbone = false;  // false: the VLM's weights are state (frozen), as train_expert_only
  bool with_prefix_hidden = false;  // also output the backbone's final hidden states
};
// The flow-matching loss: x_t = t noise + (1 - t) actions, target u = noise - actions, "loss" the
// mean squared error of the predicted "velocity". Inputs: pixel values, language ids, state,
// mask, positions, actions, noise, time and its embedding. Frozen weights (the backbone unless
// train_backbone, state_proj unless train_state_proj, and weights the loss does not reach) are
// state leaves, so mg::add_training updates only the others.
Graph smolvla_loss_graph(const SmolVLAConfig& config, int64_t batch, int64_t language,
                         const SmolVLALossOptions& options = {});

// Inference as one program: the backbone once (its keys and values, and the expert's
// projections of them in cross-attention layers), then `steps` Euler steps of the flow from
// "noise" at t = 1 to t = 0 (dt = -1/steps), giving "action_chunk".
Graph smolvla_chunk_graph(const SmolVLAConfig& config, int64_t batch, int64_t language,
                          int64_t steps);

// The flow times of those Euler steps, accumulated in f32 as LeRobot's loop does.
std::vector<float> smolvla_flow_times(int64_t steps);

}  // namespace mg::models
