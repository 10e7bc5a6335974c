#include "cli/image_classification.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/resnet.hpp"

namespace mg::cli {

Evaluation evaluate_image_folder(Session& session, const data::ImageFolder& folder, int64_t batch,
                                 int64_t size, int64_t classes) {
  data::ImageBatcherOptions options;
  options.batch_size = batch;
  options.shuffle = false;
  options.drop_last = false;
  options.transform = data::imagenet_eval_transform(size);
  data::ImageFolderBatcher batcher(folder, options);
  Evaluation evaluation;
  evaluation.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  std::vector<float> images(static_cast<size_t>(batch * batcher.image_floats()));
  // The labels of the batch in flight and of the one queued behind it.
  std::vector<int32_t> labels(static_cast<size_t>(batch)), next_labels(labels.size());
  const int64_t batches = batcher.batches_per_epoch();
  const auto start_batch = [&](std::vector<int32_t>& batch_labels) {
    const int64_t rows = batcher.next(images, batch_labels);
    std::fill(images.begin() + rows * batcher.image_floats(), images.end(), 0.0f);
    session.set_input(models::kResNetImagesInput, images);
    session.start_run();
    return rows;
  };
  int64_t rows = start_batch(labels);
  for (int64_t index = 0; index < batches; ++index) {
    int64_t next_rows = 0;
    if (index + 1 < batches) {
      next_rows = start_batch(next_labels);
    } else {
      session.finish_run();
    }
    const std::vector<int64_t> predicted =
        predictions(session.output(models::kResNetLogitsOutput), rows, classes);
    for (int64_t row = 0; row < rows; ++row) {
      ++evaluation.confusion[labels[row]][predicted[row]];
      evaluation.correct += predicted[row] == labels[row];
    }
    evaluation.examples += rows;
    std::swap(labels, next_labels);
    rows = next_rows;
  }
  return evaluation;
}

std::vector<ClassScore> top_classes(std::span<const float> logits, int64_t count) {
  const double largest = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probabilities(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probabilities[i] = std::exp(double{logits[i]} - largest);
    total += probabilities[i];
  }
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t kept = static_cast<size_t>(std::clamp<int64_t>(count, 0, order.size()));
  std::partial_sort(order.begin(), order.begin() + kept, order.end(),
                    [&](int64_t a, int64_t b) { return probabilities[a] > probabilities[b]; });
  std::vector<ClassScore> top;
  for (size_t i = 0; i < kept; ++i) top.push_back({order[i], probabilities[order[i]] / total});
  return top;
}

}  // namespace mg::cli
