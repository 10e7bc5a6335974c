#pragma once
// Pieces of `meganeura train` and `meganeura infer` shared between them: the checkpoint layout
// of a classifier session and the evaluation loop.
#include <filesystem>
#include <string>
#include <vector>

#include "data/fashion_mnist.hpp"
#include "io/checkpoint.hpp"
#include "meganeura/session.hpp"
#include "models/classifier.hpp"

namespace mg::cli {

// Every parameter and state leaf of `session` as checkpoint tensors.
std::vector<io::TensorRecord> session_tensors(const Session& session);

// Writes the checkpoint's tensors into `session`: every parameter must be present; state
// (optimizer moments) only when `with_state`. Throws mg::Error naming the file and tensor.
void load_tensors(Session& session, const io::Checkpoint& checkpoint,
                  const std::filesystem::path& path, bool with_state);

struct Evaluation {
  int64_t examples = 0;
  int64_t correct = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true class][predicted class]
  double accuracy() const { return examples ? static_cast<double>(correct) / examples : 0.0; }
};

// Runs the inference session (input "images" [batch, 1, H, W], output "logits") over the
// whole dataset, padding the last batch.
Evaluation evaluate(Session& session, const data::Dataset& dataset, int64_t batch, int64_t classes);

// One line on stderr saying how the matrix products run: "precision: fast (12 of 30 dispatches
// on cooperative matrices)", or why fast fell back to strict.
void print_precision(Precision requested, const BuildReport& report);

std::vector<int64_t> predictions(const std::vector<float>& logits, int64_t rows, int64_t classes);

}  // namespace mg::cli
