// `meganeura sample MODEL_DIR --steps N --out FILE`: denoises noise into samples with a diffusers
// UNet2DConditionModel folder, one recorded step program replayed N times.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/training_run.hpp"
#include "io/safetensors.hpp"
#include "runtime/unet_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura sample MODEL_DIR --steps N --out FILE [options]

Samples with a diffusers UNet2DConditionModel folder (config.json and
diffusion_pytorch_model.safetensors, f32, f16 or bf16): standard-normal noise is denoised by the
DDIM or Euler sampler over Stable Diffusion's noise schedule (1000 scaled-linear steps, betas
0.00085 to 0.012). The program of one step (the U-Net, classifier-free guidance and the
sampler's update) is recorded once; each step replays it with that step's constants. Writes the
final latents to FILE (safetensors, tensor "latents" [N, C, H, W]) and, for a pixel-space model
(1 or 3 channels), a PNG grid of the samples beside it (FILE with .png).

Conditioning: a folder written by 'meganeura train --model DIR' for the class-conditional demo
holds class_embeddings.safetensors; then one sample per class is drawn (or --class K). Else
--context FILE gives encoder_hidden_states (a safetensors file with "encoder_hidden_states"
[1, T, D], or [2, T, D] with the unconditional row first, which guidance needs); without
either, the context is zeros and guidance is off.

  --steps N           denoising steps (default 50)
  --sampler NAME      ddim (default) or euler
  --guidance G        classifier-free guidance scale (default 7.5; 1 turns guidance off)
  --seed S            noise seed (default 0)
  --out FILE          output latents, .safetensors (required)
  --class K           class-conditional folders: sample class K only
  --count N           samples per class, or samples without classes (default 1)
  --context FILE      encoder_hidden_states (see above)
  --tokens T          context length without --context or classes (default 77)
  --size H            sample height and width (default: the config's sample_size)
  --device SEL        device index or part of its name (default: best available)
  --precision P       strict (default), fast (f16 operands on cooperative matrices)
                      or bf16 (bfloat16 operands there)
)";

struct Conditioning {
  int64_t tokens = 0;
  std::vector<float> context;  // [runs, tokens, width]; unconditional rows first with guidance
  bool guidance = false;
  std::vector<int32_t> labels;  // classes, when class-conditional
};

Conditioning conditioning_of(const Arguments& arguments, const std::filesystem::path& folder,
                             const models::UNetConfig& config, int64_t count, double guidance) {
  Conditioning result;
  const bool wants_guidance = guidance != 1.0;
  if (const auto classes = models::load_class_embeddings(folder, config)) {
    if (arguments.has("class")) {
      result.labels.assign(count, static_cast<int32_t>(arguments.integer("class", 0)));
    } else {
      for (int32_t label = 0; label < classes->classes; ++label)
        result.labels.insert(result.labels.end(), count, label);
    }
    result.tokens = classes->tokens;
    result.guidance = wants_guidance;
    if (result.guidance) {
      const std::vector<int32_t> unconditional(result.labels.size(),
                                               static_cast<int32_t>(classes->classes));
      result.context = classes->context(unconditional);
    }
    const std::vector<float> conditional = classes->context(result.labels);
    result.context.insert(result.context.end(), conditional.begin(), conditional.end());
    return result;
  }
  if (arguments.has("class")) {
    throw Error(folder.string() + " has no " + models::kClassEmbeddingsFile +
                ", so --class cannot be used");
  }
  const int64_t width = config.cross_attention_dim;
  if (const auto path = arguments.value("context")) {
    const io::SafetensorsFile file = io::read_safetensors(*path, "context file");
    const io::TensorRecord* record = file.find(models::kUNetContext);
    if (!record || record->dtype != DType::f32 || record->shape.size() != 3 ||
        record->shape[0] < 1 || record->shape[0] > 2 || record->shape[2] != width) {
      throw Error(*path + " needs an f32 tensor \"encoder_hidden_states\" [1 or 2, tokens, " +
                  std::to_string(width) + "]");
    }
    result.tokens = record->shape[1];
    const size_t row = static_cast<size_t>(result.tokens * width);
    std::vector<float> rows(record->bytes.size() / 4);
    std::memcpy(rows.data(), record->bytes.data(), record->bytes.size());
    result.guidance = wants_guidance && record->shape[0] == 2;
    if (result.guidance) {
      for (int64_t n = 0; n < count; ++n)
        result.context.insert(result.context.end(), rows.begin(), rows.begin() + row);
    }
    for (int64_t n = 0; n < count; ++n)
      result.context.insert(result.context.end(), rows.end() - row, rows.end());
    return result;
  }
  result.tokens = arguments.integer("tokens", 77);
  if (result.tokens < 1) throw Error("--tokens must be positive");
  result.context.assign(count * result.tokens * width, 0.0f);
  return result;
}

}  // namespace

int sample_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura sample", words,
                            {"steps", "sampler", "guidance", "seed", "out", "class", "count",
                             "context", "tokens", "size", "device", "precision"},
                            {"help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().size() != 1) {
    throw Error("give one model folder: meganeura sample MODEL_DIR --steps N --out FILE");
  }
  const std::optional<std::string> out = arguments.value("out");
  if (!out) throw Error("--out FILE is required (the latents, .safetensors)");
  require_writable_file(arguments, "out");
  const std::filesystem::path folder_path = arguments.positional()[0];
  const models::UNetConfig config = models::load_unet_config(folder_path);
  const io::ModelFolder folder = io::ModelFolder::open(folder_path);
  models::check_unet_weights(folder, config);
  const int64_t steps = arguments.integer("steps", 50);
  const models::Sampler sampler = models::parse_sampler(arguments.text("sampler", "ddim"));
  const double guidance = arguments.real("guidance", 7.5);
  const int64_t count = arguments.integer("count", 1);
  const int64_t size = arguments.integer("size", config.sample_size);
  if (count < 1 || size < 1) throw Error("--count and --size must be positive");
  const models::NoiseSchedule schedule = models::scaled_linear_schedule();
  const std::vector<models::SamplerStep> plan = models::sampler_steps(schedule, sampler, steps);
  const Conditioning conditioning =
      conditioning_of(arguments, folder_path, config, count, guidance);
  const int64_t images =
      conditioning.labels.empty() ? count : static_cast<int64_t>(conditioning.labels.size());

  SessionOptions options;
  options.device = arguments.text("device", "");
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.initialise_parameters = false;
  Session session(models::unet_sampler_graph(config, {images, size, size, conditioning.tokens},
                                             conditioning.guidance),
                  options);
  std::fprintf(stderr, "device: %s\n", session.report().device.c_str());
  print_precision(options.precision, session.report());
  models::load_unet_weights(session, folder, config);

  std::mt19937_64 generator(static_cast<uint64_t>(arguments.integer("seed", 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double scale = models::initial_noise_scale(schedule, sampler, steps);
  std::vector<float> noise(images * config.in_channels * size * size);
  for (float& value : noise) value = static_cast<float>(normal(generator) * scale);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> latents =
      models::run_sampler(session, noise, plan, conditioning.context, guidance);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%lld %s steps over %lld samples%s in %.2f s (%.1f ms a step)\n",
               static_cast<long long>(steps), std::string(models::sampler_name(sampler)).c_str(),
               static_cast<long long>(images),
               conditioning.guidance ? " with classifier-free guidance" : "", seconds,
               1000 * seconds / static_cast<double>(steps));

  io::SafetensorsFile file;
  io::TensorRecord record{"latents", DType::f32, {images, config.in_channels, size, size}, {}};
  record.bytes.resize(latents.size() * 4);
  std::memcpy(record.bytes.data(), latents.data(), record.bytes.size());
  file.tensors.push_back(std::move(record));
  io::write_safetensors(*out, file);
  std::printf("latents: %s\n", out->c_str());
  if (config.out_channels == 1 || config.out_channels == 3) {
    const std::filesystem::path grid = std::filesystem::path(*out).replace_extension(".png");
    // One row per class when there are several samples of each, else rows of up to 10.
    const int64_t columns = !conditioning.labels.empty() && count > 1 ? count : 10;
    io::write_png(grid,
                  models::sample_grid(latents, images, config.out_channels, size, size, columns));
    std::printf("images: %s\n", grid.c_str());
  }
  return 0;
}

}  // namespace mg::cli
