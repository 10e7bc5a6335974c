// SmolVLA's configuration, parameter list, attention masks and time embedding (the host-side
// pieces of models/smolvla.hpp).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "meganeura/error.hpp"
#include "models/config_fields.hpp"
#include "models/smolvla.hpp"

namespace mg::models {
namespace {

template <typename Json>
int64_t int_or(const Json& config, const char* key, int64_t fallback, const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) return fallback;
  if (!value->is_number_integer()) throw Error(where + ": \"" + key + "\" must be an integer");
  return value->template get<int64_t>();
}

template <typename Json>
int64_t positive_int(const Json& config, const char* key, std::optional<int64_t> fallback,
                     const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) {
    if (fallback) return *fallback;
    throw Error(where + ": \"" + key + "\" is missing");
  }
  if (!value->is_number_integer() || value->template get<int64_t>() <= 0)
    throw Error(where + ": \"" + key + "\" must be a positive integer");
  return value->template get<int64_t>();
}

template <typename Json>
std::string string_or(const Json& config, const char* key, std::string fallback,
                      const std::string& where) {
  const Json* value = find_key(config, key);
  if (!value) return fallback;
  if (!value->is_string()) throw Error(where + ": \"" + key + "\" must be a string");
  return value->template get<std::string>();
}

SmolVLMVisionConfig vision_config(const nlohmann::json& vision, const std::string& where) {
  SmolVLMVisionConfig config;
  config.hidden_size = positive_int(vision, "hidden_size", 768, where);
  config.intermediate_size = positive_int(vision, "intermediate_size", 3072, where);
  config.layers = positive_int(vision, "num_hidden_layers", 12, where);
  config.heads = positive_int(vision, "num_attention_heads", 12, where);
  config.patch_size = positive_int(vision, "patch_size", 32, where);
  config.image_size = positive_int(vision, "image_size", 224, where);
  config.channels = positive_int(vision, "num_channels", 3, where);
  config.layer_norm_eps = number_or(vision, "layer_norm_eps", 1e-6, where);
  const std::string act = string_or(vision, "hidden_act", "gelu_pytorch_tanh", where);
  if (act != "gelu_pytorch_tanh" && act != "gelu")
    throw Error(where + ": hidden_act \"" + act + "\" is not supported (gelu_pytorch_tanh, gelu)");
  config.gelu_tanh = act == "gelu_pytorch_tanh";
  if (config.hidden_size % config.heads != 0)
    throw Error(where + ": hidden_size must be a multiple of num_attention_heads");
  if (config.image_size % config.patch_size != 0)
    throw Error(where + ": image_size must be a multiple of patch_size");
  return config;
}

// The width of a LeRobot feature {"type": ..., "shape": [n]}.
int64_t feature_width(const nlohmann::ordered_json& feature, const std::string& name,
                      const std::string& where) {
  const nlohmann::ordered_json* shape = find_key(feature, "shape");
  if (!shape || !shape->is_array() || shape->empty() || !shape->back().is_number_integer())
    throw Error(where + ": feature \"" + name + "\" has no shape");
  return shape->back().get<int64_t>();
}

}  // namespace

int64_t smolvla_expert_intermediate_size(int64_t width) {
  int64_t hidden = static_cast<int64_t>(2.0 * static_cast<double>(width) / 3.0);
  hidden *= 4;
  return 256 * ((hidden + 255) / 256);
}

int64_t SmolVLAConfig::image_tokens() const {
  const int64_t side = vision.image_size / vision.patch_size;
  return side * side / (scale_factor * scale_factor);
}

int64_t SmolVLAConfig::expert_layer_of(int64_t vlm_layer) const {
  const int64_t every = text.layers / expert_layers;
  return vlm_layer % every == 0 ? vlm_layer / every : -1;
}

bool SmolVLAConfig::is_cross_layer(int64_t vlm_layer) const {
  if (!cross_attention) return false;
  return !(self_attn_every_n_layers > 0 && vlm_layer % self_attn_every_n_layers == 0);
}

SmolVLAConfig smolvla_config_from_json(const nlohmann::ordered_json& policy,
                                       const nlohmann::json& vlm, const std::string& where) {
  if (!policy.is_object()) throw Error(where + " is not a JSON object");
  const std::string type = string_or(policy, "type", "", where);
  if (type != "smolvla") {
    throw Error(where + ": \"type\" is \"" + type +
                "\", not \"smolvla\": this is not a LeRobot SmolVLA policy folder");
  }
  const std::string vlm_where = where + " (the SmolVLM config)";
  if (!vlm.is_object() || !find_key(vlm, "vision_config") || !find_key(vlm, "text_config"))
    throw Error(vlm_where + " has no vision_config and text_config");
  SmolVLAConfig config;
  config.vision = vision_config(vlm["vision_config"], vlm_where + " vision_config");
  config.scale_factor = positive_int(vlm, "scale_factor", 2, vlm_where);
  const int64_t side = config.vision.image_size / config.vision.patch_size;
  if (side % config.scale_factor != 0)
    throw Error(vlm_where + ": the patch grid side " + std::to_string(side) +
                " is not a multiple of scale_factor " + std::to_string(config.scale_factor));
  config.text = llama_config_from_json(vlm["text_config"], vlm_where + " text_config");

  for (const char* key : {"add_image_special_tokens"}) {
    if (bool_or(policy, key, false, where))
      throw Error(where + ": \"" + key + "\": true is not supported");
  }
  if (int_or(policy, "empty_cameras", 0, where) != 0)
    throw Error(where + ": \"empty_cameras\" other than 0 is not supported");
  if (int_or(policy, "prefix_length", -1, where) > 0)
    throw Error(where + ": a positive \"prefix_length\" is not supported");

  const int64_t vlm_layers = int_or(policy, "num_vlm_layers", 16, where);
  if (vlm_layers > config.text.layers)
    throw Error(where + ": num_vlm_layers " + std::to_string(vlm_layers) +
                " exceeds the text model's " + std::to_string(config.text.layers) + " layers");
  if (vlm_layers > 0) config.text.layers = vlm_layers;
  const int64_t expert_layers = int_or(policy, "num_expert_layers", -1, where);
  config.expert_layers = expert_layers > 0 ? expert_layers : config.text.layers;
  if (config.text.layers % config.expert_layers != 0)
    throw Error(where + ": num_vlm_layers (" + std::to_string(config.text.layers) +
                ") must be a multiple of num_expert_layers (" +
                std::to_string(config.expert_layers) + ")");
  const double multiplier = number_or(policy, "expert_width_multiplier", 0.75, where);
  config.expert_hidden_size =
      static_cast<int64_t>(static_cast<double>(config.text.hidden_size) * multiplier);
  if (config.expert_hidden_size <= 0 || config.expert_hidden_size % 2 != 0)
    throw Error(where + ": expert_width_multiplier gives an expert width of " +
                std::to_string(config.expert_hidden_size) + " (it must be even and positive)");
  config.expert_intermediate_size = smolvla_expert_intermediate_size(config.expert_hidden_size);
  const std::string mode = string_or(policy, "attention_mode", "cross_attn", where);
  config.cross_attention = mode.find("cross") != std::string::npos;
  config.self_attn_every_n_layers = int_or(policy, "self_attn_every_n_layers", 2, where);
  // LeRobot reshapes the cross-attention projections by expert layer index and chooses cross
  // attention by VLM layer index; both agree only when every VLM layer has an expert layer or
  // when no layer cross-attends.
  if (config.cross_attention && config.expert_layers != config.text.layers)
    throw Error(where +
                ": cross attention with fewer expert layers than VLM layers is not "
                "supported (LeRobot's layer indices disagree there)");

  config.chunk_size = positive_int(policy, "chunk_size", 50, where);
  config.max_state_dim = positive_int(policy, "max_state_dim", 32, where);
  config.max_action_dim = positive_int(policy, "max_action_dim", 32, where);
  config.num_steps = positive_int(policy, "num_steps", 10, where);
  config.min_period = number_or(policy, "min_period", 4e-3, where);
  config.max_period = number_or(policy, "max_period", 4.0, where);
  config.tokenizer_max_length = positive_int(policy, "tokenizer_max_length", 48, where);
  config.train_expert_only = bool_or(policy, "train_expert_only", true, where);
  config.freeze_vision_encoder = bool_or(policy, "freeze_vision_encoder", true, where) &&
                                 !bool_or(policy, "fine_tune_vision_encoder", false, where);
  config.train_state_proj = bool_or(policy, "train_state_proj", true, where);
  if (const nlohmann::ordered_json* resize = find_key(policy, "resize_imgs_with_padding")) {
    if (!resize->is_array() || resize->size() != 2 || !(*resize)[0].is_number_integer() ||
        !(*resize)[1].is_number_integer())
      throw Error(where + ": \"resize_imgs_with_padding\" must be [width, height] or null");
    config.resize_with_padding = {(*resize)[0].get<int64_t>(), (*resize)[1].get<int64_t>()};
    if (config.resize_with_padding->first != config.vision.image_size ||
        config.resize_with_padding->second != config.vision.image_size)
      throw Error(where + ": resize_imgs_with_padding must be the vision encoder's image size " +
                  std::to_string(config.vision.image_size));
  }

  config.state_dim = config.max_state_dim;
  if (const nlohmann::ordered_json* inputs = find_key(policy, "input_features")) {
    for (const auto& [name, feature] : inputs->items()) {
      const std::string kind = string_or(feature, "type", "", where);
      if (kind == "VISUAL") config.camera_keys.push_back(name);
      if (kind == "STATE") config.state_dim = feature_width(feature, name, where);
    }
  }
  if (config.camera_keys.empty())
    throw Error(where + ": input_features names no camera (a feature of type VISUAL)");
  config.action_dim = config.max_action_dim;
  if (const nlohmann::ordered_json* outputs = find_key(policy, "output_features")) {
    for (const auto& [name, feature] : outputs->items())
      if (string_or(feature, "type", "", where) == "ACTION")
        config.action_dim = feature_width(feature, name, where);
  }
  if (config.state_dim > config.max_state_dim || config.action_dim > config.max_action_dim)
    throw Error(where + ": the state or action feature is wider than max_state_dim/max_action_dim");
  return config;
}

std::vector<SmolVLAParameter> smolvla_parameters(const SmolVLAConfig& config) {
  std::vector<SmolVLAParameter> parameters;
  const auto add = [&](std::string name, Shape shape, SmolVLAPart part) {
    parameters.push_back({std::move(name), std::move(shape), part});
  };
  const SmolVLMVisionConfig& vision = config.vision;
  const std::string v = kSmolVLAVisionPrefix;
  const int64_t side = vision.image_size / vision.patch_size;
  add(v + "embeddings.patch_embedding.weight",
      {vision.hidden_size, vision.channels, vision.patch_size, vision.patch_size},
      SmolVLAPart::vision);
  add(v + "embeddings.patch_embedding.bias", {vision.hidden_size}, SmolVLAPart::vision);
  add(v + "embeddings.position_embedding.weight", {side * side, vision.hidden_size},
      SmolVLAPart::vision);
  for (int64_t i = 0; i < vision.layers; ++i) {
    const std::string p = v + "encoder.layers." + std::to_string(i) + ".";
    for (const char* projection : {"k_proj", "v_proj", "q_proj", "out_proj"}) {
      add(p + "self_attn." + projection + ".weight", {vision.hidden_size, vision.hidden_size},
          SmolVLAPart::vision);
      add(p + "self_attn." + projection + ".bias", {vision.hidden_size}, SmolVLAPart::vision);
    }
    for (const char* norm : {"layer_norm1", "layer_norm2"}) {
      add(p + norm + ".weight", {vision.hidden_size}, SmolVLAPart::vision);
      add(p + norm + ".bias", {vision.hidden_size}, SmolVLAPart::vision);
    }
    add(p + "mlp.fc1.weight", {vision.intermediate_size, vision.hidden_size}, SmolVLAPart::vision);
    add(p + "mlp.fc1.bias", {vision.intermediate_size}, SmolVLAPart::vision);
    add(p + "mlp.fc2.weight", {vision.hidden_size, vision.intermediate_size}, SmolVLAPart::vision);
    add(p + "mlp.fc2.bias", {vision.hidden_size}, SmolVLAPart::vision);
  }
  add(v + "post_layernorm.weight", {vision.hidden_size}, SmolVLAPart::vision);
  add(v + "post_layernorm.bias", {vision.hidden_size}, SmolVLAPart::vision);
  add(kSmolVLAConnectorWeight,
      {config.text.hidden_size, vision.hidden_size * config.scale_factor * config.scale_factor},
      SmolVLAPart::connector);

  const LlamaConfig& text = config.text;
  const int64_t q_width = text.heads * text.head_dim;
  const int64_t kv_width = text.kv_heads * text.head_dim;
  const auto llama_layer = [&](const std::string& p, int64_t hidden, int64_t intermediate,
                               int64_t kv_in, SmolVLAPart part) {
    const auto projection = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
      add(p + name + ".weight", {out, in}, part);
      if (bias) add(p + name + ".bias", {out}, part);
    };
    projection("self_attn.q_proj", q_width, hidden, text.attention_bias);
    projection("self_attn.k_proj", kv_width, kv_in, text.attention_bias);
    projection("self_attn.v_proj", kv_width, kv_in, text.attention_bias);
    projection("self_attn.o_proj", hidden, q_width, text.attention_bias);
    projection("mlp.gate_proj", intermediate, hidden, text.mlp_bias);
    projection("mlp.up_proj", intermediate, hidden, text.mlp_bias);
    projection("mlp.down_proj", hidden, intermediate, text.mlp_bias);
    add(p + "input_layernorm.weight", {hidden}, part);
    add(p + "post_attention_layernorm.weight", {hidden}, part);
  };
  const std::string t = kSmolVLATextPrefix;
  add(t + "embed_tokens.weight", {text.vocab_size, text.hidden_size}, SmolVLAPart::text);
  for (int64_t i = 0; i < text.layers; ++i)
    llama_layer(t + "layers." + std::to_string(i) + ".", text.hidden_size, text.intermediate_size,
                text.hidden_size, SmolVLAPart::text);
  add(t + "norm.weight", {text.hidden_size}, SmolVLAPart::text);

  const std::string e = kSmolVLAExpertPrefix;
  for (int64_t i = 0; i < config.expert_layers; ++i) {
    // Expert layer i serves VLM layer i * (VLM layers / expert layers).
    const int64_t vlm_layer = i * (text.layers / config.expert_layers);
    const int64_t kv_in = config.is_cross_layer(vlm_layer) ? kv_width : config.expert_hidden_size;
    llama_layer(e + "layers." + std::to_string(i) + ".", config.expert_hidden_size,
                config.expert_intermediate_size, kv_in, SmolVLAPart::expert);
  }
  add(e + "norm.weight", {config.expert_hidden_size}, SmolVLAPart::expert);

  const int64_t width = config.expert_hidden_size;
  const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    add("model." + name + ".weight", {out, in}, SmolVLAPart::projections);
    add("model." + name + ".bias", {out}, SmolVLAPart::projections);
  };
  linear("state_proj", text.hidden_size, config.max_state_dim);
  linear("action_in_proj", width, config.max_action_dim);
  linear("action_out_proj", config.max_action_dim, width);
  linear("action_time_mlp_in", width, 2 * width);
  linear("action_time_mlp_out", width, width);
  return parameters;
}

int64_t smolvla_last_expert_layer(const SmolVLAConfig& config) {
  int64_t last = 0;
  for (int64_t i = 0; i < config.text.layers; ++i)
    if (config.expert_layer_of(i) >= 0) last = i;
  return last;
}

bool smolvla_loss_reaches(const SmolVLAConfig& config, const std::string& name) {
  const std::string layers = std::string(kSmolVLATextPrefix) + "layers.";
  if (!name.starts_with(layers)) return name != std::string(kSmolVLATextPrefix) + "norm.weight";
  const int64_t layer = std::stoll(name.substr(layers.size()));
  const int64_t last = smolvla_last_expert_layer(config);
  if (layer < last) return true;
  if (layer > last) return false;
  // The last layer the expert reads gives it keys and values only.
  return name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos ||
         name.find("input_layernorm") != std::string::npos;
}

int64_t smolvla_prefix_length(const SmolVLAConfig& config, int64_t language) {
  return config.cameras() * config.image_tokens() + language + 1;
}

SmolVLAMasks smolvla_masks(const SmolVLAConfig& config, int64_t batch, int64_t language,
                           const std::vector<bool>& language_valid) {
  if (static_cast<int64_t>(language_valid.size()) != batch * language)
    throw Error("smolvla_masks: language_valid has " + std::to_string(language_valid.size()) +
                " entries, expected " + std::to_string(batch * language));
  const int64_t images = config.cameras() * config.image_tokens();
  const int64_t prefix = smolvla_prefix_length(config, language);
  const int64_t total = prefix + config.chunk_size;
  SmolVLAMasks masks;
  masks.attention_mask.assign(batch * total * total, -1e30f);
  masks.position_ids.assign(batch * total, 0);
  for (int64_t b = 0; b < batch; ++b) {
    // Image and language tokens open no new block (0); the state token and each action do (1).
    std::vector<int64_t> block(total);
    std::vector<bool> valid(total, true);
    int64_t cumulative = 0, position = -1;
    for (int64_t i = 0; i < total; ++i) {
      if (i >= images && i < images + language)
        valid[i] = language_valid[b * language + i - images];
      if (i >= prefix - 1) ++cumulative;
      block[i] = cumulative;
      if (valid[i]) ++position;
      masks.position_ids[b * total + i] = static_cast<int32_t>(std::max<int64_t>(position, 0));
    }
    for (int64_t i = 0; i < total; ++i)
      for (int64_t j = 0; j < total; ++j)
        if (valid[i] && valid[j] && block[j] <= block[i])
          masks.attention_mask[(b * total + i) * total + j] = 0.0f;
  }
  return masks;
}

std::vector<float> smolvla_time_embedding(const SmolVLAConfig& config,
                                          const std::vector<float>& times) {
  const int64_t dim = config.expert_hidden_size;
  const int64_t half = dim / 2;
  std::vector<float> embedding(times.size() * dim);
  for (size_t b = 0; b < times.size(); ++b) {
    for (int64_t i = 0; i < half; ++i) {
      // torch.linspace(0, 1, half) in float64.
      const double fraction =
          half == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(half - 1);
      const double period =
          config.min_period * std::pow(config.max_period / config.min_period, fraction);
      const double angle = 1.0 / period * 2.0 * std::numbers::pi * static_cast<double>(times[b]);
      embedding[b * dim + i] = static_cast<float>(std::sin(angle));
      embedding[b * dim + half + i] = static_cast<float>(std::cos(angle));
    }
  }
  return embedding;
}

std::vector<float> smolvla_flow_times(int64_t steps) {
  const float dt = -1.0f / static_cast<float>(steps);
  std::vector<float> times;
  for (float time = 1.0f; time >= -dt / 2; time += dt) times.push_back(time);
  return times;
}

}  // namespace mg::models
