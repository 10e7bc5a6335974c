#include "models/resnet.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <vector>

#include "meganeura/nn.hpp"
#include "meganeura/ops.hpp"

namespace mg::models {
namespace {

struct Layout {
  std::array<int64_t, 4> blocks;  // per stage
  bool bottleneck;
  int64_t expansion() const { return bottleneck ? 4 : 1; }
};

constexpr std::array<std::pair<int, Layout>, 5> kLayouts = {{
    {18, {{2, 2, 2, 2}, false}},
    {34, {{3, 4, 6, 3}, false}},
    {50, {{3, 4, 6, 3}, true}},
    {101, {{3, 4, 23, 3}, true}},
    {152, {{3, 8, 36, 3}, true}},
}};

Layout layout_of(int depth) {
  for (const auto& [known, layout] : kLayouts) {
    if (known == depth) return layout;
  }
  throw Error("ResNet depth " + std::to_string(depth) + " is not supported (18, 34, 50, 101, 152)");
}

// torchvision's initialisation of ResNet convolutions: kaiming_normal_(mode="fan_out",
// nonlinearity="relu"), no bias.
Tensor convolution(Tensor x, const std::string& name, int64_t out, int64_t kernel, int64_t stride) {
  const double deviation = std::sqrt(2.0 / static_cast<double>(out * kernel * kernel));
  const Tensor weight = parameter(x.graph(), name + ".weight", {out, x.dim(1), kernel, kernel},
                                  Init::normal(0.0, deviation));
  Conv2dOptions options;
  options.stride = {stride, stride};
  options.padding = {kernel / 2, kernel / 2};
  return conv2d(x, weight, std::nullopt, options);
}

Tensor normalization(Tensor x, const std::string& name, bool training) {
  return nn::BatchNorm2d(x.graph(), name, x.dim(1))(x, training);
}

Tensor block(Tensor x, const std::string& name, const Layout& layout, int64_t planes,
             int64_t stride, bool training) {
  const int64_t out_channels = planes * layout.expansion();
  Tensor out;
  if (layout.bottleneck) {
    out =
        relu(normalization(convolution(x, name + ".conv1", planes, 1, 1), name + ".bn1", training));
    out = relu(normalization(convolution(out, name + ".conv2", planes, 3, stride), name + ".bn2",
                             training));
    out = normalization(convolution(out, name + ".conv3", out_channels, 1, 1), name + ".bn3",
                        training);
  } else {
    out = relu(
        normalization(convolution(x, name + ".conv1", planes, 3, stride), name + ".bn1", training));
    out = normalization(convolution(out, name + ".conv2", planes, 3, 1), name + ".bn2", training);
  }
  Tensor identity = x;
  if (stride != 1 || x.dim(1) != out_channels) {
    identity = normalization(convolution(x, name + ".downsample.0", out_channels, 1, stride),
                             name + ".downsample.1", training);
  }
  return relu(out + identity);
}

Tensor logits_of(const ResNetConfig& config, Tensor images, bool training) {
  const Layout layout = layout_of(config.depth);
  Tensor x = relu(normalization(convolution(images, "conv1", config.width, 7, 2), "bn1", training));
  x = max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  for (int64_t stage = 0; stage < 4; ++stage) {
    const int64_t planes = config.width << stage;
    for (int64_t index = 0; index < layout.blocks[stage]; ++index) {
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(index);
      x = block(x, name, layout, planes, index == 0 && stage > 0 ? 2 : 1, training);
    }
  }
  x = flatten(global_avg_pool2d(x));
  // PyTorch's Linear default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
  const int64_t features = x.dim(1);
  const double bound = 1.0 / std::sqrt(static_cast<double>(features));
  Graph& graph = images.graph();
  const Tensor weight =
      parameter(graph, "fc.weight", {config.num_classes, features}, Init::uniform(-bound, bound));
  const Tensor bias =
      parameter(graph, "fc.bias", {config.num_classes}, Init::uniform(-bound, bound));
  return linear(x, weight, bias);
}

void check_config(const ResNetConfig& config) {
  layout_of(config.depth);
  if (config.num_classes < 1 || config.width < 1) {
    throw Error("ResNet configuration " + config.to_json().dump() +
                " needs a positive num_classes and width");
  }
}

Tensor images_input(Graph& graph, const ResNetConfig& config, int64_t batch, int64_t height,
                    int64_t width) {
  check_config(config);
  if (batch < 1 || height < 1 || width < 1) {
    throw Error("ResNet input [" + std::to_string(batch) + ", 3, " + std::to_string(height) + ", " +
                std::to_string(width) + "] needs positive sizes");
  }
  return input(graph, kResNetImagesInput, {batch, 3, height, width});
}

// The number a whole dotted-name part spells, or nullopt.
std::optional<int64_t> index_of(std::string_view part) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
  if (error != std::errc() || end != part.data() + part.size() || part.empty()) return std::nullopt;
  return value;
}

std::vector<std::string_view> split_name(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

bool is_normalization_tensor(std::string_view leaf) {
  return leaf == "weight" || leaf == "bias" || leaf == "running_mean" || leaf == "running_var";
}

// "convolution"/"normalization" + leaf of an HF ResNetConvLayer -> torchvision suffix, given
// the torchvision names of its convolution and batch norm.
std::optional<std::string> conv_layer_name(std::string_view kind, std::string_view leaf,
                                           const std::string& conv, const std::string& norm) {
  if (kind == "convolution" && leaf == "weight") return conv + ".weight";
  if (kind == "normalization" && is_normalization_tensor(leaf)) {
    return norm + "." + std::string(leaf);
  }
  return std::nullopt;
}

}  // namespace

nlohmann::json ResNetConfig::to_json() const {
  return {
      {"architecture", "resnet"}, {"depth", depth}, {"num_classes", num_classes}, {"width", width}};
}

ResNetConfig ResNetConfig::from_json(const nlohmann::json& json) {
  ResNetConfig config;
  try {
    if (json.at("architecture").get<std::string>() != "resnet") {
      throw Error("model configuration " + json.dump() + " is not a ResNet");
    }
    config.depth = json.at("depth").get<int>();
    config.num_classes = json.at("num_classes").get<int64_t>();
    config.width = json.at("width").get<int64_t>();
  } catch (const nlohmann::json::exception& error) {
    throw Error("model configuration " + json.dump() + " is not a ResNet: " + error.what());
  }
  check_config(config);
  return config;
}

ResNetConfig resnet_config_from_name(std::string_view name, int64_t num_classes) {
  ResNetConfig config;
  config.num_classes = num_classes;
  const std::optional<int64_t> depth =
      name.rfind("resnet", 0) == 0 ? index_of(name.substr(6)) : std::nullopt;
  if (!depth || *depth > 1000) {
    throw Error("unknown model '" + std::string(name) +
                "' (resnet18, resnet34, resnet50, resnet101 or resnet152)");
  }
  config.depth = static_cast<int>(*depth);
  check_config(config);
  return config;
}

Graph build_resnet(const ResNetConfig& config, int64_t batch, int64_t height, int64_t width,
                   bool training) {
  Graph graph;
  const Tensor images = images_input(graph, config, batch, height, width);
  graph.set_output(kResNetLogitsOutput, logits_of(config, images, training).id());
  return graph;
}

Graph build_resnet_loss(const ResNetConfig& config, int64_t batch, int64_t height, int64_t width) {
  Graph graph;
  const Tensor images = images_input(graph, config, batch, height, width);
  const Tensor labels = input(graph, kResNetLabelsInput, {batch}, DType::i32);
  const Tensor logits = logits_of(config, images, true);
  graph.set_output(kResNetLogitsOutput, logits.id());
  graph.set_output("loss", cross_entropy(logits, labels).id());
  return graph;
}

Graph build_resnet_training(const ResNetConfig& config, int64_t batch, int64_t height,
                            int64_t width, const OptimizerConfig& optimizer) {
  Graph graph = build_resnet_loss(config, batch, height, width);
  add_training(graph, graph.output("loss"), optimizer);
  return graph;
}

ResNetConfig resnet_config_from_hf(const nlohmann::json& config_json) {
  const auto fail = [&](const std::string& problem) -> ResNetConfig {
    throw Error("Hugging Face ResNet config.json " + problem);
  };
  if (!config_json.is_object()) return fail("is not a JSON object");
  try {
    if (config_json.value("model_type", std::string("resnet")) != "resnet") {
      return fail("has model_type \"" + config_json["model_type"].get<std::string>() +
                  "\", not \"resnet\"");
    }
    const std::string layer_type = config_json.value("layer_type", std::string("bottleneck"));
    if (layer_type != "basic" && layer_type != "bottleneck") {
      return fail("has layer_type \"" + layer_type + "\" (basic or bottleneck)");
    }
    if (config_json.value("hidden_act", std::string("relu")) != "relu") {
      return fail("uses hidden_act \"" + config_json["hidden_act"].get<std::string>() +
                  "\"; only relu is supported");
    }
    if (config_json.value("num_channels", int64_t{3}) != 3) {
      return fail("has num_channels " + config_json["num_channels"].dump() +
                  "; only 3 is supported");
    }
    for (const char* flag : {"downsample_in_first_stage", "downsample_in_bottleneck"}) {
      if (config_json.value(flag, false)) {
        return fail("sets " + std::string(flag) +
                    ", which torchvision's ResNet v1.5 does not have");
      }
    }
    const auto depths = config_json.value("depths", std::vector<int64_t>{3, 4, 6, 3});
    const bool bottleneck = layer_type == "bottleneck";
    ResNetConfig config;
    config.depth = 0;
    for (const auto& [depth, layout] : kLayouts) {
      if (layout.bottleneck == bottleneck &&
          std::vector<int64_t>(layout.blocks.begin(), layout.blocks.end()) == depths) {
        config.depth = depth;
      }
    }
    if (config.depth == 0) {
      return fail("has depths " + nlohmann::json(depths).dump() + " with layer_type \"" +
                  layer_type + "\", which is not ResNet-18, 34, 50, 101 or 152");
    }
    config.width = config_json.value("embedding_size", int64_t{64});
    const int64_t expansion = bottleneck ? 4 : 1;
    const auto hidden_sizes =
        config_json.value("hidden_sizes", std::vector<int64_t>{256, 512, 1024, 2048});
    const std::vector<int64_t> expected = {config.width * expansion, config.width * expansion * 2,
                                           config.width * expansion * 4,
                                           config.width * expansion * 8};
    if (hidden_sizes != expected) {
      return fail("has hidden_sizes " + nlohmann::json(hidden_sizes).dump() +
                  "; with embedding_size " + std::to_string(config.width) + " torchvision's " +
                  "layout needs " + nlohmann::json(expected).dump());
    }
    if (config_json.contains("num_labels")) {
      config.num_classes = config_json["num_labels"].get<int64_t>();
    } else if (config_json.contains("id2label")) {
      config.num_classes = static_cast<int64_t>(config_json["id2label"].size());
    } else {
      config.num_classes = 2;  // transformers' PretrainedConfig default
    }
    check_config(config);
    return config;
  } catch (const nlohmann::json::exception& error) {
    return fail("has a field of the wrong type: " + std::string(error.what()));
  }
}

std::optional<std::string> torchvision_name_of_hf(std::string_view hf_name) {
  std::vector<std::string_view> parts = split_name(hf_name);
  if (parts.size() == 3 && parts[0] == "classifier" && parts[1] == "1" &&
      (parts[2] == "weight" || parts[2] == "bias")) {
    return "fc." + std::string(parts[2]);
  }
  if (!parts.empty() && parts[0] == "resnet") parts.erase(parts.begin());
  if (parts.size() == 4 && parts[0] == "embedder" && parts[1] == "embedder") {
    return conv_layer_name(parts[2], parts[3], "conv1", "bn1");
  }
  if (parts.size() < 7 || parts[0] != "encoder" || parts[1] != "stages" || parts[3] != "layers") {
    return std::nullopt;
  }
  const std::optional<int64_t> stage = index_of(parts[2]);
  const std::optional<int64_t> layer = index_of(parts[4]);
  if (!stage || !layer || *stage > 3) return std::nullopt;
  const std::string block = "layer" + std::to_string(*stage + 1) + "." + std::to_string(*layer);
  if (parts.size() == 8 && parts[5] == "shortcut") {
    return conv_layer_name(parts[6], parts[7], block + ".downsample.0", block + ".downsample.1");
  }
  if (parts.size() == 9 && parts[5] == "layer") {
    const std::optional<int64_t> conv = index_of(parts[6]);
    if (!conv || *conv > 2) return std::nullopt;
    const std::string index = std::to_string(*conv + 1);
    return conv_layer_name(parts[7], parts[8], block + ".conv" + index, block + ".bn" + index);
  }
  return std::nullopt;
}

bool resnet_skips_tensor(std::string_view torchvision_name) {
  constexpr std::string_view kSuffix = ".num_batches_tracked";
  return torchvision_name.size() > kSuffix.size() &&
         torchvision_name.substr(torchvision_name.size() - kSuffix.size()) == kSuffix;
}

}  // namespace mg::models
