// `meganeura train --model resnet18|34|50|101|152 --data IMAGE_DIR`, or `--model HF_FOLDER`
// (a ResNetForImageClassification folder), or `--model resnetNN --weights FILE` (a torchvision
// state dict): trains a ResNet on a torchvision-style image folder with batch statistics, and
// evaluates it with the running statistics on a held-out split after each epoch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/distributed_run.hpp"
#include "cli/image_classification.hpp"
#include "cli/non_finite_steps.hpp"
#include "cli/roofline_report.hpp"
#include "cli/run_record.hpp"
#include "cli/training_program.hpp"
#include "cli/training_run.hpp"
#include "cli/training_support.hpp"
#include "data/image_folder.hpp"
#include "io/checkpoint.hpp"
#include "io/jsonl.hpp"
#include "io/model_folder.hpp"
#include "io/plot.hpp"
#include "runtime/resnet_runtime.hpp"

namespace mg::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHelp =
    R"(usage: meganeura train --model resnet18|resnet34|resnet50|resnet101|resnet152
                       --data IMAGE_DIR [options]
       meganeura train --model HF_RESNET_DIR --data IMAGE_DIR [options]

Trains a ResNet (torchvision's layout and state-dict names) on an image folder: one sub-folder
per class holding .jpg, .jpeg, .png, .bmp or .pgm files, as torchvision's ImageFolder. When
IMAGE_DIR holds train/ and val/ (or test/) folders, those are the training and validation sets;
otherwise --validation of the images is held out at random. Batch norm trains with batch
statistics and updates its running statistics; validation runs with them. Batches are decoded
and augmented (random resized crop and horizontal flip) on background threads. Files that do not
decode are named and replaced by the next image; empty files and empty class folders are named
and skipped.

Fine-tuning: --model HF_RESNET_DIR (a Hugging Face ResNetForImageClassification folder,
config.json + model.safetensors) or --weights FILE_OR_DIR with a resnetNN model (a torchvision
state dict saved as safetensors, e.g. save_file(resnet50().state_dict(), "r50.safetensors")).
The classifier head is replaced by a new one when the class count differs.

Writes into --out: checkpoint.safetensors (parameters, running statistics, optimizer state and
class names; every --checkpoint-every steps, each epoch and at the end), metrics.jsonl and
training.png. Ctrl-C stops after the current step and saves a checkpoint. 'meganeura infer
CHECKPOINT IMAGE...' classifies images with it.

Under mpirun (or with --distributed) each process trains on its share of every --batch (its own
run of each batch of one shuffled order) and the gradients are averaged across them before the
update: docs/DISTRIBUTED.md. Batch norm normalises each process's share with that share's
statistics (as PyTorch's DistributedDataParallel without SyncBatchNorm), so a step equals one
process's step with --batch B/N --accumulate N, not one on the whole batch; each process keeps
its own running statistics and rank 0's are the ones validated and saved.

  --model NAME|DIR      resnet18, resnet34, resnet50, resnet101, resnet152 or a Hugging Face
                        ResNet folder (required)
  --data IMAGE_DIR      the image folder (required)
  --weights FILE|DIR    start from a torchvision state dict in safetensors (or a Hugging Face
                        ResNet's weights); its depth must match --model
  --classes N           classifier outputs (default: the image folder's class count)
  --size PX             side of the square images the network sees (default 224; a resumed
                        run's own)
  --width N             channels of the stem, every layer scaled alike (default 64,
                        torchvision's; a smaller one makes a quick model for a CPU device)
  --validation X        fraction held out when IMAGE_DIR has no val/ or test/ (default 0.1; 0
                        turns validation off)
  --out DIR             output folder (default runs/<timestamp>)
  --epochs N            passes over the training images (default 10)
  --max-steps N         stop after N steps (default: all the epochs)
  --batch N             images a step (default 32; a resumed run's own); in a distributed run
                        the global batch, which the number of processes must divide
  --lr X                peak learning rate (default 1e-3; 1e-4 when fine-tuning)
  --optimizer NAME      adam, adamw or sgd (default adamw)
  --weight-decay X      (default 1e-4)
  --momentum X          SGD momentum (default 0.9)
  --schedule NAME       cosine, warmup or constant (default cosine)
  --warmup N            warmup updates (default: a tenth of the updates, at most 200)
  --clip X              global gradient-norm clipping, 0 = off (default 0)
  --accumulate N        apply the mean gradient of N batches as one update (default 1)
  --min-crop X          smallest area fraction of the random crop (default 0.08, torchvision's)
  --no-augment          train on the validation transform (resize and centre crop)
  --workers N           decoding threads (default: the CPU count, at most 8)
  --seed N              initialisation, split and shuffling seed (default 0)
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
  --distributed         data-parallel over the processes of an MPI launcher (implied when
                        mpirun started this one); rank 0 writes every file
  --bucket-mb X         distributed runs: gradients summed across the ranks in buckets of
                        about X MiB, each while backward computes the next (default 25)
)";

struct Splits {
  data::ImageFolder training;
  std::optional<data::ImageFolder> validation;
};

std::optional<fs::path> sub_folder(const fs::path& root, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    std::error_code error;
    if (fs::is_directory(root / name, error)) return root / name;
  }
  return std::nullopt;
}

// IMAGE_DIR/train with val/ or test/ beside it, or IMAGE_DIR split at random.
Splits read_splits(const fs::path& data_dir, double validation, uint64_t seed) {
  const std::optional<fs::path> train_dir = sub_folder(data_dir, {"train"});
  const std::optional<fs::path> val_dir = sub_folder(data_dir, {"val", "validation", "test"});
  if (train_dir && val_dir) {
    data::ImageFolder training(*train_dir);
    data::ImageFolder held_out(*val_dir);
    if (held_out.classes() != training.classes()) {
      throw Error("the class folders of " + val_dir->string() + " differ from those of " +
                  train_dir->string() + ": both need the same class sub-folders");
    }
    return {std::move(training), std::move(held_out)};
  }
  data::ImageFolder all(train_dir ? *train_dir : data_dir);
  if (validation <= 0) return {std::move(all), std::nullopt};
  if (all.size() < 2) {
    throw Error("image folder " + all.root().string() + " has " + std::to_string(all.size()) +
                " image; holding out a validation split needs two (or --validation 0)");
  }
  const int64_t held =
      std::clamp<int64_t>(std::llround(validation * all.size()), 1, all.size() - 1);
  // A fixed permutation, different from the epochs' orders.
  const std::vector<uint32_t> order = data::epoch_order(all.size(), seed ^ 0x5eed5eedull, 0);
  std::vector<int64_t> held_out(order.begin(), order.begin() + held);
  std::vector<int64_t> kept(order.begin() + held, order.end());
  std::sort(held_out.begin(), held_out.end());
  std::sort(kept.begin(), kept.end());
  return {all.subset(kept), all.subset(held_out)};
}

// The network to train: its configuration and, for fine-tuning, where its weights come from.
struct ModelChoice {
  models::ResNetConfig config;
  std::optional<io::ModelFolder> weights;
  std::string description;  // "resnet50", or the folder's name
};

ModelChoice choose_model(const std::string& model, const std::optional<std::string>& weights) {
  ModelChoice choice;
  std::error_code error;
  if (fs::is_directory(model, error)) {
    if (weights) throw Error("--weights goes with a resnetNN --model, not a model folder");
    choice.weights = io::ModelFolder::open(model);
    choice.config = models::resnet_config_from_hf(choice.weights->config());
    choice.description = fs::path(model).filename().string();
    return choice;
  }
  choice.config = models::resnet_config_from_name(model);
  choice.description = model;
  if (weights) {
    choice.weights = io::ModelFolder::open(*weights);
    const models::ResNetConfig found = runtime::resnet_config_of_weights(*choice.weights);
    if (found.depth != choice.config.depth) {
      throw Error(choice.weights->description() + " holds a ResNet-" + std::to_string(found.depth) +
                  ", not a " + model + ": pass --model resnet" + std::to_string(found.depth));
    }
    choice.config.width = found.width;
  }
  return choice;
}

int train_resnet(const Arguments& arguments, const DistributedRun& run,
                 const std::vector<std::string>& words);

}  // namespace

int image_train_command(const std::vector<std::string>& words) {
  const Arguments arguments = training_arguments(
      words,
      {"weights", "classes", "size", "validation", "min-crop", "workers", "width", "bucket-mb"},
      {"no-augment", "distributed"});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  const DistributedRun run(arguments);
  return run.run("train", [&] { return train_resnet(arguments, run, words); });
}

namespace {

int train_resnet(const Arguments& arguments, const DistributedRun& run,
                 const std::vector<std::string>& words) {
  arguments.expect_at_most_positional(0);
  const std::optional<std::string> data_path = arguments.value("data");
  if (!data_path) throw Error("--data IMAGE_DIR is required to train a ResNet");
  const int64_t epochs = arguments.integer("epochs", 10);
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 500);
  const int64_t log_every = arguments.integer("log-every", 10, 1, INT64_MAX);
  const double validation = arguments.real("validation", 0.1);
  const double min_crop = arguments.real("min-crop", 0.08);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  if (epochs <= 0 || checkpoint_every <= 0) {
    throw Error("--epochs and --checkpoint-every must be positive");
  }
  if (!(validation >= 0 && validation < 1)) throw Error("--validation must be in [0, 1)");
  if (!(min_crop > 0 && min_crop <= 1)) throw Error("--min-crop must be in (0, 1]");

  // Everything the run reads is checked before anything is written.
  const std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments);
  ModelChoice model;
  if (resumed) {
    model.config = models::ResNetConfig::from_json(resumed->model_config);
    model.description = "resnet" + std::to_string(model.config.depth);
    const std::string named = arguments.text("model", model.description);
    if (named != model.description && !std::filesystem::is_directory(named)) {
      throw Error("checkpoint " + arguments.text("resume", "") + " holds a " + model.description +
                  ", not a " + named + ": resume it with --model " + model.description);
    }
  } else {
    model = choose_model(arguments.text("model", ""), arguments.value("weights"));
    if (arguments.has("width")) {
      if (model.weights) throw Error("--width cannot change the width of pretrained weights");
      model.config.width = arguments.integer("width", 64);
    }
  }
  const int64_t batch =
      arguments.integer("batch", resumed ? resumed->extra.value("batch", int64_t{32}) : 32);
  if (batch <= 0) throw Error("--batch must be positive");
  const int64_t local_batch = run.local_batch(batch);
  const Splits splits = read_splits(*data_path, validation, seed);
  const std::vector<std::string>& class_names = splits.training.classes();
  const int64_t classes = arguments.integer(
      "classes", resumed ? model.config.num_classes : static_cast<int64_t>(class_names.size()));
  if (classes < static_cast<int64_t>(class_names.size())) {
    throw Error("--classes " + std::to_string(classes) + " is fewer than the " +
                std::to_string(class_names.size()) + " class folders of " + *data_path);
  }
  const int64_t size =
      arguments.integer("size", resumed ? resumed->extra.value("image_size", int64_t{224}) : 224);
  if (resumed) {
    const std::string path = arguments.text("resume", "");
    if (classes != model.config.num_classes || resumed->extra.value("image_size", 0) != size ||
        resumed->extra.value("classes", nlohmann::json()) != nlohmann::json(class_names)) {
      throw Error("checkpoint " + path + " was trained with other classes or --size (" +
                  resumed->extra.value("classes", nlohmann::json()).dump() +
                  "): resume it on the same image folder");
    }
  }
  model.config.num_classes = classes;

  data::ImageBatcherOptions batcher_options;
  batcher_options.batch_size = batch;
  batcher_options.seed = seed;
  batcher_options.workers = static_cast<int>(arguments.integer("workers", 0));
  batcher_options.transform = data::imagenet_train_transform(size);
  batcher_options.transform.min_area = min_crop;
  if (arguments.has("no-augment")) batcher_options.transform = data::imagenet_eval_transform(size);
  // Each rank decodes its own run of every batch of one order (the seed's).
  batcher_options.shard = data::Shard{run.rank(), run.size()};
  data::ImageFolderBatcher batcher(splits.training, batcher_options);
  const int64_t steps_per_epoch = batcher.batches_per_epoch();
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs, arguments.integer("max-steps", steps_per_epoch * epochs));
  if (total_steps <= 0) throw Error("--max-steps must be positive");
  OptimizerDefaults defaults;
  defaults.optimizer = "adamw";
  defaults.learning_rate = model.weights ? 1e-4 : 1e-3;
  defaults.weight_decay = 1e-4;
  defaults.schedule = "cosine";
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps, defaults);
  NonFiniteSteps non_finite(arguments, run.distributed());
  non_finite.configure(optimizer);
  if (!arguments.has("warmup"))
    optimizer.warmup_steps = std::min<int64_t>(200, optimizer.total_steps / 10);

  const fs::path out_dir = arguments.text("out", default_out_dir());
  if (run.writes()) {
    open_run(out_dir, arguments, words,
             {{"job", "resnet"},
              {"model", arguments.text("model", "")},
              {"data", arguments.text("data", "")},
              {"batch", batch},
              {"ranks", run.size()},
              {"resume", arguments.text("resume", "")}});
    require_writable_file(arguments, "trace");
    std::fprintf(
        stderr, "data: %lld training images, %s, %zu classes; %lld steps of %lld\n",
        static_cast<long long>(splits.training.size()),
        splits.validation ? (std::to_string(splits.validation->size()) + " validation images (" +
                             splits.validation->root().string() + ")")
                                .c_str()
                          : "no validation",
        class_names.size(), static_cast<long long>(total_steps), static_cast<long long>(batch));
  }

  SessionOptions options;
  options.shared_device = open_shared_device(run.device(arguments));
  options.seed = seed;
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.profile = arguments.has("trace");
  TrainingProgram training(models::build_resnet_loss(model.config, local_batch, size, size),
                           optimizer, run, options, non_finite);
  // Rank 0 alone evaluates, with its running statistics (the checkpoint's).
  std::unique_ptr<Session> inference;
  SessionOptions eval_options = options;
  eval_options.profile = false;
  if (splits.validation && run.writes()) {
    inference = std::make_unique<Session>(
        models::build_resnet(model.config, batch, size, size, false), eval_options);
  }
  run.announce_device(training.report().device);
  if (run.writes()) {
    print_precision(options.precision, training.report());
    std::fprintf(stderr, "built %s training program in %.2f s (%zu dispatches)%s%s\n",
                 model.description.c_str(), training.report().build_seconds,
                 training.report().dispatches, inference ? " and evaluation program" : "",
                 run.distributed() ? ", data-parallel over the ranks" : "");
  }

  int64_t step = 0;
  if (resumed) {
    training.load(*resumed, arguments.text("resume", ""));
    step = resumed->step;
    batcher.restore(data::BatcherState::from_json(resumed->extra.at("batcher")));
    if (run.writes()) {
      drop_metrics_after(out_dir / "metrics.jsonl", step);
      std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                   static_cast<long long>(step));
    }
  } else if (model.weights) {
    const runtime::ResNetWeightsReport report =
        runtime::load_resnet_weights(training.model(), *model.weights, model.config);
    if (run.writes())
      std::fprintf(stderr, "loaded %lld tensors from %s%s\n",
                   static_cast<long long>(report.tensors), model.weights->description().c_str(),
                   report.head_loaded
                       ? ""
                       : (": new head fc for " + std::to_string(classes) +
                          " classes (the weights have " + std::to_string(report.file_classes) + ")")
                             .c_str());
  }

  const fs::path checkpoint_path = out_dir / "checkpoint.safetensors";
  std::optional<io::JsonlWriter> metrics;
  if (run.writes()) metrics.emplace(out_dir / "metrics.jsonl");
  const auto save = [&] {
    if (!run.writes()) return;
    io::Checkpoint checkpoint;
    checkpoint.model_config = model.config.to_json();
    checkpoint.step = step;
    checkpoint.epoch = batcher.epoch();
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"batcher", batcher.state().to_json()},
                        {"batch", batch},
                        {"image_size", size},
                        {"classes", class_names},
                        {"data", splits.training.root().string()}};
    checkpoint.tensors = training.tensors();
    save_run_checkpoint(checkpoint_path, checkpoint);
  };

  install_stop_handlers();
  std::vector<float> images(static_cast<size_t>(local_batch * batcher.image_floats()));
  io::Series loss_series{"train loss", {}}, train_accuracy_series{"train accuracy", {}},
      validation_series{"validation accuracy", {}};
  ProgressLine progress;
  const StepPace pace(step);
  double smoothed_loss = NAN, smoothed_accuracy = NAN, last_validation = NAN;
  double images_per_second = 0;
  // This rank's labels of the step in flight and of the one queued behind it (StepLoop's slots).
  std::vector<int32_t> labels[2] = {std::vector<int32_t>(static_cast<size_t>(local_batch)),
                                    std::vector<int32_t>(static_cast<size_t>(local_batch))};
  StepLoop loop;
  // The batch is taken from the background threads and its inputs set while the step before it
  // runs.
  loop.start = [&](int64_t index, int slot) {
    batcher.next(images, labels[slot]);
    training.set_input(models::kResNetImagesInput, images);
    training.set_input(models::kResNetLabelsInput, labels[slot]);
    training.start(index);
  };
  loop.finish = [&] { training.finish(); };
  loop.ends_a_stretch = [&](int64_t steps_done) {
    return steps_done % steps_per_epoch == 0 || steps_done % checkpoint_every == 0 ||
           steps_done == total_steps;
  };
  loop.finished = [&](int64_t steps_done, int slot) {
    const double loss = training.loss();
    const bool dropped =
        non_finite.dropped(loss, training.dropped_flag(), steps_done, checkpoint_path, progress,
                           [&] { return training.find_anomaly(); });
    const std::vector<int64_t> predicted =
        predictions(training.output(models::kResNetLogitsOutput), local_batch, classes);
    int64_t correct = 0;
    for (int64_t i = 0; i < local_batch; ++i) correct += predicted[i] == labels[slot][i];
    const double accuracy = run.sum(static_cast<double>(correct)) / batch;
    // Every rank stops at the same step, whichever of them was asked to.
    const bool stopping = run.any(stop_requested);
    if (!dropped) {
      smoothed_loss = moving_average(smoothed_loss, loss, 0.05);
      smoothed_accuracy = moving_average(smoothed_accuracy, accuracy, 0.05);
    }
    const double steps_per_second = pace.steps_per_second(steps_done);
    images_per_second = steps_per_second * batch;
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const std::string text =
        step_line(epoch + 1, epochs, steps_done, total_steps, smoothed_loss,
                  accuracy_rate_text(smoothed_accuracy, images_per_second), steps_per_second);
    if (run.writes()) progress.update(text, steps_done == total_steps);
    if (run.writes() && (steps_done % log_every == 0 || steps_done == total_steps)) {
      loss_series.points.emplace_back(steps_done, smoothed_loss);
      train_accuracy_series.points.emplace_back(steps_done, smoothed_accuracy);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed_loss, optimizer, non_finite);
      record["batch_accuracy"] = accuracy;
      record["images_per_second"] = images_per_second;
      training.add_step_times(record);
      metrics->write(record);
    }
    if (inference && (steps_done % steps_per_epoch == 0 || steps_done == total_steps)) {
      load_tensors(*inference, io::Checkpoint{.tensors = training.tensors()}, "training", false);
      const Evaluation evaluation =
          evaluate_image_folder(*inference, *splits.validation, batch, size, classes);
      last_validation = evaluation.accuracy();
      validation_series.points.emplace_back(steps_done, last_validation);
      metrics->write(
          {{"step", steps_done}, {"epoch", epoch + 1}, {"validation_accuracy", last_validation}});
      progress.finish();
      std::fprintf(stderr, "epoch %lld: validation accuracy %.2f%%\n",
                   static_cast<long long>(epoch + 1), 100 * last_validation);
    }
    if (loop.ends_a_stretch(steps_done)) save();
    return stopping;
  };
  const bool stopping =
      run_steps(step, total_steps, training.queues_steps(), run.any(stop_requested), loop);
  save();
  if (!run.writes()) return stopping ? 130 : 0;
  progress.finish();
  if (pace.ran_steps(step))
    report_training_roofline(out_dir, training.traced(), options, pace.seconds_per_step(step));
  if (stopping) std::fprintf(stderr, "stopped at step %lld\n", static_cast<long long>(step));
  if (arguments.has("trace")) training.traced().write_trace(arguments.text("trace", ""));

  io::Chart chart;
  chart.title =
      "meganeura train: " + model.description + " on " + fs::path(*data_path).filename().string();
  chart.panels.push_back({"loss", "step", "cross-entropy", {loss_series}});
  chart.panels.push_back(
      {"accuracy", "step", "accuracy", {train_accuracy_series, validation_series}});
  io::write_chart_png(out_dir / "training.png", chart);
  std::printf("checkpoint: %s\nmetrics: %s\nplot: %s\n", checkpoint_path.c_str(),
              (out_dir / "metrics.jsonl").c_str(), (out_dir / "training.png").c_str());
  std::printf("training: %.1f images/s\n", images_per_second);
  if (!std::isnan(last_validation))
    std::printf("validation accuracy: %.2f%%\n", 100 * last_validation);
  return stopping ? 130 : 0;
}

}  // namespace
}  // namespace mg::cli
