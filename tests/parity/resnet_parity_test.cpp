// ResNet parity with a PyTorch twin (tests/parity/resnet_twin.py: torchvision's structure and
// names, Debian's python3-torch on the CPU in float64). A tiny ResNet-18 (width 8, 64x64 images,
// batch 4, 10 classes) starts from the same seeded weights on both sides, batch-norm affine
// parameters and running statistics randomised too so that no normalisation is an identity.
// Compared: inference logits (running statistics), the first training step's logits, loss and
// every parameter's gradient (norm and values), every step's loss, and after five SGD steps with
// momentum every running statistic and parameter. The GPU side runs through mg::Session
// (Lavapipe in CI). torchvision's own ResNet-50 at the benchmark's shape runs the same checks
// where bench/resnet_parity_h200.py has written its side.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "io/model_folder.hpp"
#include "io/safetensors.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"
#include "models/resnet.hpp"
#include "runtime/resnet_runtime.hpp"

namespace mg {
namespace {

constexpr int64_t kBatch = 4;

struct ParityCase {
  int depth;
  int64_t width;
  int64_t side;  // images are side x side
  int steps;     // SGD steps in training mode
  // Relative L2 bounds: logits and losses; gradient norms; gradient values; running statistics
  // and parameters after the steps.
  double forward, gradient_norm, gradient, state, parameter;
};

using Tensors = std::map<std::string, std::vector<float>>;

io::TensorRecord record_of(const std::string& name, DType dtype, const Shape& shape,
                           const void* data) {
  io::TensorRecord record{name, dtype, shape, {}};
  record.bytes.resize(static_cast<size_t>(element_count(shape)) * 4);
  std::memcpy(record.bytes.data(), data, record.bytes.size());
  return record;
}

std::vector<float> floats_of(const io::TensorRecord& record) {
  std::vector<float> values(record.bytes.size() / 4);
  std::memcpy(values.data(), record.bytes.data(), record.bytes.size());
  return values;
}

// Values for every parameter and state leaf of the model: its own initialisation for the
// random ones (convolutions, fc), and random values near the defaults for the constant ones
// (batch-norm weight and running variance near 1, bias and running mean near 0).
Tensors seeded_weights(const Graph& graph, uint64_t seed) {
  std::mt19937_64 generator(seed);
  Tensors weights;
  for (const Node& node : graph.nodes()) {
    if (node.op != "parameter" && node.op != "state") continue;
    const Init init = leaf_init(node);
    std::vector<float>& values = weights[node.name];
    for (int64_t i = 0; i < node.type.elements(); ++i) {
      double value = 0;
      switch (init.kind) {
        case Init::Kind::normal:
          value = std::normal_distribution<double>(init.a, init.b)(generator);
          break;
        case Init::Kind::uniform:
          value = std::uniform_real_distribution<double>(init.a, init.b)(generator);
          break;
        case Init::Kind::ones:
          value = std::uniform_real_distribution<double>(0.5, 1.5)(generator);
          break;
        default:
          value = std::uniform_real_distribution<double>(-0.3, 0.3)(generator);
          break;
      }
      values.push_back(static_cast<float>(value));
    }
  }
  return weights;
}

double norm_of(const std::vector<float>& values) {
  double sum = 0;
  for (float value : values) sum += double{value} * value;
  return std::sqrt(sum);
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double difference = 0;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    const double delta = double{actual[i]} - expected[i];
    difference += delta * delta;
  }
  return std::sqrt(difference) / std::max(norm_of(expected), 1e-30);
}

class Worst {
 public:
  void check(const std::string& name, double error, double tolerance) {
    EXPECT_LT(error, tolerance) << name;
    if (error > error_) error_ = error, name_ = name;
  }
  std::string summary() const { return name_ + " " + std::to_string(error_); }

 private:
  double error_ = -1;
  std::string name_;
};

struct Batches {
  std::vector<float> images;    // [steps, batch, 3, side, side]
  std::vector<int32_t> labels;  // [steps, batch]
};

OptimizerConfig parity_optimizer() {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.01;
  optimizer.momentum = 0.9;
  return optimizer;
}

// Our side: inference logits on batch 0 (running statistics), then `steps` SGD steps in
// training mode, keeping the first step's logits and gradients, every loss, and every parameter
// and running statistic at the end; named as the twins name their results.
Tensors run_graph(const models::ResNetConfig& config, const ParityCase& parity,
                  const Batches& batches, const std::function<void(Session&)>& load_weights,
                  const SessionOptions& options) {
  const int64_t side = parity.side;
  const OptimizerConfig optimizer = parity_optimizer();
  Graph training = models::build_resnet(config, kBatch, side, side, true);
  const Tensor labels_input = input(training, models::kResNetLabelsInput, {kBatch}, DType::i32);
  const Tensor loss =
      cross_entropy(Tensor(&training, training.output(models::kResNetLogitsOutput)), labels_input);
  const TrainingGraph gradients = add_training(training, loss.id(), optimizer);
  std::vector<std::string> parameters;
  for (const auto& [parameter, gradient] : gradients.gradients) {
    parameters.push_back(training.node(parameter).name);
    training.set_output("grad." + parameters.back(), gradient);
  }
  const size_t image_floats = batches.images.size() / parity.steps;
  const auto step_images = [&](int step) {
    return std::span<const float>(batches.images).subspan(step * image_floats, image_floats);
  };

  Tensors gpu;
  {
    Session session(models::build_resnet(config, kBatch, side, side, false), options);
    load_weights(session);
    session.set_input(models::kResNetImagesInput, step_images(0));
    session.run();
    gpu["eval.logits"] = session.output(models::kResNetLogitsOutput);
  }
  Session session(training, options);
  load_weights(session);
  std::vector<float> losses;
  for (int step = 0; step < parity.steps; ++step) {
    session.set_input(models::kResNetImagesInput, step_images(step));
    session.set_input(models::kResNetLabelsInput,
                      std::span<const int32_t>(batches.labels).subspan(step * kBatch, kBatch));
    for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
      if (session.has_input(name)) {
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
      }
    }
    session.run();
    losses.push_back(session.scalar_output("loss"));
    if (step > 0) continue;
    gpu["train.logits"] = session.output(models::kResNetLogitsOutput);
    for (const std::string& name : parameters) gpu["grad." + name] = session.output("grad." + name);
  }
  gpu["train.losses"] = losses;
  for (const std::string& name : session.persistent_names()) {
    if (!name.starts_with("optimizer.")) gpu["final." + name] = session.read(name);
  }
  return gpu;
}

// Compares our results with a twin's (safetensors of the same names; metadata
// "state_dict_names"), each kind against its bound.
void compare(const io::SafetensorsFile& results, const Tensors& gpu, const ParityCase& parity) {
  // The twin's state dict holds exactly the graph's names, plus num_batches_tracked.
  std::set<std::string> twin_names;
  for (const std::string& name : nlohmann::json::parse(results.metadata.at("state_dict_names"))
                                     .get<std::vector<std::string>>()) {
    if (!models::resnet_skips_tensor(name)) twin_names.insert(name);
  }
  std::set<std::string> graph_names;
  for (const auto& [name, values] : gpu) {
    if (name.starts_with("final.")) graph_names.insert(name.substr(6));
  }
  EXPECT_EQ(twin_names, graph_names);

  Worst forward, gradient_values, gradient_norms, statistics, parameters;
  for (const io::TensorRecord& record : results.tensors) {
    ASSERT_TRUE(gpu.count(record.name)) << record.name << " is missing on the GPU side";
    const std::vector<float> expected = floats_of(record);
    const std::vector<float>& actual = gpu.at(record.name);
    const double error = relative_l2(actual, expected);
    if (record.name.ends_with("logits") || record.name == "train.losses") {
      forward.check(record.name, error, parity.forward);
    } else if (record.name.starts_with("grad.")) {
      gradient_norms.check(record.name,
                           std::abs(norm_of(actual) - norm_of(expected)) / norm_of(expected),
                           parity.gradient_norm);
      gradient_values.check(record.name, error, parity.gradient);
    } else if (record.name.ends_with("running_mean") || record.name.ends_with("running_var")) {
      statistics.check(record.name, error, parity.state);
    } else {
      parameters.check(record.name, error, parity.parameter);
    }
  }
  EXPECT_EQ(results.tensors.size(), gpu.size());
  std::printf(
      "worst relative errors: forward %s; gradient norms %s; gradients %s; running "
      "statistics %s; parameters %s\n",
      forward.summary().c_str(), gradient_norms.summary().c_str(),
      gradient_values.summary().c_str(), statistics.summary().c_str(),
      parameters.summary().c_str());
}

void expect_parity(const ParityCase& parity) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                          ("meganeura-resnet-parity-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  models::ResNetConfig config;
  config.depth = parity.depth;
  config.width = parity.width;
  config.num_classes = 10;
  const int64_t side = parity.side;
  const OptimizerConfig optimizer = parity_optimizer();

  const Graph graph = models::build_resnet(config, kBatch, side, side, true);
  const Tensors weights = seeded_weights(graph, 21);
  io::SafetensorsFile weights_file;
  for (const auto& [name, values] : weights) {
    const ValueId leaf = graph.find_leaf(name);
    weights_file.tensors.push_back(
        record_of(name, DType::f32, graph.type(leaf).shape, values.data()));
  }
  io::write_safetensors(directory / "weights.safetensors", weights_file);

  std::mt19937_64 generator(5);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  Batches batches;
  batches.images.resize(static_cast<size_t>(parity.steps * kBatch * 3 * side * side));
  batches.labels.resize(static_cast<size_t>(parity.steps * kBatch));
  for (float& value : batches.images) value = pixel(generator);
  for (int32_t& label : batches.labels)
    label = static_cast<int32_t>(generator() % config.num_classes);
  io::SafetensorsFile batches_file;
  batches_file.tensors.push_back(record_of(
      "images", DType::f32, {parity.steps, kBatch, 3, side, side}, batches.images.data()));
  batches_file.tensors.push_back(
      record_of("labels", DType::i32, {parity.steps, kBatch}, batches.labels.data()));
  io::write_safetensors(directory / "batches.safetensors", batches_file);

  const Tensors gpu = run_graph(
      config, parity, batches,
      [&](Session& session) {
        for (const auto& [name, values] : weights) session.write(name, values);
      },
      SessionOptions{});

  const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/resnet_twin.py";
  std::ostringstream command;
  command << "/usr/bin/python3 " << script << " " << directory / "weights.safetensors"
          << " " << directory / "batches.safetensors"
          << " " << directory / "results.safetensors"
          << " " << config.depth << " " << config.width << " " << config.num_classes << " "
          << parity.steps << " " << optimizer.learning_rate << " " << optimizer.momentum << " > "
          << directory / "twin.log"
          << " 2>&1";
  if (std::system(command.str().c_str()) != 0) {
    std::ifstream log(directory / "twin.log");
    FAIL() << "the PyTorch twin failed: " << command.str() << "\n" << log.rdbuf();
  }
  compare(io::read_safetensors(directory / "results.safetensors"), gpu, parity);
  std::filesystem::remove_all(directory);
}

// With 64x64 images the last stage keeps 2x2 values per image, 16 per channel in the batch. With
// 32x32 it would normalise 4 values per channel, and five SGD steps on so few are chaotic enough
// that PyTorch in float32 and in float64 already part ways.
TEST(ResNetParity, TinyResnet18MatchesThePyTorchTwin) {
  expect_parity({.depth = 18,
                 .width = 8,
                 .side = 64,
                 .steps = 5,
                 .forward = 1e-4,
                 .gradient_norm = 1e-3,
                 .gradient = 1e-3,
                 .state = 1e-5,
                 .parameter = 1e-5});
}

// torchvision's own resnet50() with random weights: bench/resnet_parity_h200.py saves its state
// dict (num_batches_tracked included) and ten batches as safetensors, computes torchvision's
// results in float64, and runs this test with MEGANEURA_RESNET50_PARITY naming that folder and
// MEGANEURA_RESNET50_PRECISION strict or fast. The weights load through the CLI's loader
// (runtime::load_resnet_weights). Minutes on Lavapipe, so it skips without the folder.
TEST(ResNetParity, Resnet50MatchesTorchvision) {
  const char* folder = std::getenv("MEGANEURA_RESNET50_PARITY");
  if (!folder) {
    GTEST_SKIP() << "MEGANEURA_RESNET50_PARITY is not set: bench/resnet_parity_h200.py writes "
                    "torchvision's side and runs this test";
  }
  const std::filesystem::path directory = folder;
  const char* precision_text = std::getenv("MEGANEURA_RESNET50_PRECISION");
  SessionOptions options;
  options.precision = parse_precision(precision_text ? precision_text : "strict");
  const bool fast = options.precision == Precision::fast;
  const ParityCase parity{.depth = 50,
                          .width = 64,
                          .side = 224,
                          .steps = 10,
                          .forward = fast ? 1e-2 : 1e-4,
                          .gradient_norm = fast ? 5e-2 : 1e-3,
                          .gradient = fast ? 2e-1 : 1e-2,
                          .state = fast ? 1e-2 : 1e-5,
                          .parameter = fast ? 1e-2 : 1e-4};
  const io::ModelFolder weights = io::ModelFolder::open(directory / "resnet50.safetensors");
  const models::ResNetConfig config = runtime::resnet_config_of_weights(weights);
  ASSERT_EQ(config.depth, 50);
  const io::SafetensorsFile batches_file = io::read_safetensors(directory / "batches.safetensors");
  Batches batches;
  batches.images = floats_of(*batches_file.find("images"));
  const io::TensorRecord& labels = *batches_file.find("labels");
  batches.labels.resize(labels.bytes.size() / 4);
  std::memcpy(batches.labels.data(), labels.bytes.data(), labels.bytes.size());
  ASSERT_EQ(batches.labels.size(), static_cast<size_t>(parity.steps * kBatch));
  const Tensors gpu = run_graph(
      config, parity, batches,
      [&](Session& session) {
        const runtime::ResNetWeightsReport report =
            runtime::load_resnet_weights(session, weights, config);
        EXPECT_TRUE(report.head_loaded);
      },
      options);
  compare(io::read_safetensors(directory / "torchvision.safetensors"), gpu, parity);
}

std::map<std::string, std::string> shapes_of(const nlohmann::json& names, bool skip_counts) {
  std::map<std::string, std::string> shapes;
  for (const auto& [name, shape] : names.items()) {
    if (!skip_counts || !models::resnet_skips_tensor(name)) {
      shapes[name] = shape_string(shape.get<Shape>());
    }
  }
  return shapes;
}

// Names and shapes recorded from the real torchvision and transformers by
// tests/parity/resnet_reference_names.py, which runs where those libraries are installed.
TEST(ResNetReferenceNames, TorchvisionAndHuggingFaceNamesMapOntoTheGraph) {
  const std::filesystem::path fixture =
      std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests/fixtures/resnet/reference_names.json";
  if (!std::filesystem::exists(fixture)) {
    GTEST_SKIP() << "no " << fixture
                 << ": run tests/parity/resnet_reference_names.py with torchvision and "
                    "transformers installed";
  }
  const nlohmann::json reference = nlohmann::json::parse(std::ifstream(fixture));
  for (const auto& [model, depth] : {std::pair{"resnet18", 18}, std::pair{"resnet50", 50}}) {
    const nlohmann::json& entry = reference.at(model);
    const models::ResNetConfig config = models::resnet_config_from_hf(entry.at("hf_config"));
    EXPECT_EQ(config.depth, depth);
    EXPECT_EQ(config.num_classes, 1000);
    EXPECT_EQ(config.width, 64);
    const Graph graph = models::build_resnet(config, 1, 64, 64, false);
    std::map<std::string, std::string> graph_shapes;
    for (const Node& node : graph.nodes()) {
      if (node.op == "parameter" || node.op == "state") {
        graph_shapes[node.name] = shape_string(node.type.shape);
      }
    }
    EXPECT_EQ(shapes_of(entry.at("torchvision"), true), graph_shapes) << model;
    std::map<std::string, std::string> mapped;
    for (const auto& [name, shape] : shapes_of(entry.at("hf"), false)) {
      const std::optional<std::string> torchvision = models::torchvision_name_of_hf(name);
      if (!torchvision) {
        EXPECT_TRUE(name.ends_with(".num_batches_tracked")) << name << " maps to nothing";
        continue;
      }
      EXPECT_TRUE(mapped.emplace(*torchvision, shape).second)
          << "two names map to " << *torchvision;
    }
    EXPECT_EQ(mapped, graph_shapes) << model;
  }
}

}  // namespace
}  // namespace mg
