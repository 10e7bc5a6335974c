// ResNet builder: torchvision's parameter names, shapes, counts and initialisation for every
// depth; the v1.5 stride placement; batch-norm modes; Hugging Face config.json and tensor names
// (generated here from transformers' module tree, modeling_resnet.py) mapped onto the graph's
// names exactly. The numbers against PyTorch are in tests/parity/resnet_parity_test.cpp.
#include "models/resnet.hpp"

#include <cmath>
#include <map>
#include <set>

#include "meganeura/ops.hpp"
#include "ops/op_expectations.hpp"

namespace mg::models {
namespace {

using mg::testing::expect_error;

struct Leaves {
  std::map<std::string, Shape> parameters;
  std::map<std::string, Shape> state;
  int64_t parameter_elements = 0;
};

Leaves leaves_of(const Graph& graph) {
  Leaves leaves;
  for (const Node& node : graph.nodes()) {
    if (node.op == "parameter") {
      leaves.parameters[node.name] = node.type.shape;
      leaves.parameter_elements += node.type.elements();
    } else if (node.op == "state") {
      leaves.state[node.name] = node.type.shape;
    }
  }
  return leaves;
}

ResNetConfig config_of(int depth, int64_t classes = 1000, int64_t width = 64) {
  ResNetConfig config;
  config.depth = depth;
  config.num_classes = classes;
  config.width = width;
  return config;
}

// The stride of the convolution whose weight is `weight_name`.
std::vector<int64_t> stride_of(const Graph& graph, const std::string& weight_name) {
  const ValueId weight = graph.find_leaf(weight_name);
  for (const Node& node : graph.nodes()) {
    if (node.op == "conv2d" && node.inputs.size() > 1 && node.inputs[1] == weight) {
      return node.attrs.get_ints("stride");
    }
  }
  ADD_FAILURE() << "no convolution uses " << weight_name;
  return {};
}

TEST(ResNet, ParameterCountsAndTensorCountsMatchTorchvision) {
  // torchvision.models.resnetNN(num_classes=1000): sum(p.numel() for p in parameters()) and the
  // state dict's parameters and buffers (without num_batches_tracked).
  struct Expected {
    int depth;
    int64_t elements;
    size_t parameters;
    size_t state;
  };
  for (const Expected& expected :
       {Expected{18, 11689512, 62, 40}, Expected{34, 21797672, 110, 72},
        Expected{50, 25557032, 161, 106}, Expected{101, 44549160, 314, 208},
        Expected{152, 60192808, 467, 310}}) {
    const Graph graph = build_resnet(config_of(expected.depth), 2, 64, 64, false);
    const Leaves leaves = leaves_of(graph);
    EXPECT_EQ(leaves.parameter_elements, expected.elements) << "resnet" << expected.depth;
    EXPECT_EQ(leaves.parameters.size(), expected.parameters) << "resnet" << expected.depth;
    EXPECT_EQ(leaves.state.size(), expected.state) << "resnet" << expected.depth;
    EXPECT_EQ(shape_string(graph.type(graph.output(kResNetLogitsOutput)).shape), "[2, 1000]");
  }
}

TEST(ResNet, Resnet50NamesShapesAndStrideOnTheThreeByThree) {
  const Graph graph = build_resnet(config_of(50, 10), 1, 224, 224, false);
  const Leaves leaves = leaves_of(graph);
  const std::map<std::string, Shape> expected = {
      {"conv1.weight", {64, 3, 7, 7}},
      {"bn1.weight", {64}},
      {"layer1.0.conv1.weight", {64, 64, 1, 1}},
      {"layer1.0.conv3.weight", {256, 64, 1, 1}},
      {"layer1.0.downsample.0.weight", {256, 64, 1, 1}},
      {"layer1.0.downsample.1.bias", {256}},
      {"layer2.0.conv2.weight", {128, 128, 3, 3}},
      {"layer2.0.downsample.0.weight", {512, 256, 1, 1}},
      {"layer3.5.bn2.weight", {256}},
      {"layer4.2.conv3.weight", {2048, 512, 1, 1}},
      {"fc.weight", {10, 2048}},
      {"fc.bias", {10}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(leaves.parameters.count(name)) << name;
    EXPECT_EQ(shape_string(leaves.parameters.at(name)), shape_string(shape)) << name;
  }
  EXPECT_EQ(shape_string(leaves.state.at("layer3.5.bn2.running_var")), "[256]");
  EXPECT_EQ(shape_string(leaves.state.at("layer4.0.downsample.1.running_mean")), "[2048]");
  EXPECT_FALSE(leaves.parameters.count("layer1.1.downsample.0.weight"));
  EXPECT_FALSE(leaves.parameters.count("layer1.0.conv1.bias"));
  // v1.5: the first block of a stage strides on its 3x3 convolution and on its shortcut.
  EXPECT_EQ(stride_of(graph, "conv1.weight"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(stride_of(graph, "layer1.0.conv2.weight"), (std::vector<int64_t>{1, 1}));
  for (const char* stage : {"layer2", "layer3", "layer4"}) {
    const std::string block = std::string(stage) + ".0";
    EXPECT_EQ(stride_of(graph, block + ".conv1.weight"), (std::vector<int64_t>{1, 1})) << block;
    EXPECT_EQ(stride_of(graph, block + ".conv2.weight"), (std::vector<int64_t>{2, 2})) << block;
    EXPECT_EQ(stride_of(graph, block + ".downsample.0.weight"), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(stride_of(graph, std::string(stage) + ".1.conv2.weight"),
              (std::vector<int64_t>{1, 1}));
  }
}

TEST(ResNet, Resnet18HasBasicBlocksAndDownsamplesFromTheSecondStage) {
  const Leaves leaves = leaves_of(build_resnet(config_of(18, 10, 8), 4, 32, 32, false));
  EXPECT_EQ(shape_string(leaves.parameters.at("layer1.0.conv1.weight")), "[8, 8, 3, 3]");
  EXPECT_EQ(shape_string(leaves.parameters.at("layer2.0.conv1.weight")), "[16, 8, 3, 3]");
  EXPECT_EQ(shape_string(leaves.parameters.at("layer4.1.conv2.weight")), "[64, 64, 3, 3]");
  EXPECT_EQ(shape_string(leaves.parameters.at("layer3.0.downsample.0.weight")), "[32, 16, 1, 1]");
  EXPECT_EQ(shape_string(leaves.parameters.at("fc.weight")), "[10, 64]");
  EXPECT_FALSE(leaves.parameters.count("layer1.0.downsample.0.weight"));
  EXPECT_FALSE(leaves.parameters.count("layer1.0.conv3.weight"));
}

TEST(ResNet, InitialisationFollowsTorchvision) {
  const Graph graph = build_resnet(config_of(50), 1, 64, 64, false);
  const auto init_of = [&](const std::string& name) {
    return leaf_init(graph.node(graph.find_leaf(name)));
  };
  // kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (out * kh * kw)).
  EXPECT_EQ(init_of("conv1.weight").kind, Init::Kind::normal);
  EXPECT_DOUBLE_EQ(init_of("conv1.weight").b, std::sqrt(2.0 / (64 * 49)));
  EXPECT_DOUBLE_EQ(init_of("layer3.0.conv2.weight").b, std::sqrt(2.0 / (256 * 9)));
  EXPECT_DOUBLE_EQ(init_of("layer3.0.downsample.0.weight").b, std::sqrt(2.0 / 1024));
  EXPECT_EQ(init_of("layer2.1.bn3.weight").kind, Init::Kind::ones);
  EXPECT_EQ(init_of("layer2.1.bn3.bias").kind, Init::Kind::zeros);
  EXPECT_EQ(init_of("layer2.1.bn3.running_mean").kind, Init::Kind::zeros);
  EXPECT_EQ(init_of("layer2.1.bn3.running_var").kind, Init::Kind::ones);
  EXPECT_EQ(init_of("fc.weight").kind, Init::Kind::uniform);
  EXPECT_DOUBLE_EQ(init_of("fc.weight").b, 1.0 / std::sqrt(2048.0));
  EXPECT_DOUBLE_EQ(init_of("fc.bias").a, -1.0 / std::sqrt(2048.0));
}

TEST(ResNet, TrainingUpdatesRunningStatisticsAndInferenceReadsThem) {
  const ResNetConfig config = config_of(18, 10, 8);
  const Graph training = build_resnet(config, 4, 32, 32, true);
  const Graph inference = build_resnet(config, 4, 32, 32, false);
  // Two assignments (mean, variance) per batch norm; none in inference.
  EXPECT_EQ(training.updates().size(), 40u);
  EXPECT_TRUE(inference.updates().empty());
  std::set<std::string> assigned;
  for (const auto& [target, value] : training.updates())
    assigned.insert(training.node(target).name);
  EXPECT_TRUE(assigned.count("layer2.0.downsample.1.running_var"));
  for (const Node& node : inference.nodes()) {
    if (node.op != "batch_norm") continue;
    EXPECT_EQ(node.attrs.get_int("training"), 0);
    EXPECT_EQ(node.inputs.size(), 5u);  // x, weight, bias, running mean and variance
  }
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  const Graph step = build_resnet_training(config, 4, 32, 32, optimizer);
  EXPECT_NE(step.output("loss"), kNoValue);
  EXPECT_NE(step.find_leaf(kResNetLabelsInput), kNoValue);
  // 40 statistics plus one update per parameter (plain SGD keeps no moments).
  EXPECT_EQ(step.updates().size(), 40u + 62u);
}

TEST(ResNet, ConfigurationsAndMisuse) {
  const ResNetConfig config = config_of(101, 37, 32);
  const ResNetConfig read = ResNetConfig::from_json(config.to_json());
  EXPECT_EQ(read.depth, 101);
  EXPECT_EQ(read.num_classes, 37);
  EXPECT_EQ(read.width, 32);
  EXPECT_EQ(resnet_config_from_name("resnet34", 5).depth, 34);
  EXPECT_EQ(resnet_config_from_name("resnet34", 5).num_classes, 5);
  expect_error([] { resnet_config_from_name("resnet42"); }, {"depth 42", "18, 34, 50"});
  expect_error([] { resnet_config_from_name("vgg16"); }, {"unknown model 'vgg16'"});
  expect_error([] { ResNetConfig::from_json({{"architecture", "cnn"}}); }, {"not a ResNet"});
  expect_error([] { build_resnet(config_of(50, 0), 1, 32, 32, false); }, {"num_classes"});
  expect_error([] { build_resnet(config_of(50), 0, 32, 32, false); }, {"positive sizes"});
  // Like PyTorch, training cannot normalise one value per channel (the last stage is 1x1 here).
  expect_error([] { build_resnet(config_of(18, 10, 8), 1, 32, 32, true); },
               {"batch_norm", "one value per channel"});
}

// The state-dict names of transformers' ResNetForImageClassification, built from its module
// tree: resnet.embedder.embedder (a ResNetConvLayer), resnet.encoder.stages[s].layers[l] with
// .shortcut (when the channels or the stride change) and .layer[k] (ResNetConvLayers), and
// classifier.1 (nn.Linear after nn.Flatten).
std::vector<std::string> hugging_face_names(const std::vector<int64_t>& depths,
                                            const std::vector<int64_t>& hidden_sizes,
                                            int64_t embedding_size, bool bottleneck) {
  std::vector<std::string> names;
  const auto conv_layer = [&](const std::string& prefix) {
    names.push_back(prefix + ".convolution.weight");
    for (const char* leaf :
         {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}) {
      names.push_back(prefix + ".normalization." + leaf);
    }
  };
  conv_layer("resnet.embedder.embedder");
  int64_t in_channels = embedding_size;
  for (size_t stage = 0; stage < depths.size(); ++stage) {
    for (int64_t layer = 0; layer < depths[stage]; ++layer) {
      const std::string prefix =
          "resnet.encoder.stages." + std::to_string(stage) + ".layers." + std::to_string(layer);
      const bool strided = stage > 0 && layer == 0;
      if (in_channels != hidden_sizes[stage] || strided) conv_layer(prefix + ".shortcut");
      for (int k = 0; k < (bottleneck ? 3 : 2); ++k) {
        conv_layer(prefix + ".layer." + std::to_string(k));
      }
      in_channels = hidden_sizes[stage];
    }
  }
  names.push_back("classifier.1.weight");
  names.push_back("classifier.1.bias");
  return names;
}

void expect_hugging_face_names_map_onto_graph(const nlohmann::json& config_json) {
  const ResNetConfig config = resnet_config_from_hf(config_json);
  const Leaves leaves = leaves_of(build_resnet(config, 1, 64, 64, false));
  std::set<std::string> graph_names;
  for (const auto& [name, shape] : leaves.parameters) graph_names.insert(name);
  for (const auto& [name, shape] : leaves.state) graph_names.insert(name);
  std::set<std::string> mapped;
  size_t skipped = 0;
  for (const std::string& name : hugging_face_names(
           config_json["depths"], config_json["hidden_sizes"], config_json["embedding_size"],
           config_json["layer_type"] == "bottleneck")) {
    const std::optional<std::string> torchvision = torchvision_name_of_hf(name);
    if (!torchvision) {
      EXPECT_TRUE(name.ends_with(".num_batches_tracked")) << name;
      ++skipped;
      continue;
    }
    EXPECT_TRUE(mapped.insert(*torchvision).second) << "two names map to " << *torchvision;
  }
  EXPECT_EQ(mapped, graph_names);
  EXPECT_EQ(skipped, leaves.state.size() / 2);
}

nlohmann::json microsoft_resnet_50_config() {
  // The fields of microsoft/resnet-50's config.json (id2label shortened to its size).
  nlohmann::json id2label;
  for (int i = 0; i < 1000; ++i) id2label[std::to_string(i)] = "class " + std::to_string(i);
  return {{"architectures", {"ResNetForImageClassification"}},
          {"depths", {3, 4, 6, 3}},
          {"downsample_in_first_stage", false},
          {"embedding_size", 64},
          {"hidden_act", "relu"},
          {"hidden_sizes", {256, 512, 1024, 2048}},
          {"id2label", id2label},
          {"layer_type", "bottleneck"},
          {"model_type", "resnet"},
          {"num_channels", 3}};
}

TEST(ResNetHuggingFace, ConfigJsonGivesTheTorchvisionModel) {
  const ResNetConfig resnet50 = resnet_config_from_hf(microsoft_resnet_50_config());
  EXPECT_EQ(resnet50.depth, 50);
  EXPECT_EQ(resnet50.num_classes, 1000);
  EXPECT_EQ(resnet50.width, 64);
  const nlohmann::json resnet18 = {{"depths", {2, 2, 2, 2}},
                                   {"embedding_size", 64},
                                   {"hidden_sizes", {64, 128, 256, 512}},
                                   {"layer_type", "basic"},
                                   {"num_labels", 7}};
  EXPECT_EQ(resnet_config_from_hf(resnet18).depth, 18);
  EXPECT_EQ(resnet_config_from_hf(resnet18).num_classes, 7);

  nlohmann::json changed = microsoft_resnet_50_config();
  changed["downsample_in_bottleneck"] = true;
  expect_error([&] { resnet_config_from_hf(changed); }, {"downsample_in_bottleneck"});
  changed = microsoft_resnet_50_config();
  changed["depths"] = {2, 2, 2, 2};
  expect_error([&] { resnet_config_from_hf(changed); }, {"depths [2,2,2,2]", "bottleneck"});
  changed = microsoft_resnet_50_config();
  changed["hidden_sizes"] = {64, 128, 256, 512};
  expect_error([&] { resnet_config_from_hf(changed); }, {"hidden_sizes", "[256,512,1024,2048]"});
  changed = microsoft_resnet_50_config();
  changed["hidden_act"] = "gelu";
  expect_error([&] { resnet_config_from_hf(changed); }, {"gelu"});
  changed = microsoft_resnet_50_config();
  changed["depths"] = "many";
  expect_error([&] { resnet_config_from_hf(changed); }, {"config.json", "wrong type"});
}

TEST(ResNetHuggingFace, EveryTensorNameMapsOntoTheGraph) {
  expect_hugging_face_names_map_onto_graph(microsoft_resnet_50_config());
  expect_hugging_face_names_map_onto_graph({{"depths", {2, 2, 2, 2}},
                                            {"embedding_size", 16},
                                            {"hidden_sizes", {16, 32, 64, 128}},
                                            {"layer_type", "basic"},
                                            {"num_labels", 3}});
  const std::map<std::string, std::string> examples = {
      {"resnet.embedder.embedder.convolution.weight", "conv1.weight"},
      {"resnet.embedder.embedder.normalization.running_var", "bn1.running_var"},
      {"resnet.encoder.stages.0.layers.0.shortcut.convolution.weight",
       "layer1.0.downsample.0.weight"},
      {"resnet.encoder.stages.3.layers.2.shortcut.normalization.bias",
       "layer4.2.downsample.1.bias"},
      {"resnet.encoder.stages.1.layers.3.layer.2.convolution.weight", "layer2.3.conv3.weight"},
      {"resnet.encoder.stages.2.layers.5.layer.0.normalization.running_mean",
       "layer3.5.bn1.running_mean"},
      {"classifier.1.weight", "fc.weight"},
  };
  for (const auto& [hf, torchvision] : examples) {
    EXPECT_EQ(torchvision_name_of_hf(hf).value_or("(none)"), torchvision) << hf;
  }
  for (const char* other :
       {"resnet.embedder.embedder.normalization.num_batches_tracked", "resnet.pooler.weight",
        "resnet.encoder.stages.4.layers.0.layer.0.convolution.weight",
        "resnet.encoder.stages.0.layers.0.layer.3.convolution.weight",
        "resnet.encoder.stages.x.layers.0.layer.0.convolution.weight", "classifier.0.weight",
        "resnet.encoder.stages.0.layers.0.layer.0.convolution.bias", ""}) {
    EXPECT_FALSE(torchvision_name_of_hf(other).has_value()) << other;
  }
  EXPECT_TRUE(resnet_skips_tensor("layer1.0.bn1.num_batches_tracked"));
  EXPECT_FALSE(resnet_skips_tensor("layer1.0.bn1.running_var"));
}

}  // namespace
}  // namespace mg::models
