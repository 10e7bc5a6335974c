#include "cli/training_run.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace mg::cli {

std::vector<io::TensorRecord> session_tensors(const Session& session) {
  std::vector<io::TensorRecord> tensors;
  for (const std::string& name : session.persistent_names()) {
    const std::vector<float> values = session.read(name);
    io::TensorRecord record;
    record.name = name;
    record.dtype = DType::f32;
    record.shape = session.leaf_type(name).shape;
    record.bytes.resize(values.size() * sizeof(float));
    std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
    tensors.push_back(std::move(record));
  }
  return tensors;
}

void load_tensors(Session& session, const io::Checkpoint& checkpoint,
                  const std::filesystem::path& path, bool with_state) {
  for (const std::string& name : session.persistent_names()) {
    const bool is_state = name.rfind("optimizer.", 0) == 0;
    if (is_state && !with_state) continue;
    const io::TensorRecord* record = checkpoint.find(name);
    if (!record) {
      throw Error("checkpoint " + path.string() + " has no tensor '" + name + "'");
    }
    const TensorType type = session.leaf_type(name);
    if (record->dtype != DType::f32 || record->shape != type.shape) {
      throw Error("checkpoint " + path.string() + ": tensor '" + name + "' is " +
                  std::string(dtype_name(record->dtype)) + shape_string(record->shape) +
                  " but the program expects " + type_string(type));
    }
    std::vector<float> values(static_cast<size_t>(type.elements()));
    std::memcpy(values.data(), record->bytes.data(), values.size() * sizeof(float));
    session.write(name, values);
  }
}

std::vector<int64_t> predictions(const std::vector<float>& logits, int64_t rows, int64_t classes) {
  std::vector<int64_t> predicted(static_cast<size_t>(rows));
  for (int64_t row = 0; row < rows; ++row) {
    const float* begin = logits.data() + row * classes;
    predicted[row] = std::max_element(begin, begin + classes) - begin;
  }
  return predicted;
}

Evaluation evaluate(Session& session, const data::Dataset& dataset, int64_t batch,
                    int64_t classes) {
  for (int64_t example = 0; example < dataset.count; ++example) {
    const int32_t label = dataset.labels[static_cast<size_t>(example)];
    if (label < 0 || label >= classes) {
      throw Error("example " + std::to_string(example) + " of the data set has label " +
                  std::to_string(label) + ", but the model has " + std::to_string(classes) +
                  " classes (0.." + std::to_string(classes - 1) +
                  "): evaluate it on data with its own classes");
    }
  }
  Evaluation evaluation;
  evaluation.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  const int64_t image = dataset.image_size();
  std::vector<float> images(static_cast<size_t>(batch * image));
  const auto start_batch = [&](int64_t start) {
    const int64_t rows = std::min(batch, dataset.count - start);
    if (rows == batch) {
      session.set_input(models::kImagesInput, std::span(dataset.images)
                                                  .subspan(static_cast<size_t>(start * image),
                                                           static_cast<size_t>(batch * image)));
    } else {  // the last, partial batch, padded with zeros
      std::fill(images.begin(), images.end(), 0.0f);
      std::copy_n(dataset.images.begin() + start * image, rows * image, images.begin());
      session.set_input(models::kImagesInput, images);
    }
    session.start_run();
  };
  // Each batch is queued behind the one in flight, whose logits are read once it has finished.
  if (dataset.count > 0) start_batch(0);
  for (int64_t start = 0; start < dataset.count; start += batch) {
    if (start + batch < dataset.count) {
      start_batch(start + batch);
    } else {
      session.finish_run();
    }
    const int64_t rows = std::min(batch, dataset.count - start);
    const std::vector<int64_t> predicted = predictions(session.output("logits"), rows, classes);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t truth = dataset.labels[start + row];
      ++evaluation.confusion[truth][predicted[row]];
      evaluation.correct += predicted[row] == truth;
    }
    evaluation.examples += rows;
  }
  return evaluation;
}

void print_precision(Precision requested, const BuildReport& report) {
  const std::string name(precision_name(requested));
  if (requested == Precision::strict) {
    std::fprintf(stderr, "precision: strict (f32)\n");
  } else if (report.coop_matrix_dispatches > 0) {
    std::fprintf(stderr, "precision: %s (%zu of %zu dispatches on cooperative matrices)\n",
                 name.c_str(), report.coop_matrix_dispatches, report.dispatches);
  } else if (report.coop_matrix_available) {
    std::fprintf(stderr,
                 "precision: strict (%s was asked for, but every product is small enough to run "
                 "faster strict; MEGANEURA_COOP_GEMM_MIN=0 puts them on cooperative matrices)\n",
                 name.c_str());
  } else {
    std::fprintf(stderr,
                 "precision: strict (%s was asked for, but the device has no %s cooperative "
                 "matrices%s or MEGANEURA_NO_COOPMAT is set)\n",
                 name.c_str(), requested == Precision::bf16 ? "bfloat16" : "f16",
                 requested == Precision::bf16 ? " (VK_KHR_shader_bfloat16)" : "");
  }
}

}  // namespace mg::cli
