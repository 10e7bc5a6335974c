// `meganeura train --model WHISPER_DIR --data DIR_OR_MANIFEST`: fine-tunes (or trains from its
// initial weights) a Whisper model folder on (audio, transcript) pairs with the teacher-forced
// cross-entropy of WhisperForConditionalGeneration; a training and an evaluation program share
// one copy of the weights on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/anomaly_finder.hpp"
#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/distributed_run.hpp"
#include "cli/non_finite_steps.hpp"
#include "cli/roofline_report.hpp"
#include "cli/run_record.hpp"
#include "cli/training_run.hpp"
#include "cli/training_support.hpp"
#include "data/audio.hpp"
#include "data/batcher.hpp"
#include "data/log_mel.hpp"
#include "io/checkpoint.hpp"
#include "io/jsonl.hpp"
#include "io/model_folder.hpp"
#include "io/plot.hpp"
#include "io/tokenizer.hpp"
#include "runtime/whisper_runtime.hpp"

namespace mg::cli {
namespace {

namespace wio = models::whisper_io;

constexpr const char* kHelp =
    R"(usage: meganeura train --model WHISPER_DIR --data DIR_OR_MANIFEST [options]

Trains a Whisper model folder (WhisperForConditionalGeneration as the Hugging Face Hub and
save_pretrained write it) on speech with the teacher-forced cross-entropy transformers computes:
the decoder reads <|startoftranscript|> <|language|> <|task|> <|notimestamps|> and the
transcript's tokens (a space first, as Whisper writes text) and predicts each next token, then
<|endoftext|>. Writes into --out: checkpoint.safetensors (weights and optimizer state, every
--checkpoint-every steps and at the end), metrics.jsonl, training.png and model/, a folder in the
same layout (tokenizer, preprocessor and generation configs copied) that transformers and
'meganeura transcribe' open. Ctrl-C stops after the current step and saves.

The data: a folder of audio files (.wav, .flac, .ogg) each with a .txt transcript of the same
name, or a .jsonl manifest, one {"audio": PATH, "text": TRANSCRIPT} a line (paths relative to the
manifest's folder). Clips are at most one window (30 s for the real models); their log-mel
features are computed once, before training. The last --validation fraction is held out.

  --model DIR           the Whisper folder to start from (required)
  --data DIR|FILE       the speech (required)
  --out DIR             output folder (default runs/<timestamp>)
  --decoder-only        train the decoder alone; the encoder's weights stay as they are
  --language CODE       the transcripts' language (default en)
  --task NAME           transcribe (default) or translate
  --batch N             clips a step (default 8)
  --tokens N            decoder positions a clip (default: the longest transcript's)
  --epochs N            passes over the training clips (default 1)
  --max-steps N         stop after N steps (default: all the epochs)
  --validation X        fraction of the clips held out (default 0.05; 0 turns it off)
  --lr X                peak learning rate (default 1e-5)
  --optimizer NAME      adamw, adam or sgd (default adamw)
  --momentum X          SGD momentum (default 0.9)
  --weight-decay X      (default 0.0)
  --schedule NAME       cosine, warmup or constant (default cosine)
  --warmup N            warmup steps (default: a tenth of the updates, at most 100)
  --clip X              global gradient-norm clipping, 0 = off (default 1.0)
  --accumulate N        apply the mean gradient of N batches as one update (default 1)
  --seed N              shuffling seed (default 0)
  --device SEL          device index or part of its name (default: best available)
  --precision P         strict (default), fast (f16 operands on cooperative matrices)
                        or bf16 (bfloat16 operands there)
  --resume CKPT         continue from a checkpoint written by this command
  --overwrite           replace the run already in --out (without it, and without --resume,
                        a folder holding a checkpoint or metrics is refused)
  --checkpoint-every N  steps between checkpoints (default 200)
  --log-every N         steps between metrics.jsonl records (default 10)
  --trace FILE          write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                        the last step
)";

struct Clip {
  std::filesystem::path audio;
  std::string text;
};

std::string read_transcript(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("cannot read the transcript " + path.string());
  std::string text(std::istreambuf_iterator<char>(file), {});
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::vector<Clip> read_clips(const std::filesystem::path& data) {
  std::vector<Clip> clips;
  if (std::filesystem::is_directory(data)) {
    std::vector<std::filesystem::path> audio;
    for (const auto& entry : std::filesystem::directory_iterator(data)) {
      const std::string extension = entry.path().extension().string();
      if (extension == ".wav" || extension == ".flac" || extension == ".ogg")
        audio.push_back(entry.path());
    }
    std::sort(audio.begin(), audio.end());
    for (const std::filesystem::path& path : audio) {
      std::filesystem::path transcript = path;
      transcript.replace_extension(".txt");
      if (!std::filesystem::exists(transcript)) {
        throw Error("the audio file " + path.string() + " has no transcript " +
                    transcript.string() + ": add one, or give a .jsonl manifest");
      }
      clips.push_back({path, read_transcript(transcript)});
    }
    if (clips.empty())
      throw Error("the data folder " + data.string() + " holds no .wav, .flac or .ogg files");
    return clips;
  }
  std::ifstream file(data);
  if (!file || data.extension() != ".jsonl") {
    throw Error("--data " + data.string() +
                " is neither a folder of audio and .txt transcripts nor a .jsonl manifest");
  }
  std::string line;
  int64_t number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (!record.is_object() || !record.contains("audio") || !record["audio"].is_string() ||
        !record.contains("text") || !record["text"].is_string()) {
      throw Error(data.string() + " line " + std::to_string(number) +
                  " is not a JSON object with \"audio\" and \"text\" strings");
    }
    std::filesystem::path audio = record["audio"].get<std::string>();
    if (audio.is_relative()) audio = data.parent_path() / audio;
    clips.push_back({audio, record["text"].get<std::string>()});
  }
  if (clips.empty()) throw Error("the manifest " + data.string() + " lists no clips");
  return clips;
}

// One clip ready to train on: its features and its decoder inputs and labels.
struct Example {
  std::vector<float> features;
  std::vector<int32_t> ids, labels;
};

struct Batch {
  std::vector<float> features;
  std::vector<int32_t> ids, labels;
};

void fill_batch(const std::vector<Example>& examples, const std::vector<uint32_t>& rows,
                int64_t batch, int64_t tokens, int32_t pad, int64_t feature_count, Batch& out) {
  out.features.assign(batch * feature_count, 0.0f);
  out.ids.assign(batch * tokens, pad);
  out.labels.assign(batch * tokens, wio::kIgnoredLabel);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Example& example = examples[rows[r]];
    std::copy(example.features.begin(), example.features.end(),
              out.features.begin() + r * feature_count);
    std::copy(example.ids.begin(), example.ids.end(), out.ids.begin() + r * tokens);
    std::copy(example.labels.begin(), example.labels.end(), out.labels.begin() + r * tokens);
  }
}

const char* const kCopiedFiles[] = {"tokenizer.json",
                                    "tokenizer_config.json",
                                    "special_tokens_map.json",
                                    "generation_config.json",
                                    "preprocessor_config.json",
                                    "vocab.json",
                                    "merges.txt",
                                    "added_tokens.json",
                                    "normalizer.json"};

}  // namespace

int whisper_train_command(const std::vector<std::string>& words) {
  const Arguments arguments =
      training_arguments(words, {"tokens", "validation", "language", "task"}, {"decoder-only"});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  refuse_mpi_launcher("Whisper");
  arguments.expect_at_most_positional(0);
  const std::filesystem::path folder_path = arguments.text("model", "");
  const std::optional<std::string> data_path = arguments.value("data");
  if (!data_path) throw Error("--data DIR_OR_MANIFEST is required to train a Whisper model");
  const int64_t batch = arguments.integer("batch", 8);
  const int64_t epochs = arguments.integer("epochs", 1);
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 200);
  const int64_t log_every = arguments.integer("log-every", 10, 1, INT64_MAX);
  const double validation = arguments.real("validation", 0.05);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0));
  const bool decoder_only = arguments.has("decoder-only");
  if (batch <= 0 || epochs <= 0 || checkpoint_every <= 0)
    throw Error("--batch, --epochs and --checkpoint-every must be positive");
  if (!(validation >= 0 && validation < 1)) throw Error("--validation must be in [0, 1)");

  // Everything the run reads is checked before anything is written.
  const models::WhisperConfig config = models::load_whisper_config(folder_path);
  const io::ModelFolder folder = io::ModelFolder::open(folder_path);
  models::check_whisper_weights(folder, config);
  const io::Tokenizer tokenizer = io::Tokenizer::load(folder_path / "tokenizer.json");
  const data::LogMelConfig features_config = models::load_whisper_features(folder_path, config);
  const models::WhisperDecoding decoding = models::load_whisper_decoding(
      folder_path, config, tokenizer, arguments.text("language", "en"),
      arguments.text("task", "transcribe"));
  if (decoding.end_tokens.empty())
    throw Error("model folder " + folder_path.string() + " names no end-of-text token");
  const int32_t end_token = *decoding.end_tokens.begin();
  const int32_t pad = config.pad_token_id >= 0 ? config.pad_token_id : end_token;

  const std::vector<Clip> clips = read_clips(*data_path);
  std::vector<Example> examples;
  int64_t longest = 0;
  double audio_seconds = 0;
  for (const Clip& clip : clips) {
    const data::Audio audio = data::read_audio(clip.audio, features_config.sample_rate);
    if (static_cast<int64_t>(audio.samples.size()) > features_config.window_samples()) {
      throw Error(clip.audio.string() + " is longer than the model's window of " +
                  std::to_string(features_config.chunk_seconds) + " s: cut it into clips");
    }
    audio_seconds += static_cast<double>(audio.samples.size()) / audio.sample_rate;
    Example example;
    example.features = data::whisper_log_mel(audio.samples, features_config);
    example.ids = decoding.prompt;
    const std::vector<int32_t> text = tokenizer.encode(" " + clip.text);
    example.ids.insert(example.ids.end(), text.begin(), text.end());
    example.labels.assign(example.ids.begin() + 1, example.ids.end());
    example.labels.push_back(end_token);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(example.ids.size()));
    examples.push_back(std::move(example));
  }
  const int64_t tokens = arguments.integer("tokens", longest);
  if (tokens < longest || tokens > config.max_target_positions) {
    throw Error("--tokens " + std::to_string(tokens) + " must hold the longest transcript (" +
                std::to_string(longest) + " tokens with the prompt) and fit the decoder's " +
                std::to_string(config.max_target_positions) + " positions");
  }
  const int64_t count = static_cast<int64_t>(examples.size());
  const int64_t held_out = validation > 0 && count > 1
                               ? std::clamp<int64_t>(std::llround(validation * count), 1, count - 1)
                               : 0;
  const int64_t training_clips = count - held_out;
  if (training_clips < batch) {
    throw Error(*data_path + " gives " + std::to_string(training_clips) +
                " training clips: fewer than one --batch of " + std::to_string(batch));
  }
  const int64_t steps_per_epoch = training_clips / batch;
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs, arguments.integer("max-steps", steps_per_epoch * epochs));
  if (total_steps <= 0) throw Error("--max-steps must be positive");
  OptimizerDefaults defaults;
  defaults.optimizer = "adamw";
  defaults.learning_rate = 1e-5;
  defaults.schedule = "cosine";
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps, defaults);
  NonFiniteSteps non_finite(arguments);
  non_finite.configure(optimizer);
  if (!arguments.has("warmup"))
    optimizer.warmup_steps = std::min<int64_t>(100, optimizer.total_steps / 10);
  if (!arguments.has("clip")) optimizer.clip_norm = 1.0;
  const nlohmann::json model_json = {
      {"kind", "whisper"}, {"config", folder.config()}, {"decoder_only", decoder_only}};
  const std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments, model_json);

  const std::filesystem::path out_dir = arguments.text("out", default_out_dir());
  open_run(out_dir, arguments, words,
           {{"job", "whisper"},
            {"model", arguments.text("model", "")},
            {"data", arguments.text("data", "")},
            {"resume", arguments.text("resume", "")}});
  require_writable_file(arguments, "trace");
  std::fprintf(stderr,
               "data: %lld clips, %.1f s of audio: %lld training and %lld validation clips, %lld "
               "decoder positions\n",
               static_cast<long long>(count), audio_seconds, static_cast<long long>(training_clips),
               static_cast<long long>(held_out), static_cast<long long>(tokens));
  for (Example& example : examples) {
    example.ids.resize(tokens, pad);
    example.labels.resize(tokens, wio::kIgnoredLabel);
  }

  SessionOptions options;
  options.shared_device = open_shared_device(arguments.text("device", ""));
  options.shared_tensors = make_shared_tensors(options.shared_device);
  // Every tensor is written from the folder (or the checkpoint) before the first run.
  options.initialise_parameters = false;
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.seed = seed;
  Graph training_graph = models::whisper_loss_graph(config, batch, tokens, !decoder_only);
  const TrainingGraph parts =
      add_training(training_graph, training_graph.output(wio::kLoss), optimizer);
  // The training program alone is profiled for --trace.
  SessionOptions training_options = options;
  training_options.profile = arguments.has("trace");
  Session training(training_graph, training_options);
  RecordedInputs training_inputs(
      training, non_finite.detects_anomaly()
                    ? std::make_unique<AnomalyFinder>(training_graph, parts, options)
                    : nullptr);
  std::unique_ptr<Session> evaluation;
  std::unique_ptr<RecordedInputs> evaluation_inputs;
  if (held_out > 0) {
    evaluation = std::make_unique<Session>(
        models::whisper_loss_graph(config, batch, tokens, !decoder_only), options);
    evaluation_inputs = std::make_unique<RecordedInputs>(*evaluation);
  }
  std::fprintf(stderr, "device: %s\n", training.report().device.c_str());
  current_run().set("device", training.report().device);
  print_precision(options.precision, training.report());
  std::fprintf(stderr, "built training program in %.2f s (%zu dispatches)%s; training %s\n",
               training.report().build_seconds, training.report().dispatches,
               evaluation ? " and evaluation program" : "",
               decoder_only ? "the decoder alone" : "encoder and decoder");

  int64_t step = 0;
  if (resumed) {
    load_tensors(training, *resumed, arguments.text("resume", ""), true);
    step = resumed->step;
    drop_metrics_after(out_dir / "metrics.jsonl", step);
    std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                 static_cast<long long>(step));
  } else {
    models::load_whisper_weights({&training}, folder, config);
  }

  const std::filesystem::path checkpoint_path = out_dir / "checkpoint.safetensors";
  io::JsonlWriter metrics(out_dir / "metrics.jsonl");
  const auto save = [&] {
    io::Checkpoint checkpoint;
    checkpoint.model_config = model_json;
    checkpoint.step = step;
    checkpoint.epoch = step / steps_per_epoch;
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"tokens", tokens}, {"batch", batch}, {"seed", seed}};
    checkpoint.tensors = session_tensors(training);
    save_run_checkpoint(checkpoint_path, checkpoint);
  };
  const int64_t feature_count = config.num_mel_bins * config.input_frames();
  Batch rows;
  const auto set_batch = [&](RecordedInputs& inputs, const std::vector<uint32_t>& indices) {
    fill_batch(examples, indices, batch, tokens, pad, feature_count, rows);
    inputs.set(wio::kInputFeatures, rows.features);
    inputs.set(wio::kDecoderInputIds, rows.ids);
    inputs.set(wio::kLabels, rows.labels);
  };
  const auto validation_loss = [&]() {
    double total = 0;
    int64_t counted = 0;
    for (int64_t first = training_clips; first < count; first += batch) {
      std::vector<uint32_t> indices;
      int64_t labels = 0;
      for (int64_t c = first; c < std::min(count, first + batch); ++c) {
        indices.push_back(static_cast<uint32_t>(c));
        for (int32_t label : examples[c].labels) labels += label != wio::kIgnoredLabel;
      }
      set_batch(*evaluation_inputs, indices);
      evaluation->run();
      total += evaluation->scalar_output(wio::kLoss) * static_cast<double>(labels);
      counted += labels;
    }
    return total / static_cast<double>(counted);
  };

  install_stop_handlers();
  io::Series loss_series{"training loss", {}}, validation_series{"validation loss", {}};
  ProgressLine progress;
  const StepPace pace(step);
  double smoothed = NAN, last_validation = NAN;
  std::vector<uint32_t> order;
  int64_t order_epoch = -1;
  StepLoop loop;
  loop.start = [&](int64_t index, int) {
    const int64_t epoch = index / steps_per_epoch;
    if (epoch != order_epoch) {
      order = data::epoch_order(training_clips, seed, epoch);
      order_epoch = epoch;
    }
    const int64_t position = (index % steps_per_epoch) * batch;
    set_batch(training_inputs, {order.begin() + position, order.begin() + position + batch});
    training_inputs.set_step(non_finite, optimizer, index);
    training.start_run();
  };
  loop.finish = [&] { training.finish_run(); };
  loop.ends_a_stretch = [&](int64_t steps_done) {
    return (evaluation && steps_done % steps_per_epoch == 0) || steps_done % checkpoint_every == 0;
  };
  loop.finished = [&](int64_t steps_done, int) {
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const double loss = training.scalar_output(wio::kLoss);
    if (!non_finite.dropped(loss, training.scalar_output(kNonFiniteOutput), steps_done,
                            checkpoint_path, progress, training_inputs.anomaly()))
      smoothed = moving_average(smoothed, loss, 0.05);
    const double steps_per_second = pace.steps_per_second(steps_done);
    const std::string line =
        step_line(epoch + 1, epochs, steps_done, total_steps, smoothed,
                  rate_text(steps_per_second * batch, 1, "clips/s"), steps_per_second);
    progress.update(line, steps_done == total_steps);
    if (steps_done % log_every == 0 || steps_done == total_steps) {
      loss_series.points.emplace_back(steps_done, smoothed);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed, optimizer, non_finite);
      record["clips_per_second"] = steps_per_second * batch;
      metrics.write(record);
    }
    const bool epoch_end = steps_done % steps_per_epoch == 0 || steps_done == total_steps;
    if (evaluation && (epoch_end || steps_done % checkpoint_every == 0)) {
      last_validation = validation_loss();
      validation_series.points.emplace_back(steps_done, last_validation);
      metrics.write({{"step", steps_done}, {"validation_loss", last_validation}});
      progress.finish();
      std::fprintf(stderr, "step %lld: validation loss %.4f\n", static_cast<long long>(steps_done),
                   last_validation);
    }
    if (steps_done % checkpoint_every == 0) save();
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

  io::SaveOptions save_options;
  for (const char* name : kCopiedFiles) {
    if (std::filesystem::exists(folder_path / name))
      save_options.copy_files.push_back(folder_path / name);
  }
  nlohmann::json saved_config = folder.config();
  if (saved_config.contains("torch_dtype")) saved_config["torch_dtype"] = "float32";
  if (saved_config.contains("dtype")) saved_config["dtype"] = "float32";
  io::save_model_folder(out_dir / "model", saved_config, models::whisper_weights(training, config),
                        save_options);

  io::Chart chart;
  chart.title = "meganeura train: " + folder_path.filename().string() + " on " +
                std::filesystem::path(*data_path).filename().string();
  std::vector<io::Series> series = {loss_series};
  if (!validation_series.points.empty()) series.push_back(validation_series);
  chart.panels.push_back({"loss", "step", "cross-entropy", series});
  io::write_chart_png(out_dir / "training.png", chart);
  std::printf("checkpoint: %s\nmodel: %s\nmetrics: %s\nplot: %s\n", checkpoint_path.c_str(),
              (out_dir / "model").c_str(), (out_dir / "metrics.jsonl").c_str(),
              (out_dir / "training.png").c_str());
  if (!std::isnan(last_validation)) std::printf("validation loss: %.4f\n", last_validation);
  return stop_requested ? 130 : 0;
}

}  // namespace mg::cli
