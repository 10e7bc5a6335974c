#pragma once
// What `meganeura train` and `meganeura infer` share for ResNet image classifiers: evaluation
// over an image folder and the top classes of logits.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cli/arguments.hpp"
#include "cli/training_run.hpp"
#include "data/image_folder.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {

// Runs the inference session (input "images" [batch, 3, size, size], output "logits") over every
// image of `folder` once, with the evaluation transform (resize and centre crop), padding the
// last batch. Decoding runs on background threads.
Evaluation evaluate_image_folder(Session& session, const data::ImageFolder& folder, int64_t batch,
                                 int64_t size, int64_t classes);

struct ClassScore {
  int64_t index = 0;
  double probability = 0;
};

// The `count` most probable classes of one row of logits (softmax in double), most probable
// first.
std::vector<ClassScore> top_classes(std::span<const float> logits, int64_t count);

// `meganeura infer` for a checkpoint of a ResNet (model "architecture": "resnet"): the top
// --top classes of each image, or the accuracy over --data IMAGE_DIR; --json for machine output.
int image_infer(const Arguments& arguments, const io::Checkpoint& checkpoint,
                const std::filesystem::path& checkpoint_path);

}  // namespace mg::cli
