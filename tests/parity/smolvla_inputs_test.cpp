// SmolVLA's input checks and preprocessing (CPU only): a folder that is not SmolVLA, images that
// are not RGB or not the encoder's size, a state of the wrong width each give one clear error;
// resizing with padding keeps the aspect ratio and pads the left and top with -1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "meganeura/error.hpp"
#include "runtime/smolvla_runtime.hpp"

namespace mg {
namespace {

struct PolicyFolder {
  // One folder a process: ctest runs this suite's tests side by side.
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("meganeura-smolvla-inputs-" + std::to_string(::getpid()));
  explicit PolicyFolder(bool resize) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path / "vlm");
    nlohmann::ordered_json policy = {{"type", "smolvla"},
                                     {"chunk_size", 4},
                                     {"max_state_dim", 4},
                                     {"max_action_dim", 4},
                                     {"num_vlm_layers", 2}};
    if (resize) policy["resize_imgs_with_padding"] = {16, 16};
    policy["input_features"]["observation.images.top"] = {{"type", "VISUAL"},
                                                          {"shape", {3, 16, 16}}};
    policy["input_features"]["observation.state"] = {{"type", "STATE"}, {"shape", {3}}};
    policy["output_features"]["action"] = {{"type", "ACTION"}, {"shape", {2}}};
    const nlohmann::json vlm = {{"scale_factor", 2},
                                {"vision_config",
                                 {{"hidden_size", 8},
                                  {"intermediate_size", 16},
                                  {"num_hidden_layers", 1},
                                  {"num_attention_heads", 2},
                                  {"patch_size", 4},
                                  {"image_size", 16}}},
                                {"text_config",
                                 {{"model_type", "llama"},
                                  {"vocab_size", 1100},
                                  {"hidden_size", 16},
                                  {"intermediate_size", 32},
                                  {"num_hidden_layers", 2},
                                  {"num_attention_heads", 2},
                                  {"hidden_act", "silu"}}}};
    std::ofstream(path / "config.json") << policy.dump();
    std::ofstream(path / "vlm" / "config.json") << vlm.dump();
    std::filesystem::copy_file(
        std::string(MEGANEURA_SOURCE_DIR) + "/tests/fixtures/tokenizer/smollm2_like/tokenizer.json",
        path / "vlm" / "tokenizer.json");
  }
  ~PolicyFolder() { std::filesystem::remove_all(path); }
};

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

io::Image solid(int width, int height, int channels) {
  return {width, height, channels, std::vector<uint8_t>(width * height * channels, 255)};
}

TEST(SmolVLAInputs, BadInputsGiveOneClearLine) {
  const PolicyFolder resizing(true);
  const models::SmolVLAFolder folder = models::open_smolvla_folder(resizing.path, true);
  EXPECT_NE(error_of([&] {
              models::smolvla_state(folder, {1, 2});
            }).find("observation.state has 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              models::smolvla_image(solid(16, 16, 1), folder.config, "top.png");
            }).find("top.png has 1 channels"),
            std::string::npos);
  // Without the config that resizes, images must have the encoder's size.
  const PolicyFolder exact(false);
  const models::SmolVLAFolder strict = models::open_smolvla_folder(exact.path, true);
  EXPECT_NE(error_of([&] {
              models::smolvla_image(solid(20, 16, 3), strict.config, "a.png");
            }).find("a.png is 20x16: this policy takes 16x16"),
            std::string::npos);
  // Weights are required to act: a config-only folder names the missing file.
  EXPECT_NE(error_of([&] { models::open_smolvla_folder(exact.path); }).find("model.safetensors"),
            std::string::npos);
  const std::string other = std::string(MEGANEURA_SOURCE_DIR) + "/tests/fixtures/tokenizer";
  EXPECT_NE(error_of([&] { models::open_smolvla_folder(other); }).find("config.json"),
            std::string::npos);
}

TEST(SmolVLAInputs, ResizeWithPaddingKeepsTheAspectAndPadsLeftAndTop) {
  const PolicyFolder resizing(true);
  const models::SmolVLAFolder folder = models::open_smolvla_folder(resizing.path, true);
  // 32x16 white -> 16x8 white at the bottom, the top 8 rows padding (-1 after the mapping).
  const std::vector<float> pixels = models::smolvla_image(solid(32, 16, 3), folder.config, "x");
  ASSERT_EQ(pixels.size(), 3u * 16 * 16);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        EXPECT_FLOAT_EQ(pixels[(c * 16 + y) * 16 + x], y < 8 ? -1.0f : 1.0f) << y << "," << x;
}

}  // namespace
}  // namespace mg
