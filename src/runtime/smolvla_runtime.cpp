#include "runtime/smolvla_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <set>

#include "meganeura/error.hpp"

namespace mg::models {
namespace {

// LeRobot's normalisation buffers in a SmolVLA checkpoint.
constexpr const char* kStateMean = "normalize_inputs.buffer_observation_state.mean";
constexpr const char* kStateStd = "normalize_inputs.buffer_observation_state.std";
constexpr const char* kActionMean = "unnormalize_outputs.buffer_action.mean";
constexpr const char* kActionStd = "unnormalize_outputs.buffer_action.std";
constexpr double kStdEpsilon = 1e-8;

template <typename Json>
Json read_json(const std::filesystem::path& path, const std::string& what) {
  std::ifstream file(path);
  if (!file)
    throw Error(what + " has no " + path.filename().string() + " (looked at " + path.string() +
                ")");
  Json json = Json::parse(file, nullptr, false);
  if (json.is_discarded()) throw Error(path.string() + " is not valid JSON");
  return json;
}

bool has_weights(const std::filesystem::path& folder) {
  return std::filesystem::exists(folder / "model.safetensors") ||
         std::filesystem::exists(folder / "model.safetensors.index.json");
}

FeatureStats read_stats(const io::ModelFolder& weights, const char* mean, const char* std,
                        int64_t width) {
  FeatureStats stats;
  if (!weights.find(mean) || !weights.find(std)) return stats;
  stats.mean = io::tensor_as_f32(weights.at(mean));
  stats.std = io::tensor_as_f32(weights.at(std));
  if (static_cast<int64_t>(stats.mean.size()) != width ||
      static_cast<int64_t>(stats.std.size()) != width)
    throw Error(weights.description() + ": " + mean + " and " + std + " must hold " +
                std::to_string(width) + " values (the feature's width)");
  return stats;
}

// torch.nn.functional.interpolate(mode="bilinear", align_corners=False) without antialiasing:
// the source coordinate of output pixel i is (i + 0.5) * in / out - 0.5, clamped at 0.
struct Taps {
  std::vector<int64_t> low, high;
  std::vector<float> weight;
};

Taps bilinear_taps(int64_t in, int64_t out) {
  Taps taps;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t i = 0; i < out; ++i) {
    const float source = std::max(0.0f, (static_cast<float>(i) + 0.5f) * scale - 0.5f);
    const int64_t low = std::min<int64_t>(static_cast<int64_t>(source), in - 1);
    taps.low.push_back(low);
    taps.high.push_back(std::min<int64_t>(low + 1, in - 1));
    taps.weight.push_back(source - static_cast<float>(low));
  }
  return taps;
}

}  // namespace

SmolVLAFolder open_smolvla_folder(const std::filesystem::path& path, bool weights_optional) {
  if (!std::filesystem::is_directory(path))
    throw Error("no SmolVLA policy folder at " + path.string() +
                ": give a folder holding LeRobot's config.json and model.safetensors");
  const std::string what = "policy folder " + path.string();
  auto policy = read_json<nlohmann::ordered_json>(path / "config.json", what);
  if (!policy.is_object() || !policy.contains("type") || policy["type"] != "smolvla")
    throw Error(path.string() +
                "/config.json is not a SmolVLA policy (LeRobot's config.json has "
                "\"type\": \"smolvla\")");
  std::filesystem::path vlm_path = path / "vlm";
  if (!std::filesystem::exists(vlm_path / "config.json")) {
    const std::string name = policy.value("vlm_model_name", std::string());
    const std::filesystem::path named =
        std::filesystem::path(name).is_absolute() ? std::filesystem::path(name) : path / name;
    if (name.empty() || !std::filesystem::exists(named / "config.json"))
      throw Error(what +
                  " has no SmolVLM config: put the backbone's config.json and "
                  "tokenizer.json in " +
                  (path / "vlm").string() + " (or make vlm_model_name \"" + name +
                  "\" a local folder)");
    vlm_path = named;
  }
  SmolVLAFolder folder{
      path,
      policy,
      read_json<nlohmann::json>(vlm_path / "config.json", "SmolVLM folder " + vlm_path.string()),
      vlm_path,
      {},
      io::Tokenizer::load(vlm_path / "tokenizer.json"),
      std::nullopt,
      {},
      {}};
  folder.config =
      smolvla_config_from_json(policy, folder.vlm_config, (path / "config.json").string());
  if (folder.tokenizer.vocab_size() > folder.config.text.vocab_size)
    throw Error(vlm_path.string() + "/tokenizer.json has " +
                std::to_string(folder.tokenizer.vocab_size()) +
                " tokens, more than the text model's vocab_size " +
                std::to_string(folder.config.text.vocab_size));
  if (weights_optional && !has_weights(path)) return folder;
  folder.weights = io::ModelFolder::open(path);
  std::map<std::string, Shape> expected;
  for (const SmolVLAParameter& parameter : smolvla_parameters(folder.config))
    expected[parameter.name] = parameter.shape;
  // LeRobot checkpoints also hold the VLM's lm_head, its normalisation buffers, and (from
  // older LeRobot versions) the text layers past num_vlm_layers.
  io::check_tensors(
      *folder.weights, "SmolVLA", expected, {},
      {"model.vlm_with_expert.vlm.lm_head.", "normalize_inputs.", "normalize_targets.",
       "unnormalize_outputs.", std::string(kSmolVLATextPrefix) + "layers."});
  folder.state_stats = read_stats(*folder.weights, kStateMean, kStateStd, folder.config.state_dim);
  folder.action_stats =
      read_stats(*folder.weights, kActionMean, kActionStd, folder.config.action_dim);
  return folder;
}

void load_smolvla_weights(Session& session, const SmolVLAFolder& folder) {
  if (!folder.weights) return;
  const std::vector<std::string> names = session.persistent_names();
  const std::set<std::string> held(names.begin(), names.end());
  for (const SmolVLAParameter& parameter : smolvla_parameters(folder.config))
    if (held.count(parameter.name))
      session.write(parameter.name, io::tensor_as_f32(folder.weights->at(parameter.name)));
}

void save_smolvla_folder(const std::filesystem::path& dir, const SmolVLAFolder& folder,
                         const Session& session) {
  const std::vector<std::string> names = session.persistent_names();
  const std::set<std::string> held(names.begin(), names.end());
  std::vector<io::SavedTensor> tensors;
  for (const SmolVLAParameter& parameter : smolvla_parameters(folder.config)) {
    if (held.count(parameter.name)) {
      tensors.push_back({parameter.name, parameter.shape, session.read(parameter.name)});
    } else if (folder.weights) {
      tensors.push_back(
          {parameter.name, parameter.shape, io::tensor_as_f32(folder.weights->at(parameter.name))});
    } else {
      // Trained from scratch, and never read by the policy (text layers after the expert's
      // last, the text model's final norm): the initializer's deterministic part.
      const bool norm = parameter.name.ends_with("norm.weight");
      int64_t count = 1;
      for (int64_t extent : parameter.shape) count *= extent;
      tensors.push_back(
          {parameter.name, parameter.shape, std::vector<float>(count, norm ? 1.0f : 0.0f)});
    }
  }
  const auto stats = [&](const char* mean, const char* std, const FeatureStats& values) {
    if (values.empty()) return;
    const Shape shape{static_cast<int64_t>(values.mean.size())};
    tensors.push_back({mean, shape, values.mean});
    tensors.push_back({std, shape, values.std});
  };
  stats(kStateMean, kStateStd, folder.state_stats);
  stats(kActionMean, kActionStd, folder.action_stats);
  io::save_model_folder(dir, folder.policy_config, tensors);
  std::filesystem::create_directories(dir / "vlm");
  std::ofstream(dir / "vlm" / "config.json") << folder.vlm_config.dump(2) << "\n";
  std::filesystem::copy_file(folder.vlm_path / "tokenizer.json", dir / "vlm" / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
}

std::vector<float> smolvla_image(const io::Image& image, const SmolVLAConfig& config,
                                 const std::string& what) {
  if (image.channels != 3)
    throw Error(what + " has " + std::to_string(image.channels) +
                " channels: SmolVLA takes RGB images (3 channels)");
  const int64_t side = config.vision.image_size;
  const int64_t width = image.width, height = image.height;
  int64_t resized_width = width, resized_height = height;
  if (config.resize_with_padding) {
    const double ratio = std::max(static_cast<double>(width) / static_cast<double>(side),
                                  static_cast<double>(height) / static_cast<double>(side));
    resized_width = static_cast<int64_t>(static_cast<double>(width) / ratio);
    resized_height = static_cast<int64_t>(static_cast<double>(height) / ratio);
  } else if (width != side || height != side) {
    throw Error(what + " is " + std::to_string(width) + "x" + std::to_string(height) +
                ": this policy takes " + std::to_string(side) + "x" + std::to_string(side) +
                " images (its config has no resize_imgs_with_padding)");
  }
  const Taps columns = bilinear_taps(width, resized_width);
  const Taps rows = bilinear_taps(height, resized_height);
  const int64_t pad_left = side - resized_width, pad_top = side - resized_height;
  // Padding is 0 before the mapping to [-1, 1], as LeRobot pads.
  std::vector<float> out(3 * side * side, -1.0f);
  const auto pixel = [&](int64_t y, int64_t x, int c) {
    return static_cast<float>(image.pixels[(y * width + x) * 3 + c]) / 255.0f;
  };
  for (int c = 0; c < 3; ++c)
    for (int64_t y = 0; y < resized_height; ++y)
      for (int64_t x = 0; x < resized_width; ++x) {
        const float wy = rows.weight[y], wx = columns.weight[x];
        const float top = pixel(rows.low[y], columns.low[x], c) * (1 - wx) +
                          pixel(rows.low[y], columns.high[x], c) * wx;
        const float bottom = pixel(rows.high[y], columns.low[x], c) * (1 - wx) +
                             pixel(rows.high[y], columns.high[x], c) * wx;
        const float value = top * (1 - wy) + bottom * wy;
        out[(c * side + pad_top + y) * side + pad_left + x] = value * 2.0f - 1.0f;
      }
  return out;
}

std::vector<int32_t> smolvla_instruction_ids(const io::Tokenizer& tokenizer,
                                             const std::string& instruction) {
  const std::string text = instruction.ends_with("\n") ? instruction : instruction + "\n";
  std::vector<int32_t> ids = tokenizer.encode(text, true);
  if (ids.empty()) throw Error("the instruction gives no tokens: give --instruction TEXT");
  return ids;
}

std::vector<float> smolvla_state(const SmolVLAFolder& folder, const std::vector<float>& state) {
  const SmolVLAConfig& config = folder.config;
  if (static_cast<int64_t>(state.size()) != config.state_dim)
    throw Error("the state has " + std::to_string(state.size()) +
                " values; this policy's "
                "observation.state has " +
                std::to_string(config.state_dim));
  std::vector<float> padded(config.max_state_dim, 0.0f);
  for (size_t i = 0; i < state.size(); ++i)
    padded[i] = folder.state_stats.empty()
                    ? state[i]
                    : static_cast<float>((state[i] - folder.state_stats.mean[i]) /
                                         (folder.state_stats.std[i] + kStdEpsilon));
  return padded;
}

std::vector<float> smolvla_normalise_actions(const SmolVLAFolder& folder,
                                             const std::vector<float>& actions) {
  const SmolVLAConfig& config = folder.config;
  const int64_t rows = static_cast<int64_t>(actions.size()) / config.action_dim;
  std::vector<float> padded(config.chunk_size * config.max_action_dim, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < config.action_dim; ++i) {
      const float value = actions[r * config.action_dim + i];
      padded[r * config.max_action_dim + i] =
          folder.action_stats.empty()
              ? value
              : static_cast<float>((value - folder.action_stats.mean[i]) /
                                   (folder.action_stats.std[i] + kStdEpsilon));
    }
  return padded;
}

std::vector<float> smolvla_unnormalise_actions(const SmolVLAFolder& folder,
                                               const std::vector<float>& padded_chunk) {
  const SmolVLAConfig& config = folder.config;
  std::vector<float> actions(config.chunk_size * config.action_dim);
  for (int64_t r = 0; r < config.chunk_size; ++r)
    for (int64_t i = 0; i < config.action_dim; ++i) {
      const float value = padded_chunk[r * config.max_action_dim + i];
      actions[r * config.action_dim + i] =
          folder.action_stats.empty()
              ? value
              : value * folder.action_stats.std[i] + folder.action_stats.mean[i];
    }
  return actions;
}

SmolVLAPolicy::SmolVLAPolicy(const SmolVLAFolder& folder, const SessionOptions& options,
                             int64_t steps)
    : folder_(folder), options_(options), steps_(steps) {
  if (steps <= 0) throw Error("the number of flow steps must be positive");
}

Session& SmolVLAPolicy::session_for(int64_t language) {
  auto it = sessions_.find(language);
  if (it == sessions_.end()) {
    SessionOptions options = options_;
    options.initialise_parameters = !folder_.weights.has_value();
    auto session = std::make_unique<Session>(
        smolvla_chunk_graph(folder_.config, 1, language, steps_), options);
    load_smolvla_weights(*session, folder_);
    it = sessions_.emplace(language, std::move(session)).first;
  }
  return *it->second;
}

ActionChunk SmolVLAPolicy::act(const std::vector<io::Image>& images,
                               const std::vector<float>& state, const std::string& instruction,
                               uint64_t seed) {
  const SmolVLAConfig& config = folder_.config;
  if (static_cast<int64_t>(images.size()) != config.cameras())
    throw Error("this policy takes " + std::to_string(config.cameras()) + " image(s) (" +
                std::to_string(images.size()) + " given), one per camera in this order: " + [&] {
                  std::string keys;
                  for (const std::string& key : config.camera_keys)
                    keys += (keys.empty() ? "" : ", ") + key;
                  return keys;
                }());
  std::vector<float> pixels;
  for (size_t i = 0; i < images.size(); ++i) {
    const std::vector<float> image = smolvla_image(
        images[i], config, "image " + std::to_string(i + 1) + " (" + config.camera_keys[i] + ")");
    pixels.insert(pixels.end(), image.begin(), image.end());
  }
  const std::vector<float> padded_state = smolvla_state(folder_, state);
  const std::vector<int32_t> ids = smolvla_instruction_ids(folder_.tokenizer, instruction);
  const int64_t language = static_cast<int64_t>(ids.size());
  const SmolVLAMasks masks = smolvla_masks(config, 1, language, std::vector<bool>(language, true));
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> noise(config.chunk_size * config.max_action_dim);
  for (float& value : noise) value = normal(generator);

  Session& session = session_for(language);
  const auto start = std::chrono::steady_clock::now();
  session.set_input(kPixelValues, pixels);
  session.set_input(kLanguageIds, ids);
  session.set_input(kState, padded_state);
  session.set_input(kAttentionMask, masks.attention_mask);
  session.set_input(kPositionIds, masks.position_ids);
  session.set_input(kNoise, noise);
  session.run();
  ActionChunk chunk;
  chunk.actions = smolvla_unnormalise_actions(folder_, session.output(kActionChunk));
  chunk.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return chunk;
}

}  // namespace mg::models
