// ResNet parity with a PyTorch twin (tests/parity/resnet_twin.py: torchvision's structure and
// names, Debian's python3-torch on the CPU in float64). A tiny ResNet-18 (width 8, 64x64 images,
// batch 4, 10 classes) starts from the same seeded weights on both sides, batch-norm affine
// parameters and running statistics randomised too so that no normalisation is an identity.
// Compared: inference logits (running statistics), the first training step's logits, loss and
// every parameter's gradient (norm and values), every step's loss, and after five SGD steps with
// momentum every running statistic and parameter. The GPU side runs through mg::Session
// (Lavapipe in CI). A ResNet-50 at the benchmark's shape runs the same checks on GPUs only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "io/safetensors.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"
#include "models/resnet.hpp"

namespace mg {
namespace {

constexpr int64_t kBatch = 4;
constexpr int kSteps = 5;

struct ParityCase {
  int depth;
  int64_t width;
  int64_t side;  // images are side x side
  // Relative L2 bounds: logits and losses; gradient norms; gradient values; running statistics
  // and parameters after the steps.
  double forward, gradient_norm, gradient, state;
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

void expect_parity(const ParityCase& parity) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                          ("meganeura-resnet-parity-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  models::ResNetConfig config;
  config.depth = parity.depth;
  config.width = parity.width;
  config.num_classes = 10;
  const int64_t side = parity.side;
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.01;
  optimizer.momentum = 0.9;

  Graph training = models::build_resnet(config, kBatch, side, side, true);
  const Tensors weights = seeded_weights(training, 21);
  const Tensor labels_input = input(training, models::kResNetLabelsInput, {kBatch}, DType::i32);
  const Tensor loss =
      cross_entropy(Tensor(&training, training.output(models::kResNetLogitsOutput)), labels_input);
  const TrainingGraph gradients = add_training(training, loss.id(), optimizer);
  for (const auto& [parameter, gradient] : gradients.gradients) {
    training.set_output("grad." + training.node(parameter).name, gradient);
  }
  const Graph inference = models::build_resnet(config, kBatch, side, side, false);

  io::SafetensorsFile weights_file;
  for (const auto& [name, values] : weights) {
    const ValueId leaf = training.find_leaf(name);
    weights_file.tensors.push_back(
        record_of(name, DType::f32, training.type(leaf).shape, values.data()));
  }
  io::write_safetensors(directory / "weights.safetensors", weights_file);

  std::mt19937_64 generator(5);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(kSteps * kBatch * 3 * side * side));
  std::vector<int32_t> labels(static_cast<size_t>(kSteps * kBatch));
  for (float& value : images) value = pixel(generator);
  for (int32_t& label : labels) label = static_cast<int32_t>(generator() % config.num_classes);
  io::SafetensorsFile batches;
  batches.tensors.push_back(
      record_of("images", DType::f32, {kSteps, kBatch, 3, side, side}, images.data()));
  batches.tensors.push_back(record_of("labels", DType::i32, {kSteps, kBatch}, labels.data()));
  io::write_safetensors(directory / "batches.safetensors", batches);
  const size_t image_floats = images.size() / kSteps;
  const auto step_images = [&](int step) {
    return std::span<const float>(images).subspan(step * image_floats, image_floats);
  };

  Tensors gpu;
  {
    Session session(inference);
    for (const auto& [name, values] : weights) session.write(name, values);
    session.set_input(models::kResNetImagesInput, step_images(0));
    session.run();
    gpu["eval.logits"] = session.output(models::kResNetLogitsOutput);
  }
  {
    Session session(training);
    for (const auto& [name, values] : weights) session.write(name, values);
    std::vector<float> losses;
    for (int step = 0; step < kSteps; ++step) {
      session.set_input(models::kResNetImagesInput, step_images(step));
      session.set_input(models::kResNetLabelsInput,
                        std::span<const int32_t>(labels).subspan(step * kBatch, kBatch));
      for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
        if (session.has_input(name)) {
          session.set_input(name, std::vector<float>{static_cast<float>(value)});
        }
      }
      session.run();
      losses.push_back(session.scalar_output("loss"));
      if (step > 0) continue;
      gpu["train.logits"] = session.output(models::kResNetLogitsOutput);
      for (const auto& [name, values] : weights) {
        if (training.node(training.find_leaf(name)).op == "parameter") {
          gpu["grad." + name] = session.output("grad." + name);
        }
      }
    }
    gpu["train.losses"] = losses;
    for (const auto& [name, values] : weights) gpu["final." + name] = session.read(name);
  }

  const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/resnet_twin.py";
  std::ostringstream command;
  command << "/usr/bin/python3 " << script << " " << directory / "weights.safetensors"
          << " " << directory / "batches.safetensors"
          << " " << directory / "results.safetensors"
          << " " << config.depth << " " << config.width << " " << config.num_classes << " "
          << kSteps << " " << optimizer.learning_rate << " " << optimizer.momentum << " > "
          << directory / "twin.log"
          << " 2>&1";
  if (std::system(command.str().c_str()) != 0) {
    std::ifstream log(directory / "twin.log");
    FAIL() << "the PyTorch twin failed: " << command.str() << "\n" << log.rdbuf();
  }
  const io::SafetensorsFile results = io::read_safetensors(directory / "results.safetensors");

  // The twin's state dict holds exactly the graph's names, plus num_batches_tracked.
  std::set<std::string> twin_names;
  for (const std::string& name : nlohmann::json::parse(results.metadata.at("state_dict_names"))
                                     .get<std::vector<std::string>>()) {
    if (!models::resnet_skips_tensor(name)) twin_names.insert(name);
  }
  std::set<std::string> graph_names;
  for (const auto& [name, values] : weights) graph_names.insert(name);
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
      parameters.check(record.name, error, parity.state);
    }
  }
  EXPECT_EQ(results.tensors.size(), gpu.size());
  std::printf(
      "worst relative errors: forward %s; gradient norms %s; gradients %s; running "
      "statistics %s; parameters %s\n",
      forward.summary().c_str(), gradient_norms.summary().c_str(),
      gradient_values.summary().c_str(), statistics.summary().c_str(),
      parameters.summary().c_str());
  std::filesystem::remove_all(directory);
}

// With 64x64 images the last stage keeps 2x2 values per image, 16 per channel in the batch. With
// 32x32 it would normalise 4 values per channel, and five SGD steps on so few are chaotic enough
// that PyTorch in float32 and in float64 already part ways.
TEST(ResNetParity, TinyResnet18MatchesThePyTorchTwin) {
  expect_parity({.depth = 18,
                 .width = 8,
                 .side = 64,
                 .forward = 1e-4,
                 .gradient_norm = 1e-3,
                 .gradient = 1e-3,
                 .state = 1e-5});
}

// The benchmark's shape (batch 4, 224x224) at full width: minutes on Lavapipe, so CI leaves it
// out; run it on a GPU with --gtest_also_run_disabled_tests.
TEST(ResNetParity, DISABLED_Resnet50MatchesThePyTorchTwin) {
  expect_parity({.depth = 50,
                 .width = 64,
                 .side = 224,
                 .forward = 1e-3,
                 .gradient_norm = 1e-3,
                 .gradient = 1e-2,
                 .state = 1e-4});
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
