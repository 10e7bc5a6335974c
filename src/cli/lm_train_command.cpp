// `meganeura train --model MODEL_DIR --data FILE`: fine-tunes a Llama-family model folder on
// text with the causal-LM loss; a training and an evaluation program share one copy of the
// weights on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

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
#include "io/checkpoint.hpp"
#include "io/jsonl.hpp"
#include "io/model_folder.hpp"
#include "io/plot.hpp"
#include "io/tokenizer.hpp"
#include "runtime/llama_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura train --model MODEL_DIR --data FILE [options]

Fine-tunes a Llama-family model folder (LlamaForCausalLM as the Hugging Face Hub and
save_pretrained write it: config.json, safetensors weights, tokenizer.json) on text with the
causal language-modelling loss, and writes into --out: checkpoint.safetensors (weights and
optimizer state, every --checkpoint-every steps and at the end), metrics.jsonl, training.png
(training and validation loss) and model/, a folder in the same layout that transformers and
'meganeura generate' open. Ctrl-C stops after the current step and saves. Under mpirun (or with
--distributed) each process trains on its share of every batch and the gradients are averaged
across them: docs/DISTRIBUTED.md.

The data: a .jsonl file (one JSON object a line with a "text" field, each a document) or any
other file as plain UTF-8 text (one document). Documents are tokenised, joined with the
end-of-sequence token and cut into sequences of --seq tokens (each also predicts the token after
it); the last --validation fraction of the sequences is held out for the validation loss.

  --model MODEL_DIR     the model folder to start from (required)
  --data FILE           the text (required)
  --out DIR             output folder (default runs/<timestamp>)
  --seq N               tokens a sequence (default 128)
  --batch N             sequences a step (default 8); in a distributed run the global batch,
                        which the number of processes must divide
  --epochs N            passes over the training sequences (default 1)
  --max-steps N         stop after N steps (default: all the epochs)
  --validation X        fraction of the sequences held out (default 0.05; 0 turns it off)
  --lr X                peak learning rate (default 5e-5)
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
  --overwrite           replace the run already in --out
  --checkpoint-every N  steps between checkpoints (default 200)
  --log-every N         steps between metrics.jsonl records (default 10)
  --trace FILE          write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                        the last step
  --distributed         data-parallel over the processes of an MPI launcher (implied when
                        mpirun started this one); rank 0 writes every file
  --bucket-mb X         distributed runs: gradients summed across the ranks in buckets of
                        about X MiB, each while backward computes the next (default 25)
)";

struct TextData {
  std::vector<int32_t> tokens;
  int64_t documents = 0;
};

TextData read_text_data(const std::filesystem::path& path, const io::Tokenizer& tokenizer,
                        std::optional<int32_t> separator) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("cannot open the data file " + path.string() + ": give --data FILE");
  TextData data;
  const auto add = [&](const std::string& text) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    data.tokens.insert(data.tokens.end(), ids.begin(), ids.end());
    if (separator) data.tokens.push_back(*separator);
    ++data.documents;
  };
  if (path.extension() == ".jsonl") {
    std::string line;
    int64_t number = 0;
    while (std::getline(file, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      if (!record.is_object() || !record.contains("text") || !record["text"].is_string()) {
        throw Error(path.string() + " line " + std::to_string(number) +
                    " is not a JSON object with a \"text\" string");
      }
      add(record["text"].get<std::string>());
    }
  } else {
    add(std::string(std::istreambuf_iterator<char>(file), {}));
  }
  return data;
}

// Fills ids and labels of `rows` sequences starting at token offsets `starts` (labels: the next
// tokens); rows past starts.size() are padding with ignored labels.
void fill_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& starts,
                int64_t rows, int64_t seq, std::vector<int32_t>& ids,
                std::vector<int32_t>& labels) {
  ids.assign(rows * seq, 0);
  labels.assign(rows * seq, static_cast<int32_t>(models::kIgnoredLabel));
  for (size_t r = 0; r < starts.size(); ++r) {
    for (int64_t t = 0; t < seq; ++t) {
      ids[r * seq + t] = tokens[starts[r] + t];
      labels[r * seq + t] = tokens[starts[r] + t + 1];
    }
  }
}

const char* const kCopiedFiles[] = {"tokenizer.json",
                                    "tokenizer_config.json",
                                    "special_tokens_map.json",
                                    "generation_config.json",
                                    "vocab.json",
                                    "merges.txt"};

int train_language_model(const Arguments& arguments, const DistributedRun& run,
                         const std::vector<std::string>& words);

}  // namespace

int lm_train_command(const std::vector<std::string>& words) {
  const Arguments arguments =
      training_arguments(words, {"seq", "validation", "bucket-mb"}, {"distributed"});
  if (arguments.has("help")) {
    print_training_help(kHelp);
    return 0;
  }
  const DistributedRun run(arguments);
  return run.run("train", [&] { return train_language_model(arguments, run, words); });
}

namespace {

int train_language_model(const Arguments& arguments, const DistributedRun& run,
                         const std::vector<std::string>& words) {
  arguments.expect_at_most_positional(0);
  const std::filesystem::path folder_path = arguments.text("model", "");
  const std::optional<std::string> data_path = arguments.value("data");
  if (!data_path) throw Error("--data FILE is required to train a language model");
  const int64_t seq = arguments.integer("seq", 128, 1, 1 << 20);
  const int64_t batch = arguments.integer("batch", 8, 1, 1 << 20);
  const int64_t epochs = arguments.integer("epochs", 1, 1, 1'000'000);
  const int64_t checkpoint_every = arguments.integer("checkpoint-every", 200, 1, INT64_MAX);
  const int64_t log_every = arguments.integer("log-every", 10, 1, INT64_MAX);
  const double validation = arguments.real("validation", 0.05);
  const uint64_t seed = static_cast<uint64_t>(arguments.integer("seed", 0, 0, INT64_MAX));
  const int64_t local_batch = run.local_batch(batch);
  if (!(validation >= 0 && validation < 1)) throw Error("--validation must be in [0, 1)");

  // Everything the run reads is checked before anything is written.
  const models::LlamaConfig config = models::load_llama_config(folder_path);
  const io::ModelFolder folder = io::ModelFolder::open(folder_path);
  models::check_llama_weights(folder, config);
  if (seq > config.max_positions) {
    throw Error("--seq " + std::to_string(seq) + " exceeds the model's " +
                std::to_string(config.max_positions) + " positions");
  }
  const io::Tokenizer tokenizer = io::Tokenizer::load(folder_path / "tokenizer.json");
  const std::optional<int32_t> separator =
      config.eos_token_ids.empty() ? std::nullopt
                                   : std::optional<int32_t>(config.eos_token_ids.front());
  const TextData text = with_kind(Error::Kind::data,
                                  [&] { return read_text_data(*data_path, tokenizer, separator); });
  const int64_t sequences = (static_cast<int64_t>(text.tokens.size()) - 1) / seq;
  const int64_t held_out =
      validation > 0 && sequences > 1
          ? std::clamp<int64_t>(std::llround(validation * sequences), 1, sequences - 1)
          : 0;
  const int64_t training_sequences = sequences - held_out;
  if (training_sequences < batch) {
    throw Error(*data_path + " gives " + std::to_string(text.tokens.size()) + " tokens, " +
                std::to_string(training_sequences) + " training sequences of --seq " +
                std::to_string(seq) + ": fewer than one --batch of " + std::to_string(batch));
  }
  const int64_t steps_per_epoch = training_sequences / batch;
  const int64_t total_steps =
      std::min(steps_per_epoch * epochs,
               arguments.integer("max-steps", steps_per_epoch * epochs, 1, INT64_MAX));
  OptimizerDefaults defaults;
  defaults.optimizer = "adamw";
  defaults.learning_rate = 5e-5;
  defaults.schedule = "cosine";
  OptimizerConfig optimizer = optimizer_from(arguments, total_steps, defaults);
  NonFiniteSteps non_finite(arguments, run.distributed());
  non_finite.configure(optimizer);
  if (!arguments.has("warmup"))
    optimizer.warmup_steps = std::min<int64_t>(100, optimizer.total_steps / 10);
  if (!arguments.has("clip")) optimizer.clip_norm = 1.0;
  const nlohmann::json model_json = {{"kind", "llama"}, {"config", folder.config()}};
  const std::optional<io::Checkpoint> resumed = resumed_checkpoint(arguments, model_json);

  const std::filesystem::path out_dir = arguments.text("out", default_out_dir());
  if (run.writes()) {
    prepare_out_dir(out_dir);
    claim_out_dir(out_dir, arguments);
    require_writable_file(arguments, "trace");
    start_run_record(out_dir, words,
                     {{"job", "language_model"},
                      {"model", folder_path.string()},
                      {"data", *data_path},
                      {"seq", seq},
                      {"batch", batch},
                      {"steps", total_steps},
                      {"seed", seed},
                      {"resume", arguments.text("resume", "")}},
                     arguments.text("device", ""));
    std::fprintf(stderr,
                 "data: %lld documents, %zu tokens: %lld training and %lld validation sequences of "
                 "%lld tokens\n",
                 static_cast<long long>(text.documents), text.tokens.size(),
                 static_cast<long long>(training_sequences), static_cast<long long>(held_out),
                 static_cast<long long>(seq));
  }

  SessionOptions options;
  options.shared_device = open_shared_device(run.device(arguments));
  options.shared_tensors = make_shared_tensors(options.shared_device);
  // Every parameter is written from the folder (or the checkpoint) before the first run.
  options.initialise_parameters = false;
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.seed = seed;
  // The training program alone is profiled for --trace.
  SessionOptions training_options = options;
  training_options.profile = arguments.has("trace");
  TrainingProgram training(models::llama_loss_graph(config, local_batch, seq), optimizer, run,
                           training_options, non_finite);
  // Rank 0 alone computes the validation loss, on the weights it shares with the training.
  std::unique_ptr<Session> evaluation;
  if (held_out > 0 && run.writes())
    evaluation = std::make_unique<Session>(models::llama_loss_graph(config, batch, seq), options);
  run.announce_device(training.report().device);
  if (run.writes()) {
    print_precision(options.precision, training.report());
    std::fprintf(stderr, "built training program in %.2f s (%zu dispatches)%s%s\n",
                 training.report().build_seconds, training.report().dispatches,
                 evaluation ? " and evaluation program" : "",
                 run.distributed() ? ", data-parallel over the ranks" : "");
  }

  int64_t step = 0;
  if (resumed) {
    load_tensors(training.state(), *resumed, arguments.text("resume", ""), true);
    step = resumed->step;
    if (step > total_steps) {
      throw Error("checkpoint " + arguments.text("resume", "") + " is at step " +
                  std::to_string(step) + ", past the " + std::to_string(total_steps) +
                  " steps of this run: raise --epochs or --max-steps to train further");
    }
    if (run.writes()) {
      drop_metrics_after(out_dir / "metrics.jsonl", step);
      std::fprintf(stderr, "resumed from %s at step %lld\n", arguments.text("resume", "").c_str(),
                   static_cast<long long>(step));
    }
  } else {
    models::load_llama_weights(training.state(), folder, config);
  }

  const std::filesystem::path checkpoint_path = out_dir / "checkpoint.safetensors";
  std::optional<io::JsonlWriter> metrics;
  if (run.writes()) metrics.emplace(out_dir / "metrics.jsonl");
  const auto save = [&] {
    if (!run.writes()) return;
    io::Checkpoint checkpoint;
    checkpoint.model_config = model_json;
    checkpoint.step = step;
    checkpoint.epoch = step / steps_per_epoch;
    checkpoint.optimizer = optimizer_json(optimizer);
    checkpoint.extra = {{"seq", seq}, {"batch", batch}, {"seed", seed}};
    checkpoint.tensors = session_tensors(training.state());
    save_run_checkpoint(checkpoint_path, checkpoint);
  };
  std::vector<int32_t> ids, labels;
  const auto validation_loss = [&]() {
    double total = 0;
    int64_t counted = 0;
    for (int64_t first = training_sequences; first < sequences; first += batch) {
      std::vector<int64_t> starts;
      for (int64_t s = first; s < std::min(sequences, first + batch); ++s)
        starts.push_back(s * seq);
      fill_batch(text.tokens, starts, batch, seq, ids, labels);
      evaluation->set_input(models::kInputIds, ids);
      evaluation->set_input(models::kLabels, labels);
      evaluation->run();
      const int64_t tokens = static_cast<int64_t>(starts.size()) * seq;
      total += evaluation->scalar_output(models::kLoss) * static_cast<double>(tokens);
      counted += tokens;
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
      order = data::epoch_order(training_sequences, seed, epoch);
      order_epoch = epoch;
    }
    // This rank's share of the global batch: its run of consecutive sequences in it.
    const int64_t position = (index % steps_per_epoch) * batch + run.rank() * local_batch;
    std::vector<int64_t> starts;
    for (int64_t r = 0; r < local_batch; ++r) starts.push_back(int64_t{order[position + r]} * seq);
    fill_batch(text.tokens, starts, local_batch, seq, ids, labels);
    training.set_input(models::kInputIds, ids);
    training.set_input(models::kLabels, labels);
    training.start(index);
  };
  loop.finish = [&] { training.finish(); };
  loop.ends_a_stretch = [&](int64_t steps_done) {
    return (evaluation && steps_done % steps_per_epoch == 0) || steps_done % checkpoint_every == 0;
  };
  loop.finished = [&](int64_t steps_done, int) {
    const int64_t epoch = (steps_done - 1) / steps_per_epoch;
    const double loss = training.loss();
    const bool dropped =
        non_finite.dropped(loss, training.dropped_flag(), steps_done, checkpoint_path, progress,
                           [&] { return training.find_anomaly(); });
    // Every rank stops at the same step, whichever of them was asked to.
    const bool stopping = run.any(stop_requested);
    if (!dropped) smoothed = moving_average(smoothed, loss, 0.05);
    const double steps_per_second = pace.steps_per_second(steps_done);
    const std::string line =
        step_line(epoch + 1, epochs, steps_done, total_steps, smoothed,
                  rate_text(steps_per_second * batch * seq, 0, "tokens/s"), steps_per_second);
    if (run.writes()) progress.update(line, steps_done == total_steps);
    if (run.writes() && (steps_done % log_every == 0 || steps_done == total_steps)) {
      loss_series.points.emplace_back(steps_done, smoothed);
      nlohmann::json record =
          step_record(steps_done, epoch + 1, loss, smoothed, optimizer, non_finite);
      record["tokens_per_second"] = steps_per_second * batch * seq;
      training.add_step_times(record);
      metrics->write(record);
    }
    const bool epoch_end = steps_done % steps_per_epoch == 0 || steps_done == total_steps;
    if (evaluation && (epoch_end || steps_done % checkpoint_every == 0)) {
      last_validation = validation_loss();
      validation_series.points.emplace_back(steps_done, last_validation);
      metrics->write({{"step", steps_done}, {"validation_loss", last_validation}});
      progress.finish();
      std::fprintf(stderr, "step %lld: validation loss %.4f (perplexity %.2f)\n",
                   static_cast<long long>(steps_done), last_validation, std::exp(last_validation));
    }
    if (steps_done % checkpoint_every == 0) save();
    return stopping;
  };
  const bool stopping =
      run_steps(step, total_steps, training.queues_steps(), run.any(stop_requested), loop);
  save();
  if (!run.writes()) return stopping ? 130 : 0;
  progress.finish();
  if (pace.ran_steps(step))
    report_training_roofline(out_dir, training.traced(), options, pace.seconds_per_step(step));
  if (arguments.has("trace")) training.traced().write_trace(arguments.text("trace", ""));
  if (stopping) std::fprintf(stderr, "stopped at step %lld\n", static_cast<long long>(step));

  io::SaveOptions save_options;
  for (const char* name : kCopiedFiles) {
    if (std::filesystem::exists(folder_path / name))
      save_options.copy_files.push_back(folder_path / name);
  }
  nlohmann::json saved_config = folder.config();
  if (saved_config.contains("torch_dtype")) saved_config["torch_dtype"] = "float32";
  if (saved_config.contains("dtype")) saved_config["dtype"] = "float32";
  io::save_model_folder(out_dir / "model", saved_config,
                        models::llama_weights(training.state(), config), save_options);

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
  if (!std::isnan(last_validation))
    std::printf("validation loss: %.4f (perplexity %.2f)\n", last_validation,
                std::exp(last_validation));
  return stopping ? 130 : 0;
}

}  // namespace
}  // namespace mg::cli
