#pragma once
// ResNet weights from files into a Session: a torchvision state dict saved as safetensors
// ("conv1.weight", "layer1.0.bn1.running_mean", "fc.bias") or a Hugging Face
// ResNetForImageClassification folder ("resnet.embedder.embedder.convolution.weight",
// "classifier.1.bias"), told apart by their names.
#include <cstdint>
#include <filesystem>
#include <string>

#include "io/model_folder.hpp"
#include "meganeura/session.hpp"
#include "models/resnet.hpp"

namespace mg::runtime {

struct ResNetWeightsReport {
  bool hugging_face_names = false;  // the file used transformers' names
  int64_t tensors = 0;              // tensors written into the session
  // False when the file's fc has another class count than the session's: the session keeps its
  // freshly initialised head (fine-tuning to new classes).
  bool head_loaded = false;
  int64_t file_classes = 0;  // rows of the file's fc.weight (classifier.1.weight)
};

// Writes every parameter and running statistic of `session` (a build_resnet graph of `config`)
// from `weights`. fc.weight and fc.bias load only when their shapes match; otherwise the head is
// left as the session initialised it. Throws one mg::Error naming the file and the first
// missing tensors or mismatched shapes (another depth or width), for any tensor but the head.
ResNetWeightsReport load_resnet_weights(Session& session, const io::ModelFolder& weights,
                                        const models::ResNetConfig& config);

// The depth and width a ResNet state dict describes, from its names and shapes (layer3 block
// count, conv3 presence, conv1 width); num_classes from fc. Throws mg::Error naming the file when
// the names are not a ResNet's.
models::ResNetConfig resnet_config_of_weights(const io::ModelFolder& weights);

}  // namespace mg::runtime
