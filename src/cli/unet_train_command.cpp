// `meganeura train --model UNET_DIR`: trains a diffusers UNet2DConditionModel folder as a
// class-conditional pixel-space diffusion model on Fashion-MNIST (noise-prediction MSE at random
// timesteps, AdamW, an EMA of the weights), then samples a grid per class and, given a
// classifier checkpoint, reports how many samples it labels as the class they were drawn for.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cli/anomaly_finder.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/distributed_run.hpp"
#include "cli/non_finite_steps.hpp"
#include "cli/roofline_report.hpp"
#include "cli/run_record.hpp"
#include "cli/training_run.hpp"
#include "cli/training_support.hpp"
#include "data/batcher.hpp"
#include "data/fashion_mnist.hpp"
#include "io/checkpoint.hpp"
#include "io/jsonl.hpp"
#include "io/plot.hpp"
#include "io/safetensors.hpp"
#include "meganeura/ops.hpp"
#include "models/classifier.hpp"
#include "runtime/unet_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura train --model UNET_DIR [options]

Trains a diffusers UNet2DConditionModel folder (config.json, and diffusion_pytorch_model.safetensors
to start from; without weights it starts from PyTorch's default initialisation) as a
class-conditional diffusion model in pixel space on Fashion-MNIST: images padded to the config's
sample_size and scaled to [-1, 1], the class given through cross-attention to a learned table
of class embeddings (--tokens rows of cross_attention_dim per class, plus an unconditional row
used with probability --uncond, for classifier-free guidance). Each step draws timesteps
uniformly from Stable Diffusion's 1000-step scaled-linear schedule and minimises the MSE of the
predicted noise with AdamW; an exponential moving average of the weights (warmed up as
diffusers' EMAModel does) is kept on the GPU.

Writes into --out: checkpoint.safetensors (weights, optimizer state and EMA; every
--checkpoint-every steps and at the end), metrics.jsonl, training.png, model/ and ema/ (diffusers
folders of the last and the averaged weights, each with class_embeddings.safetensors, which
'meganeura sample' reads), and samples.png: --per-class samples of every class from the EMA
weights (DDIM, --sample-steps steps, --guidance). With --classifier CKPT (a checkpoint of
'meganeura train' on Fashion-MNIST) the samples are labelled and the share labelled as their own
class is printed. Ctrl-C stops after the current step and saves.

  --model UNET_DIR      the U-Net folder (required); its in/out_channels must be 1 or 3
  --data DIR            Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)
  --limit N             use only the first N training images (default: all)
  --out DIR             output folder (default runs/<timestamp>)
  --batch N             images a step (default 64)
  --epochs N            passes over the training images (default 1)
  --max-steps N         stop after N steps (default: all the epochs)
  --lr X                peak learning rate (default 1e-4)
  --optimizer NAME      adamw, adam or sgd (default adamw)
  --momentum X          SGD momentum (default 0.9)
  --weight-decay X      AdamW's decoupled weight decay (default 0.01)
  --schedule NAME       constant, warmup or cosine (default warmup)
  --warmup N            warmup steps (default: a twentieth of the updates, at most 500)
  --clip X              global gradient-norm clipping, 0 = off (default 1.0)
  --accumulate N        apply the mean gradient of N batches as one update (default 1)
  --ema X               EMA decay (default 0.999)
  --tokens N            class-embedding tokens a class (default 1)
  --uncond X            probability of training a step's image without its class (default 0.1)
  --sample-steps N      DDIM steps of the samples at the end (default 50; 0 = no samples)
  --guidance G          their classifier-free guidance scale (default 2)
  --per-class N         samples a class (default 10)
  --classifier CKPT     label the samples with this Fashion-MNIST classifier
  --seed N              initialisation, shuffling and noise seed (default 0)
  --device SEL          device index or part of its name (default: best available)
  --precision P         strict (default), fast (f16 operands on cooperative matrices)
                        or bf16 (bfloat16 operands there)
  --resume CKPT         continue from a checkpoint written by this command
  --overwrite           replace the run already in --out (without it, and without --resume,
                        a folder holding a checkpoint or metrics is refused)
  --checkpoint-every N  steps between checkpoints (default 500)
  --log-every N         steps between metrics.jsonl records (default 10)
  --trace FILE          write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                        the last step
)";

constexpr const char* kClassLabels = "class_labels";
constexpr const char* kEmaDecay = "ema.decay";
constexpr int64_t kClasses = 10;

// Fashion-MNIST's [0, 1] images, centred in sample_size with the background value, in [-1, 1],
// repeated over `channels`.
std::vector<float> pixel_images(const data::Dataset& dataset, int64_t size, int64_t channels) {
  const int64_t top = (size - dataset.rows) / 2, left = (size - dataset.cols) / 2;
  std::vector<float> images(dataset.count * channels * size * size, -1.0f);
  for (int64_t n = 0; n < dataset.count; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t y = 0; y < dataset.rows; ++y) {
        for (int64_t x = 0; x < dataset.cols; ++x) {
          images[((n * channels + c) * size + top + y) * size + left + x] =
              2.0f * dataset.images[(n * dataset.rows + y) * dataset.cols + x] - 1.0f;
        }
      }
    }
  }
  return images;
}

// The training graph: the class table feeds encoder_hidden_states, the U-Net predicts the noise,
// AdamW updates every parameter and each parameter's EMA follows its updated value.
Graph training_graph(const models::UNetConfig& config, int64_t batch, int64_t size, int64_t tokens,
                     const OptimizerConfig& optimizer, TrainingGraph& parts) {
  Graph graph;
  const Tensor sample = input(graph, models::kUNetSample, {batch, config.in_channels, size, size});
  const Tensor timestep = input(graph, models::kUNetTimestep, {batch});
  const Tensor labels = input(graph, kClassLabels, {batch}, DType::i32);
  const Tensor table =
      parameter(graph, models::kClassEmbeddingsTensor,
                {kClasses + 1, tokens * config.cross_attention_dim}, Init::normal(0.0, 1.0));
  const Tensor context =
      reshape(gather(table, labels), {batch, tokens, config.cross_attention_dim});
  const Tensor prediction = models::unet_forward(config, sample, timestep, context);
  const Tensor noise = input(graph, models::kUNetNoise, prediction.shape());
  parts = add_training(graph, mse_loss(prediction, noise).id(), optimizer);
  const Tensor decay = input(graph, kEmaDecay, {1});
  // With --accumulate the average moves once an update, as diffusers' training scripts step
  // their EMAModel only where the optimizer steps: the other batches keep it bit for bit.
  const ValueId apply = graph.find_leaf(kApplyUpdateInput);
  const auto updates = graph.updates();
  for (const auto& [target, value] : updates) {
    const Node& leaf = graph.node(target);
    if (leaf.op != "parameter") continue;
    const Tensor average(&graph, graph.state("ema." + leaf.name, leaf.type));
    Tensor moved = average + (Tensor(&graph, value) - average) * (1.0 - decay);
    if (apply != kNoValue) moved = where(Tensor(&graph, apply), moved, average);
    graph.assign(average.id(), moved.id());
  }
  return graph;
}

// The parameter names of the training graph that are the U-Net's (all but the class table).
std::vector<std::string> unet_names(const models::UNetConfig& config) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : models::unet_parameters(config)) names.push_back(name);
  return names;
}

void save_folder(const std::filesystem::path& dir, const models::UNetConfig& config,
                 const Session& session, const std::string& prefix, int64_t tokens) {
  std::vector<io::SavedTensor> tensors;
  for (const auto& [name, shape] : models::unet_parameters(config))
    tensors.push_back({name, shape, session.read(prefix + name)});
  io::SaveOptions options;
  options.weights_name = "diffusion_pytorch_model";
  io::save_model_folder(dir, models::unet_config_to_json(config), tensors, options);
  const std::vector<float> table = session.read(prefix + models::kClassEmbeddingsTensor);
  io::SafetensorsFile file;
  io::TensorRecord record{models::kClassEmbeddingsTensor,
                          DType::f32,
                          {kClasses + 1, tokens, config.cross_attention_dim},
                          {}};
  record.bytes.resize(table.size() * 4);
  std::memcpy(record.bytes.data(), table.data(), record.bytes.size());
  file.tensors.push_back(std::move(record));
  io::write_safetensors(dir / models::kClassEmbeddingsFile, file);
}

// Samples `per_class` images of every class with the EMA weights; returns them [N, C, S, S].
std::vector<float> sample_classes(const models::UNetConfig& config, const Session& training,
                                  const SessionOptions& base, int64_t size, int64_t tokens,
                                  int64_t per_class, int64_t steps, double guidance, uint64_t seed,
                                  std::vector<int32_t>& labels) {
  const int64_t images = kClasses * per_class;
  SessionOptions options = base;
  options.initialise_parameters = false;
  Session sampler(models::unet_sampler_graph(config, {images, size, size, tokens}, true), options);
  for (const std::string& name : unet_names(config))
    sampler.write(name, training.read("ema." + name));
  models::ClassEmbeddings table;
  table.classes = kClasses;
  table.tokens = tokens;
  table.width = config.cross_attention_dim;
  table.values = training.read(std::string("ema.") + models::kClassEmbeddingsTensor);
  labels.clear();
  for (int32_t label = 0; label < kClasses; ++label) labels.insert(labels.end(), per_class, label);
  std::vector<float> context =
      table.context(std::vector<int32_t>(labels.size(), static_cast<int32_t>(kClasses)));
  const std::vector<float> conditional = table.context(labels);
  context.insert(context.end(), conditional.begin(), conditional.end());
  const models::NoiseSchedule schedule = models::scaled_linear_schedule();
  std::mt19937_64 generator(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> noise(images * config.in_channels * size * size);
  for (float& value : noise) value = normal(generator);
  return models::run_sampler(sampler, noise,
                             models::sampler_steps(schedule, models::Sampler::ddim, steps), context,
                             guidance);
}

// The share of samples that the classifier checkpoint labels as the class they were drawn for.
double labelled_share(const std::filesystem::path& path, const std::vector<float>& samples,
                      const std::vector<int32_t>& labels, int64_t channels, int64_t size,
                      const SessionOptions& base) {
  const io::Checkpoint checkpoint = io::load_checkpoint(path);
  const models::ClassifierConfig model =
      models::ClassifierConfig::from_json(checkpoint.model_config);
  const int64_t count = static_cast<int64_t>(labels.size()), side = model.image_size;
  if (side > size) {
    throw Error(path.string() + " classifies " + std::to_string(side) +
                "-pixel images, larger than the " + std::to_string(size) + "-pixel samples");
  }
  SessionOptions options = base;
  options.initialise_parameters = false;
  Session session(models::build_classifier(model, count), options);
  load_tensors(session, checkpoint, path, false);
  // The centre crop of each sample, channels averaged, back to [0, 1].
  const int64_t offset = (size - side) / 2;
  std::vector<float> images(count * side * side, 0.0f);
  for (int64_t n = 0; n < count; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t y = 0; y < side; ++y)
        for (int64_t x = 0; x < side; ++x)
          images[(n * side + y) * side + x] +=
              std::clamp(
                  (samples[((n * channels + c) * size + offset + y) * size + offset + x] + 1.0f) /
                      2.0f,
                  0.0f, 1.0f) /
              static_cast<float>(channels);
  session.set_input(models::kImagesInput, images);
  session.run();
  const std::vector<int64_t> predicted =
      predictions(session.output("logits"), count, model.classes);
  int64_t correct = 0;
  for (int64_t n = 0; n < count; ++n) correct += predicted[n] == labels[n];
  return static_cast<double>(correct) / static_cast<double>(count);
}

}  // namespace

int unet_train_command(const std::vector<std::string>& words) {
  const Arguments arguments = training_arguments(
      words,
      {"limit", "ema", "tokens", "uncond", "sample-steps", "guidance", "per-class", "classifier"},
      {});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  refuse_mpi_launcher("U-Net");
  arguments.expect_at_most_positional(0);
  const std::filesystem::path folder_path = arguments.text("model", "");
  const models::UNetConfig config = models::load_unet_config(folder_path);
  if (config.in_channels != config.out_channels ||
      (config.in_channels != 1 && config.in_channels != 3)) {
    throw Error(folder_path.string() + "/config.json: training on Fashion-MNIST needs " +
                "in_channels equal to out_channels, 1 or 3");
  }
  const int64_t size = config.sample_size;
  if (size < 28 || size % config.downsampling_factor() != 0) {
    throw Error(folder_path.string() + "/config.json: sample_size " + std::to_string(size) +
                " must hold a 28-pixel image and be a multiple of " +
                std::to_string(config.downsampling_factor()));
  }
  const int64_t batch = arguments.integer("batch", 64);
  const int64_t epochs = arguments.integer("epochs", 1);
  const int64_t tokens = arguments.integer("tokens", 1);
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 500);
  const int64_t log_every = arguments.integer("log-every", 10, 1, INT64_MAX);
  const int64_t sample_steps = arguments.integer("sample-steps", 50);
  const int64_t per_class = arguments.integer("per-class", 10);
  const double ema = arguments.real("ema", 0.999);
  const double uncond = arguments.real("uncond", 0.1);
  const double guidance = arguments.real("guidance", 2.0);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  if (batch <= 0 || epochs <= 0 || tokens <= 0 || checkpoint_every <= 0 || per_class <= 0 ||
      sample_steps < 0) {
    throw Error("--batch, --epochs, --tokens, --checkpoint-every and --per-class must be positive");
  }
  if (!(ema >= 0 && ema < 1) || !(uncond >= 0 && uncond <= 1)) {
    throw Error("--ema must be in [0, 1) and --uncond in [0, 1]");
  }
  if (arguments.has("classifier")) io::load_checkpoint(arguments.text("classifier", ""));
  const std::optional<io::ModelFolder> folder =
      std::filesystem::exists(folder_path / "diffusion_pytorch_model.safetensors") ||
              std::filesystem::exists(folder_path /
                                      "diffusion_pytorch_model.safetensors.index.json")
          ? std::optional<io::ModelFolder>(io::ModelFolder::open(folder_path))
          : std::nullopt;
  if (folder) models::check_unet_weights(*folder, config);
  const std::optional<models::ClassEmbeddings> classes =
      models::load_class_embeddings(folder_path, config);
  if (classes && (classes->classes != kClasses || classes->tokens != tokens)) {
    throw Error(folder_path.string() + "/" + models::kClassEmbeddingsFile + " holds " +
                std::to_string(classes->classes) + " classes of " +
                std::to_string(classes->tokens) +
                " tokens; this run needs 10 classes of --tokens " + std::to_string(tokens));
  }
  const data::Dataset dataset =
      data::load_fashion_mnist(arguments.text("data", std::string(data::kFashionMnistDir)), "train",
                               arguments.integer("limit", -1));
  if (dataset.count < batch) {
    throw Error("the training set has " + std::to_string(dataset.count) +
                " images, fewer than one --batch of " + std::to_string(batch));
  }
  const std::vector<float> images = pixel_images(dataset, size, config.in_channels);
  const int64_t steps_per_epoch = dataset.count / batch;
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs, arguments.integer("max-steps", steps_per_epoch * epochs));
  if (total_steps <= 0) throw Error("--max-steps must be positive");
  OptimizerDefaults defaults;
  defaults.optimizer = "adamw";
  defaults.learning_rate = 1e-4;
  defaults.weight_decay = 0.01;
  defaults.schedule = "warmup";
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps, defaults);
  NonFiniteSteps non_finite(arguments);
  non_finite.configure(optimizer);
  if (!arguments.has("warmup"))
    optimizer.warmup_steps = std::min<int64_t>(500, optimizer.total_steps / 20);
  if (!arguments.has("clip")) optimizer.clip_norm = 1.0;
  const nlohmann::json model_json = {
      {"kind", "unet"}, {"config", models::unet_config_to_json(config)}, {"tokens", tokens}};
  const std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments, model_json);

  const std::filesystem::path out_dir = arguments.text("out", default_out_dir());
  open_run(out_dir, arguments, words,
           {{"job", "unet"},
            {"model", arguments.text("model", "")},
            {"data", arguments.text("data", "")},
            {"resume", arguments.text("resume", "")}});
  require_writable_file(arguments, "trace");
  SessionOptions options;
  options.shared_device = open_shared_device(arguments.text("device", ""));
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.seed = seed;
  TrainingGraph parts;
  const Graph graph = training_graph(config, batch, size, tokens, optimizer, parts);
  // The training program alone is profiled for --trace.
  SessionOptions training_options = options;
  training_options.profile = arguments.has("trace");
  Session training(graph, training_options);
  RecordedInputs training_inputs(training,
                                 non_finite.detects_anomaly()
                                     ? std::make_unique<AnomalyFinder>(graph, parts, options)
                                     : nullptr);
  std::fprintf(stderr, "device: %s\n", training.report().device.c_str());
  current_run().set("device", training.report().device);
  print_precision(options.precision, training.report());
  std::fprintf(
      stderr,
      "data: %lld images at %lldx%lld; built the training program in %.2f s (%zu dispatches)\n",
      static_cast<long long>(dataset.count), static_cast<long long>(size),
      static_cast<long long>(size), training.report().build_seconds, training.report().dispatches);
  int64_t step = 0;
  if (resumed) {
    load_tensors(training, *resumed, arguments.text("resume", ""), true);
    step = resumed->step;
    drop_metrics_after(out_dir / "metrics.jsonl", step);
    std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                 static_cast<long long>(step));
  } else {
    if (folder) models::load_unet_weights(training, *folder, config);
    if (classes) training.write(models::kClassEmbeddingsTensor, classes->values);
    for (const std::string& name : unet_names(config))
      training.write("ema." + name, training.read(name));
    training.write(std::string("ema.") + models::kClassEmbeddingsTensor,
                   training.read(models::kClassEmbeddingsTensor));
  }

  const std::filesystem::path checkpoint_path = out_dir / "checkpoint.safetensors";
  io::JsonlWriter metrics(out_dir / "metrics.jsonl");
  const auto save = [&] {
    io::Checkpoint checkpoint;
    checkpoint.model_config = model_json;
    checkpoint.step = step;
    checkpoint.epoch = step / steps_per_epoch;
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"batch", batch}, {"seed", seed}, {"ema", ema}};
    checkpoint.tensors = session_tensors(training);
    save_run_checkpoint(checkpoint_path, checkpoint);
  };

  const models::NoiseSchedule schedule = models::scaled_linear_schedule();
  const int64_t pixels = config.in_channels * size * size;
  std::vector<float> sample(batch * pixels), noise(batch * pixels), timesteps(batch);
  std::vector<int32_t> labels(batch);
  install_stop_handlers();
  io::Series loss_series{"training loss", {}};
  ProgressLine progress;
  const StepPace pace(step);
  double smoothed = NAN;
  std::vector<uint32_t> order;
  int64_t order_epoch = -1;
  // diffusers' EMAModel warm-up: the decay grows towards --ema over the first updates.
  const auto ema_decay = [&](int64_t index) {
    const int64_t update = index / optimizer.accumulation_steps;
    return std::min(ema, (1.0 + update) / (10.0 + update));
  };
  StepLoop loop;
  loop.start = [&](int64_t index, int) {
    const int64_t epoch = index / steps_per_epoch;
    if (epoch != order_epoch) {
      order = data::epoch_order(dataset.count, seed, epoch);
      order_epoch = epoch;
    }
    // Each step's noise, timesteps and dropped classes come from (seed, step), so a resumed run
    // continues exactly.
    std::mt19937_64 generator(seed * 1000003 + static_cast<uint64_t>(index));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int64_t> timestep(0, schedule.timesteps() - 1);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t image = order[(index % steps_per_epoch) * batch + r];
      const int64_t t = timestep(generator);
      const double alpha = schedule.alphas_cumprod[t];
      timesteps[r] = static_cast<float>(t);
      labels[r] = coin(generator) < uncond ? static_cast<int32_t>(kClasses) : dataset.labels[image];
      for (int64_t i = 0; i < pixels; ++i) {
        const float epsilon = normal(generator);
        noise[r * pixels + i] = epsilon;
        sample[r * pixels + i] = static_cast<float>(std::sqrt(alpha) * images[image * pixels + i] +
                                                    std::sqrt(1 - alpha) * epsilon);
      }
    }
    training_inputs.set(models::kUNetSample, sample);
    training_inputs.set(models::kUNetNoise, noise);
    training_inputs.set(models::kUNetTimestep, timesteps);
    training_inputs.set(kClassLabels, labels);
    training_inputs.set(kEmaDecay, std::vector<float>{static_cast<float>(ema_decay(index))});
    training_inputs.set_step(non_finite, optimizer, index);
    training.start_run();
  };
  loop.finish = [&] { training.finish_run(); };
  loop.ends_a_stretch = [&](int64_t steps_done) { return steps_done % checkpoint_every == 0; };
  loop.finished = [&](int64_t steps_done, int) {
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const double loss = training.scalar_output("loss");
    if (!non_finite.dropped(loss, training.scalar_output(kNonFiniteOutput), steps_done,
                            checkpoint_path, progress, training_inputs.anomaly()))
      smoothed = moving_average(smoothed, loss, 0.02);
    const double steps_per_second = pace.steps_per_second(steps_done);
    const std::string line =
        step_line(epoch + 1, epochs, steps_done, total_steps, smoothed,
                  rate_text(steps_per_second * batch, 0, "images/s"), steps_per_second);
    progress.update(line, steps_done == total_steps);
    if (steps_done % log_every == 0 || steps_done == total_steps) {
      loss_series.points.emplace_back(steps_done, smoothed);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed, optimizer, non_finite);
      record["ema_decay"] = ema_decay(steps_done - 1);
      record["images_per_second"] = steps_per_second * batch;
      metrics.write(record);
    }
    if (loop.ends_a_stretch(steps_done)) save();
    return bool{stop_requested};
  };
  // With --detect-anomaly a step's re-run needs the parameters from before it.
  run_steps(step, total_steps, !non_finite.detects_anomaly(), stop_requested, loop);
  progress.finish();
  save();
  save_folder(out_dir / "model", config, training, "", tokens);
  save_folder(out_dir / "ema", config, training, "ema.", tokens);
  io::Chart chart;
  chart.title = "meganeura train: " + folder_path.filename().string() + " on Fashion-MNIST";
  chart.panels.push_back({"noise prediction", "step", "MSE", {loss_series}});
  io::write_chart_png(out_dir / "training.png", chart);
  std::printf("checkpoint: %s\nmodel: %s\nema: %s\nmetrics: %s\nplot: %s\n",
              checkpoint_path.c_str(), (out_dir / "model").c_str(), (out_dir / "ema").c_str(),
              (out_dir / "metrics.jsonl").c_str(), (out_dir / "training.png").c_str());
  if (pace.ran_steps(step))
    report_training_roofline(out_dir, training, options, pace.seconds_per_step(step));
  if (arguments.has("trace")) training.write_trace(arguments.text("trace", ""));
  if (stop_requested) {
    std::fprintf(stderr, "stopped at step %lld\n", static_cast<long long>(step));
    return 130;
  }
  if (sample_steps == 0) return 0;

  std::vector<int32_t> sample_labels;
  const auto sampling_start = std::chrono::steady_clock::now();
  const std::vector<float> samples =
      sample_classes(config, training, options, size, tokens, per_class, sample_steps, guidance,
                     seed, sample_labels);
  std::fprintf(
      stderr, "sampled %lld images (%lld DDIM steps, guidance %.1f) in %.2f s\n",
      static_cast<long long>(sample_labels.size()), static_cast<long long>(sample_steps), guidance,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sampling_start).count());
  io::write_png(
      out_dir / "samples.png",
      models::sample_grid(samples, static_cast<int64_t>(sample_labels.size()), config.in_channels,
                          size, size, per_class == 1 ? kClasses : per_class));
  std::printf("samples: %s (%s)\n", (out_dir / "samples.png").c_str(),
              per_class == 1 ? "one per class" : "one row per class");
  if (const auto classifier = arguments.value("classifier")) {
    const double share =
        labelled_share(*classifier, samples, sample_labels, config.in_channels, size, options);
    metrics.write({{"step", step}, {"samples_labelled_as_their_class", share}});
    std::printf("samples the classifier labels as their class: %.1f%%\n", 100 * share);
  }
  return 0;
}

}  // namespace mg::cli
