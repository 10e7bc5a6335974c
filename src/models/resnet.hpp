#pragma once
// ResNet (He et al. 2015) as torchvision builds it, v1.5: the stride of a bottleneck block sits
// on its 3x3 convolution. Parameters and running statistics carry torchvision's state-dict
// names ("conv1.weight", "layer1.0.bn1.running_mean", "layer2.0.downsample.0.weight",
// "fc.bias"), so torchvision checkpoints load by name and Hugging Face ones through
// torchvision_name_of_hf. docs/RESNET.md describes the names and batch-norm semantics.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "meganeura/graph.hpp"
#include "meganeura/train.hpp"

namespace mg::models {

struct ResNetConfig {
  int depth = 50;  // 18 and 34 (basic blocks), 50, 101 and 152 (bottleneck blocks)
  int64_t num_classes = 1000;
  int64_t width = 64;  // channels of the stem; torchvision's models have 64

  // Identifies the model in checkpoints: {"architecture": "resnet", "depth", "num_classes",
  // "width"}. from_json throws mg::Error naming what is missing or unsupported.
  nlohmann::json to_json() const;
  static ResNetConfig from_json(const nlohmann::json& json);
};

// "resnet18", "resnet34", "resnet50", "resnet101" or "resnet152" with torchvision's width;
// throws mg::Error naming the text otherwise.
ResNetConfig resnet_config_from_name(std::string_view name, int64_t num_classes = 1000);

inline constexpr const char* kResNetImagesInput = "images";  // f32 [batch, 3, height, width]
inline constexpr const char* kResNetLabelsInput = "labels";  // i32 [batch]
inline constexpr const char* kResNetLogitsOutput = "logits";

// The network on input "images" with output "logits" [batch, num_classes]. training = true
// normalises with batch statistics and updates the running statistics after each run
// (PyTorch: momentum 0.1, unbiased variance); false normalises with the running statistics.
// Parameters start with torchvision's initialisation (Kaiming-normal convolutions, fan-out
// mode; batch-norm weight 1, bias 0; PyTorch's Linear default for fc). Throws mg::Error for an
// unsupported depth or non-positive sizes and, as PyTorch does, for a training batch that leaves
// one value per channel to normalise in the last stage (batch 1 with images up to 32x32).
Graph build_resnet(const ResNetConfig& config, int64_t batch, int64_t height, int64_t width,
                   bool training);

// build_resnet(training = true) plus input "labels" [batch] and output "loss", the mean
// cross-entropy: the forward graph a data-parallel trainer differentiates.
Graph build_resnet_loss(const ResNetConfig& config, int64_t batch, int64_t height, int64_t width);

// build_resnet_loss plus the optimizer update of every parameter (add_training).
Graph build_resnet_training(const ResNetConfig& config, int64_t batch, int64_t height,
                            int64_t width, const OptimizerConfig& optimizer);

// Reads a Hugging Face ResNetForImageClassification config.json (depths, hidden_sizes,
// embedding_size, layer_type, num_labels or id2label). Throws mg::Error naming the field when
// it describes a network build_resnet cannot express (downsample_in_first_stage,
// downsample_in_bottleneck, another activation, widths that are not torchvision's ratios).
ResNetConfig resnet_config_from_hf(const nlohmann::json& config_json);

// Maps a Hugging Face ResNetForImageClassification tensor name to the torchvision name the
// graph uses ("resnet.encoder.stages.1.layers.0.shortcut.convolution.weight" ->
// "layer2.0.downsample.0.weight", "classifier.1.bias" -> "fc.bias"); nullopt for tensors the
// graph does not hold (num_batches_tracked) and for names that are not part of that model.
std::optional<std::string> torchvision_name_of_hf(std::string_view hf_name);

// True for torchvision state-dict entries the graph leaves out on purpose:
// "*.num_batches_tracked", which only matters for momentum=None (a cumulative average).
bool resnet_skips_tensor(std::string_view torchvision_name);

}  // namespace mg::models
