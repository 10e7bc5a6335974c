// The Whisper-tiny workload of `meganeura bench workloads`: the encoder on 30 s of audio, one
// decode step, the study's training step (30 s and 4 decoder tokens), its inference cell (the
// encoder and 4 decoder tokens to logits) and transcription's real-time factor, at whisper-tiny's
// configuration with random weights.
#include <chrono>
#include <cmath>
#include <numbers>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "data/log_mel.hpp"
#include "meganeura/train.hpp"
#include "runtime/whisper_runtime.hpp"

namespace mg::cli {
namespace {

namespace wio = models::whisper_io;

constexpr int64_t kWhisperDecoderTokens = 4;

OptimizerConfig whisper_tiny_optimizer() {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 1e-5;
  return optimizer;
}

// openai/whisper-tiny's config.json (the keys the model reads).
nlohmann::json whisper_tiny_config() {
  return {{"model_type", "whisper"},
          {"vocab_size", 51865},
          {"d_model", 384},
          {"encoder_layers", 4},
          {"encoder_attention_heads", 6},
          {"encoder_ffn_dim", 1536},
          {"decoder_layers", 4},
          {"decoder_attention_heads", 6},
          {"decoder_ffn_dim", 1536},
          {"num_mel_bins", 80},
          {"max_source_positions", 1500},
          {"max_target_positions", 448},
          {"activation_function", "gelu"},
          {"scale_embedding", false},
          {"tie_word_embeddings", true},
          {"decoder_start_token_id", 50258},
          {"eos_token_id", 50257},
          {"pad_token_id", 50257}};
}

// 30 s of a chirp with noise, as the transcription cell's audio: its features are those of any
// audio, and the random model's tokens do not depend on what it says.
std::vector<float> test_audio(int64_t samples) {
  std::vector<float> audio(samples);
  uint32_t state = 1;
  for (int64_t i = 0; i < samples; ++i) {
    const double t = static_cast<double>(i) / 16000.0;
    state = state * 1664525u + 1013904223u;
    const double noise = static_cast<double>(state >> 8) / static_cast<double>(1u << 24) - 0.5;
    audio[i] =
        static_cast<float>(0.3 * std::sin(2 * 3.14159265 * (200 + 40 * t) * t) + 0.05 * noise);
  }
  return audio;
}

}  // namespace

Graph whisper_tiny_workload_training_graph() {
  Graph graph = models::whisper_loss_graph(
      models::whisper_config_from_json(whisper_tiny_config(), "whisper-tiny"), 1,
      kWhisperDecoderTokens);
  add_training(graph, graph.output(wio::kLoss), whisper_tiny_optimizer());
  return graph;
}

nlohmann::json bench_whisper_tiny(Precision precision, const WorkloadOptions& bench) {
  const int64_t runs = bench.runs;
  const models::WhisperConfig config =
      models::whisper_config_from_json(whisper_tiny_config(), "whisper-tiny");
  const int64_t tokens = kWhisperDecoderTokens, decode_tokens = 64;
  SessionOptions options;
  options.device = bench.device;
  options.precision = precision;
  options.shared_device = open_shared_device(bench.device);
  options.shared_tensors = make_shared_tensors(options.shared_device);

  Graph training_graph = whisper_tiny_workload_training_graph();
  const OptimizerConfig optimizer = whisper_tiny_optimizer();
  const std::pair<BuildReport, BuildReport> builds = compile_reports(training_graph, options);
  const double cold = compile_seconds(builds.first), warm = compile_seconds(builds.second);

  Session training(training_graph, options);
  Session encoder(models::whisper_encoder_graph(config, 1), options);
  Session inference(models::whisper_logits_graph(config, 1, tokens), options);
  training.write(models::kEncoderPositions,
                 models::whisper_sinusoids(config.max_source_positions, config.d_model));
  const data::LogMelConfig features_config;
  const std::vector<float> audio = test_audio(features_config.window_samples());
  const std::vector<float> features = data::whisper_log_mel(audio, features_config);
  const std::vector<int32_t> ids = {50258, 50259, 50359, 50363};
  const std::vector<int32_t> labels = {50259, 50359, 50363, 50257};
  for (Session* session : {&training, &inference, &encoder})
    session->set_input(wio::kInputFeatures, features);
  for (Session* session : {&training, &inference}) session->set_input(wio::kDecoderInputIds, ids);
  training.set_input(wio::kLabels, labels);
  for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
    training.set_input(input, std::vector<float>{static_cast<float>(value)});

  const double encoder_ms = median_ms([&] { encoder.run(); }, runs);
  const double inference_ms = median_ms([&] { inference.run(); }, runs);
  const double training_ms = median_ms([&] { training.run(); }, runs);
  const float loss = training.scalar_output(wio::kLoss);

  // Transcription: features of 30 s, the cross kv program and greedy decoding of at most
  // decode_tokens tokens (random weights rarely end earlier); one decode step timed alone.
  models::WhisperDecoding decoding;
  decoding.prompt = ids;
  decoding.end_tokens = {50257};
  decoding.max_length = static_cast<int64_t>(ids.size()) + decode_tokens;
  models::WhisperTranscriber transcriber(config, options, config.max_target_positions);
  transcriber.transcribe(features, decoding);  // builds and warms the programs
  std::vector<double> factors, steps;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> generated =
        transcriber.transcribe(data::whisper_log_mel(audio, features_config), decoding);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    factors.push_back(seconds / 30.0);
    steps.push_back(static_cast<double>(generated.size()));
  }
  Session& decode = transcriber.decode_session();
  decode.set_input(wio::kDecoderInputIds, std::vector<int32_t>{50259});
  decode.set_input(wio::kPosition, std::vector<int32_t>{static_cast<int32_t>(tokens)});
  const double decode_step_ms = median_ms([&] { decode.run(); }, runs);

  SessionOptions timed = options;
  timed.time_runs = true;
  Session timed_inference(models::whisper_logits_graph(config, 1, tokens), timed);
  timed_inference.set_input(wio::kInputFeatures, features);
  timed_inference.set_input(wio::kDecoderInputIds, ids);
  Session timed_training(training_graph, timed);
  timed_training.set_input(wio::kInputFeatures, features);
  timed_training.set_input(wio::kDecoderInputIds, ids);
  timed_training.set_input(wio::kLabels, labels);
  for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
    timed_training.set_input(input, std::vector<float>{static_cast<float>(value)});

  const std::string mode(precision_name(precision));
  write_workload_trace(bench, "whisper-tiny-" + mode + "-encoder",
                       models::whisper_encoder_graph(config, 1), options,
                       [&](Session& session) { session.set_input(wio::kInputFeatures, features); });
  write_workload_trace(bench, "whisper-tiny-" + mode + "-inference",
                       models::whisper_logits_graph(config, 1, tokens), options,
                       [&](Session& session) {
                         session.set_input(wio::kInputFeatures, features);
                         session.set_input(wio::kDecoderInputIds, ids);
                       });
  write_workload_trace(bench, "whisper-tiny-" + mode + "-training", training_graph, options,
                       [&](Session& session) {
                         session.set_input(wio::kInputFeatures, features);
                         session.set_input(wio::kDecoderInputIds, ids);
                         session.set_input(wio::kLabels, labels);
                         for (const auto& [input, value] : optimizer_inputs(optimizer, 0))
                           session.set_input(input, std::vector<float>{static_cast<float>(value)});
                       });

  const BuildReport& report = training.report();
  nlohmann::json memory = planner_json(report);
  memory["training_device_bytes"] = device_bytes(report);
  return {{"framework", "meganeura"},
          {"model", "whisper-tiny"},
          {"mode", mode},
          {"device", report.device},
          {"config",
           {{"batch", 1},
            {"mel_frames", config.input_frames()},
            {"decoder_tokens", tokens},
            {"transcription_tokens", median(steps)}}},
          {"timings",
           {{"compile_s", cold},
            {"compile_warm_s", warm},
            {"encoder_ms", encoder_ms},
            {"inference_ms", inference_ms},
            {"inference_gpu_ms", gpu_ms(timed_inference, runs)},
            {"training_ms", training_ms},
            {"training_gpu_ms", gpu_ms(timed_training, runs)},
            {"decode_step_ms", decode_step_ms},
            {"real_time_factor", median(factors)}}},
          {"memory", memory},
          {"compile_parts", compile_parts_json(builds)},
          {"dispatches",
           {{"inference", inference.report().dispatches},
            {"training", report.dispatches},
            {"cross_kv", transcriber.cross_kv_session().report().dispatches},
            {"decode", decode.report().dispatches}}},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace mg::cli
