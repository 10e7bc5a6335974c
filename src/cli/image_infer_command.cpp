// `meganeura infer CKPT IMAGE...` for ResNet checkpoints: the top classes of each image with
// their probabilities (class names from the checkpoint), or accuracy over an image folder.
#include <cstdio>
#include <random>

#include "cli/arguments.hpp"
#include "cli/image_classification.hpp"
#include "models/resnet.hpp"

namespace mg::cli {

int image_infer(const Arguments& arguments, const io::Checkpoint& checkpoint,
                const std::filesystem::path& checkpoint_path) {
  const models::ResNetConfig config = models::ResNetConfig::from_json(checkpoint.model_config);
  const int64_t size = checkpoint.extra.value("image_size", int64_t{224});
  std::vector<std::string> class_names =
      checkpoint.extra.value("classes", std::vector<std::string>());
  for (int64_t c = static_cast<int64_t>(class_names.size()); c < config.num_classes; ++c)
    class_names.push_back(std::to_string(c));
  const std::vector<std::string> image_paths(arguments.positional().begin() + 1,
                                             arguments.positional().end());
  const std::optional<std::string> data_dir = arguments.value("data");
  if (image_paths.empty() && !data_dir) {
    throw Error(
        "give IMAGE files to classify or --data IMAGE_DIR to evaluate (usage: meganeura "
        "infer CHECKPOINT IMAGE...)");
  }
  const int64_t top = arguments.integer("top", 5);
  if (top <= 0) throw Error("--top must be positive");
  const int64_t batch = arguments.integer(
      "batch",
      image_paths.empty() ? 32 : std::min<int64_t>(32, static_cast<int64_t>(image_paths.size())));
  if (batch <= 0) throw Error("--batch must be positive");

  SessionOptions options;
  options.device = arguments.text("device", "");
  options.precision = parse_precision(arguments.text("precision", "strict"));
  options.profile = arguments.has("trace");
  Session session(models::build_resnet(config, batch, size, size, false), options);
  load_tensors(session, checkpoint, checkpoint_path, false);
  std::fprintf(stderr,
               "device: %s\nloaded %s (resnet%d, %lld classes, %lldx%lld images, step %lld); "
               "inference program: %zu dispatches\n",
               session.report().device.c_str(), checkpoint_path.c_str(), config.depth,
               static_cast<long long>(config.num_classes), static_cast<long long>(size),
               static_cast<long long>(size), static_cast<long long>(checkpoint.step),
               session.report().dispatches);
  print_precision(options.precision, session.report());

  if (image_paths.empty()) {
    const data::ImageFolder folder(*data_dir);
    const auto start = std::chrono::steady_clock::now();
    const Evaluation evaluation =
        evaluate_image_folder(session, folder, batch, size, config.num_classes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (arguments.has("json")) {
      std::printf("%s\n", nlohmann::json{{"images", evaluation.examples},
                                         {"accuracy", evaluation.accuracy()},
                                         {"images_per_second", evaluation.examples / seconds}}
                              .dump()
                              .c_str());
    } else {
      std::printf("evaluated %lld images in %.3f s (%.0f images/s, batch %lld)\n",
                  static_cast<long long>(evaluation.examples), seconds,
                  evaluation.examples / seconds, static_cast<long long>(batch));
      std::printf("accuracy: %.2f%%\n", 100 * evaluation.accuracy());
    }
    if (arguments.has("trace")) session.write_trace(arguments.text("trace", ""));
    return 0;
  }

  const data::ImageTransform transform = data::imagenet_eval_transform(size);
  const int64_t image_floats = 3 * size * size;
  std::vector<float> images(static_cast<size_t>(batch * image_floats));
  nlohmann::json results = nlohmann::json::array();
  std::mt19937_64 unused_random;  // the evaluation transform draws no random numbers
  for (size_t first = 0; first < image_paths.size(); first += static_cast<size_t>(batch)) {
    const size_t count = std::min(image_paths.size() - first, static_cast<size_t>(batch));
    std::fill(images.begin(), images.end(), 0.0f);
    for (size_t i = 0; i < count; ++i) {
      data::apply_transform(io::read_image(image_paths[first + i]), transform, unused_random,
                            std::span(images).subspan(i * image_floats, image_floats));
    }
    session.set_input(models::kResNetImagesInput, images);
    session.run();
    const std::vector<float> logits = session.output(models::kResNetLogitsOutput);
    for (size_t i = 0; i < count; ++i) {
      const std::vector<ClassScore> scores =
          top_classes(std::span(logits).subspan(i * config.num_classes, config.num_classes), top);
      nlohmann::json entries = nlohmann::json::array();
      for (const ClassScore& score : scores) {
        entries.push_back({{"class", class_names[score.index]},
                           {"index", score.index},
                           {"probability", score.probability}});
      }
      results.push_back({{"image", image_paths[first + i]}, {"top", entries}});
      if (arguments.has("json")) continue;
      std::printf("%s\n", image_paths[first + i].c_str());
      for (const ClassScore& score : scores) {
        std::printf("  %6.2f%%  %s\n", 100 * score.probability, class_names[score.index].c_str());
      }
    }
  }
  if (arguments.has("json")) std::printf("%s\n", results.dump(2).c_str());
  if (arguments.has("trace")) session.write_trace(arguments.text("trace", ""));
  return 0;
}

}  // namespace mg::cli
