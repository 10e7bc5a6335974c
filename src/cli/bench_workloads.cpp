// `meganeura bench workloads`: the study's workloads as whole programs (random weights at the
// real configurations), one JSON line per (workload, precision) in the format that
// bench/workloads_pytorch.py prints for PyTorch, and a table.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/arguments.hpp"
#include "cli/bench_timing.hpp"
#include "cli/commands.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "runtime/llama_runtime.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura bench workloads [--filter NAME] [--runs N] [--precision P] [--device SEL]

Times the study's workloads end to end with random weights at their real configurations, and
prints one JSON object per workload and precision (the format of bench/workloads_pytorch.py,
which times the same cells in PyTorch; bench/compare.py --workloads joins the two) and a table:

  smollm2-135m   SmolLM2-135M (LlamaForCausalLM), batch 1, seq 128: the forward to every
                 position's logits (inference; their argmax comes back to the host), a training step (loss, gradients, AdamW), and greedy decode of 64
                 tokens after a 128-token prefill (decode tokens/s)

Each figure is the median wall-clock time of --runs runs after 0.3 s of warm-up (at least 3
runs), the host's upload and download included; *_gpu_ms is the GPU time of one run with every
dispatch waiting for the one before. compile_s builds the training program with an empty kernel
cache (cold), compile_warm_s again with the cache it filled. Memory: the training program's
device memory (weights, optimizer state, transient values as placed) and the planner's saving
on transient values against giving each its own bytes.

  --filter NAME   only workloads whose name contains NAME
  --runs N        timed runs a cell (default 20)
  --precision P   strict, fast or both (default both)
  --device SEL    device index or part of its name (default: best available)
)";

// Wall-clock milliseconds of one run (the host's waits included), median of `runs`.
double median_ms(const std::function<void()>& run, int64_t runs) {
  warm_up(run);
  std::vector<double> times;
  for (int64_t i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return median(std::move(times));
}

double gpu_ms(Session& session, int64_t runs) {
  std::vector<double> times;
  for (int64_t i = 0; i < std::max<int64_t>(runs, 3); ++i) {
    session.run();
    times.push_back(session.last_run_gpu_ms());
  }
  return median(std::move(times));
}

// SmolLM2-135M's config.json.
nlohmann::json smollm2_135m_config() {
  return {{"model_type", "llama"},       {"vocab_size", 49152},
          {"hidden_size", 576},          {"intermediate_size", 1536},
          {"num_hidden_layers", 30},     {"num_attention_heads", 9},
          {"num_key_value_heads", 3},    {"max_position_embeddings", 8192},
          {"rms_norm_eps", 1e-5},        {"rope_theta", 100000.0},
          {"tie_word_embeddings", true}, {"hidden_act", "silu"},
          {"bos_token_id", 0},           {"eos_token_id", 0}};
}

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> tokens(count);
  for (int32_t& id : tokens) id = token(generator);
  return tokens;
}

// The cold and warm build of `graph`, each on a device opened afresh over a new kernel cache.
std::pair<double, double> compile_seconds(const Graph& graph, SessionOptions options) {
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("meganeura-workload-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(cache);
  options.switches = Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache.string()}});
  options.shared_device.reset();
  options.shared_tensors.reset();
  // The build alone: random weights would take time in proportion to the model's size.
  options.initialise_parameters = false;
  double seconds[2];
  for (double& measured : seconds) measured = Session(graph, options).report().build_seconds;
  std::filesystem::remove_all(cache);
  return {seconds[0], seconds[1]};
}

nlohmann::json bench_llama(const std::string& name, const nlohmann::json& config_json,
                           Precision precision, const std::string& device, int64_t runs) {
  const models::LlamaConfig config = models::llama_config_from_json(config_json, name);
  const int64_t seq = 128, decode_tokens = 64;
  SessionOptions options;
  options.device = device;
  options.precision = precision;
  options.shared_device = open_shared_device(device);
  options.shared_tensors = make_shared_tensors(options.shared_device);

  Graph training_graph = models::llama_loss_graph(config, 1, seq);
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 1e-4;
  add_training(training_graph, training_graph.output(models::kLoss), optimizer);
  const auto [cold, warm] = compile_seconds(training_graph, options);

  Session training(training_graph, options);
  // Both sides compute every position's logits; neither moves them to the host (PyTorch's
  // forward leaves them on the GPU), so the program returns their argmax.
  Session inference(models::llama_next_token_graph(config, 1, seq), options);
  const std::vector<int32_t> tokens = random_tokens(seq + 1, config.vocab_size, 1);
  const std::vector<int32_t> ids(tokens.begin(), tokens.begin() + seq);
  const std::vector<int32_t> labels(tokens.begin() + 1, tokens.end());
  inference.set_input(models::kInputIds, ids);
  training.set_input(models::kInputIds, ids);
  training.set_input(models::kLabels, labels);
  for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
    training.set_input(input, std::vector<float>{static_cast<float>(value)});

  const double inference_ms = median_ms([&] { inference.run(); }, runs);
  const double training_ms = median_ms([&] { training.run(); }, runs);
  const float loss = training.scalar_output(models::kLoss);

  models::LlamaGenerator generator(config, options, seq + decode_tokens);
  models::SamplingOptions greedy;
  generator.generate(ids, decode_tokens, greedy);  // builds and warms the programs
  std::vector<double> rates;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const models::Generation generation = generator.generate(ids, decode_tokens, greedy);
    rates.push_back(static_cast<double>(generation.decode_steps) / generation.decode_seconds);
  }

  SessionOptions timed = options;
  timed.time_runs = true;
  Session timed_inference(models::llama_next_token_graph(config, 1, seq), timed);
  timed_inference.set_input(models::kInputIds, ids);
  Session timed_training(training_graph, timed);
  timed_training.set_input(models::kInputIds, ids);
  timed_training.set_input(models::kLabels, labels);
  for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
    timed_training.set_input(input, std::vector<float>{static_cast<float>(value)});

  const BuildReport& report = training.report();
  const uint64_t device_bytes =
      report.persistent_bytes + report.shared_bytes + report.transient_physical_bytes;
  return {{"framework", "meganeura"},
          {"model", name},
          {"mode", std::string(precision_name(precision))},
          {"device", report.device},
          {"config", {{"batch", 1}, {"seq", seq}, {"decode_tokens", decode_tokens}}},
          {"timings",
           {{"compile_s", cold},
            {"compile_warm_s", warm},
            {"inference_ms", inference_ms},
            {"inference_gpu_ms", gpu_ms(timed_inference, runs)},
            {"training_ms", training_ms},
            {"training_gpu_ms", gpu_ms(timed_training, runs)},
            {"decode_tokens_per_second", median(rates)}}},
          {"memory",
           {{"training_device_bytes", device_bytes},
            {"transient_logical_bytes", report.transient_logical_bytes},
            {"transient_physical_bytes", report.transient_physical_bytes},
            {"planner_saving", report.transient_logical_bytes
                                   ? 1.0 - static_cast<double>(report.transient_physical_bytes) /
                                               static_cast<double>(report.transient_logical_bytes)
                                   : 0.0}}},
          {"dispatches",
           {{"inference", inference.report().dispatches},
            {"training", report.dispatches},
            {"decode", generator.decode_session().report().dispatches}}},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace

int bench_workloads(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura bench workloads", words,
                            {"filter", "runs", "precision", "device"}, {"help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (!arguments.positional().empty())
    throw Error("unexpected '" + arguments.positional()[0] +
                "' (see meganeura bench workloads --help)");
  const int64_t runs = arguments.integer("runs", 20);
  if (runs < 1) throw Error("--runs must be at least 1");
  const std::string precision = arguments.text("precision", "both");
  std::vector<Precision> precisions;
  if (precision == "both") {
    precisions = {Precision::strict, Precision::fast};
  } else {
    precisions = {parse_precision(precision)};
  }
  const std::string filter = arguments.text("filter", "");
  const std::string device = arguments.text("device", "");
  struct Workload {
    std::string name;
    std::function<nlohmann::json(Precision)> run;
  };
  const std::vector<Workload> workloads = {
      {"smollm2-135m", [&](Precision p) {
         return bench_llama("smollm2-135m", smollm2_135m_config(), p, device, runs);
       }}};
  std::vector<std::string> table;
  size_t selected = 0;
  for (const Workload& workload : workloads) {
    if (workload.name.find(filter) == std::string::npos) continue;
    ++selected;
    for (Precision p : precisions) {
      const nlohmann::json record = workload.run(p);
      std::printf("%s\n", record.dump().c_str());
      std::fflush(stdout);
      const nlohmann::json& t = record["timings"];
      char row[240];
      std::snprintf(row, sizeof(row),
                    "%-14s %-6s inference %8.3f ms (gpu %8.3f)  training %8.3f ms (gpu %8.3f)  "
                    "decode %7.1f tok/s  compile %.2f / %.2f s",
                    workload.name.c_str(), std::string(precision_name(p)).c_str(),
                    t["inference_ms"].get<double>(), t["inference_gpu_ms"].get<double>(),
                    t["training_ms"].get<double>(), t["training_gpu_ms"].get<double>(),
                    t["decode_tokens_per_second"].get<double>(), t["compile_s"].get<double>(),
                    t["compile_warm_s"].get<double>());
      table.push_back(row);
    }
  }
  if (selected == 0) throw Error("no workload matches --filter '" + filter + "' (smollm2-135m)");
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  return 0;
}

}  // namespace mg::cli
