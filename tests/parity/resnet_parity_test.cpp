// ResNet parity with a PyTorch twin (tests/parity/resnet_twin.py: torchvision's structure and
// names, Debian's python3-torch on the CPU in float64, and in float32 as the yardstick of what
// float32 rounding alone does). A tiny ResNet-18 (width 8, 64x64 images, batch 4, 10 classes)
// starts from the same seeded weights on both sides, batch-norm affine parameters and running
// statistics randomised too so that no normalisation is an identity. Compared, chained:
// inference logits (running statistics), the first training step's logits, loss and every
// parameter's gradient (norm and values), every step's loss, and after five SGD steps with
// momentum every running statistic and parameter; then every step alone, from float64's state
// before it (parameters, running statistics, momentum buffers), against float64's state after
// it. The GPU side runs through mg::Session (Lavapipe in CI). torchvision's own ResNet-50 at the
// benchmark's shape runs the same checks where bench/resnet_parity_h200.py has written its side.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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
#include "meganeura/train.hpp"
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
  // Relative L2 bounds: logits and losses; gradient norms; gradient values (and momentum
  // buffers); running statistics and parameters after the steps. Each is a floor: a result may
  // also be off by up to kFloat32Factor times PyTorch's own float32 error in the same
  // comparison, which is the part of the difference float32 arithmetic alone explains.
  double forward, gradient_norm, gradient, state, parameter;
  bool amp_yardstick = false;  // fast precision: PyTorch AMP's error counts too (kAmpFactor)
};

// Chained SGD steps on a deep network with batch-norm statistics of four images amplify rounding
// from step to step: after ten steps PyTorch in float32 and in float64 part ways entirely. A
// result may therefore be up to this many times as far from float64 as PyTorch's float32 is.
constexpr double kFloat32Factor = 10;
// In fast precision a result may also be off by up to this many times PyTorch's own mixed
// precision's error (torch.autocast f16 with loss scaling; "amp." + name in the results, which
// bench/resnet_parity_h200.py writes on a GPU): on ResNet-50 with random weights and batch
// statistics of four images, f16 operands move the early layers' gradients by more than the
// fast floors, in PyTorch as here.
constexpr double kAmpFactor = 2;

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

double relative_norm_difference(const std::vector<float>& actual,
                                const std::vector<float>& expected) {
  return std::abs(norm_of(actual) - norm_of(expected)) / std::max(norm_of(expected), 1e-30);
}

// The twin's results by name, mapped (ResNet-50's hold a state per step): float64's under their
// names, PyTorch float32's under "float32." + name (tests/parity/resnet_twin.py, `reference`).
class Reference {
 public:
  explicit Reference(const std::filesystem::path& path)
      : file_(io::MappedSafetensors::open(path, "parity results")) {}
  std::vector<float> operator()(const std::string& name) const {
    const io::TensorView* tensor = file_.find(name);
    if (!tensor) {
      ADD_FAILURE() << "the twin's results have no " << name;
      return {};
    }
    std::vector<float> values(tensor->bytes.size() / 4);
    std::memcpy(values.data(), tensor->bytes.data(), tensor->bytes.size());
    return values;
  }
  const io::MappedSafetensors& file() const { return file_; }

 private:
  io::MappedSafetensors file_;
};

// One kind of result (logits, gradients, ...) of one comparison: every tensor's error and
// PyTorch's worst in the same comparison (float32's, or the yardstick with AMP's).
class KindCheck {
 public:
  explicit KindCheck(std::string label) : label_(std::move(label)) {}
  void add(const std::string& name, double error, double float32_error) {
    errors_.emplace_back(name, error);
    if (error > worst_) worst_ = error;
    float32_worst_ = std::max(float32_worst_, float32_error);
  }
  double worst() const { return worst_; }
  double float32_worst() const { return float32_worst_; }
  // Checks every tensor against `bound`; returns "label NAME error (PyTorch X, bound Y)".
  std::string check(double bound) const {
    std::string worst_name;
    double worst = -1;
    for (const auto& [name, error] : errors_) {
      EXPECT_LT(error, bound) << label_ << " " << name << " (PyTorch's worst " << float32_worst_
                              << ")";
      if (!(error <= worst)) worst = error, worst_name = name;
    }
    std::ostringstream line;
    line << label_ << " " << worst_name << " " << worst << " (PyTorch " << float32_worst_
         << ", bound " << bound << ")";
    return line.str();
  }

 private:
  std::string label_;
  std::vector<std::pair<std::string, double>> errors_;
  double worst_ = 0;
  double float32_worst_ = 0;
};

double bound_of(double floor, double float32_error) {
  return std::max(floor, kFloat32Factor * float32_error);
}

// PyTorch's own error in one comparison, which bound_of multiplies by kFloat32Factor: float32's,
// or with `amp` also PyTorch AMP's result under "amp." + name (where the results hold it),
// weighed so that the bound is kAmpFactor times AMP's error.
double yardstick(const Reference& reference, const std::string& name, bool amp,
                 double float32_error,
                 const std::function<double(const std::vector<float>&)>& error_of) {
  if (!amp || !reference.file().find("amp." + name)) return float32_error;
  return std::max(float32_error, kAmpFactor / kFloat32Factor * error_of(reference("amp." + name)));
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

bool is_running_statistic(const std::string& name) {
  return name.ends_with("running_mean") || name.ends_with("running_var");
}

struct Batches {
  std::vector<float> images;    // [steps, batch, 3, side, side]
  std::vector<int32_t> labels;  // [steps, batch]
};

// In fast precision with loss scaling, as PyTorch AMP trains (GradScaler): the products' f16
// operands would flush an untrained network's small cotangents to zero.
OptimizerConfig parity_optimizer(Precision precision = Precision::strict) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.01;
  optimizer.momentum = 0.9;
  optimizer.skip_non_finite = optimizer.loss_scaling = precision == Precision::fast;
  return optimizer;
}

class ParityRun {
 public:
  ParityRun(const models::ResNetConfig& config, const ParityCase& parity, const Batches& batches,
            std::function<void(Session&)> load_weights, const SessionOptions& options)
      : parity_(parity),
        batches_(batches),
        load_weights_(std::move(load_weights)),
        optimizer_(parity_optimizer(options.precision)),
        training_(models::build_resnet(config, kBatch, parity.side, parity.side, true)) {
    const int64_t side = parity.side;
    const Tensor labels_input = input(training_, models::kResNetLabelsInput, {kBatch}, DType::i32);
    const Tensor loss = cross_entropy(
        Tensor(&training_, training_.output(models::kResNetLogitsOutput)), labels_input);
    const TrainingGraph gradients = add_training(training_, loss.id(), optimizer_);
    for (const auto& [parameter, gradient] : gradients.gradients) {
      parameters_.push_back(training_.node(parameter).name);
      training_.set_output("grad." + parameters_.back(), gradient);
    }
    {
      Session session(models::build_resnet(config, kBatch, side, side, false), options);
      load_weights_(session);
      session.set_input(models::kResNetImagesInput, step_images(0));
      session.run();
      chained_["eval.logits"] = session.output(models::kResNetLogitsOutput);
    }
    session_ = std::make_unique<Session>(training_, options);
  }

  // Our side of the chained run: inference logits on batch 0 (running statistics), then the
  // steps in training mode, keeping the first step's logits and gradients, every loss, and every
  // parameter and running statistic at the end; named as the twins name their results.
  const Tensors& run_chained() {
    Session& session = *session_;
    load_weights_(session);
    std::vector<float> losses;
    for (int step = 0; step < parity_.steps; ++step) {
      losses.push_back(run_step(step));
      if (step > 0) continue;
      chained_["train.logits"] = session.output(models::kResNetLogitsOutput);
      for (const std::string& name : parameters_) {
        std::vector<float> gradient = session.output("grad." + name);
        for (float& value : gradient) value = static_cast<float>(value / loss_scale_);
        chained_["grad." + name] = std::move(gradient);
      }
    }
    chained_["train.losses"] = losses;
    for (const std::string& name : session.persistent_names()) {
      if (!name.starts_with("optimizer.")) chained_["final." + name] = session.read(name);
    }
    return chained_;
  }

  // Every step alone from the float64 chain's state before it (parameters, running statistics,
  // momentum), so that no earlier step's rounding is amplified into it; each is compared with
  // the chain's next state, as PyTorch float32 is from the same states. Even so, a float32 step
  // now and then takes a ReLU or max-pool decision near a tie the other way from float64, and
  // then the early layers' gradients, which batch norm's backward leaves as small differences of
  // large terms, move by percent: PyTorch's float32 does so at some steps and ours at others.
  // So the median over the steps of each kind's worst error is held to PyTorch float32's median
  // (an error in a step's arithmetic shows at every step), and every step to PyTorch float32's
  // largest over the steps.
  void compare_steps(const Reference& reference) {
    Session& session = *session_;
    const std::vector<float> losses = reference("train.losses");
    const std::vector<float> float32_losses = reference("float32.step.losses");
    const std::array<const char*, 4> labels{"loss", "momentum buffers (gradients)",
                                            "running statistics", "parameters"};
    const std::array<double, 4> floors{parity_.forward, parity_.gradient, parity_.state,
                                       parity_.parameter};
    std::vector<std::vector<KindCheck>> steps;  // [step][kind]
    for (int step = 0; step < parity_.steps; ++step) {
      if (step == 0) load_weights_(session);
      for (const std::string& name : session.persistent_names()) {
        if (step > 0) {
          session.write(name, reference("state" + std::to_string(step) + "." + name));
        } else if (name.starts_with("optimizer.")) {
          session.write(name, std::vector<float>(session.read(name).size(), 0.0f));
        }
      }
      const double loss = run_step(step);
      std::vector<KindCheck>& kinds = steps.emplace_back(labels.begin(), labels.end());
      const auto loss_error = [&](const std::vector<float>& step_losses) {
        return std::abs(step_losses[step] - losses[step]) / std::abs(losses[step]);
      };
      kinds[0].add("loss", std::abs(loss - losses[step]) / std::abs(losses[step]),
                   yardstick(reference, "step.losses", parity_.amp_yardstick,
                             loss_error(float32_losses), loss_error));
      const std::string next = "state" + std::to_string(step + 1) + ".";
      for (const std::string& name : session.persistent_names()) {
        const std::vector<float> expected = reference(next + name);
        const double error = relative_l2(session.read(name), expected);
        const double float32_error =
            yardstick(reference, next + name, parity_.amp_yardstick,
                      relative_l2(reference("float32." + next + name), expected),
                      [&](const std::vector<float>& amp) { return relative_l2(amp, expected); });
        kinds[name.starts_with("optimizer.") ? 1
              : is_running_statistic(name)   ? 2
                                             : 3]
            .add(name, error, float32_error);
      }
    }
    std::array<double, 4> every_step_bounds{};
    std::ostringstream medians;
    for (size_t kind = 0; kind < labels.size(); ++kind) {
      std::vector<double> ours, float32;
      for (const std::vector<KindCheck>& kinds : steps) {
        ours.push_back(kinds[kind].worst());
        float32.push_back(kinds[kind].float32_worst());
      }
      const double bound = bound_of(floors[kind], median_of(float32));
      EXPECT_LT(median_of(ours), bound)
          << "the median over the steps alone of the worst " << labels[kind] << " error";
      every_step_bounds[kind] =
          bound_of(floors[kind], *std::max_element(float32.begin(), float32.end()));
      medians << (kind ? "; " : "") << labels[kind] << " " << median_of(ours) << " (PyTorch "
              << median_of(float32) << ", bound " << bound << ")";
    }
    for (size_t step = 0; step < steps.size(); ++step) {
      std::printf("parity step %zu alone, from float64's state: %s; %s; %s; %s\n", step,
                  steps[step][0].check(every_step_bounds[0]).c_str(),
                  steps[step][1].check(every_step_bounds[1]).c_str(),
                  steps[step][2].check(every_step_bounds[2]).c_str(),
                  steps[step][3].check(every_step_bounds[3]).c_str());
    }
    std::printf("parity steps alone, median over the steps of the worst error: %s\n",
                medians.str().c_str());
  }

 private:
  std::span<const float> step_images(int step) const {
    const size_t floats = batches_.images.size() / parity_.steps;
    return std::span<const float>(batches_.images).subspan(step * floats, floats);
  }

  float run_step(int step) {
    Session& session = *session_;
    session.set_input(models::kResNetImagesInput, step_images(step));
    session.set_input(models::kResNetLabelsInput,
                      std::span<const int32_t>(batches_.labels).subspan(step * kBatch, kBatch));
    for (const auto& [name, value] : optimizer_inputs(optimizer_, step)) {
      if (session.has_input(name)) {
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
      }
    }
    if (!optimizer_.loss_scaling) {
      session.run();
      return session.scalar_output("loss");
    }
    // Each step from LossScaler's first scale, halved while the step is dropped. A dropped step
    // keeps the parameters and momentum, but batch norm's forward has moved the running
    // statistics: they are put back before the step runs again.
    std::map<std::string, std::vector<float>> statistics;
    for (const std::string& name : session.persistent_names())
      if (is_running_statistic(name)) statistics[name] = session.read(name);
    LossScaler scaler;
    for (;;) {
      loss_scale_ = scaler.start_step();
      session.set_input(kLossScaleInput, std::vector<float>{static_cast<float>(loss_scale_)});
      session.run();
      const float loss = session.scalar_output("loss");
      if (session.scalar_output(kNonFiniteOutput) == 0) return loss;
      if (scaler.end_step(true, std::isfinite(loss)) == LossScaler::StepEnd::non_finite)
        throw Error("step " + std::to_string(step) + " is not finite even without loss scaling");
      for (const auto& [name, values] : statistics) session.write(name, values);
    }
  }

  const ParityCase& parity_;
  const Batches& batches_;
  std::function<void(Session&)> load_weights_;
  const OptimizerConfig optimizer_;
  Graph training_;
  double loss_scale_ = 1.0;  // of the last step run
  std::vector<std::string> parameters_;
  std::unique_ptr<Session> session_;
  Tensors chained_;
};

// Compares our chained run with the twin's (metadata "state_dict_names"), each kind against its
// bound, and prints every step's loss beside PyTorch float32's.
void compare_chained(const Reference& reference, const Tensors& gpu, const ParityCase& parity) {
  // The twin's state dict holds exactly the graph's names, plus num_batches_tracked.
  std::set<std::string> twin_names;
  for (const std::string& name :
       nlohmann::json::parse(reference.file().metadata().at("state_dict_names"))
           .get<std::vector<std::string>>()) {
    if (!models::resnet_skips_tensor(name)) twin_names.insert(name);
  }
  std::set<std::string> graph_names;
  for (const auto& [name, values] : gpu) {
    if (name.starts_with("final.")) graph_names.insert(name.substr(6));
  }
  EXPECT_EQ(twin_names, graph_names);

  KindCheck forward("forward"), gradient_norms("gradient norms"), gradient_values("gradients"),
      statistics("running statistics"), parameters("parameters");
  size_t chained_results = 0;
  for (const io::TensorView& tensor : reference.file().tensors()) {
    const std::string& name = tensor.name;
    if (name.starts_with("float32.") || name.starts_with("amp.") || name.starts_with("state"))
      continue;
    ++chained_results;
    if (!gpu.count(name)) {
      ADD_FAILURE() << name << " is missing on the GPU side";
      continue;
    }
    const std::vector<float> expected = reference(name);
    const std::vector<float>& actual = gpu.at(name);
    const std::vector<float> float32 = reference("float32." + name);
    const double error = relative_l2(actual, expected);
    const auto l2_error = [&](const std::vector<float>& values) {
      return relative_l2(values, expected);
    };
    const double float32_error =
        yardstick(reference, name, parity.amp_yardstick, l2_error(float32), l2_error);
    if (name.ends_with("logits") || name == "train.losses") {
      forward.add(name, error, float32_error);
    } else if (name.starts_with("grad.")) {
      const auto norm_error = [&](const std::vector<float>& values) {
        return relative_norm_difference(values, expected);
      };
      gradient_norms.add(
          name, relative_norm_difference(actual, expected),
          yardstick(reference, name, parity.amp_yardstick, norm_error(float32), norm_error));
      gradient_values.add(name, error, float32_error);
    } else if (is_running_statistic(name)) {
      statistics.add(name, error, float32_error);
    } else {
      parameters.add(name, error, float32_error);
    }
  }
  EXPECT_EQ(chained_results, gpu.size());
  const std::vector<float> losses = reference("train.losses");
  const std::vector<float> float32_losses = reference("float32.train.losses");
  const std::vector<float>& our_losses = gpu.at("train.losses");
  for (size_t step = 0; step < std::min(losses.size(), our_losses.size()); ++step) {
    std::printf("parity chained step %zu: loss %.6f, float64 %.6f, PyTorch float32 %.6f\n", step,
                our_losses[step], losses[step], float32_losses[step]);
  }
  std::printf(
      "parity worst relative errors of the chained run: %s; %s; %s; %s; %s\n",
      forward.check(bound_of(parity.forward, forward.float32_worst())).c_str(),
      gradient_norms.check(bound_of(parity.gradient_norm, gradient_norms.float32_worst())).c_str(),
      gradient_values.check(bound_of(parity.gradient, gradient_values.float32_worst())).c_str(),
      statistics.check(bound_of(parity.state, statistics.float32_worst())).c_str(),
      parameters.check(bound_of(parity.parameter, parameters.float32_worst())).c_str());
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

  ParityRun run(
      config, parity, batches,
      [&](Session& session) {
        for (const auto& [name, values] : weights) session.write(name, values);
      },
      SessionOptions{});
  const Tensors& gpu = run.run_chained();

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
  const Reference reference(directory / "results.safetensors");
  compare_chained(reference, gpu, parity);
  run.compare_steps(reference);
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
  const io::ModelFolder weights = io::ModelFolder::open(directory / "resnet50.safetensors");
  const models::ResNetConfig config = runtime::resnet_config_of_weights(weights);
  ASSERT_EQ(config.depth, 50);
  const io::SafetensorsFile batches_file = io::read_safetensors(directory / "batches.safetensors");
  const io::TensorRecord& images = *batches_file.find("images");
  const io::TensorRecord& labels = *batches_file.find("labels");
  // The script's batches are [steps, batch, 3, side, side]: ten of 224x224 on the H200.
  ASSERT_EQ(images.shape.size(), 5u);
  ASSERT_EQ(images.shape[1], kBatch);
  const ParityCase parity{.depth = 50,
                          .width = 64,
                          .side = images.shape[3],
                          .steps = static_cast<int>(images.shape[0]),
                          .forward = fast ? 1e-2 : 1e-4,
                          .gradient_norm = fast ? 5e-2 : 1e-3,
                          .gradient = fast ? 2e-1 : 1e-2,
                          .state = fast ? 1e-2 : 1e-5,
                          .parameter = fast ? 1e-2 : 1e-4,
                          .amp_yardstick = fast};
  Batches batches;
  batches.images = floats_of(images);
  batches.labels.resize(labels.bytes.size() / 4);
  std::memcpy(batches.labels.data(), labels.bytes.data(), labels.bytes.size());
  ASSERT_EQ(batches.labels.size(), static_cast<size_t>(parity.steps * kBatch));
  ParityRun run(
      config, parity, batches,
      [&](Session& session) {
        const runtime::ResNetWeightsReport report =
            runtime::load_resnet_weights(session, weights, config);
        EXPECT_TRUE(report.head_loaded);
      },
      options);
  const Tensors& gpu = run.run_chained();
  const Reference reference(directory / "torchvision.safetensors");
  compare_chained(reference, gpu, parity);
  run.compare_steps(reference);
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
