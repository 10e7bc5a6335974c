#include <chrono>
#include <cstdio>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "cli/image_classification.hpp"
#include "cli/training_run.hpp"
#include "io/image.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp = R"(usage: meganeura infer CHECKPOINT [IMAGE...] [options]

Loads a checkpoint written by 'meganeura train' into an inference program (no gradients, its
own smaller memory plan). Without images it evaluates the Fashion-MNIST test set and prints
'test accuracy: NN.NN%' and the confusion matrix. With images (PNG or PGM, any size, scaled to
28x28 grey; like Fashion-MNIST, a light object on a dark background) it prints each image's
class.

A ResNet checkpoint (from 'meganeura train --model resnet50 --data IMAGE_DIR') prints each
image's --top classes with their probabilities (JPEG, PNG, BMP or PGM; resized and centre-cropped
as in validation), or with --data IMAGE_DIR and no images the accuracy over that image folder.

  --top N        classes printed per image (ResNet; default 5)
  --json         ResNet: print the results as JSON on stdout
  --batch N      images per GPU run (default 500)
  --device SEL   device index or part of its name (default: best available)
  --precision P  strict (default), fast (f16 operands on cooperative matrices, f32
                 accumulation; devices without them run strict) or bf16 (bfloat16 operands)
  --data DIR     Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist), or for a
                 ResNet an image folder to evaluate
  --trace FILE   write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of the last
                 batch and print its GPU time; the timestamps make every dispatch wait for
                 the one before, so images/s drops while tracing
)";

void print_confusion(const Evaluation& evaluation) {
  std::printf("confusion matrix (rows: true class, columns: predicted):\n%14s", "");
  for (size_t c = 0; c < evaluation.confusion.size(); ++c) std::printf("%6zu", c);
  std::printf("\n");
  for (size_t truth = 0; truth < evaluation.confusion.size(); ++truth) {
    const std::string name = truth < data::kFashionMnistClasses.size()
                                 ? std::string(data::kFashionMnistClasses[truth])
                                 : std::to_string(truth);
    std::printf("%2zu %-11s", truth, name.c_str());
    for (int64_t count : evaluation.confusion[truth])
      std::printf("%6lld", static_cast<long long>(count));
    std::printf("\n");
  }
}

// Writes the last run's trace to `path` and prints its GPU time, the sum of its dispatches'.
void write_trace(const Session& session, const std::string& path) {
  session.write_trace(path);
  double gpu_ms = 0;
  const std::vector<DispatchProfile> dispatches = session.profile();
  for (const DispatchProfile& dispatch : dispatches) gpu_ms += dispatch.duration_ms;
  std::fprintf(stderr, "trace: %s (%zu dispatches, %.1f us of GPU time for one batch)\n",
               path.c_str(), dispatches.size(), 1000 * gpu_ms);
}

}  // namespace

int infer_command(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura infer", words,
                            {"batch", "device", "precision", "data", "trace", "top"},
                            {"help", "json"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (arguments.positional().empty()) {
    throw Error("missing CHECKPOINT (usage: meganeura infer CHECKPOINT [IMAGE...])");
  }
  require_writable_file(arguments, "trace");
  const std::filesystem::path checkpoint_path = arguments.positional()[0];
  const io::Checkpoint checkpoint = io::load_checkpoint(checkpoint_path);
  if (checkpoint.model_config.is_object() &&
      checkpoint.model_config.value("architecture", "") == "resnet") {
    return image_infer(arguments, checkpoint, checkpoint_path);
  }
  const models::ClassifierConfig model =
      models::ClassifierConfig::from_json(checkpoint.model_config);
  const std::vector<std::string> image_paths(arguments.positional().begin() + 1,
                                             arguments.positional().end());
  const int64_t batch = image_paths.empty() ? arguments.integer("batch", 500)
                                            : static_cast<int64_t>(image_paths.size());
  if (batch <= 0) throw Error("--batch must be positive");

  SessionOptions options;
  options.device = arguments.text("device", "");
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.profile = arguments.has("trace");
  Session session(models::build_classifier(model, batch), options);
  load_tensors(session, checkpoint, checkpoint_path, false);
  std::fprintf(stderr, "device: %s\nloaded %s (%s, step %lld); inference program: %zu dispatches\n",
               session.report().device.c_str(), checkpoint_path.c_str(), model.architecture.c_str(),
               static_cast<long long>(checkpoint.step), session.report().dispatches);
  print_precision(options.precision, session.report());

  if (image_paths.empty()) {
    const data::Dataset test_set = data::load_fashion_mnist(
        arguments.text("data", std::string(data::kFashionMnistDir)), "test");
    const auto start = std::chrono::steady_clock::now();
    const Evaluation evaluation = evaluate(session, test_set, batch, model.classes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print_confusion(evaluation);
    std::printf("evaluated %lld images in %.3f s (%.0f images/s, batch %lld)\n",
                static_cast<long long>(evaluation.examples), seconds, evaluation.examples / seconds,
                static_cast<long long>(batch));
    std::printf("test accuracy: %.2f%%\n", 100 * evaluation.accuracy());
    if (arguments.has("trace")) write_trace(session, arguments.text("trace", ""));
    return 0;
  }

  const int64_t side = model.image_size;
  std::vector<float> images(static_cast<size_t>(batch * side * side));
  for (size_t i = 0; i < image_paths.size(); ++i) {
    const io::GrayImage gray = io::resize(io::to_gray(io::read_image(image_paths[i])),
                                          static_cast<int>(side), static_cast<int>(side));
    std::copy(gray.pixels.begin(), gray.pixels.end(), images.begin() + i * side * side);
  }
  session.set_input(models::kImagesInput, images);
  session.run();
  const std::vector<float> logits = session.output("logits");
  const std::vector<int64_t> predicted = predictions(logits, batch, model.classes);
  for (size_t i = 0; i < image_paths.size(); ++i) {
    const int64_t c = predicted[i];
    const std::string name = c < static_cast<int64_t>(data::kFashionMnistClasses.size())
                                 ? std::string(data::kFashionMnistClasses[c])
                                 : std::to_string(c);
    std::printf("%s: %s (class %lld)\n", image_paths[i].c_str(), name.c_str(),
                static_cast<long long>(c));
  }
  if (arguments.has("trace")) write_trace(session, arguments.text("trace", ""));
  return 0;
}

}  // namespace mg::cli
