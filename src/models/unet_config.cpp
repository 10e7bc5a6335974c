// Reading and writing diffusers' UNet2DConditionModel config.json.
#include <algorithm>
#include <fstream>

#include "meganeura/error.hpp"
#include "models/config_fields.hpp"
#include "models/unet.hpp"

namespace mg::models {
namespace {

int64_t positive_int(const nlohmann::json& value, const std::string& where, const char* key) {
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
    throw Error(where + ": \"" + key + "\" must be a positive integer (or a list of them)");
  }
  return value.get<int64_t>();
}

int64_t int_or(const nlohmann::json& config, const char* key, int64_t fallback,
               const std::string& where) {
  const nlohmann::json* value = find_key(config, key);
  return value ? positive_int(*value, where, key) : fallback;
}

std::string string_or(const nlohmann::json& config, const char* key, const std::string& fallback,
                      const std::string& where) {
  const nlohmann::json* value = find_key(config, key);
  if (!value) return fallback;
  if (!value->is_string()) throw Error(where + ": \"" + key + "\" must be a string");
  return value->get<std::string>();
}

// An int for every block or a list with one per block (diffusers accepts both).
std::vector<int64_t> per_block(const nlohmann::json& config, const char* key, int64_t fallback,
                               size_t blocks, const std::string& where) {
  const nlohmann::json* value = find_key(config, key);
  if (!value) return std::vector<int64_t>(blocks, fallback);
  if (!value->is_array()) return std::vector<int64_t>(blocks, positive_int(*value, where, key));
  if (value->size() != blocks) {
    throw Error(where + ": \"" + key + "\" lists " + std::to_string(value->size()) +
                " values for " + std::to_string(blocks) + " blocks (block_out_channels)");
  }
  std::vector<int64_t> values;
  for (const nlohmann::json& item : *value) values.push_back(positive_int(item, where, key));
  return values;
}

std::vector<std::string> block_types(const nlohmann::json& config, const char* key,
                                     const std::vector<std::string>& known,
                                     const std::string& where) {
  const nlohmann::json* value = find_key(config, key);
  if (!value || !value->is_array()) throw Error(where + ": \"" + key + "\" must be a list");
  std::vector<std::string> types;
  for (const nlohmann::json& item : *value) {
    const std::string type = item.is_string() ? item.get<std::string>() : item.dump();
    if (std::find(known.begin(), known.end(), type) == known.end()) {
      std::string names;
      for (const std::string& name : known) names += (names.empty() ? "" : ", ") + name;
      throw Error(where + ": \"" + key + "\" has the unknown block type \"" + type +
                  "\" (supported: " + names + ")");
    }
    types.push_back(type);
  }
  return types;
}

// Options of the class that change the network in ways this builder does not express: they must
// be absent, null or at the value that leaves them off.
void refuse_features(const nlohmann::json& config, const std::string& where) {
  for (const char* key :
       {"class_embed_type", "addition_embed_type", "encoder_hid_dim", "encoder_hid_dim_type",
        "num_class_embeds", "time_cond_proj_dim", "time_embedding_act_fn", "timestep_post_act",
        "cross_attention_norm", "reverse_transformer_layers_per_block", "num_attention_heads",
        "projection_class_embeddings_input_dim", "addition_time_embed_dim"}) {
    if (find_key(config, key)) {
      throw Error(where + ": \"" + key + "\" is set, which the U-Net builder does not support " +
                  "(docs/UNET.md lists what it builds)");
    }
  }
  const auto expect_text = [&](const char* key, const std::string& off) {
    const std::string value = string_or(config, key, off, where);
    if (value != off) {
      throw Error(where + ": \"" + key + "\" is \"" + value + "\"; only \"" + off +
                  "\" is supported");
    }
  };
  expect_text("resnet_time_scale_shift", "default");
  expect_text("time_embedding_type", "positional");
  expect_text("attention_type", "default");
  for (const char* key : {"dual_cross_attention", "resnet_skip_time_act"}) {
    if (bool_or(config, key, false, where)) {
      throw Error(where + ": \"" + std::string(key) + "\" is true, which is not supported");
    }
  }
  // A bool for every block or a list with one per block.
  if (const nlohmann::json* value = find_key(config, "only_cross_attention")) {
    const nlohmann::json values = value->is_array() ? *value : nlohmann::json::array({*value});
    for (const nlohmann::json& item : values) {
      if (!item.is_boolean() || item.get<bool>()) {
        throw Error(where + ": \"only_cross_attention\" is set, which is not supported");
      }
    }
  }
  if (number_or(config, "resnet_out_scale_factor", 1.0, where) != 1.0) {
    throw Error(where + ": \"resnet_out_scale_factor\" other than 1 is not supported");
  }
  if (number_or(config, "dropout", 0.0, where) != 0.0) {
    throw Error(where + ": \"dropout\" other than 0 is not supported");
  }
  const std::string activation = string_or(config, "act_fn", "silu", where);
  if (activation != "silu" && activation != "swish") {
    throw Error(where + ": \"act_fn\" is \"" + activation + "\"; only silu is supported");
  }
}

void check_divisible(int64_t channels, int64_t divisor, const std::string& what,
                     const std::string& where) {
  if (channels % divisor != 0) {
    throw Error(where + ": " + what + " " + std::to_string(divisor) + " does not divide " +
                std::to_string(channels) + " channels");
  }
}

}  // namespace

int64_t UNetConfig::downsampling_factor() const {
  return int64_t{1} << (block_out_channels.size() - 1);
}

UNetConfig unet_config_from_json(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw Error(where + " is not a JSON object");
  const std::string class_name = string_or(json, "_class_name", "UNet2DConditionModel", where);
  if (class_name != "UNet2DConditionModel") {
    throw Error(where + " describes a " + class_name + ", not a UNet2DConditionModel");
  }
  refuse_features(json, where);
  UNetConfig config;
  config.in_channels = int_or(json, "in_channels", 4, where);
  config.out_channels = int_or(json, "out_channels", 4, where);
  if (const nlohmann::json* size = find_key(json, "sample_size")) {
    config.sample_size =
        positive_int(size->is_array() && !size->empty() ? (*size)[0] : *size, where, "sample_size");
  }
  const nlohmann::json* channels = find_key(json, "block_out_channels");
  if (!channels || !channels->is_array() || channels->empty()) {
    throw Error(where + ": \"block_out_channels\" must be a non-empty list");
  }
  for (const nlohmann::json& item : *channels)
    config.block_out_channels.push_back(positive_int(item, where, "block_out_channels"));
  const size_t blocks = config.block_out_channels.size();

  const std::vector<std::string> down =
      block_types(json, "down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}, where);
  const std::vector<std::string> up =
      block_types(json, "up_block_types", {"CrossAttnUpBlock2D", "UpBlock2D"}, where);
  for (const auto& [key, types] :
       {std::pair<const char*, const std::vector<std::string>&>{"down_block_types", down},
        {"up_block_types", up}}) {
    if (types.size() != blocks) {
      throw Error(where + ": \"" + key + "\" names " + std::to_string(types.size()) +
                  " blocks, but block_out_channels has " + std::to_string(blocks) +
                  " (one block each)");
    }
  }
  const std::string mid = string_or(json, "mid_block_type", "UNetMidBlock2DCrossAttn", where);
  if (find_key(json, "mid_block_type") == nullptr && json.contains("mid_block_type")) {
    config.mid_block = false;
  } else if (mid != "UNetMidBlock2DCrossAttn") {
    throw Error(where + ": \"mid_block_type\" has the unknown block type \"" + mid +
                "\" (supported: UNetMidBlock2DCrossAttn, null)");
  }

  const std::vector<int64_t> layers = per_block(json, "layers_per_block", 2, blocks, where);
  const nlohmann::json* transformer = find_key(json, "transformer_layers_per_block");
  if (transformer && transformer->is_array()) {
    for (const nlohmann::json& item : *transformer) {
      if (item.is_array()) {
        throw Error(where + ": nested \"transformer_layers_per_block\" lists are not supported");
      }
    }
  }
  const std::vector<int64_t> transformer_layers =
      per_block(json, "transformer_layers_per_block", 1, blocks, where);
  const std::vector<int64_t> heads = per_block(json, "attention_head_dim", 8, blocks, where);
  const std::vector<int64_t> cross = per_block(json, "cross_attention_dim", 1280, blocks, where);
  for (int64_t width : cross) {
    if (width != cross[0]) {
      throw Error(where + ": \"cross_attention_dim\" differs between blocks (" +
                  find_key(json, "cross_attention_dim")->dump() +
                  "); one encoder_hidden_states width is supported");
    }
  }
  config.cross_attention_dim = cross[0];
  config.norm_num_groups = int_or(json, "norm_num_groups", 32, where);
  if (json.contains("norm_num_groups") && json["norm_num_groups"].is_null()) {
    throw Error(where + ": \"norm_num_groups\" null (no output norm) is not supported");
  }
  config.norm_eps = number_or(json, "norm_eps", 1e-5, where);
  config.flip_sin_to_cos = bool_or(json, "flip_sin_to_cos", true, where);
  config.freq_shift = number_or(json, "freq_shift", 0, where);
  config.use_linear_projection = bool_or(json, "use_linear_projection", false, where);
  config.center_input_sample = bool_or(json, "center_input_sample", false, where);
  config.mid_block_scale_factor = number_or(json, "mid_block_scale_factor", 1.0, where);
  config.downsample_padding = static_cast<int64_t>(number_or(json, "downsample_padding", 1, where));
  if (config.downsample_padding != 0 && config.downsample_padding != 1) {
    throw Error(where + ": \"downsample_padding\" must be 0 or 1");
  }
  config.conv_in_kernel = int_or(json, "conv_in_kernel", 3, where);
  config.conv_out_kernel = int_or(json, "conv_out_kernel", 3, where);
  if (config.conv_in_kernel % 2 == 0 || config.conv_out_kernel % 2 == 0) {
    throw Error(where + ": \"conv_in_kernel\" and \"conv_out_kernel\" must be odd");
  }
  config.time_embed_dim =
      int_or(json, "time_embedding_dim", config.block_out_channels[0] * 4, where);

  for (size_t i = 0; i < blocks; ++i) {
    const int64_t width = config.block_out_channels[i];
    check_divisible(width, config.norm_num_groups, "norm_num_groups", where);
    config.down_blocks.push_back({down[i], layers[i], transformer_layers[i], heads[i]});
    if (down[i] == "CrossAttnDownBlock2D") {
      check_divisible(width, heads[i], "attention_head_dim (heads)", where);
    }
    // Up block i mirrors down block blocks-1-i: reversed lists, one more ResNet.
    const size_t mirror = blocks - 1 - i;
    config.up_blocks.push_back(
        {up[i], layers[mirror] + 1, transformer_layers[mirror], heads[mirror]});
    if (up[i] == "CrossAttnUpBlock2D") {
      check_divisible(config.block_out_channels[mirror], heads[mirror],
                      "attention_head_dim (heads)", where);
    }
  }
  config.mid_transformer_layers = transformer_layers.back();
  config.mid_heads = heads.back();
  if (config.mid_block) {
    check_divisible(config.block_out_channels.back(), config.mid_heads,
                    "attention_head_dim (heads)", where);
  }
  return config;
}

UNetConfig load_unet_config(const std::filesystem::path& folder) {
  return unet_config_from_json(read_config_json(folder, "a diffusers unet folder"),
                               (folder / "config.json").string());
}

nlohmann::json unet_config_to_json(const UNetConfig& config) {
  nlohmann::json down = nlohmann::json::array(), up = nlohmann::json::array();
  nlohmann::json layers = nlohmann::json::array(), transformer = nlohmann::json::array(),
                 heads = nlohmann::json::array();
  for (const UNetBlockConfig& block : config.down_blocks) {
    down.push_back(block.type);
    layers.push_back(block.layers);
    transformer.push_back(block.transformer_layers);
    heads.push_back(block.heads);
  }
  for (const UNetBlockConfig& block : config.up_blocks) up.push_back(block.type);
  return {{"_class_name", "UNet2DConditionModel"},
          {"act_fn", "silu"},
          {"attention_head_dim", heads},
          {"block_out_channels", config.block_out_channels},
          {"center_input_sample", config.center_input_sample},
          {"conv_in_kernel", config.conv_in_kernel},
          {"conv_out_kernel", config.conv_out_kernel},
          {"cross_attention_dim", config.cross_attention_dim},
          {"down_block_types", down},
          {"downsample_padding", config.downsample_padding},
          {"flip_sin_to_cos", config.flip_sin_to_cos},
          {"freq_shift", config.freq_shift},
          {"in_channels", config.in_channels},
          {"layers_per_block", layers},
          {"mid_block_scale_factor", config.mid_block_scale_factor},
          {"mid_block_type",
           config.mid_block ? nlohmann::json("UNetMidBlock2DCrossAttn") : nlohmann::json()},
          {"norm_eps", config.norm_eps},
          {"norm_num_groups", config.norm_num_groups},
          {"out_channels", config.out_channels},
          {"sample_size", config.sample_size},
          {"time_embedding_dim", config.time_embed_dim},
          {"transformer_layers_per_block", transformer},
          {"up_block_types", up},
          {"use_linear_projection", config.use_linear_projection}};
}

}  // namespace mg::models
