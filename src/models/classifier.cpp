#include "models/classifier.hpp"

#include <cmath>

#include "io/json_limits.hpp"
#include "meganeura/ops.hpp"

namespace mg::models {
namespace {

// PyTorch's default initialisation for Linear and Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Init fan_in_uniform(int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return Init::uniform(-bound, bound);
}

Tensor dense(Tensor x, const std::string& name, int64_t in, int64_t out) {
  Graph& graph = x.graph();
  const Tensor weight = parameter(graph, name + ".weight", {out, in}, fan_in_uniform(in));
  const Tensor bias = parameter(graph, name + ".bias", {out}, fan_in_uniform(in));
  return linear(x, weight, bias);
}

Tensor convolution(Tensor x, const std::string& name, int64_t in, int64_t out, int64_t kernel) {
  Graph& graph = x.graph();
  const int64_t fan_in = in * kernel * kernel;
  const Tensor weight =
      parameter(graph, name + ".weight", {out, in, kernel, kernel}, fan_in_uniform(fan_in));
  const Tensor bias = parameter(graph, name + ".bias", {out}, fan_in_uniform(fan_in));
  Conv2dOptions options;
  options.padding = {kernel / 2, kernel / 2};
  return conv2d(x, weight, bias, options);
}

Tensor logits_of(const ClassifierConfig& config, Tensor images) {
  const int64_t size = config.image_size;
  if (config.architecture == "mlp") {
    Tensor x = flatten(images);
    x = relu(dense(x, "model.fc1", size * size, 256));
    x = relu(dense(x, "model.fc2", 256, 128));
    return dense(x, "model.fc3", 128, config.classes);
  }
  Tensor x = relu(convolution(images, "model.conv1", 1, 16, 3));
  x = max_pool2d(x, {2, 2});
  x = relu(convolution(x, "model.conv2", 16, 32, 3));
  x = max_pool2d(x, {2, 2});
  const int64_t side = size / 4;
  x = flatten(x);
  x = relu(dense(x, "model.fc1", 32 * side * side, 128));
  return dense(x, "model.fc2", 128, config.classes);
}

}  // namespace

nlohmann::json ClassifierConfig::to_json() const {
  return {{"architecture", architecture}, {"image_size", image_size}, {"classes", classes}};
}

ClassifierConfig ClassifierConfig::from_json(const nlohmann::json& json) {
  ClassifierConfig config;
  try {
    config.architecture = json.at("architecture").get<std::string>();
    config.image_size = json.at("image_size").get<int64_t>();
    config.classes = json.at("classes").get<int64_t>();
  } catch (const nlohmann::json::exception& error) {
    throw Error("model configuration " + io::json_excerpt(json) +
                " is not a classifier: " + io::shortened(std::string_view(error.what()), 120));
  }
  if (config.architecture != "cnn" && config.architecture != "mlp") {
    throw Error("unknown classifier architecture '" + io::shortened(config.architecture) +
                "' (cnn or mlp)");
  }
  // The bounds keep a corrupt checkpoint from asking for an absurd program.
  if (config.image_size % 4 != 0 || config.image_size <= 0 || config.image_size > 4096 ||
      config.classes <= 1 || config.classes > 1'000'000) {
    throw Error("unsupported classifier configuration " + io::json_excerpt(json) +
                " (image_size a multiple of 4 up to 4096, classes 2 to 1000000)");
  }
  return config;
}

Graph build_classifier(const ClassifierConfig& config, int64_t batch) {
  Graph graph;
  const Tensor images =
      input(graph, kImagesInput, {batch, 1, config.image_size, config.image_size});
  graph.set_output("logits", logits_of(config, images).id());
  return graph;
}

Graph build_classifier_loss(const ClassifierConfig& config, int64_t batch) {
  Graph graph;
  const Tensor images =
      input(graph, kImagesInput, {batch, 1, config.image_size, config.image_size});
  const Tensor labels = input(graph, kLabelsInput, {batch}, DType::i32);
  const Tensor logits = logits_of(config, images);
  const Tensor loss = cross_entropy(logits, labels);
  graph.set_output("logits", logits.id());
  graph.set_output("loss", loss.id());
  return graph;
}

Graph build_classifier_training(const ClassifierConfig& config, int64_t batch,
                                const OptimizerConfig& optimizer) {
  Graph graph = build_classifier_loss(config, batch);
  add_training(graph, graph.output("loss"), optimizer);
  return graph;
}

}  // namespace mg::models
