// The Stable Diffusion 1.5 U-Net workload of `meganeura bench workloads` ("sd-unet"): one U-Net
// evaluation at 64x64 latents, batch 2, 77 text tokens of width 768 (the study's cell), a
// training step at batch 1 and 4, and 50 DDIM steps with classifier-free guidance, at SD 1.5's
// exact config with random weights.
#include <random>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "meganeura/train.hpp"
#include "runtime/unet_runtime.hpp"

namespace mg::cli {
namespace {

std::vector<float> normal_values(int64_t count, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

}  // namespace

nlohmann::json stable_diffusion_15_unet_config() {
  return {{"_class_name", "UNet2DConditionModel"},
          {"act_fn", "silu"},
          {"attention_head_dim", 8},
          {"block_out_channels", {320, 640, 1280, 1280}},
          {"center_input_sample", false},
          {"cross_attention_dim", 768},
          {"down_block_types",
           {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"}},
          {"downsample_padding", 1},
          {"flip_sin_to_cos", true},
          {"freq_shift", 0},
          {"in_channels", 4},
          {"layers_per_block", 2},
          {"mid_block_scale_factor", 1},
          {"norm_eps", 1e-5},
          {"norm_num_groups", 32},
          {"out_channels", 4},
          {"sample_size", 64},
          {"up_block_types",
           {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}}};
}

namespace {

constexpr int64_t kUNetSide = 64, kUNetTokens = 77;

models::UNetConfig sd_unet_config() {
  return models::unet_config_from_json(stable_diffusion_15_unet_config(), "Stable Diffusion 1.5");
}

OptimizerConfig sd_unet_optimizer() {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 1e-5;
  return optimizer;
}

}  // namespace

Graph sd_unet_workload_inference_graph(int64_t batch) {
  return models::unet_graph(sd_unet_config(), {batch, kUNetSide, kUNetSide, kUNetTokens});
}

Graph sd_unet_workload_sampler_graph() {
  return models::unet_sampler_graph(sd_unet_config(), {1, kUNetSide, kUNetSide, kUNetTokens}, true);
}

Graph sd_unet_workload_training_graph(int64_t batch) {
  Graph graph =
      models::unet_loss_graph(sd_unet_config(), {batch, kUNetSide, kUNetSide, kUNetTokens});
  add_training(graph, graph.output(models::kUNetLoss), sd_unet_optimizer());
  return graph;
}

nlohmann::json bench_sd_unet(Precision precision, const WorkloadOptions& bench) {
  const models::UNetConfig config = sd_unet_config();
  const int64_t side = kUNetSide, tokens = kUNetTokens, ddim_steps = 50;
  SessionOptions options;
  options.device = bench.device;
  options.precision = precision;
  options.shared_device = open_shared_device(bench.device);
  options.shared_tensors = make_shared_tensors(options.shared_device);
  const OptimizerConfig optimizer = sd_unet_optimizer();
  const auto set_inputs = [&](Session& session, int64_t batch, bool training) {
    session.set_input(models::kUNetSample, normal_values(batch * 4 * side * side, 1));
    std::vector<float> timesteps(batch);
    for (int64_t i = 0; i < batch; ++i) timesteps[i] = static_cast<float>(999 - 37 * i);
    session.set_input(models::kUNetTimestep, timesteps);
    session.set_input(models::kUNetContext,
                      normal_values(batch * tokens * config.cross_attention_dim, 2));
    if (!training) return;
    session.set_input(models::kUNetNoise, normal_values(batch * 4 * side * side, 3));
    for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
      session.set_input(input, std::vector<float>{static_cast<float>(value)});
  };

  const Graph train_1 = sd_unet_workload_training_graph(1);
  const std::pair<BuildReport, BuildReport> builds = compile_reports(train_1, options);
  const double cold = compile_seconds(builds.first), warm = compile_seconds(builds.second);
  Session inference(sd_unet_workload_inference_graph(2), options);
  set_inputs(inference, 2, false);
  const double inference_ms = median_ms([&] { inference.run(); }, bench.runs);
  nlohmann::json timings = {
      {"compile_s", cold}, {"compile_warm_s", warm}, {"inference_ms", inference_ms}};
  {
    SessionOptions timed = options;
    timed.time_runs = true;
    Session timed_inference(sd_unet_workload_inference_graph(2), timed);
    set_inputs(timed_inference, 2, false);
    timings["inference_gpu_ms"] = gpu_ms(timed_inference, bench.runs);
  }
  nlohmann::json memory, dispatches = {{"inference", inference.report().dispatches}};
  float loss = 0;
  for (const int64_t batch : {int64_t{1}, int64_t{4}}) {
    const std::string suffix = batch == 1 ? "" : "_b" + std::to_string(batch);
    const Graph graph = batch == 1 ? train_1 : sd_unet_workload_training_graph(batch);
    Session training(graph, options);
    set_inputs(training, batch, true);
    timings["training" + suffix + "_ms"] = median_ms([&] { training.run(); }, bench.runs);
    if (batch == 1) loss = training.scalar_output(models::kUNetLoss);
    memory["training" + suffix + "_device_bytes"] = device_bytes(training.report());
    dispatches["training" + suffix] = training.report().dispatches;
    if (batch == 1) memory.update(planner_json(training.report()));
  }
  {
    SessionOptions timed = options;
    timed.time_runs = true;
    Session timed_training(train_1, timed);
    set_inputs(timed_training, 1, true);
    timings["training_gpu_ms"] = gpu_ms(timed_training, bench.runs);
  }

  const std::string mode(precision_name(precision));
  write_workload_trace(bench, "sd-unet-" + mode + "-inference", sd_unet_workload_inference_graph(2),
                       options, [&](Session& session) { set_inputs(session, 2, false); });
  write_workload_trace(bench, "sd-unet-" + mode + "-training", train_1, options,
                       [&](Session& session) { set_inputs(session, 1, true); });

  Session sampler(sd_unet_workload_sampler_graph(), options);
  const models::NoiseSchedule schedule = models::scaled_linear_schedule();
  const std::vector<models::SamplerStep> steps =
      models::sampler_steps(schedule, models::Sampler::ddim, ddim_steps);
  const std::vector<float> noise = normal_values(4 * side * side, 4);
  const std::vector<float> context = normal_values(2 * tokens * config.cross_attention_dim, 5);
  timings["ddim50_ms"] =
      median_ms([&] { models::run_sampler(sampler, noise, steps, context, 7.5); },
                std::min<int64_t>(bench.runs, 3));
  dispatches["ddim_step"] = sampler.report().dispatches;
  return {{"framework", "meganeura"},
          {"model", "sd-unet"},
          {"mode", mode},
          {"device", inference.report().device},
          {"config",
           {{"inference_batch", 2},
            {"latent", {4, side, side}},
            {"tokens", tokens},
            {"cross_attention_dim", config.cross_attention_dim},
            {"training_batches", {1, 4}},
            {"ddim_steps", ddim_steps},
            {"guidance", 7.5}}},
          {"timings", timings},
          {"memory", memory},
          {"compile_parts", compile_parts_json(builds)},
          {"dispatches", dispatches},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace mg::cli
