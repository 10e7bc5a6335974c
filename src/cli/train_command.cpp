#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "backends/vulkan/runtime/gpu.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/distributed_run.hpp"
#include "cli/non_finite_steps.hpp"
#include "cli/roofline_report.hpp"
#include "cli/run_record.hpp"
#include "cli/training_program.hpp"
#include "cli/training_run.hpp"
#include "cli/training_support.hpp"
#include "data/batcher.hpp"
#include "io/json_limits.hpp"
#include "io/jsonl.hpp"
#include "io/plot.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura train [options]
       meganeura train --model MODEL_DIR --data FILE [options]

The second form trains or fine-tunes a model folder, the job chosen by its config.json: a
Llama-family language model on text, Whisper on speech, a SmolVLA policy on robot episodes, a
diffusers UNet2DConditionModel on Fashion-MNIST: see 'meganeura train --model MODEL_DIR --help'.
'meganeura train --model resnet50 --data IMAGE_DIR' trains a ResNet on an image folder (or
fine-tunes a Hugging Face ResNet folder): see 'meganeura train --model resnet50 --help'. The
first trains a classifier on Fashion-MNIST on the GPU, evaluates it on the test set after each
epoch, and writes into --out: checkpoint.safetensors (every
--checkpoint-every steps, each epoch and at the end), metrics.jsonl (one JSON object per logged
step and per epoch) and training.png (loss and accuracy curves). Ctrl-C stops after the current
step and saves a checkpoint. Under mpirun (or with --distributed) each process trains on its
share of every batch and the gradients are averaged across them: docs/DISTRIBUTED.md.

  --out DIR             output folder (default runs/<timestamp>)
  --model cnn|mlp       architecture (default cnn); a folder path selects the second form,
                        resnet18 ... resnet152 the ResNet job
  --epochs N            passes over the training set (default 3 on a GPU; 1 on a CPU device)
  --limit N             use only the first N training images (default: all on a GPU; 36000 on
                        a CPU device such as Lavapipe, where the default run takes about
                        2.5 minutes on two cores and reaches about 85-86 % test accuracy)
  --batch N             batch size (default 64); in a distributed run the global batch,
                        which the number of processes must divide
  --lr X                learning rate (default 0.002)
  --optimizer NAME      adam, adamw or sgd (default adam)
  --weight-decay X      (default 0)
  --momentum X          SGD momentum (default 0.9)
  --schedule NAME       constant, warmup or cosine (default constant)
  --warmup N            warmup steps for warmup and cosine (default 0)
  --clip X              global gradient-norm clipping, 0 = off (default 0)
  --accumulate N        gradient accumulation: apply the mean gradient of N batches as one
                        update (effective batch N x --batch; default 1). Steps below still
                        count batches; --warmup and the schedule count updates
  --seed N              initialisation and shuffling seed (default 0)
  --device SEL          device index or part of its name (default: best available)
  --precision P         strict (f32 everywhere, the default), fast (f16 operands on
                        cooperative matrices / tensor cores with f32 accumulation, for the
                        matrix products, convolutions and attention; devices without them
                        run strict) or bf16 (bfloat16 operands there: f32's range, so no
                        loss scaling; devices without bfloat16 matrices run strict)
  --data DIR            Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)
  --resume CKPT         continue from a checkpoint written by this command (the metrics
                        logged after its step are dropped, as the run logs them again)
  --overwrite           replace the run already in --out (without it, and without --resume,
                        a folder holding a checkpoint or metrics is refused)
  --checkpoint-every N  steps between checkpoints (default 500)
  --max-steps N         stop after N steps (default: all the epochs)
  --log-every N         steps between metrics.jsonl records (default 10)
  --trace FILE          write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                        the last step
  --distributed         data-parallel over the processes of an MPI launcher (implied when
                        mpirun started this one); rank 0 writes every file
  --bucket-mb X         distributed runs: gradients summed across the ranks in buckets of
                        about X MiB, each while backward computes the next (default 25)
)";

int train_classifier(const Arguments& arguments, const DistributedRun& run,
                     const std::vector<std::string>& words);

// Restores the batcher from a checkpoint's "extra" field, after checking that it agrees with the
// checkpoint's step and fits this run.
void resume_batcher(data::Batcher& batcher, const io::Checkpoint& checkpoint,
                    const std::string& path, int64_t total_steps) {
  if (checkpoint.step > total_steps) {
    throw Error("checkpoint " + path + " is at step " + std::to_string(checkpoint.step) +
                ", past the " + std::to_string(total_steps) +
                " steps of this run: raise --epochs to train further");
  }
  if (!checkpoint.extra.is_object() || !checkpoint.extra.contains("batcher")) {
    throw Error("checkpoint " + path +
                " has no batcher state in its \"extra\" field; resume from a checkpoint that "
                "'meganeura train' wrote for a classifier");
  }
  batcher.restore(data::BatcherState::from_json(checkpoint.extra["batcher"]));
  const data::BatcherState state = batcher.state();
  const int64_t steps_per_epoch = batcher.batches_per_epoch();
  const int64_t batches_done = (state.position + state.batch_size - 1) / state.batch_size;
  if (state.epoch > INT64_MAX / steps_per_epoch - 1 ||
      state.epoch * steps_per_epoch + batches_done != checkpoint.step) {
    throw Error("checkpoint " + path + " is inconsistent: it is at step " +
                std::to_string(checkpoint.step) + " but its batcher is at epoch " +
                std::to_string(state.epoch) + ", example " + std::to_string(state.position));
  }
}

}  // namespace

// The value of --model, where given.
std::optional<std::string> model_option(const std::vector<std::string>& words) {
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "--model" && i + 1 < words.size()) return words[i + 1];
    if (words[i].starts_with("--model=")) return words[i].substr(8);
  }
  return std::nullopt;
}

// What a model folder holds, from its config.json: transformers' "model_type", diffusers'
// "_class_name" or LeRobot's "type"; as {key, value}.
std::pair<std::string, std::string> model_folder_kind(const std::filesystem::path& folder) {
  const std::filesystem::path config_path = folder / "config.json";
  std::ifstream file(config_path);
  if (!std::filesystem::is_directory(folder) || !file) {
    throw Error("no model folder at " + folder.string() +
                " (--model takes a folder with a config.json, or a built-in model: cnn, mlp, "
                "resnet18, resnet34, resnet50, resnet101, resnet152)");
  }
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const nlohmann::json config = io::parse_json(text, config_path.string());
  if (!config.is_object()) throw Error(config_path.string() + " is not a JSON object");
  for (const char* key : {"model_type", "_class_name", "type"}) {
    if (config.contains(key) && config[key].is_string())
      return {key, config[key].get<std::string>()};
  }
  throw Error(config_path.string() +
              " names no model_type, _class_name or type: it is not a model folder that "
              "meganeura train knows");
}

int train_job(const std::vector<std::string>& words) {
  if (const std::optional<std::string> model = model_option(words);
      model && model->starts_with("resnet") && !std::filesystem::is_directory(*model)) {
    return image_train_command(words);
  }
  if (const std::optional<std::string> model = model_option(words);
      model && (std::filesystem::is_directory(*model) || model->find('/') != std::string::npos)) {
    // Each kind of model folder has its own training job.
    const std::map<std::string, int (*)(const std::vector<std::string>&)> jobs = {
        {"llama", lm_train_command},
        {"resnet", image_train_command},
        {"whisper", whisper_train_command},
        {"smolvla", smolvla_train_command},
        {"UNet2DConditionModel", unet_train_command}};
    const auto [key, kind] = model_folder_kind(*model);
    if (const auto job = jobs.find(kind); job != jobs.end()) return job->second(words);
    std::string known;
    for (const auto& [name, job] : jobs) known += (known.empty() ? "" : ", ") + name;
    throw Error(*model + "/config.json has " + key + " \"" + io::shortened(kind) +
                "\", which meganeura train cannot train (it trains: " + known + ")");
  }
  const Arguments arguments = training_arguments(words, {"limit", "bucket-mb"}, {"distributed"});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  const DistributedRun run(arguments);
  return run.run("train", [&] { return train_classifier(arguments, run, words); });
}

namespace {

int train_classifier(const Arguments& arguments, const DistributedRun& run,
                     const std::vector<std::string>& words) {
  arguments.expect_at_most_positional(0);
  const std::string device = run.device(arguments);
  // Every number is checked before anything is created, loaded or built.
  optimizer_from(arguments, 1);
  NonFiniteSteps non_finite(arguments, run.distributed());
  const bool defaults_depend_on_device = !arguments.has("epochs") || !arguments.has("limit");
  const bool cpu_device = defaults_depend_on_device && running_on_cpu_device(device);
  const std::filesystem::path out_dir = arguments.text("out", default_out_dir());
  const std::filesystem::path data_dir =
      arguments.text("data", std::string(data::kFashionMnistDir));
  const int64_t batch = arguments.integer("batch", 64, 1, 1 << 20);
  const int64_t epochs = arguments.integer("epochs", cpu_device ? 1 : 3, 1, 1'000'000);
  const int64_t limit = arguments.has("limit") ? arguments.integer("limit", 0, 1, INT32_MAX)
                                               : (cpu_device ? 36000 : -1);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0, 0, INT64_MAX));
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 500, 1, INT64_MAX);
  const int64_t log_every = arguments.integer("log-every", 10, 1, INT64_MAX);

  if (run.writes()) {
    prepare_out_dir(out_dir);
    claim_out_dir(out_dir, arguments);
    require_writable_file(arguments, "trace");
  }

  models::ClassifierConfig model;
  model.architecture = arguments.text("model", "cnn");
  model = models::ClassifierConfig::from_json(model.to_json());
  if (run.writes())
    start_run_record(out_dir, words,
                     {{"job", "classifier"},
                      {"model", model.to_json()},
                      {"batch", batch},
                      {"epochs", epochs},
                      {"limit", limit},
                      {"seed", seed},
                      {"checkpoint_every", checkpoint_every},
                      {"data", data_dir.string()},
                      {"resume", arguments.text("resume", "")}},
                     device);

  const std::optional<io::Checkpoint> resumed = arguments.has("model")
                                                    ? resumed_checkpoint(arguments, model.to_json())
                                                    : resumed_checkpoint(arguments);
  if (resumed) model = models::ClassifierConfig::from_json(resumed->model_config);

  const data::Dataset train_set = with_kind(
      Error::Kind::data, [&] { return data::load_fashion_mnist(data_dir, "train", limit); });
  const data::Dataset test_set =
      with_kind(Error::Kind::data, [&] { return data::load_fashion_mnist(data_dir, "test"); });
  if (train_set.count < batch) {
    throw Error("--batch " + std::to_string(batch) + " is larger than the " +
                std::to_string(train_set.count) + " training images");
  }
  data::Batcher batcher(train_set, batch, seed, true, true, data::Shard{run.rank(), run.size()});
  const int64_t steps_per_epoch = batcher.batches_per_epoch();
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs,
               arguments.integer("max-steps", steps_per_epoch * epochs, 1, INT64_MAX));
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps);
  non_finite.configure(optimizer);
  if (resumed) {
    with_kind(Error::Kind::checkpoint, [&] {
      resume_batcher(batcher, *resumed, arguments.text("resume", ""), total_steps);
    });
  }

  SessionOptions session_options;
  // One device for the training and the evaluation program.
  session_options.shared_device = open_shared_device(device);
  session_options.seed = seed;
  session_options.precision = parse_precision(arguments.text("precision", "strict"));
  session_options.profile = arguments.has("trace");
  TrainingProgram training(models::build_classifier_loss(model, run.local_batch(batch)), optimizer,
                           run, session_options, non_finite);
  // Rank 0 alone evaluates (the parameters are the same on every rank).
  const int64_t eval_batch = 500;
  std::unique_ptr<Session> inference;
  if (run.writes()) {
    SessionOptions eval_options = session_options;
    eval_options.profile = false;
    inference =
        std::make_unique<Session>(models::build_classifier(model, eval_batch), eval_options);
  }
  run.announce_device(training.report().device);
  if (run.writes()) {
    print_precision(session_options.precision, training.report());
    std::fprintf(stderr, "built training program in %.2f s (%zu dispatches, %u pipelines)%s\n",
                 training.report().build_seconds, training.report().dispatches,
                 training.report().pipelines,
                 run.distributed() ? ", data-parallel over the ranks" : "");
  }

  int64_t step = 0;
  const std::filesystem::path checkpoint_path = out_dir / "checkpoint.safetensors";
  if (resumed) {
    load_tensors(training.state(), *resumed, arguments.text("resume", ""), true);
    step = resumed->step;
    if (run.writes()) {
      drop_metrics_after(out_dir / "metrics.jsonl", step);
      std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                   static_cast<long long>(step));
    }
  }

  std::optional<io::JsonlWriter> metrics;
  if (run.writes()) metrics.emplace(out_dir / "metrics.jsonl");
  auto save = [&] {
    if (!run.writes()) return;
    io::Checkpoint checkpoint;
    checkpoint.model_config = model.to_json();
    checkpoint.step = step;
    checkpoint.epoch = step / steps_per_epoch;  // epochs completed
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"batcher", batcher.state().to_json()}, {"batch", batch}};
    checkpoint.tensors = session_tensors(training.state());
    save_run_checkpoint(checkpoint_path, checkpoint);
  };

  install_stop_handlers();
  const int64_t rows = batcher.shard_size();  // this process's examples a step
  std::vector<float> images(static_cast<size_t>(rows * train_set.image_size()));
  io::Series loss_series{"train loss", {}}, train_accuracy_series{"train accuracy", {}},
      test_accuracy_series{"test accuracy", {}};
  ProgressLine progress;
  const StepPace pace(step);
  double smoothed_loss = NAN, smoothed_accuracy = NAN;
  double last_test_accuracy = NAN;
  // The labels of the step in flight and of the one queued behind it (StepLoop's slots).
  std::vector<int32_t> labels[2] = {std::vector<int32_t>(static_cast<size_t>(rows)),
                                    std::vector<int32_t>(static_cast<size_t>(rows))};
  StepLoop loop;
  loop.start = [&](int64_t index, int slot) {
    batcher.next(images, labels[slot]);
    training.set_input(models::kImagesInput, images);
    training.set_input(models::kLabelsInput, labels[slot]);
    training.start(index);
  };
  loop.finish = [&] { training.finish(); };
  loop.ends_a_stretch = [&](int64_t steps_done) {
    return steps_done % steps_per_epoch == 0 || steps_done % checkpoint_every == 0;
  };
  loop.finished = [&](int64_t steps_done, int slot) {
    const double loss = training.loss();
    const bool dropped =
        non_finite.dropped(loss, training.dropped_flag(), steps_done, checkpoint_path, progress,
                           [&] { return training.find_anomaly(); });
    const std::vector<int64_t> predicted =
        predictions(training.output("logits"), rows, model.classes);
    int64_t correct = 0;
    for (int64_t i = 0; i < rows; ++i) correct += predicted[i] == labels[slot][i];
    const double accuracy = run.sum(static_cast<double>(correct)) / batch;
    // Every rank stops at the same step, whichever of them was asked to.
    const bool stopping = run.any(stop_requested);
    if (!dropped) {
      smoothed_loss = moving_average(smoothed_loss, loss, 0.05);
      smoothed_accuracy = moving_average(smoothed_accuracy, accuracy, 0.05);
    }

    const double steps_per_second = pace.steps_per_second(steps_done);
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const std::string text = step_line(
        epoch + 1, epochs, steps_done, total_steps, smoothed_loss,
        accuracy_rate_text(smoothed_accuracy, steps_per_second * batch), steps_per_second);
    if (run.writes()) progress.update(text, steps_done == total_steps);
    if (run.writes() && (steps_done % log_every == 0 || steps_done == total_steps)) {
      loss_series.points.emplace_back(steps_done, smoothed_loss);
      train_accuracy_series.points.emplace_back(steps_done, smoothed_accuracy);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed_loss, optimizer, non_finite);
      record["batch_accuracy"] = accuracy;
      record["images_per_second"] = steps_per_second * batch;
      training.add_step_times(record);
      metrics->write(record);
    }
    const bool epoch_end = steps_done % steps_per_epoch == 0;
    if (epoch_end && run.writes()) {
      load_tensors(*inference, io::Checkpoint{.tensors = session_tensors(training.state())},
                   "training", false);
      const Evaluation evaluation = evaluate(*inference, test_set, eval_batch, model.classes);
      last_test_accuracy = evaluation.accuracy();
      test_accuracy_series.points.emplace_back(steps_done, last_test_accuracy);
      metrics->write(
          {{"step", steps_done}, {"epoch", epoch + 1}, {"test_accuracy", last_test_accuracy}});
      progress.finish();
      std::fprintf(stderr, "epoch %lld: test accuracy %.2f%%\n", static_cast<long long>(epoch + 1),
                   100 * last_test_accuracy);
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
    report_training_roofline(out_dir, training.traced(), session_options,
                             pace.seconds_per_step(step));
  if (stopping) std::fprintf(stderr, "stopped at step %lld\n", static_cast<long long>(step));
  if (arguments.has("trace")) training.traced().write_trace(arguments.text("trace", ""));

  io::Chart chart;
  chart.title = "meganeura train: " + model.architecture + " on Fashion-MNIST";
  chart.panels.push_back({"loss", "step", "cross-entropy", {loss_series}});
  chart.panels.push_back(
      {"accuracy", "step", "accuracy", {train_accuracy_series, test_accuracy_series}});
  io::write_chart_png(out_dir / "training.png", chart);
  std::printf("checkpoint: %s\n", checkpoint_path.c_str());
  std::printf("metrics: %s\nplot: %s\n", (out_dir / "metrics.jsonl").c_str(),
              (out_dir / "training.png").c_str());
  if (!std::isnan(last_test_accuracy))
    std::printf("test accuracy: %.2f%%\n", 100 * last_test_accuracy);
  return stopping ? 130 : 0;
}

}  // namespace

int train_command(const std::vector<std::string>& words) {
  try {
    const int code = train_job(words);
    throw_if_stopped_for_non_finite();
    current_run().finish(code == 130 ? RunStatus::interrupted : RunStatus::completed, "");
    return code;
  } catch (const Error& error) {
    // A fault of the device mid-run: say what of the run is kept.
    const std::string kept = current_run().checkpoint_text();
    if ((error.kind() == Error::Kind::device_lost || error.kind() == Error::Kind::out_of_memory) &&
        !kept.empty()) {
      const Error with_checkpoint(std::string(error.what()) + "; " + kept, error.kind());
      current_run().finish(status_of(error.kind()), with_checkpoint.what());
      throw with_checkpoint;
    }
    current_run().finish(status_of(error.kind()), error.what());
    throw;
  } catch (const std::exception& error) {
    current_run().finish(RunStatus::failed, error.what());
    throw;
  }
}

}  // namespace mg::cli
