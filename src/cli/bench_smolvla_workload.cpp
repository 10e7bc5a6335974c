// The SmolVLA workload of `meganeura bench workloads`: one action chunk (the backbone once, then
// the flow's Euler steps) and one flow-matching training step, at SmolVLA's defaults over
// SmolVLM2-500M's backbone cut to 16 layers, with random weights.
#include <random>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "meganeura/train.hpp"
#include "models/smolvla.hpp"

namespace mg::cli {
namespace {

// HuggingFaceTB/SmolVLM2-500M-Video-Instruct's config.json (the parts SmolVLA reads).
nlohmann::json smolvlm2_500m_config() {
  return {{"model_type", "smolvlm"},
          {"scale_factor", 4},
          {"vision_config",
           {{"hidden_size", 768},
            {"intermediate_size", 3072},
            {"num_hidden_layers", 12},
            {"num_attention_heads", 12},
            {"patch_size", 16},
            {"image_size", 512},
            {"layer_norm_eps", 1e-6},
            {"hidden_act", "gelu_pytorch_tanh"}}},
          {"text_config",
           {{"model_type", "llama"},
            {"vocab_size", 49280},
            {"hidden_size", 960},
            {"intermediate_size", 2560},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 15},
            {"num_key_value_heads", 5},
            {"head_dim", 64},
            {"max_position_embeddings", 8192},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 100000.0},
            {"hidden_act", "silu"}}}};
}

// LeRobot's SmolVLAConfig defaults with one camera and a 6-joint arm (SO-100's).
nlohmann::ordered_json smolvla_policy_config() {
  nlohmann::ordered_json policy = {{"type", "smolvla"},
                                   {"chunk_size", 50},
                                   {"num_steps", 10},
                                   {"num_vlm_layers", 16},
                                   {"attention_mode", "cross_attn"},
                                   {"self_attn_every_n_layers", 2},
                                   {"expert_width_multiplier", 0.75},
                                   {"resize_imgs_with_padding", {512, 512}}};
  policy["input_features"] = nlohmann::ordered_json::object();
  policy["input_features"]["observation.images.top"] = {{"type", "VISUAL"},
                                                        {"shape", {3, 512, 512}}};
  policy["input_features"]["observation.state"] = {{"type", "STATE"}, {"shape", {6}}};
  policy["output_features"] = {{"action", {{"type", "ACTION"}, {"shape", {6}}}}};
  return policy;
}

}  // namespace

models::SmolVLAConfig smolvla_workload_config() {
  return models::smolvla_config_from_json(smolvla_policy_config(), smolvlm2_500m_config(),
                                          "smolvla");
}

Graph smolvla_workload_training_graph(const models::SmolVLAConfig& config,
                                      const OptimizerConfig& optimizer) {
  Graph graph = models::smolvla_loss_graph(config, 1, config.tokenizer_max_length);
  add_training(graph, graph.output(models::kLoss), optimizer);
  return graph;
}

OptimizerConfig smolvla_workload_optimizer() {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 1e-4;
  optimizer.beta2 = 0.95;
  optimizer.clip_norm = 10.0;
  return optimizer;
}

namespace {

std::vector<float> random_floats(size_t count, uint64_t seed, float scale) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

}  // namespace

nlohmann::json bench_smolvla(Precision precision, const WorkloadOptions& bench) {
  const models::SmolVLAConfig config = smolvla_workload_config();
  const int64_t batch = 1, language = config.tokenizer_max_length;
  SessionOptions options;
  options.precision = precision;
  options.shared_device = open_shared_device(bench.device);

  const OptimizerConfig optimizer = smolvla_workload_optimizer();
  const Graph training_graph = smolvla_workload_training_graph(config, optimizer);
  const std::pair<BuildReport, BuildReport> builds = compile_reports(training_graph, options);
  const double cold = compile_seconds(builds.first), warm = compile_seconds(builds.second);
  const Graph chunk_graph = models::smolvla_chunk_graph(config, batch, language, config.num_steps);

  const int64_t side = config.vision.image_size;
  const std::vector<float> pixels = random_floats(batch * 3 * side * side, 1, 0.5f);
  const std::vector<int32_t> ids = random_tokens(batch * language, config.text.vocab_size, 2);
  const std::vector<float> state = random_floats(batch * config.max_state_dim, 3, 1.0f);
  const size_t chunk = batch * config.chunk_size * config.max_action_dim;
  const std::vector<float> noise = random_floats(chunk, 4, 1.0f);
  const std::vector<float> actions = random_floats(chunk, 5, 1.0f);
  const std::vector<float> times(batch, 0.6f);
  const models::SmolVLAMasks masks =
      models::smolvla_masks(config, batch, language, std::vector<bool>(batch * language, true));
  const auto feed = [&](Session& session, bool training) {
    session.set_input(models::kPixelValues, pixels);
    session.set_input(models::kLanguageIds, ids);
    session.set_input(models::kState, state);
    session.set_input(models::kAttentionMask, masks.attention_mask);
    session.set_input(models::kPositionIds, masks.position_ids);
    session.set_input(models::kNoise, noise);
    if (!training) return;
    session.set_input(models::kActions, actions);
    session.set_input(models::kFlowTime, times);
    session.set_input(models::kTimeEmbedding, models::smolvla_time_embedding(config, times));
    for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
      session.set_input(input, std::vector<float>{static_cast<float>(value)});
  };

  Session sampler(chunk_graph, options);
  feed(sampler, false);
  const double chunk_ms = median_ms([&] { sampler.run(); }, bench.runs);
  Session training(training_graph, options);
  feed(training, true);
  const double training_ms = median_ms([&] { training.run(); }, bench.runs);
  const float loss = training.scalar_output(models::kLoss);

  SessionOptions timed = options;
  timed.time_runs = true;
  Session timed_sampler(chunk_graph, timed);
  feed(timed_sampler, false);
  Session timed_training(training_graph, timed);
  feed(timed_training, true);

  const std::string mode(precision_name(precision));
  write_workload_trace(bench, "smolvla-" + mode + "-chunk", chunk_graph, options,
                       [&](Session& session) { feed(session, false); });
  write_workload_trace(bench, "smolvla-" + mode + "-training", training_graph, options,
                       [&](Session& session) { feed(session, true); });

  const BuildReport& report = training.report();
  nlohmann::json memory = planner_json(report);
  memory["training_device_bytes"] = device_bytes(report);
  memory["chunk_device_bytes"] = device_bytes(sampler.report());
  return {{"framework", "meganeura"},
          {"model", "smolvla"},
          {"mode", std::string(precision_name(precision))},
          {"device", report.device},
          {"config",
           {{"batch", batch},
            {"language_tokens", language},
            {"chunk_size", config.chunk_size},
            {"flow_steps", config.num_steps},
            {"vlm_layers", config.text.layers},
            {"backbone", "frozen"}}},
          {"timings",
           {{"compile_s", cold},
            {"compile_warm_s", warm},
            {"latency_ms", chunk_ms},
            {"latency_gpu_ms", gpu_ms(timed_sampler, bench.runs)},
            {"training_ms", training_ms},
            {"training_gpu_ms", gpu_ms(timed_training, bench.runs)}}},
          {"memory", memory},
          {"compile_parts", compile_parts_json(builds)},
          {"dispatches", {{"chunk", sampler.report().dispatches}, {"training", report.dispatches}}},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace mg::cli
