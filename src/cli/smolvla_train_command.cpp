// `meganeura train --model SMOLVLA_DIR --data DIR`: trains a SmolVLA policy folder by flow
// matching on recorded demonstrations (data/robot_episodes.hpp), and measures the action error
// of sampled chunks on held-out episodes before, during and after training.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

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
#include "data/robot_episodes.hpp"
#include "io/checkpoint.hpp"
#include "io/jsonl.hpp"
#include "io/plot.hpp"
#include "runtime/smolvla_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura train --model SMOLVLA_DIR --data DIR [options]

Trains a SmolVLA policy folder (LeRobot's config.json with "type": "smolvla", model.safetensors,
and the SmolVLM backbone's config.json and tokenizer.json in SMOLVLA_DIR/vlm; a folder without
model.safetensors starts from random weights) by flow matching: each step draws noise and a
flow time t ~ Beta(1.5, 1) * 0.999 + 0.001, mixes x_t = t noise + (1 - t) actions, and fits the
expert's velocity to noise - actions (mean squared error). The backbone stays frozen unless the
config's train_expert_only is false or --train-backbone is given (the vision encoder then
follows freeze_vision_encoder). Held-out episodes are acted on with the one-program sampler
before training, at every checkpoint and at the end: "action error" is the mean absolute
difference between the sampled and the recorded chunks.

Writes into --out: checkpoint.safetensors (weights and optimizer state, every
--checkpoint-every steps and at the end), metrics.jsonl, training.png (loss and held-out action
error) and model/, a policy folder 'meganeura act' and this command open. Ctrl-C stops after
the current step and saves.

The data: DIR/episodes.jsonl, one record a line (docs/SMOLVLA.md):
  {"episode": 0, "images": ["frames/0.png"], "state": [...], "instruction": "...",
   "actions": [[...], ...]}   (chunk_size rows of the action's width)

  --model DIR           the policy folder (required)
  --data DIR            the demonstrations (required)
  --out DIR             output folder (default runs/<timestamp>)
  --batch N             records a step (default 8)
  --epochs N            passes over the training records (default 1)
  --max-steps N         stop after N steps (default: all the epochs)
  --validation X        fraction of the episodes held out (default 0.1; 0 turns it off)
  --train-backbone      train the VLM too (default: the config's train_expert_only)
  --steps N             Euler steps when sampling held-out chunks (default: num_steps)
  --lr X                peak learning rate (default 1e-4, LeRobot's)
  --optimizer NAME      adamw, adam or sgd (default adamw, betas 0.9 and 0.95)
  --momentum X          SGD momentum (default 0.9)
  --weight-decay X      (default 1e-10)
  --schedule NAME       cosine, warmup or constant (default cosine)
  --warmup N            warmup steps (default: a tenth of the updates, at most 1000)
  --clip X              global gradient-norm clipping, 0 = off (default 10)
  --accumulate N        apply the mean gradient of N batches as one update (default 1)
  --seed N              shuffling, noise and time seed (default 0)
  --device SEL          device index or part of its name (default: best available)
  --precision P         strict (default), fast (f16 operands on cooperative matrices)
                        or bf16 (bfloat16 operands there)
  --resume CKPT         continue from a checkpoint written by this command
  --overwrite           replace the run already in --out (without it, and without --resume,
                        a folder holding a checkpoint or metrics is refused)
  --checkpoint-every N  steps between checkpoints (default 200)
  --log-every N         steps between metrics.jsonl records (default 1)
  --trace FILE          write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                        the last step
)";

// A record ready for the graphs: preprocessed pixels, padded state and actions, token ids.
struct Example {
  int64_t episode = 0;
  std::vector<float> pixels;
  std::vector<float> state;
  std::vector<int32_t> ids;
  std::vector<float> actions;      // normalised, padded [chunk, max_action_dim]
  std::vector<float> raw_actions;  // [chunk, action_dim] as recorded
};

std::vector<Example> prepare_examples(const std::vector<data::RobotRecord>& records,
                                      const models::SmolVLAFolder& folder,
                                      const std::string& data_path) {
  const models::SmolVLAConfig& config = folder.config;
  std::vector<Example> examples;
  for (size_t r = 0; r < records.size(); ++r) {
    const data::RobotRecord& record = records[r];
    const std::string where = data_path + "/episodes.jsonl record " + std::to_string(r + 1);
    if (static_cast<int64_t>(record.images.size()) != config.cameras())
      throw Error(where + " has " + std::to_string(record.images.size()) +
                  " images; the policy has " + std::to_string(config.cameras()) + " cameras");
    if (record.action_rows != config.chunk_size || record.action_width != config.action_dim)
      throw Error(where + " has " + std::to_string(record.action_rows) + " actions of width " +
                  std::to_string(record.action_width) + "; the policy takes chunks of " +
                  std::to_string(config.chunk_size) + " x " + std::to_string(config.action_dim));
    Example example;
    example.episode = record.episode;
    for (size_t c = 0; c < record.images.size(); ++c) {
      const std::vector<float> image = models::smolvla_image(
          record.images[c], config, where + " image " + std::to_string(c + 1));
      example.pixels.insert(example.pixels.end(), image.begin(), image.end());
    }
    example.state = models::smolvla_state(folder, record.state);
    example.ids = models::smolvla_instruction_ids(folder.tokenizer, record.instruction);
    example.actions = models::smolvla_normalise_actions(folder, record.actions);
    example.raw_actions = record.actions;
    examples.push_back(std::move(example));
  }
  return examples;
}

// LeRobot normalises state and actions with the data set's statistics; a folder without them
// (a new policy) takes them from the data, and its output folder keeps them.
models::FeatureStats feature_stats(const std::vector<data::RobotRecord>& records, bool actions,
                                   int64_t width) {
  std::vector<double> sum(width, 0.0), squares(width, 0.0);
  int64_t count = 0;
  for (const data::RobotRecord& record : records) {
    const std::vector<float>& values = actions ? record.actions : record.state;
    if (values.size() % width != 0) continue;
    for (size_t i = 0; i < values.size(); ++i) {
      sum[i % width] += values[i];
      squares[i % width] += static_cast<double>(values[i]) * values[i];
    }
    count += static_cast<int64_t>(values.size()) / width;
  }
  models::FeatureStats stats;
  for (int64_t i = 0; i < width; ++i) {
    const double mean = sum[i] / static_cast<double>(count);
    const double variance = std::max(0.0, squares[i] / static_cast<double>(count) - mean * mean);
    stats.mean.push_back(static_cast<float>(mean));
    // A constant feature keeps unit scale rather than dividing by zero.
    stats.std.push_back(variance > 1e-12 ? static_cast<float>(std::sqrt(variance)) : 1.0f);
  }
  return stats;
}

void add_missing_stats(models::SmolVLAFolder& folder,
                       const std::vector<data::RobotRecord>& records) {
  if (folder.state_stats.empty())
    folder.state_stats = feature_stats(records, false, folder.config.state_dim);
  if (folder.action_stats.empty())
    folder.action_stats = feature_stats(records, true, folder.config.action_dim);
}

// The inputs of a batch of examples (rows past `chosen` repeat the first, for the last batch).
struct Batch {
  std::vector<float> pixels, state, actions;
  std::vector<int32_t> ids;
  models::SmolVLAMasks masks;
};

Batch make_batch(const std::vector<Example>& examples, const std::vector<size_t>& chosen,
                 int64_t batch, int64_t language, const models::SmolVLAConfig& config) {
  Batch out;
  std::vector<bool> valid;
  for (int64_t r = 0; r < batch; ++r) {
    const Example& example = examples[chosen[std::min<size_t>(r, chosen.size() - 1)]];
    out.pixels.insert(out.pixels.end(), example.pixels.begin(), example.pixels.end());
    out.state.insert(out.state.end(), example.state.begin(), example.state.end());
    out.actions.insert(out.actions.end(), example.actions.begin(), example.actions.end());
    for (int64_t t = 0; t < language; ++t) {
      const bool present = t < static_cast<int64_t>(example.ids.size());
      out.ids.push_back(present ? example.ids[t] : 0);
      valid.push_back(present);
    }
  }
  out.masks = models::smolvla_masks(config, batch, language, valid);
  return out;
}

void set_common_inputs(RecordedInputs& inputs, const Batch& batch) {
  inputs.set(models::kPixelValues, batch.pixels);
  inputs.set(models::kLanguageIds, batch.ids);
  inputs.set(models::kState, batch.state);
  inputs.set(models::kAttentionMask, batch.masks.attention_mask);
  inputs.set(models::kPositionIds, batch.masks.position_ids);
}

}  // namespace

int smolvla_train_command(const std::vector<std::string>& words) {
  const Arguments arguments =
      training_arguments(words, {"validation", "steps"}, {"train-backbone"});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  refuse_mpi_launcher("SmolVLA");
  arguments.expect_at_most_positional(0);
  const std::optional<std::string> data_path = arguments.value("data");
  if (!data_path) throw Error("--data DIR is required to train a SmolVLA policy");
  const int64_t batch = arguments.integer("batch", 8);
  const int64_t epochs = arguments.integer("epochs", 1);
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 200);
  const int64_t log_every = arguments.integer("log-every", 1, 1, INT64_MAX);
  const double validation = arguments.real("validation", 0.1);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  if (batch <= 0 || epochs <= 0 || checkpoint_every <= 0)
    throw Error("--batch, --epochs and --checkpoint-every must be positive");
  if (!(validation >= 0 && validation < 1)) throw Error("--validation must be in [0, 1)");

  models::SmolVLAFolder folder = models::open_smolvla_folder(arguments.text("model", ""), true);
  const models::SmolVLAConfig& config = folder.config;
  const int64_t flow_steps = arguments.integer("steps", config.num_steps);
  const std::vector<data::RobotRecord> records = data::read_robot_episodes(*data_path);
  add_missing_stats(folder, records);
  const std::vector<Example> examples = prepare_examples(records, folder, *data_path);
  std::set<int64_t> episodes;
  for (const Example& example : examples) episodes.insert(example.episode);
  const int64_t held_episodes =
      validation > 0 && episodes.size() > 1
          ? std::clamp<int64_t>(std::llround(validation * static_cast<double>(episodes.size())), 1,
                                static_cast<int64_t>(episodes.size()) - 1)
          : 0;
  // The episodes with the highest numbers are held out.
  const int64_t first_held = held_episodes > 0 ? *std::next(episodes.end(), -held_episodes)
                                               : std::numeric_limits<int64_t>::max();
  std::vector<size_t> training_records, held_records;
  int64_t language = 1;
  for (size_t i = 0; i < examples.size(); ++i) {
    (examples[i].episode >= first_held ? held_records : training_records).push_back(i);
    language = std::max<int64_t>(language, static_cast<int64_t>(examples[i].ids.size()));
  }
  if (static_cast<int64_t>(training_records.size()) < batch)
    throw Error(*data_path + " has " + std::to_string(training_records.size()) +
                " training records: fewer than one --batch of " + std::to_string(batch));
  const int64_t steps_per_epoch = static_cast<int64_t>(training_records.size()) / batch;
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs, arguments.integer("max-steps", steps_per_epoch * epochs));
  if (total_steps <= 0) throw Error("--max-steps must be positive");
  OptimizerDefaults defaults;
  defaults.optimizer = "adamw";
  defaults.learning_rate = 1e-4;
  defaults.weight_decay = 1e-10;
  defaults.schedule = "cosine";
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps, defaults);
  NonFiniteSteps non_finite(arguments);
  non_finite.configure(optimizer);
  optimizer.beta2 = 0.95;
  if (!arguments.has("warmup"))
    optimizer.warmup_steps = std::min<int64_t>(1000, optimizer.total_steps / 10);
  if (!arguments.has("clip")) optimizer.clip_norm = 10.0;
  const bool train_backbone = arguments.has("train-backbone") || !config.train_expert_only;
  const nlohmann::json model_json = {{"kind", "smolvla"},
                                     {"config", nlohmann::json::parse(folder.policy_config.dump())},
                                     {"train_backbone", train_backbone}};
  const std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments, model_json);

  const std::filesystem::path out_dir = arguments.text("out", default_out_dir());
  open_run(out_dir, arguments, words,
           {{"job", "smolvla"},
            {"model", arguments.text("model", "")},
            {"data", arguments.text("data", "")},
            {"resume", arguments.text("resume", "")}});
  require_writable_file(arguments, "trace");
  std::fprintf(stderr,
               "data: %zu records of %zu episodes: %zu training, %zu held out (%lld episodes); "
               "language padded to %lld tokens\n",
               examples.size(), episodes.size(), training_records.size(), held_records.size(),
               static_cast<long long>(held_episodes), static_cast<long long>(language));
  if (!folder.weights) std::fprintf(stderr, "no model.safetensors: starting from random weights\n");

  SessionOptions options;
  options.shared_device = open_shared_device(arguments.text("device", ""));
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.seed = seed;
  // The folder's weights are written right after each build: drawing them first would cost time
  // in proportion to the model.
  options.initialise_parameters = !folder.weights.has_value();
  models::SmolVLALossOptions loss_options;
  loss_options.train_backbone = train_backbone;
  int64_t step = 0;
  const std::filesystem::path checkpoint_path = out_dir / "checkpoint.safetensors";
  io::JsonlWriter metrics(out_dir / "metrics.jsonl");
  std::unique_ptr<Session> sampler;
  std::unique_ptr<RecordedInputs> sampler_inputs;
  if (!held_records.empty()) {
    sampler = std::make_unique<Session>(
        models::smolvla_chunk_graph(config, batch, language, flow_steps), options);
    sampler_inputs = std::make_unique<RecordedInputs>(*sampler);
    models::load_smolvla_weights(*sampler, folder);
  }
  // Weights from one program into another, for the names both hold.
  const auto copy_weights = [](const Session& from, Session& to) {
    const std::vector<std::string> names = from.persistent_names();
    const std::set<std::string> held(names.begin(), names.end());
    for (const std::string& name : to.persistent_names())
      if (held.count(name)) to.write(name, from.read(name));
  };
  // Mean absolute error of sampled chunks on the held-out records, in the robot's units.
  const auto action_error = [&]() {
    std::mt19937_64 noise_random(seed + 1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    double total = 0;
    int64_t counted = 0;
    for (size_t first = 0; first < held_records.size(); first += batch) {
      const std::vector<size_t> chosen(
          held_records.begin() + first,
          held_records.begin() + std::min(held_records.size(), first + batch));
      const Batch inputs = make_batch(examples, chosen, batch, language, config);
      std::vector<float> noise(batch * config.chunk_size * config.max_action_dim);
      for (float& value : noise) value = normal(noise_random);
      set_common_inputs(*sampler_inputs, inputs);
      sampler_inputs->set(models::kNoise, noise);
      sampler->run();
      const std::vector<float> chunks = sampler->output(models::kActionChunk);
      const size_t per_chunk = config.chunk_size * config.max_action_dim;
      for (size_t r = 0; r < chosen.size(); ++r) {
        const std::vector<float> predicted = models::smolvla_unnormalise_actions(
            folder, std::vector<float>(chunks.begin() + r * per_chunk,
                                       chunks.begin() + (r + 1) * per_chunk));
        const std::vector<float>& recorded = examples[chosen[r]].raw_actions;
        for (size_t i = 0; i < recorded.size(); ++i) total += std::abs(predicted[i] - recorded[i]);
        counted += static_cast<int64_t>(recorded.size());
      }
    }
    return total / static_cast<double>(counted);
  };

  install_stop_handlers();
  io::Series loss_series{"training loss", {}}, error_series{"held-out action error", {}};
  double last_error = NAN;
  const auto evaluate_actions = [&](const char* when) {
    if (!sampler) return;
    last_error = action_error();
    error_series.points.emplace_back(step, last_error);
    metrics.write({{"step", step}, {"validation_action_error", last_error}});
    std::fprintf(stderr, "step %lld: held-out action error %.4f (%s)\n",
                 static_cast<long long>(step), last_error, when);
  };
  // The untrained policy is evaluated first, and training starts from exactly its weights.
  if (!resumed) evaluate_actions("untrained");
  const double untrained_error = last_error;

  Graph training_graph = models::smolvla_loss_graph(config, batch, language, loss_options);
  const TrainingGraph parts =
      add_training(training_graph, training_graph.output(models::kLoss), optimizer);
  // The training program alone is profiled for --trace.
  SessionOptions training_options = options;
  training_options.profile = arguments.has("trace");
  Session training(training_graph, training_options);
  RecordedInputs training_inputs(
      training, non_finite.detects_anomaly()
                    ? std::make_unique<AnomalyFinder>(training_graph, parts, options)
                    : nullptr);
  std::fprintf(stderr, "device: %s\n", training.report().device.c_str());
  current_run().set("device", training.report().device);
  print_precision(options.precision, training.report());
  std::fprintf(stderr, "built training program in %.2f s (%zu dispatches), backbone %s\n",
               training.report().build_seconds, training.report().dispatches,
               train_backbone ? "trained" : "frozen");

  if (resumed) {
    load_tensors(training, *resumed, arguments.text("resume", ""), true);
    step = resumed->step;
    drop_metrics_after(out_dir / "metrics.jsonl", step);
    std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                 static_cast<long long>(step));
  } else {
    models::load_smolvla_weights(training, folder);
    if (!folder.weights && sampler) copy_weights(*sampler, training);
  }

  const auto save = [&] {
    io::Checkpoint checkpoint;
    checkpoint.model_config = model_json;
    checkpoint.step = step;
    checkpoint.epoch = step / steps_per_epoch;
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"batch", batch}, {"seed", seed}, {"language", language}};
    checkpoint.tensors = session_tensors(training);
    save_run_checkpoint(checkpoint_path, checkpoint);
  };
  ProgressLine progress;
  const StepPace pace(step);
  double smoothed = NAN;
  std::mt19937_64 random(seed ^ 0x5eed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<uint32_t> order;
  int64_t order_epoch = -1;
  StepLoop loop;
  loop.start = [&](int64_t index, int) {
    const int64_t epoch = index / steps_per_epoch;
    if (epoch != order_epoch) {
      order = data::epoch_order(static_cast<int64_t>(training_records.size()), seed, epoch);
      order_epoch = epoch;
    }
    const int64_t position = (index % steps_per_epoch) * batch;
    std::vector<size_t> chosen;
    for (int64_t r = 0; r < batch; ++r) chosen.push_back(training_records[order[position + r]]);
    const Batch inputs = make_batch(examples, chosen, batch, language, config);
    std::vector<float> noise(inputs.actions.size());
    for (float& value : noise) value = normal(random);
    // LeRobot's time: Beta(1.5, 1) (the 1/1.5 power of a uniform), scaled into [0.001, 1].
    std::vector<float> times(batch);
    for (float& time : times)
      time = static_cast<float>(std::pow(uniform(random), 1.0 / 1.5) * 0.999 + 0.001);
    set_common_inputs(training_inputs, inputs);
    training_inputs.set(models::kActions, inputs.actions);
    training_inputs.set(models::kNoise, noise);
    training_inputs.set(models::kFlowTime, times);
    training_inputs.set(models::kTimeEmbedding, models::smolvla_time_embedding(config, times));
    training_inputs.set_step(non_finite, optimizer, index);
    training.start_run();
  };
  loop.finish = [&] { training.finish_run(); };
  loop.ends_a_stretch = [&](int64_t steps_done) {
    return steps_done % checkpoint_every == 0 && steps_done != total_steps;
  };
  loop.finished = [&](int64_t steps_done, int) {
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const double loss = training.scalar_output(models::kLoss);
    if (!non_finite.dropped(loss, training.scalar_output(kNonFiniteOutput), steps_done,
                            checkpoint_path, progress, training_inputs.anomaly()))
      smoothed = moving_average(smoothed, loss, 0.1);
    const double steps_per_second = pace.steps_per_second(steps_done);
    const std::string line =
        step_line(epoch + 1, epochs, steps_done, total_steps, smoothed,
                  rate_text(steps_per_second * batch, 1, "records/s"), steps_per_second);
    progress.update(line, steps_done == total_steps);
    if (steps_done % log_every == 0 || steps_done == total_steps) {
      loss_series.points.emplace_back(steps_done, smoothed);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed, optimizer, non_finite);
      record["records_per_second"] = steps_per_second * batch;
      metrics.write(record);
    }
    if (loop.ends_a_stretch(steps_done)) {
      progress.finish();
      save();
      if (sampler) copy_weights(training, *sampler);
      evaluate_actions("checkpoint");
    }
    return bool{stop_requested};
  };
  // With --detect-anomaly a step's re-run needs the parameters from before it.
  run_steps(step, total_steps, !non_finite.detects_anomaly(), stop_requested, loop);
  progress.finish();
  save();
  if (pace.ran_steps(step))
    report_training_roofline(out_dir, training, options, pace.seconds_per_step(step));
  if (arguments.has("trace")) training.write_trace(arguments.text("trace", ""));
  if (stop_requested) std::fprintf(stderr, "stopped at step %lld\n", static_cast<long long>(step));
  if (sampler) copy_weights(training, *sampler);
  evaluate_actions("trained");
  models::save_smolvla_folder(out_dir / "model", folder, training);

  io::Chart chart;
  chart.title = "meganeura train: SmolVLA " +
                std::filesystem::path(arguments.text("model", "")).filename().string();
  chart.panels.push_back({"flow-matching loss", "step", "MSE", {loss_series}});
  if (!error_series.points.empty())
    chart.panels.push_back({"held-out action error", "step", "mean |error|", {error_series}});
  io::write_chart_png(out_dir / "training.png", chart);
  std::printf("checkpoint: %s\nmodel: %s\nmetrics: %s\nplot: %s\n", checkpoint_path.c_str(),
              (out_dir / "model").c_str(), (out_dir / "metrics.jsonl").c_str(),
              (out_dir / "training.png").c_str());
  if (!std::isnan(last_error))
    std::printf("held-out action error: %.4f (untrained %.4f)\n", last_error, untrained_error);
  return stop_requested ? 130 : 0;
}

}  // namespace mg::cli
