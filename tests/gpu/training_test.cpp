// End-to-end training on the GPU against the f64 reference interpreter, and the memory planner
// against a plan without reuse.
#include <random>

#include "harness.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"

namespace mg {
namespace {

struct Batch {
  std::vector<float> features;
  std::vector<int32_t> labels;
};

Batch random_batch(std::mt19937_64& generator, int64_t rows, int64_t features, int64_t classes) {
  Batch batch;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < rows * features; ++i) batch.features.push_back(normal(generator));
  for (int64_t i = 0; i < rows; ++i) {
    batch.labels.push_back(static_cast<int32_t>(generator() % static_cast<uint64_t>(classes)));
  }
  return batch;
}

Graph small_mlp(int64_t rows, int64_t features, int64_t classes, const OptimizerConfig& optimizer) {
  Graph graph;
  const Tensor x = input(graph, "x", {rows, features});
  const Tensor labels = input(graph, "labels", {rows}, DType::i32);
  const Tensor w1 = parameter(graph, "model.fc1.weight", {16, features}, Init::uniform(-0.4, 0.4));
  const Tensor b1 = parameter(graph, "model.fc1.bias", {16}, Init::uniform(-0.1, 0.1));
  const Tensor w2 = parameter(graph, "model.fc2.weight", {classes, 16}, Init::uniform(-0.4, 0.4));
  const Tensor hidden = gelu(linear(x, w1, b1), GeluApproximation::tanh);
  const Tensor loss = cross_entropy(linear(hidden, w2), labels, 0.1);
  add_training(graph, loss.id(), optimizer);
  return graph;
}

// Runs `steps` training steps on the GPU and on the reference with the same batches and
// returns the largest relative loss difference.
double train_and_compare(const Graph& graph, int64_t rows, int64_t features, int64_t classes,
                         const OptimizerConfig& optimizer, int steps, SessionOptions options = {}) {
  options.validation = true;
  Session session(graph, options);
  Environment environment;
  initialise_leaves(graph, environment, options.seed);
  std::mt19937_64 generator(99);
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const Batch batch = random_batch(generator, rows, features, classes);
    session.set_input("x", batch.features);
    session.set_input("labels", batch.labels);
    environment.leaves["x"] =
        HostTensor({rows, features}, {batch.features.begin(), batch.features.end()});
    environment.leaves["labels"] = HostTensor({rows}, {batch.labels.begin(), batch.labels.end()});
    std::map<std::string, double> inputs = optimizer_inputs(optimizer, step);
    // With loss scaling the GPU runs at LossScaler's first scale, the reference unscaled.
    if (optimizer.loss_scaling) inputs[kLossScaleInput] = 1.0;
    for (const auto& [name, value] : inputs) {
      if (session.has_input(name))
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
      environment.leaves[name] = HostTensor({}, value);
    }
    if (optimizer.loss_scaling)
      session.set_input(kLossScaleInput, std::vector<float>{LossScaler::kInitialScale});
    session.run();
    const std::vector<HostTensor> values = mg::step(graph, environment);
    const double reference = values[graph.output("loss")].data[0];
    const double gpu = session.scalar_output("loss");
    worst = std::max(worst, std::abs(gpu - reference) / std::abs(reference));
  }
  EXPECT_EQ(session.validation_messages(), 0u);
  return worst;
}

TEST(GpuTraining, AdamMatchesReferenceOverTwentySteps) {
  OptimizerConfig optimizer;
  optimizer.learning_rate = 0.01;
  const Graph graph = small_mlp(8, 12, 3, optimizer);
  EXPECT_LT(train_and_compare(graph, 8, 12, 3, optimizer, 20), 1e-4);
}

TEST(GpuTraining, SgdNesterovWithClippingMatchesReference) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.05;
  optimizer.momentum = 0.9;
  optimizer.nesterov = true;
  optimizer.clip_norm = 0.5;
  optimizer.weight_decay = 0.01;
  const Graph graph = small_mlp(8, 12, 3, optimizer);
  EXPECT_LT(train_and_compare(graph, 8, 12, 3, optimizer, 20), 1e-4);
}

// The GPU at LossScaler's first scale trains as the reference unscaled: the reciprocal folded
// into the update (SGD's momentum buffer; with weight decay, a multiply before it) undoes the
// seed. SGD, whose step grows with the gradient, unlike Adam's or a clipped one.
TEST(GpuTraining, LossScaledSgdMatchesReference) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.05;
  optimizer.momentum = 0.9;
  optimizer.skip_non_finite = true;
  optimizer.loss_scaling = true;
  for (double weight_decay : {0.0, 0.01}) {
    optimizer.weight_decay = weight_decay;
    optimizer.nesterov = weight_decay > 0;
    const Graph graph = small_mlp(8, 12, 3, optimizer);
    EXPECT_LT(train_and_compare(graph, 8, 12, 3, optimizer, 10), 1e-4) << weight_decay;
  }
}

// A scale that takes f32 gradients past the largest f32 value drops the step with the loss
// finite, leaving parameters and momentum bit for bit; the step run again at LossScaler's
// first scale applies as the reference's unscaled step.
TEST(GpuTraining, LossScaleOverflowDropsTheStep) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.1;
  optimizer.momentum = 0.9;
  OptimizerConfig scaled = optimizer;
  scaled.skip_non_finite = true;
  scaled.loss_scaling = true;
  const int64_t size = 64;
  const auto build = [&](const OptimizerConfig& config) {
    Graph graph;
    const Tensor p = parameter(graph, "p", {size}, Init::uniform(-1.0, 1.0));
    const Tensor target = input(graph, "target", {size});
    add_training(graph, sum_all(square(p - target) * 0.5).id(), config);
    return graph;
  };
  const Graph graph = build(scaled), reference_graph = build(optimizer);
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  std::mt19937_64 generator(17);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> start(size), target(size);
  for (float& value : start) value = normal(generator) / 100.0f;
  for (float& value : target) value = normal(generator);
  session.write("p", start);
  session.set_input("target", target);
  Environment environment;
  environment.leaves["p"] = HostTensor({size}, {start.begin(), start.end()});
  initialise_leaves(reference_graph, environment, options.seed);
  environment.leaves["target"] = HostTensor({size}, {target.begin(), target.end()});
  const auto run = [&](double loss_scale) {
    std::map<std::string, double> inputs = optimizer_inputs(scaled, 0);
    inputs[kLossScaleInput] = loss_scale;
    for (const auto& [name, value] : inputs) {
      if (session.has_input(name))
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
    }
    session.run();
    return session.scalar_output(kNonFiniteOutput);
  };
  const std::vector<float> parameters = session.read("p");
  const std::vector<float> momentum = session.read("optimizer.p.momentum");
  EXPECT_EQ(run(1e38), 1.0);
  EXPECT_TRUE(std::isfinite(session.scalar_output("loss")));
  EXPECT_EQ(session.read("p"), parameters);
  EXPECT_EQ(session.read("optimizer.p.momentum"), momentum);
  EXPECT_EQ(run(LossScaler::kInitialScale), 0.0);
  for (const auto& [name, value] : optimizer_inputs(optimizer, 0))
    environment.leaves[name] = HostTensor({}, value);
  mg::step(reference_graph, environment);
  const std::vector<float> got = session.read("p");
  const std::vector<double>& want = environment.leaves.at("p").data;
  for (int64_t i = 0; i < size; ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << i;
  EXPECT_EQ(session.validation_messages(), 0u);
}

TEST(GpuTraining, PlannerReuseGivesBitIdenticalResults) {
  OptimizerConfig optimizer;
  const Graph graph =
      models::build_classifier_training(models::ClassifierConfig{"mlp", 8, 4}, 6, optimizer);
  std::mt19937_64 generator(5);
  const Batch batch = random_batch(generator, 6, 64, 4);
  std::vector<std::vector<float>> losses, weights;
  for (bool reuse : {true, false}) {
    SessionOptions options;
    options.reuse_memory = reuse;
    options.validation = true;
    Session session(graph, options);
    std::vector<float> trajectory;
    for (int step = 0; step < 3; ++step) {
      session.set_input(models::kImagesInput, batch.features);
      session.set_input(models::kLabelsInput, batch.labels);
      for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
      }
      session.run();
      trajectory.push_back(session.scalar_output("loss"));
    }
    losses.push_back(trajectory);
    weights.push_back(session.read("model.fc1.weight"));
    EXPECT_EQ(session.validation_messages(), 0u);
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(weights[0], weights[1]);
}

// Steps queued behind each other (Session::start_run, as `meganeura train` runs them): each
// step's inputs are set while the step before it is in flight, and its loss is read after the
// next one was started. Losses, parameters and the optimizer state match the same steps run one
// by one with every input set each step, bit for bit; the queued steps get the (constant)
// learning rate once, before the first step, and it holds for every step although the steps
// alternate between two input stagings. output() before any run finished is an error.
TEST(GpuTraining, QueuedStepsMatchStepsRunOneByOne) {
  OptimizerConfig optimizer;
  optimizer.learning_rate = 0.01;
  const Graph graph = small_mlp(8, 12, 3, optimizer);
  std::mt19937_64 generator(17);
  std::vector<Batch> batches;
  for (int step = 0; step < 7; ++step) batches.push_back(random_batch(generator, 8, 12, 3));
  const auto set_step = [&](Session& session, int step, bool learning_rate) {
    session.set_input("x", batches[static_cast<size_t>(step)].features);
    session.set_input("labels", batches[static_cast<size_t>(step)].labels);
    for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
      if (session.has_input(name) && (name != kLearningRateInput || learning_rate))
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
    }
  };
  std::vector<std::vector<float>> losses(2), weights(2), moments(2);
  for (const bool queued : {false, true}) {
    SessionOptions options;
    options.validation = true;
    Session session(graph, options);
    EXPECT_THROW(session.output("loss"), Error);
    std::vector<float>& trajectory = losses[queued ? 1 : 0];
    if (queued) {
      set_step(session, 0, true);
      session.start_run();
      for (int step = 1; step < 7; ++step) {
        set_step(session, step, false);
        session.start_run();  // step - 1 has finished
        trajectory.push_back(session.scalar_output("loss"));
      }
      session.finish_run();
      trajectory.push_back(session.scalar_output("loss"));
    } else {
      for (int step = 0; step < 7; ++step) {
        set_step(session, step, true);
        session.run();
        trajectory.push_back(session.scalar_output("loss"));
      }
    }
    weights[queued ? 1 : 0] = session.read("model.fc1.weight");
    for (const std::string& name : session.persistent_names()) {
      if (name.find("fc2.weight") != std::string::npos && name != "model.fc2.weight")
        moments[queued ? 1 : 0] = session.read(name);
    }
    EXPECT_EQ(session.validation_messages(), 0u);
  }
  ASSERT_EQ(losses[0].size(), 7u);
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_FALSE(moments[0].empty());
  EXPECT_EQ(moments[0], moments[1]);
  // Different batches give different losses, so equal trajectories are not all one value.
  EXPECT_NE(losses[0][0], losses[0][6]);
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// Split-K of convolution weight gradients (on by default on GPUs, off on CPU devices; forced
// here): grouped, with K = 8 * 10 * 10 = 800 in three slices of 272 that cut images, on the
// device's default kernels and on conv_igemm.comp. The split costs one reduction dispatch.
void check_split_weight_gradients() {
  const auto build = [](Graph& graph, std::vector<Tensor>& in) {
    Conv2dOptions options;
    options.groups = 2;
    const Tensor y = conv2d(in[0], in[1], std::nullopt, options);
    const auto grads = gradients(graph, y.id(), {in[1].id()}, in[2].id());
    graph.set_output("weight_grad", grads.at(in[1].id()));
  };
  const std::vector<testing::HarnessInput> inputs{
      {"x", {8, 4, 12, 12}}, {"w", {4, 2, 3, 3}}, {"seed", {8, 4, 10, 10}}};
  size_t split_dispatches = 0, whole_dispatches = 0;
  {
    const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    testing::check_on_gpu(inputs, build, 1e-5, 7, {}, &split_dispatches);
  }
  const testing::ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  testing::check_on_gpu(inputs, build, 1e-5, 7, {}, &whole_dispatches);
  EXPECT_EQ(split_dispatches, whole_dispatches + 1);
}

TEST(GpuTraining, SplitKWeightGradientsMatchReference) {
  check_split_weight_gradients();
}

TEST(GpuTraining, SplitKWeightGradientsMatchReferenceOnGpuKernels) {
  const testing::ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_split_weight_gradients();
}

}  // namespace
}  // namespace mg
