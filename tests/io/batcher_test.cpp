#include "data/batcher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "scratch_dir.hpp"

namespace mg::data {
namespace {

using io::testing::expect_error;

// Image i is filled with the value i, so a batch reveals which examples it holds.
Dataset numbered_dataset(int64_t count) {
  Dataset dataset{count, 2, 3, {}, {}};
  for (int64_t i = 0; i < count; ++i) {
    dataset.images.insert(dataset.images.end(), 6, static_cast<float>(i));
    dataset.labels.push_back(static_cast<int32_t>(i % 10));
  }
  return dataset;
}

// The example indices of the next batch (checking each image matches its label).
std::vector<int64_t> next_indices(Batcher& batcher, std::vector<float>& images,
                                  std::vector<int32_t>& labels) {
  const int64_t count = batcher.next(images, labels);
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < count; ++i) {
    const auto index = static_cast<int64_t>(images[i * 6]);
    EXPECT_EQ(images[i * 6 + 5], images[i * 6]);
    EXPECT_EQ(labels[i], index % 10);
    indices.push_back(index);
  }
  return indices;
}

struct Buffers {
  explicit Buffers(int64_t batch) : images(batch * 6), labels(batch) {}
  std::vector<float> images;
  std::vector<int32_t> labels;
};

TEST(Batcher, EachEpochIsAPermutationAndEpochsDiffer) {
  const Dataset dataset = numbered_dataset(103);
  Batcher batcher(dataset, 10, /*seed=*/99, /*shuffle=*/true, /*drop_last=*/false);
  Buffers buffers(10);
  EXPECT_EQ(batcher.batches_per_epoch(), 11);
  std::vector<std::vector<int64_t>> epochs(2);
  for (auto& order : epochs) {
    for (int64_t b = 0; b < batcher.batches_per_epoch(); ++b) {
      const auto batch = next_indices(batcher, buffers.images, buffers.labels);
      EXPECT_EQ(batch.size(), b + 1 < batcher.batches_per_epoch() ? 10u : 3u);
      order.insert(order.end(), batch.begin(), batch.end());
    }
    EXPECT_TRUE(batcher.epoch_finished());
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(sorted[i], i);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_FALSE(std::is_sorted(epochs[0].begin(), epochs[0].end()));
}

TEST(Batcher, SameSeedSameBatchesOtherSeedOtherBatches) {
  const Dataset dataset = numbered_dataset(50);
  Batcher first(dataset, 8, 1), second(dataset, 8, 1), other(dataset, 8, 2);
  Buffers a(8), b(8), c(8);
  bool any_difference = false;
  for (int step = 0; step < 20; ++step) {
    const auto batch = next_indices(first, a.images, a.labels);
    EXPECT_EQ(batch, next_indices(second, b.images, b.labels));
    any_difference |= batch != next_indices(other, c.images, c.labels);
  }
  EXPECT_TRUE(any_difference);
}

TEST(Batcher, DropLastGivesOnlyFullBatchesAndCountsEpochs) {
  const Dataset dataset = numbered_dataset(25);
  Batcher batcher(dataset, 8, 4);
  Buffers buffers(8);
  EXPECT_EQ(batcher.batches_per_epoch(), 3);
  for (int step = 0; step < 7; ++step) {
    EXPECT_EQ(batcher.next(buffers.images, buffers.labels), 8);
    EXPECT_EQ(batcher.epoch(), step / 3);
  }
}

TEST(Batcher, UnshuffledBatcherKeepsDatasetOrder) {
  const Dataset dataset = numbered_dataset(9);
  Batcher batcher(dataset, 4, 0, /*shuffle=*/false);
  Buffers buffers(4);
  EXPECT_EQ(next_indices(batcher, buffers.images, buffers.labels),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(next_indices(batcher, buffers.images, buffers.labels),
            (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(next_indices(batcher, buffers.images, buffers.labels),
            (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Batcher, RestoredStateContinuesExactly) {
  const Dataset dataset = numbered_dataset(70);
  Batcher original(dataset, 16, 2024);
  Buffers a(16), b(16);
  for (int step = 0; step < 6; ++step) next_indices(original, a.images, a.labels);
  // Through JSON, as a checkpoint's "extra" field would carry it.
  const BatcherState saved = BatcherState::from_json(original.state().to_json());
  EXPECT_EQ(saved, original.state());
  EXPECT_EQ(saved.epoch, 1);

  Batcher resumed(dataset, 16, 2024);
  resumed.restore(saved);
  for (int step = 0; step < 12; ++step) {
    EXPECT_EQ(next_indices(original, a.images, a.labels), next_indices(resumed, b.images, b.labels))
        << "step " << step;
  }
}

// Three ranks' shards of each batch are disjoint and, in rank order, the batch one process takes;
// their state is the unsharded batcher's, so a checkpoint of either resumes the other.
TEST(Batcher, ShardsOfRanksMakeUpTheBatchOfOneProcess) {
  const Dataset dataset = numbered_dataset(40);
  Batcher whole(dataset, 12, 5);
  std::vector<Batcher> shards;
  for (int64_t rank = 0; rank < 3; ++rank)
    shards.emplace_back(dataset, 12, 5, true, true, Shard{rank, 3});
  Buffers all(12), part(4);
  for (int step = 0; step < 7; ++step) {  // past an epoch's end (3 batches an epoch)
    std::vector<int64_t> joined;
    for (Batcher& shard : shards) {
      EXPECT_EQ(shard.shard_size(), 4);
      const auto indices = next_indices(shard, part.images, part.labels);
      joined.insert(joined.end(), indices.begin(), indices.end());
    }
    EXPECT_EQ(joined, next_indices(whole, all.images, all.labels)) << "step " << step;
    for (const Batcher& shard : shards) EXPECT_EQ(shard.state(), whole.state());
  }
  expect_error([&] { Batcher(dataset, 10, 5, true, true, Shard{0, 3}); }, {"3 equal shards"});
  expect_error([&] { Batcher(dataset, 12, 5, true, false, Shard{0, 3}); }, {"full batches"});
  expect_error([&] { Batcher(dataset, 12, 5, true, true, Shard{3, 3}); }, {"shard 3 of 3"});
}

TEST(Batcher, RestoreRejectsMismatchedRuns) {
  const Dataset dataset = numbered_dataset(30);
  Batcher batcher(dataset, 5, 1);
  expect_error([&] { batcher.restore({2, 5, 0, 0}); }, {"seed 2", "seed 1"});
  expect_error([&] { batcher.restore({1, 6, 0, 0}); }, {"batch size 6"});
  expect_error([&] { batcher.restore({1, 5, 0, 31}); }, {"position 31"});
  expect_error([&] { BatcherState::from_json({{"seed", 1}}); }, {"batch_size"});
}

TEST(Batcher, RejectsBadConfigurationsAndSmallBuffers) {
  const Dataset dataset = numbered_dataset(4);
  expect_error([&] { Batcher(dataset, 0, 1); }, {"batch size must be positive"});
  expect_error([&] { Batcher(dataset, 5, 1); }, {"larger than the dataset"});
  Batcher batcher(dataset, 2, 1);
  std::vector<float> images(6);
  std::vector<int32_t> labels(2);
  expect_error([&] { batcher.next(images, labels); }, {"batch buffers"});
}

}  // namespace
}  // namespace mg::data
