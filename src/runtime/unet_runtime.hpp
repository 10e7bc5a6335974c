#pragma once
// The runtime side of models/unet.hpp: a diffusers UNet2DConditionModel folder's weights into (and
// out of) a Session, and sampling as one recorded program whose every run is one denoising step
// (the step's constants are small inputs, the latents a state tensor the run updates in place),
// replayed N times.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "io/image.hpp"
#include "io/model_folder.hpp"
#include "meganeura/session.hpp"
#include "models/diffusion_schedule.hpp"
#include "models/unet.hpp"

namespace mg::models {

// Checks the folder's tensors against the config with one mg::Error line: a block the config
// needs that holds no tensor at all ("has no down_blocks.1.attentions.0"), a cross-attention
// width that differs from cross_attention_dim, or else every missing, unexpected or mis-shaped
// tensor by name.
void check_unet_weights(const io::ModelFolder& folder, const UNetConfig& config);
// check_unet_weights, then every parameter written into `session` (f32, f16 or bf16 on disk).
void load_unet_weights(Session& session, const io::ModelFolder& folder, const UNetConfig& config);
// The parameters of `session` under diffusers' names, for io::save_model_folder (with
// weights_name "diffusion_pytorch_model").
std::vector<io::SavedTensor> unet_weights(const Session& session, const UNetConfig& config);

inline constexpr const char* kSamplerLatents = "latents";  // state [images, C, H, W]
inline constexpr const char* kStepTimestep = "step.timestep";
inline constexpr const char* kStepInputScale = "step.input_scale";
inline constexpr const char* kStepSampleScale = "step.sample_scale";
inline constexpr const char* kStepNoiseScale = "step.noise_scale";
inline constexpr const char* kGuidanceScale = "guidance_scale";

// One denoising step over `shape.batch` images. With `guidance` the U-Net runs on twice the
// batch, encoder_hidden_states [2 * images, T, D] holding the unconditional rows first, and the
// noise is uncond + guidance_scale * (cond - uncond) (classifier-free guidance); without it,
// encoder_hidden_states is [images, T, D].
Graph unet_sampler_graph(const UNetConfig& config, const UNetShape& shape, bool guidance);

// Runs the sampler program `steps.size()` times from `initial_latents` (already scaled by
// initial_noise_scale) and returns the final latents. The context and guidance stay fixed; the
// step constants of step k+1 are set while step k runs.
std::vector<float> run_sampler(Session& session, std::span<const float> initial_latents,
                               const std::vector<SamplerStep>& steps,
                               std::span<const float> context, double guidance_scale);

// Class conditioning (the Fashion-MNIST demo's): a learned table of `classes + 1` rows, each
// `tokens` x cross_attention_dim, whose rows are a class's encoder_hidden_states and whose last
// row is the unconditional one (classifier-free guidance). The training job saves it beside the
// U-Net's weights in the model folder, in this file, as tensor kClassEmbeddingsTensor.
inline constexpr const char* kClassEmbeddingsFile = "class_embeddings.safetensors";
inline constexpr const char* kClassEmbeddingsTensor = "class_embeddings";

struct ClassEmbeddings {
  int64_t classes = 0;  // rows - 1
  int64_t tokens = 0;
  int64_t width = 0;
  std::vector<float> values;  // [classes + 1, tokens, width]
  // encoder_hidden_states of each label in turn (a label of `classes` is the unconditional row).
  std::vector<float> context(std::span<const int32_t> labels) const;
};
// Reads `folder`/class_embeddings.safetensors; nullopt when the folder has none. Throws
// mg::Error naming the file when its tensor is missing or its width is not cross_attention_dim.
std::optional<ClassEmbeddings> load_class_embeddings(const std::filesystem::path& folder,
                                                     const UNetConfig& config);

// Samples [N, C, H, W] in [-1, 1] (pixel-space models, C of 1 or 3) as one image: `columns`
// samples a row, a 2-pixel gap between them.
io::Image sample_grid(std::span<const float> samples, int64_t count, int64_t channels,
                      int64_t height, int64_t width, int64_t columns);

}  // namespace mg::models
