#pragma once
// Small image classifiers for the train-to-deploy job: a CNN and an MLP over 28x28 grey images.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "meganeura/graph.hpp"
#include "meganeura/train.hpp"

namespace mg::models {

struct ClassifierConfig {
  std::string architecture = "cnn";  // "cnn" or "mlp"
  int64_t image_size = 28;
  int64_t classes = 10;

  // Identifies the model in checkpoints (no batch size: programs of any batch share weights).
  nlohmann::json to_json() const;
  static ClassifierConfig from_json(const nlohmann::json& json);  // throws mg::Error
};

inline constexpr const char* kImagesInput = "images";  // f32 [batch, 1, size, size]
inline constexpr const char* kLabelsInput = "labels";  // i32 [batch]

// Inference graph: output "logits" [batch, classes].
Graph build_classifier(const ClassifierConfig& config, int64_t batch);

// The graph of the loss (mean cross-entropy over the batch): outputs "logits" and "loss".
Graph build_classifier_loss(const ClassifierConfig& config, int64_t batch);

// Training graph: outputs "loss" and "logits", with the optimizer update of every parameter.
Graph build_classifier_training(const ClassifierConfig& config, int64_t batch,
                                const OptimizerConfig& optimizer);

}  // namespace mg::models
