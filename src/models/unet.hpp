#pragma once
// diffusers' UNet2DConditionModel (the Stable Diffusion 1.x/2.x denoiser and smaller models of the
// same class) built from a diffusers unet/config.json, with diffusers' parameter names
// ("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"), so a diffusers folder
// loads and saves in the same layout. docs/UNET.md describes the supported configurations.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/ops.hpp"

namespace mg::models {

struct UNetBlockConfig {
  std::string type;    // CrossAttnDownBlock2D, DownBlock2D, CrossAttnUpBlock2D, UpBlock2D
  int64_t layers = 2;  // ResNet blocks (up blocks have layers_per_block + 1)
  int64_t transformer_layers = 1;  // BasicTransformerBlocks in each Transformer2DModel
  int64_t heads = 8;               // diffusers' attention_head_dim is the number of heads
  bool has_attention() const { return type.starts_with("CrossAttn"); }
};

struct UNetConfig {
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  int64_t sample_size = 64;
  std::vector<int64_t> block_out_channels;
  std::vector<UNetBlockConfig> down_blocks;  // one per block_out_channels entry
  std::vector<UNetBlockConfig> up_blocks;    // in diffusers' order (deepest first)
  bool mid_block = true;                     // UNetMidBlock2DCrossAttn, or none
  int64_t mid_transformer_layers = 1;
  int64_t mid_heads = 8;
  int64_t cross_attention_dim = 768;
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  bool flip_sin_to_cos = true;
  double freq_shift = 0;
  int64_t time_embed_dim = 0;  // block_out_channels[0] * 4 unless time_embedding_dim is set
  bool use_linear_projection = false;
  bool center_input_sample = false;
  double mid_block_scale_factor = 1.0;
  int64_t downsample_padding = 1;
  int64_t conv_in_kernel = 3;
  int64_t conv_out_kernel = 3;

  // Downsampling stages: a sample's height and width must be multiples of 2^this.
  int64_t downsampling_factor() const;
};

// Reads a diffusers UNet2DConditionModel config.json. Throws mg::Error naming `where` and the key
// for anything it does not build (another _class_name, an unknown block type, class or addition
// embeddings, a time-scale-shift ResNet, per-block cross-attention widths that differ, ...).
UNetConfig unet_config_from_json(const nlohmann::json& config, const std::string& where);
// The config of folder `folder` (its config.json): mg::Error for a missing folder or file.
UNetConfig load_unet_config(const std::filesystem::path& folder);
// The JSON diffusers writes for `config` (what save_model_folder puts in config.json).
nlohmann::json unet_config_to_json(const UNetConfig& config);

inline constexpr const char* kUNetSample = "sample";                  // f32 [B, C, H, W]
inline constexpr const char* kUNetTimestep = "timestep";              // f32 [B]
inline constexpr const char* kUNetContext = "encoder_hidden_states";  // f32 [B, T, cross_dim]
inline constexpr const char* kUNetNoisePrediction = "noise_pred";     // f32 [B, out, H, W]
inline constexpr const char* kUNetNoise = "noise";                    // training target
inline constexpr const char* kUNetLoss = "loss";

struct UNetShape {
  int64_t batch = 1;
  int64_t height = 64;
  int64_t width = 64;
  int64_t tokens = 77;  // encoder_hidden_states length
};

// Appends the network to the graph of `sample`, creating its parameters (PyTorch's default
// initialisation, diffusers' names): sample [B, in, H, W], timestep [B] (any real value),
// context [B, T, cross_attention_dim] -> noise prediction [B, out, H, W]. Throws mg::Error
// naming the input whose shape does not fit.
Tensor unet_forward(const UNetConfig& config, Tensor sample, Tensor timestep, Tensor context);

// Inputs sample, timestep, encoder_hidden_states -> output noise_pred.
Graph unet_graph(const UNetConfig& config, const UNetShape& shape);
// unet_graph plus input "noise" (the target) and output "loss": the mean squared error of the
// noise prediction (diffusers' training objective), and "noise_pred" when `with_prediction`.
// Add mg::add_training to train it.
Graph unet_loss_graph(const UNetConfig& config, const UNetShape& shape,
                      bool with_prediction = false);

// Every parameter's name and shape, in the order the graphs declare them.
std::vector<std::pair<std::string, Shape>> unet_parameters(const UNetConfig& config);

}  // namespace mg::models
