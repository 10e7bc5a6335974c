// The SmolLM2-135M workload of `meganeura bench workloads`: the forward to every position's
// logits, a training step and greedy decoding, at the real configuration with random weights.
#include <chrono>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "meganeura/train.hpp"
#include "runtime/llama_runtime.hpp"

namespace mg::cli {

nlohmann::json smollm2_135m_config() {
  return {{"model_type", "llama"},       {"vocab_size", 49152},
          {"hidden_size", 576},          {"intermediate_size", 1536},
          {"num_hidden_layers", 30},     {"num_attention_heads", 9},
          {"num_key_value_heads", 3},    {"max_position_embeddings", 8192},
          {"rms_norm_eps", 1e-5},        {"rope_theta", 100000.0},
          {"tie_word_embeddings", true}, {"hidden_act", "silu"},
          {"bos_token_id", 0},           {"eos_token_id", 0}};
}

namespace {

nlohmann::json bench_llama(const std::string& name, const nlohmann::json& config_json,
                           Precision precision, const WorkloadOptions& bench) {
  const std::string& device = bench.device;
  const int64_t runs = bench.runs;
  const models::LlamaConfig config = models::llama_config_from_json(config_json, name);
  const int64_t seq = kSmolLM2WorkloadSeq, decode_tokens = kSmolLM2WorkloadDecodeTokens;
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
  const std::pair<BuildReport, BuildReport> builds = compile_reports(training_graph, options);

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

  const std::string mode(precision_name(precision));
  write_workload_trace(bench, name + "-" + mode + "-inference",
                       models::llama_next_token_graph(config, 1, seq), options,
                       [&](Session& session) { session.set_input(models::kInputIds, ids); });
  write_workload_trace(bench, name + "-" + mode + "-training", training_graph, options,
                       [&](Session& session) {
                         session.set_input(models::kInputIds, ids);
                         session.set_input(models::kLabels, labels);
                         for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
                           session.set_input(input, std::vector<float>{static_cast<float>(value)});
                       });

  const BuildReport& report = training.report();
  nlohmann::json memory = planner_json(report);
  memory["training_device_bytes"] = device_bytes(report);
  memory["inference_device_bytes"] = device_bytes(inference.report());
  return {{"framework", "meganeura"},
          {"model", name},
          {"mode", mode},
          {"device", report.device},
          {"config", {{"batch", 1}, {"seq", seq}, {"decode_tokens", decode_tokens}}},
          {"timings",
           {{"compile_s", compile_seconds(builds.first)},
            {"compile_warm_s", compile_seconds(builds.second)},
            {"inference_ms", inference_ms},
            {"inference_gpu_ms", gpu_ms(timed_inference, runs)},
            {"training_ms", training_ms},
            {"training_gpu_ms", gpu_ms(timed_training, runs)},
            {"decode_tokens_per_second", median(rates)}}},
          {"memory", memory},
          {"compile_parts", compile_parts_json(builds)},
          {"dispatches",
           {{"inference", inference.report().dispatches},
            {"training", report.dispatches},
            {"decode", generator.decode_session().report().dispatches}}},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace

nlohmann::json bench_smollm2_135m(Precision precision, const WorkloadOptions& options) {
  return bench_llama("smollm2-135m", smollm2_135m_config(), precision, options);
}

}  // namespace mg::cli
