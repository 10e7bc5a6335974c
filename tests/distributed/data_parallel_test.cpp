// DataParallelTrainer against the f64 reference interpreter running add_training's single
// program on the global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "meganeura/distributed.hpp"
#include "models/classifier.hpp"
#include "ops/interpreter.hpp"

namespace mg {
namespace {

// Rank 0 of two whose other rank always holds the same values: a sum doubles them. Two ranks fed
// the same batch X make the global batch [X; X], whose mean loss and gradients are X's.
class MirroredCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  void start_sum(std::span<float> values) override {
    ++sums;
    for (float& value : values) value *= 2;
  }
  void wait_all() override {}
  void sum(std::span<double> values) override {
    for (double& value : values) value *= 2;
  }
  void broadcast(std::span<std::byte>, int) override {}
  int sums = 0;

 protected:
  void abort_job(int) override {}
};

const models::ClassifierConfig kModel{"mlp", 8, 4};
constexpr int64_t kBatch = 6;

// Trains `steps` steps with the trainer and with the reference on the same random batches;
// returns the largest relative loss difference, and checks every parameter at the end.
double compare_with_reference(const OptimizerConfig& optimizer,
                              std::shared_ptr<Communicator> communicator, int steps,
                              DataParallelOptions parallel = {}) {
  const Graph forward = models::build_classifier_loss(kModel, kBatch);
  SessionOptions options;
  options.validation = true;
  options.seed = 7;
  DataParallelTrainer trainer(forward, forward.output("loss"), optimizer, communicator, options,
                              parallel);
  const Graph fused = models::build_classifier_training(kModel, kBatch, optimizer);
  Environment environment;
  initialise_leaves(fused, environment, options.seed);

  std::mt19937_64 generator(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(kBatch * 64));
  std::vector<int32_t> labels(static_cast<size_t>(kBatch));
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    for (float& pixel : images) pixel = normal(generator);
    for (int32_t& label : labels) label = static_cast<int32_t>(generator() % 4);
    trainer.set_input(models::kImagesInput, images);
    trainer.set_input(models::kLabelsInput, labels);
    trainer.step(step);
    environment.leaves[models::kImagesInput] =
        HostTensor({kBatch, 1, 8, 8}, {images.begin(), images.end()});
    environment.leaves[models::kLabelsInput] = HostTensor({kBatch}, {labels.begin(), labels.end()});
    for (const auto& [name, value] : optimizer_inputs(optimizer, step))
      environment.leaves[name] = HostTensor({}, value);
    const std::vector<HostTensor> values = mg::step(fused, environment);
    const double reference = values[fused.output("loss")].data[0];
    worst = std::max(worst, std::abs(trainer.loss() - reference) / std::abs(reference));
    EXPECT_EQ(trainer.output("logits").size(), static_cast<size_t>(kBatch * 4));
  }
  for (const std::string& name : trainer.state().persistent_names()) {
    const std::vector<float> gpu = trainer.state().read(name);
    const HostTensor& reference = environment.leaves.at(name);
    double difference = 0, norm = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
      difference += std::pow(gpu[i] - reference.data[i], 2);
      norm += std::pow(reference.data[i], 2);
    }
    EXPECT_LT(std::sqrt(difference), 1e-4 * std::max(std::sqrt(norm), 1e-3)) << name;
  }
  EXPECT_EQ(trainer.state().validation_messages(), 0u);
  return worst;
}

TEST(DataParallel, OneProcessMatchesAddTrainingWithAdamAndClipping) {
  OptimizerConfig optimizer;
  optimizer.learning_rate = 0.01;
  optimizer.clip_norm = 0.5;
  EXPECT_LT(compare_with_reference(optimizer, single_process_communicator(), 8), 1e-4);
}

// Two ranks: the sums of the mirrored gradients are divided by two before clipping and the
// update; small buckets put each gradient in a sum of its own.
TEST(DataParallel, TwoRanksAverageBeforeClippingAndAccumulation) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.05;
  optimizer.momentum = 0.9;
  optimizer.clip_norm = 0.3;
  optimizer.accumulation_steps = 2;
  const auto communicator = std::make_shared<MirroredCommunicator>();
  EXPECT_LT(compare_with_reference(optimizer, communicator, 6, {.bucket_bytes = 64}), 1e-4);
  EXPECT_EQ(communicator->sums, 6 * 6);  // six parameters, six steps
}

// Plain SGD: a gradient that is not divided by the number of ranks, or divided twice, changes
// every update (clipping and Adam's normalisation would hide it).
TEST(DataParallel, BucketsGatherGradientsUpToTheirSize) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::sgd;
  optimizer.learning_rate = 0.1;
  optimizer.momentum = 0;
  const auto communicator = std::make_shared<MirroredCommunicator>();
  EXPECT_LT(compare_with_reference(optimizer, communicator, 3), 1e-4);
  EXPECT_EQ(communicator->sums, 3);  // every gradient in one bucket of 25 MiB
}

// Overlap: the gradient program runs in segments, and each bucket's sum starts when the segment
// that finishes its gradients has run, while the GPU still has later segments to run. The
// parameters are those of the trainer that sums after the whole gradient program, bit for bit.
TEST(DataParallel, SumsStartWhileBackwardStillRuns) {
  OptimizerConfig optimizer;
  optimizer.learning_rate = 0.01;
  const Graph forward = models::build_classifier_loss(kModel, kBatch);
  SessionOptions options;
  options.validation = true;
  options.seed = 3;
  const auto overlapped_ranks = std::make_shared<MirroredCommunicator>();
  const auto blocking_ranks = std::make_shared<MirroredCommunicator>();
  DataParallelTrainer overlapped(forward, forward.output("loss"), optimizer, overlapped_ranks,
                                 options, {.bucket_bytes = 64, .overlap = true});
  DataParallelTrainer blocking(forward, forward.output("loss"), optimizer, blocking_ranks, options,
                               {.bucket_bytes = 64, .overlap = false});
  std::mt19937_64 generator(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(kBatch * 64));
  std::vector<int32_t> labels(static_cast<size_t>(kBatch));
  for (int step = 0; step < 3; ++step) {
    for (float& pixel : images) pixel = normal(generator);
    for (int32_t& label : labels) label = static_cast<int32_t>(generator() % 4);
    for (DataParallelTrainer* trainer : {&overlapped, &blocking}) {
      trainer->set_input(models::kImagesInput, images);
      trainer->set_input(models::kLabelsInput, labels);
      trainer->step(step);
    }
    EXPECT_EQ(overlapped.loss(), blocking.loss());
  }
  for (const std::string& name : overlapped.state().persistent_names())
    EXPECT_EQ(overlapped.state().read(name), blocking.state().read(name)) << name;
  EXPECT_EQ(overlapped_ranks->sums, blocking_ranks->sums);

  const DataParallelTrainer::StepTimes times = overlapped.last_step_times();
  ASSERT_GE(times.segments, 3u);  // one bucket a parameter, finished at different dispatches
  EXPECT_GT(times.sums_started_during_backward, 0u);
  EXPECT_EQ(blocking.last_step_times().segments, 1u);
  EXPECT_EQ(blocking.last_step_times().sums_started_during_backward, 0u);
  using Kind = DataParallelTrainer::StepEvent::Kind;
  std::vector<size_t> finished, summed;
  std::optional<size_t> first_sum, last_submission;
  const std::vector<DataParallelTrainer::StepEvent> events = overlapped.last_step_events();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == Kind::segment_finished) finished.push_back(events[i].index);
    if (events[i].kind == Kind::sum_started) {
      summed.push_back(events[i].index);
      if (!first_sum) first_sum = i;
    }
    if (events[i].kind == Kind::segment_submitted && events[i].index + 1 == times.segments)
      last_submission = i;
  }
  std::vector<size_t> in_order(times.segments), buckets(6);
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] = i;
  EXPECT_EQ(finished, in_order);
  EXPECT_EQ(summed, buckets);  // every rank starts the sums in bucket order
  ASSERT_TRUE(first_sum && last_submission);
  EXPECT_LT(*first_sum, *last_submission);  // bucket 0 is summed before backward's end is queued
  EXPECT_EQ(overlapped.state().validation_messages(), 0u);
}

TEST(DataParallel, RejectsANonScalarLossAndAMissingCommunicator) {
  const Graph forward = models::build_classifier_loss(kModel, kBatch);
  EXPECT_THROW(
      DataParallelTrainer(forward, forward.output("logits"), {}, single_process_communicator()),
      Error);
  EXPECT_THROW(DataParallelTrainer(forward, forward.output("loss"), {}, nullptr), Error);
}

TEST(DataParallel, RefusesLossScalingForNow) {
  const Graph forward = models::build_classifier_loss(kModel, kBatch);
  OptimizerConfig optimizer;
  optimizer.skip_non_finite = optimizer.loss_scaling = true;
  try {
    DataParallelTrainer(forward, forward.output("loss"), optimizer, single_process_communicator());
    ADD_FAILURE() << "loss scaling was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("loss scaling is not supported in data-parallel"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace mg
