#include "runtime/unet_runtime.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "io/safetensors.hpp"
#include "io/tensor_values.hpp"
#include "meganeura/error.hpp"

namespace mg::models {
namespace {

// "down_blocks.1.attentions.0" of "down_blocks.1.attentions.0.norm.weight"; the block itself
// for names one level up ("conv_in", "time_embedding", "mid_block.resnets.0").
std::string block_of(const std::string& name) {
  size_t end = 0;
  for (int parts = 0; parts < 4; ++parts) {
    end = name.find('.', end + (parts ? 1 : 0));
    if (end == std::string::npos) return name;
    const std::string head = name.substr(0, end);
    if (parts == 0 && head != "down_blocks" && head != "up_blocks" && head != "mid_block")
      return head;
    if (parts == 2 && head.starts_with("mid_block")) return head;
  }
  return name.substr(0, end);
}

}  // namespace

void check_unet_weights(const io::ModelFolder& folder, const UNetConfig& config) {
  std::map<std::string, Shape> expected;
  std::set<std::string> blocks;
  for (const auto& [name, shape] : unet_parameters(config)) {
    expected[name] = shape;
    blocks.insert(block_of(name));
  }
  const std::vector<std::string> names = folder.tensor_names();
  for (const std::string& block : blocks) {
    const bool present = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return name.starts_with(block + ".");
    });
    if (!present) {
      throw Error(folder.description() + " has no " + block +
                  " though its config.json needs one (a missing block: check down_block_types, "
                  "up_block_types, layers_per_block and mid_block_type)");
    }
  }
  for (const auto& [name, shape] : expected) {
    if (!name.ends_with("attn2.to_k.weight")) continue;
    const io::TensorView* tensor = folder.find(name);
    if (tensor && tensor->shape.size() == 2 && tensor->shape[1] != shape[1]) {
      throw Error(folder.description() + ": " + name + " is " + shape_string(tensor->shape) +
                  ", so its cross_attention_dim is " + std::to_string(tensor->shape[1]) +
                  ", but config.json says " + std::to_string(config.cross_attention_dim));
    }
  }
  io::check_tensors(folder, "UNet2DConditionModel", expected);
}

void load_unet_weights(Session& session, const io::ModelFolder& folder, const UNetConfig& config) {
  check_unet_weights(folder, config);
  for (const auto& [name, shape] : unet_parameters(config))
    session.write(name, io::tensor_as_f32(folder.at(name)));
}

std::vector<io::SavedTensor> unet_weights(const Session& session, const UNetConfig& config) {
  std::vector<io::SavedTensor> tensors;
  for (const auto& [name, shape] : unet_parameters(config))
    tensors.push_back({name, shape, session.read(name)});
  return tensors;
}

Graph unet_sampler_graph(const UNetConfig& config, const UNetShape& shape, bool guidance) {
  Graph graph;
  const int64_t images = shape.batch, runs = guidance ? 2 * images : images;
  const Shape latent_shape = {images, config.in_channels, shape.height, shape.width};
  if (config.in_channels != config.out_channels) {
    throw Error("sampling needs a U-Net whose out_channels (" +
                std::to_string(config.out_channels) + ") equal its in_channels (" +
                std::to_string(config.in_channels) + ")");
  }
  const Tensor latents(&graph, graph.state(kSamplerLatents, {DType::f32, latent_shape}));
  const Tensor timestep = input(graph, kStepTimestep, {1});
  const Tensor input_scale = input(graph, kStepInputScale, {1});
  const Tensor sample_scale = input(graph, kStepSampleScale, {1});
  const Tensor noise_scale = input(graph, kStepNoiseScale, {1});
  const Tensor context =
      input(graph, kUNetContext, {runs, shape.tokens, config.cross_attention_dim});
  Tensor model_input = latents * input_scale;
  if (guidance) model_input = concat({model_input, model_input}, 0);
  Tensor noise = unet_forward(config, model_input, broadcast_to(timestep, {runs}), context);
  if (guidance) {
    const Tensor scale = input(graph, kGuidanceScale, {1});
    const Tensor unconditional = slice(noise, 0, 0, images);
    noise = unconditional + scale * (slice(noise, 0, images, runs) - unconditional);
  }
  graph.assign(latents.id(), (latents * sample_scale + noise * noise_scale).id());
  return graph;
}

std::vector<float> run_sampler(Session& session, std::span<const float> initial_latents,
                               const std::vector<SamplerStep>& steps,
                               std::span<const float> context, double guidance_scale) {
  session.write(kSamplerLatents, initial_latents);
  if (session.has_input(kUNetContext)) session.set_input(kUNetContext, context);
  if (session.has_input(kGuidanceScale))
    session.set_input(kGuidanceScale, std::vector<float>{static_cast<float>(guidance_scale)});
  for (const SamplerStep& step : steps) {
    session.set_input(kStepTimestep, std::vector<float>{static_cast<float>(step.timestep)});
    session.set_input(kStepInputScale, std::vector<float>{static_cast<float>(step.input_scale)});
    session.set_input(kStepSampleScale, std::vector<float>{static_cast<float>(step.sample_scale)});
    session.set_input(kStepNoiseScale, std::vector<float>{static_cast<float>(step.noise_scale)});
    session.start_run();
  }
  session.finish_run();
  return session.read(kSamplerLatents);
}

std::vector<float> ClassEmbeddings::context(std::span<const int32_t> labels) const {
  const size_t row = static_cast<size_t>(tokens * width);
  std::vector<float> result;
  result.reserve(labels.size() * row);
  for (int32_t label : labels) {
    if (label < 0 || label > classes) {
      throw Error("class " + std::to_string(label) + " is outside the model's " +
                  std::to_string(classes) + " classes (0 to " + std::to_string(classes - 1) + ")");
    }
    result.insert(result.end(), values.begin() + label * row, values.begin() + (label + 1) * row);
  }
  return result;
}

std::optional<ClassEmbeddings> load_class_embeddings(const std::filesystem::path& folder,
                                                     const UNetConfig& config) {
  const std::filesystem::path path = folder / kClassEmbeddingsFile;
  if (!std::filesystem::exists(path)) return std::nullopt;
  const io::MappedSafetensors file = io::MappedSafetensors::open(path);
  const io::TensorView* view = file.find(kClassEmbeddingsTensor);
  if (!view || view->shape.size() != 3 || view->shape[0] < 2 ||
      view->shape[2] != config.cross_attention_dim) {
    throw Error(path.string() + " needs a tensor \"" + kClassEmbeddingsTensor +
                "\" of shape [classes + 1, tokens, " + std::to_string(config.cross_attention_dim) +
                "] (the U-Net's cross_attention_dim)");
  }
  ClassEmbeddings embeddings;
  embeddings.classes = view->shape[0] - 1;
  embeddings.tokens = view->shape[1];
  embeddings.width = view->shape[2];
  embeddings.values = io::tensor_as_f32(*view);
  return embeddings;
}

io::Image sample_grid(std::span<const float> samples, int64_t count, int64_t channels,
                      int64_t height, int64_t width, int64_t columns) {
  if (channels != 1 && channels != 3) {
    throw Error("an image grid needs samples of 1 or 3 channels, not " + std::to_string(channels));
  }
  constexpr int64_t kGap = 2;
  columns = std::max<int64_t>(1, std::min(columns, count));
  const int64_t rows = (count + columns - 1) / columns;
  io::Image image;
  image.width = static_cast<int>(columns * (width + kGap) + kGap);
  image.height = static_cast<int>(rows * (height + kGap) + kGap);
  image.channels = static_cast<int>(channels);
  image.pixels.assign(static_cast<size_t>(image.width) * image.height * channels, 255);
  for (int64_t n = 0; n < count; ++n) {
    const int64_t left = kGap + (n % columns) * (width + kGap);
    const int64_t top = kGap + (n / columns) * (height + kGap);
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t y = 0; y < height; ++y) {
        for (int64_t x = 0; x < width; ++x) {
          const float value = samples[((n * channels + c) * height + y) * width + x];
          const float level = std::clamp((value + 1.0f) * 127.5f, 0.0f, 255.0f);
          image.pixels[((top + y) * image.width + left + x) * channels + c] =
              static_cast<uint8_t>(std::lround(level));
        }
      }
    }
  }
  return image;
}

}  // namespace mg::models
