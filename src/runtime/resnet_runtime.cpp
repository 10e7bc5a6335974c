#include "runtime/resnet_runtime.hpp"

#include <map>
#include <optional>
#include <set>

#include "io/tensor_values.hpp"
#include "meganeura/error.hpp"

namespace mg::runtime {
namespace {

bool uses_hugging_face_names(const io::ModelFolder& weights) {
  for (const std::string& name : weights.tensor_names()) {
    if (name.starts_with("resnet.") || name.starts_with("classifier.")) return true;
  }
  return false;
}

// The file's tensors under the graph's (torchvision) names; num_batches_tracked and names that
// are no part of a ResNet left out.
std::map<std::string, const io::TensorView*> graph_named_tensors(const io::ModelFolder& weights,
                                                                 bool hugging_face) {
  std::map<std::string, const io::TensorView*> tensors;
  for (const std::string& name : weights.tensor_names()) {
    std::optional<std::string> graph_name;
    if (hugging_face) {
      graph_name = models::torchvision_name_of_hf(name);
    } else if (!models::resnet_skips_tensor(name)) {
      graph_name = name;
    }
    if (graph_name) tensors[*graph_name] = weights.find(name);
  }
  return tensors;
}

std::string list_of(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 5; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > 5) text += " and " + std::to_string(names.size() - 5) + " more";
  return text;
}

}  // namespace

ResNetWeightsReport load_resnet_weights(Session& session, const io::ModelFolder& weights,
                                        const models::ResNetConfig& config) {
  ResNetWeightsReport report;
  report.hugging_face_names = uses_hugging_face_names(weights);
  const std::map<std::string, const io::TensorView*> tensors =
      graph_named_tensors(weights, report.hugging_face_names);
  if (const auto fc = tensors.find("fc.weight"); fc != tensors.end() && !fc->second->shape.empty())
    report.file_classes = fc->second->shape[0];

  const std::vector<std::string> names = session.persistent_names();
  const auto shape_matches = [&](const std::string& name) {
    const auto found = tensors.find(name);
    return found != tensors.end() && found->second->shape == session.leaf_type(name).shape;
  };
  report.head_loaded = shape_matches("fc.weight") && shape_matches("fc.bias");
  std::vector<std::string> missing, mismatched;
  for (const std::string& name : names) {
    if (name.starts_with("optimizer.") || name.starts_with("fc.")) continue;
    const auto found = tensors.find(name);
    if (found == tensors.end()) {
      missing.push_back(name);
    } else if (!shape_matches(name)) {
      mismatched.push_back(name + " is " + shape_string(found->second->shape) + ", expected " +
                           shape_string(session.leaf_type(name).shape));
    }
  }
  if (!missing.empty() || !mismatched.empty()) {
    std::string text = weights.description() + " does not hold a " + config.to_json().dump() + ":";
    if (!missing.empty()) text += " missing " + list_of(missing) + ";";
    if (!mismatched.empty()) text += " " + list_of(mismatched) + ";";
    throw Error(text + " pass the --model that matches the weights");
  }
  for (const std::string& name : names) {
    if (name.starts_with("optimizer.")) continue;
    if (name.starts_with("fc.") && !report.head_loaded) continue;
    session.write(name, io::tensor_as_f32(*tensors.at(name)));
    ++report.tensors;
  }
  return report;
}

models::ResNetConfig resnet_config_of_weights(const io::ModelFolder& weights) {
  const std::map<std::string, const io::TensorView*> tensors =
      graph_named_tensors(weights, uses_hugging_face_names(weights));
  const auto conv1 = tensors.find("conv1.weight");
  const auto fc = tensors.find("fc.weight");
  if (conv1 == tensors.end() || fc == tensors.end() || conv1->second->shape.size() != 4 ||
      fc->second->shape.size() != 2) {
    throw Error(weights.description() +
                " holds no ResNet weights (conv1.weight and fc.weight, or the Hugging Face "
                "ResNetForImageClassification names)");
  }
  std::set<int64_t> stage3_blocks;
  for (const auto& [name, view] : tensors) {
    if (name.starts_with("layer3.")) stage3_blocks.insert(std::stoll(name.substr(7)));
  }
  const bool bottleneck = tensors.count("layer1.0.conv3.weight") > 0;
  const std::map<std::pair<bool, size_t>, int> depths = {
      {{false, 2}, 18}, {{false, 6}, 34}, {{true, 6}, 50}, {{true, 23}, 101}, {{true, 36}, 152}};
  const auto depth = depths.find({bottleneck, stage3_blocks.size()});
  if (depth == depths.end()) {
    throw Error(weights.description() + " holds a ResNet with " +
                std::to_string(stage3_blocks.size()) + (bottleneck ? " bottleneck" : " basic") +
                " blocks in layer3, which is none of ResNet-18, 34, 50, 101 or 152");
  }
  models::ResNetConfig config;
  config.depth = depth->second;
  config.width = conv1->second->shape[0];
  config.num_classes = fc->second->shape[0];
  return config;
}

}  // namespace mg::runtime
