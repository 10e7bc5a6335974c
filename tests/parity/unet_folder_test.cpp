// diffusers U-Net folders: the config errors and the folder checks name what is wrong in one
// line (unknown block type, a block the config needs and the folder lacks, a cross-attention
// width that is not the config's), and a saved folder (f16, diffusers' names) passes the check.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "io/model_folder.hpp"
#include "models/unet.hpp"
#include "runtime/unet_runtime.hpp"

namespace mg {
namespace {

nlohmann::json small_config() {
  return {{"_class_name", "UNet2DConditionModel"},
          {"in_channels", 1},
          {"out_channels", 1},
          {"block_out_channels", {16, 32}},
          {"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
          {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
          {"layers_per_block", 1},
          {"attention_head_dim", 2},
          {"cross_attention_dim", 24},
          {"norm_num_groups", 4}};
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Writes a folder holding the parameters of `config` (random values), except those starting
// with `left_out`.
std::filesystem::path write_folder(const std::string& name, const nlohmann::json& json,
                                   const models::UNetConfig& config,
                                   const std::string& left_out = "~") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("meganeura-" + name);
  std::vector<io::SavedTensor> tensors;
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [tensor, shape] : models::unet_parameters(config)) {
    if (tensor.starts_with(left_out)) continue;
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    std::vector<float> values(count);
    for (float& value : values) value = normal(generator);
    tensors.push_back({tensor, shape, values});
  }
  io::SaveOptions options;
  options.dtype = DType::f16;
  options.weights_name = "diffusion_pytorch_model";
  io::save_model_folder(dir, json, tensors, options);
  return dir;
}

TEST(UNetFolder, ConfigErrorsNameTheKey) {
  nlohmann::json json = small_config();
  json["down_block_types"][1] = "AttnDownBlock2D";
  const std::string unknown = error_of([&] { models::unet_config_from_json(json, "cfg"); });
  EXPECT_NE(unknown.find("unknown block type \"AttnDownBlock2D\""), std::string::npos) << unknown;
  json = small_config();
  json["up_block_types"] = {"UpBlock2D"};
  const std::string count = error_of([&] { models::unet_config_from_json(json, "cfg"); });
  EXPECT_NE(count.find("\"up_block_types\" names 1 blocks"), std::string::npos) << count;
  json = small_config();
  json["cross_attention_dim"] = {24, 32};
  const std::string widths = error_of([&] { models::unet_config_from_json(json, "cfg"); });
  EXPECT_NE(widths.find("cross_attention_dim"), std::string::npos) << widths;
  json = small_config();
  json["class_embed_type"] = "timestep";
  EXPECT_NE(error_of([&] { models::unet_config_from_json(json, "cfg"); }).find("class_embed_type"),
            std::string::npos);
  for (const std::string& message : {unknown, count, widths})
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(UNetFolder, GraphRefusesAContextOfTheWrongWidth) {
  const models::UNetConfig config = models::unet_config_from_json(small_config(), "cfg");
  Graph graph;
  const std::string message = error_of([&] {
    models::unet_forward(config, input(graph, "sample", {1, 1, 8, 8}),
                         input(graph, "timestep", {1}), input(graph, "context", {1, 3, 16}));
  });
  EXPECT_NE(message.find("cross_attention_dim"), std::string::npos) << message;
}

TEST(UNetFolder, MissingBlockAndWrongCrossAttentionWidthAreNamed) {
  const models::UNetConfig config = models::unet_config_from_json(small_config(), "cfg");
  const std::filesystem::path complete = write_folder("unet-complete", small_config(), config);
  models::check_unet_weights(io::ModelFolder::open(complete), config);
  EXPECT_EQ(models::unet_config_to_json(
                models::unet_config_from_json(io::ModelFolder::open(complete).config(), "saved")),
            models::unet_config_to_json(config));

  const std::filesystem::path missing =
      write_folder("unet-missing", small_config(), config, "down_blocks.0.attentions.0.");
  const std::string block =
      error_of([&] { models::check_unet_weights(io::ModelFolder::open(missing), config); });
  EXPECT_NE(block.find("has no down_blocks.0.attentions.0 "), std::string::npos) << block;

  nlohmann::json wide = small_config();
  wide["cross_attention_dim"] = 40;
  const models::UNetConfig wide_config = models::unet_config_from_json(wide, "cfg");
  const std::string width =
      error_of([&] { models::check_unet_weights(io::ModelFolder::open(complete), wide_config); });
  EXPECT_NE(width.find("its cross_attention_dim is 24, but config.json says 40"), std::string::npos)
      << width;
  for (const auto& dir : {complete, missing}) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mg
