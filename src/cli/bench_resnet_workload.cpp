// The ResNet-50 workload of `meganeura bench workloads`: torchvision's resnet50 with random
// weights on 224x224 images: inference and a training step at batch 4 (the study's cells), and
// training throughput at batch 64 and 256.
#include <random>

#include "cli/bench_timing.hpp"
#include "cli/bench_workloads.hpp"
#include "meganeura/train.hpp"
#include "models/resnet.hpp"

namespace mg::cli {
namespace {

constexpr int64_t kSide = 224;

std::vector<float> random_images(int64_t batch, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(batch * 3 * kSide * kSide));
  for (float& value : images) value = pixel(generator);
  return images;
}

// SGD with momentum, as torchvision's reference recipe, on both sides.
OptimizerConfig sgd() {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.01;
  optimizer.momentum = 0.9;
  return optimizer;
}

void set_training_inputs(Session& session, const models::ResNetConfig& config, int64_t batch) {
  session.set_input(models::kResNetImagesInput, random_images(batch, 2));
  const std::vector<int32_t> labels = random_tokens(batch, config.num_classes, 3);
  session.set_input(models::kResNetLabelsInput, labels);
  for (const auto& [input, value] : optimizer_inputs(sgd(), 0)) {
    if (session.has_input(input))
      session.set_input(input, std::vector<float>{static_cast<float>(value)});
  }
}

// A training session for `batch` images with its inputs set.
std::unique_ptr<Session> training_session(const models::ResNetConfig& config, int64_t batch,
                                          const SessionOptions& options) {
  auto session = std::make_unique<Session>(
      models::build_resnet_training(config, batch, kSide, kSide, sgd()), options);
  set_training_inputs(*session, config, batch);
  return session;
}

}  // namespace

Graph resnet50_workload_training_graph(int64_t batch) {
  return models::build_resnet_training(models::resnet_config_from_name("resnet50"), batch, kSide,
                                       kSide, sgd());
}

nlohmann::json bench_resnet50(Precision precision, const WorkloadOptions& bench) {
  const models::ResNetConfig config = models::resnet_config_from_name("resnet50");
  const int64_t batch = kResNet50CompileBatch;
  SessionOptions options;
  options.device = bench.device;
  options.precision = precision;
  options.shared_device = open_shared_device(bench.device);
  const std::pair<BuildReport, BuildReport> builds =
      compile_reports(resnet50_workload_training_graph(batch), options);
  const double cold = compile_seconds(builds.first), warm = compile_seconds(builds.second);

  Session inference(models::build_resnet(config, batch, kSide, kSide, false), options);
  inference.set_input(models::kResNetImagesInput, random_images(batch, 1));
  const double inference_ms = median_ms([&] { inference.run(); }, bench.runs);
  std::unique_ptr<Session> training = training_session(config, batch, options);
  const double training_ms = median_ms([&] { training->run(); }, bench.runs);
  const float loss = training->scalar_output("loss");
  const BuildReport report = training->report();
  const size_t inference_dispatches = inference.report().dispatches;

  SessionOptions timed = options;
  timed.time_runs = true;
  Session timed_inference(models::build_resnet(config, batch, kSide, kSide, false), timed);
  timed_inference.set_input(models::kResNetImagesInput, random_images(batch, 1));
  const double inference_gpu_ms = gpu_ms(timed_inference, bench.runs);
  std::unique_ptr<Session> timed_training = training_session(config, batch, timed);
  const double training_gpu_ms = gpu_ms(*timed_training, bench.runs);
  timed_training.reset();
  training.reset();

  nlohmann::json timings = {{"compile_s", cold},
                            {"compile_warm_s", warm},
                            {"inference_ms", inference_ms},
                            {"inference_gpu_ms", inference_gpu_ms},
                            {"training_ms", training_ms},
                            {"training_gpu_ms", training_gpu_ms}};
  nlohmann::json memory = planner_json(report);
  memory["training_device_bytes"] = device_bytes(report);
  // Throughput: fewer runs, each a large step.
  for (const int64_t large : {64, 256}) {
    std::unique_ptr<Session> session = training_session(config, large, options);
    const double ms = median_ms([&] { session->run(); }, std::max<int64_t>(3, bench.runs / 4));
    const std::string key = "training_b" + std::to_string(large);
    timings[key + "_images_per_second"] = 1000.0 * static_cast<double>(large) / ms;
    memory[key + "_device_bytes"] = device_bytes(session->report());
  }
  const std::string mode(precision_name(precision));
  write_workload_trace(bench, "resnet-50-" + mode + "-inference",
                       models::build_resnet(config, batch, kSide, kSide, false), options,
                       [&](Session& session) {
                         session.set_input(models::kResNetImagesInput, random_images(batch, 1));
                       });
  for (const int64_t traced : {batch, int64_t{256}}) {
    write_workload_trace(bench, "resnet-50-" + mode + "-training-b" + std::to_string(traced),
                         models::build_resnet_training(config, traced, kSide, kSide, sgd()),
                         options,
                         [&](Session& session) { set_training_inputs(session, config, traced); });
  }
  return {{"framework", "meganeura"},
          {"model", "resnet-50"},
          {"mode", mode},
          {"device", report.device},
          {"config", {{"batch", batch}, {"image_size", kSide}, {"throughput_batches", {64, 256}}}},
          {"timings", timings},
          {"memory", memory},
          {"compile_parts", compile_parts_json(builds)},
          {"dispatches", {{"inference", inference_dispatches}, {"training", report.dispatches}}},
          {"outputs", {{"loss", loss}}}};
}

}  // namespace mg::cli
