#pragma once
// The runtime side of models/smolvla.hpp: a SmolVLA policy folder (LeRobot's config.json and
// model.safetensors, plus the SmolVLM backbone's config.json and tokenizer.json in vlm/), its
// weights into and out of Sessions, SmolVLA's preprocessing (images resized with padding and
// mapped to [-1, 1], the instruction tokenised with a newline, state and actions normalised
// with the checkpoint's mean and std where it has them), and acting: one action chunk from one
// observation as one recorded program.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "io/image.hpp"
#include "io/model_folder.hpp"
#include "io/tokenizer.hpp"
#include "meganeura/session.hpp"
#include "models/smolvla.hpp"

namespace mg::models {

// LeRobot's MEAN_STD normalisation of one feature: (x - mean) / (std + 1e-8).
struct FeatureStats {
  std::vector<float> mean, std;
  bool empty() const { return mean.empty(); }
};

struct SmolVLAFolder {
  std::filesystem::path path;
  nlohmann::ordered_json policy_config;
  nlohmann::json vlm_config;
  std::filesystem::path vlm_path;  // the folder holding the SmolVLM config and tokenizer
  SmolVLAConfig config;
  io::Tokenizer tokenizer;
  std::optional<io::ModelFolder> weights;  // absent: a config-only folder (train from scratch)
  FeatureStats state_stats, action_stats;
};

// Opens a policy folder: config.json with "type": "smolvla"; the SmolVLM config.json and
// tokenizer.json in <folder>/vlm/ or in the folder that vlm_model_name names (absolute or
// relative to the policy folder); model.safetensors (checked against the config) unless
// `weights_optional` and absent. Throws mg::Error naming the folder and what is wrong (not a
// folder, not SmolVLA, missing VLM config or tokenizer, mismatched tensors).
SmolVLAFolder open_smolvla_folder(const std::filesystem::path& path, bool weights_optional = false);

// Writes the folder's weights into every parameter and state leaf `session` holds.
void load_smolvla_weights(Session& session, const SmolVLAFolder& folder);

// A policy folder that open_smolvla_folder reads back (and LeRobot's names): config.json,
// vlm/config.json and vlm/tokenizer.json, model.safetensors with the session's weights (those
// it lacks, such as VLM layers the training graph does not read, from `folder`) and the
// normalisation buffers.
void save_smolvla_folder(const std::filesystem::path& dir, const SmolVLAFolder& folder,
                         const Session& session);

// SmolVLA's image preprocessing into [channels, S, S]: resize_imgs_with_padding (bilinear as
// torch's interpolate, the image kept whole and padded at the left and top), then [0, 1] to
// [-1, 1]. Throws mg::Error naming `what` for an image that is not RGB, or not S x S when the
// config does not resize.
std::vector<float> smolvla_image(const io::Image& image, const SmolVLAConfig& config,
                                 const std::string& what);

// The instruction's token ids as LeRobot's prepare_language gives them (a newline appended).
std::vector<int32_t> smolvla_instruction_ids(const io::Tokenizer& tokenizer,
                                             const std::string& instruction);

// The state padded to max_state_dim and normalised; throws mg::Error when its width is not
// the config's.
std::vector<float> smolvla_state(const SmolVLAFolder& folder, const std::vector<float>& state);
// Actions [chunk, action_dim] normalised (for training) or back from the model (for acting).
std::vector<float> smolvla_normalise_actions(const SmolVLAFolder& folder,
                                             const std::vector<float>& actions);
std::vector<float> smolvla_unnormalise_actions(const SmolVLAFolder& folder,
                                               const std::vector<float>& padded_chunk);

struct ActionChunk {
  std::vector<float> actions;  // [chunk_size, action_dim], in the robot's units
  double seconds = 0;          // the program's run, inputs in and the chunk out
};

// Acts from one observation at a time: the chunk program for an instruction's length is built
// (and given the folder's weights) on first use.
class SmolVLAPolicy {
 public:
  SmolVLAPolicy(const SmolVLAFolder& folder, const SessionOptions& options, int64_t steps);
  // `images` one per camera in the config's order. `seed` draws the flow's starting noise.
  ActionChunk act(const std::vector<io::Image>& images, const std::vector<float>& state,
                  const std::string& instruction, uint64_t seed);
  Session& session_for(int64_t language);

 private:
  const SmolVLAFolder& folder_;
  SessionOptions options_;
  int64_t steps_;
  std::map<int64_t, std::unique_ptr<Session>> sessions_;
};

}  // namespace mg::models
