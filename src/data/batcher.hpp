#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "data/fashion_mnist.hpp"

namespace mg::data {

// Where a Batcher is in its stream of batches; saved in checkpoints so --resume continues with
// exactly the batches an uninterrupted run would have seen.
struct BatcherState {
  uint64_t seed = 0;
  int64_t batch_size = 0;
  int64_t epoch = 0;
  int64_t position = 0;  // examples of this epoch already handed out

  nlohmann::json to_json() const;
  // Throws mg::Error when a field is missing or not an integer.
  static BatcherState from_json(const nlohmann::json& json);
  bool operator==(const BatcherState&) const = default;
};

// The example order of epoch `epoch` over `count` examples: a permutation that depends only on
// (seed, epoch), so a restored run reproduces it, and that does not depend on the standard library
// (std::mt19937_64 driven directly); the identity when `shuffle` is false.
std::vector<uint32_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch, bool shuffle = true);

// The part of each batch that one of `count` ranks of a data-parallel run takes: the index-th of
// `count` equal runs of consecutive examples. The shards of all ranks make up the batch one
// process would take, and differ from each other (disjoint shards of every epoch, one seed).
struct Shard {
  int64_t index = 0;
  int64_t count = 1;
};

// Hands out fixed-size batches of a Dataset in the order epoch_order gives each epoch, so a
// restored state reproduces the rest of the run exactly.
class Batcher {
 public:
  // With drop_last the final partial batch of each epoch is skipped, so every batch is full.
  // `batch_size` is the whole batch; a shard of several needs drop_last and a batch size that
  // `shard.count` divides.
  Batcher(const Dataset& dataset, int64_t batch_size, uint64_t seed, bool shuffle = true,
          bool drop_last = true, Shard shard = {});

  // Copies this shard of the next batch into `images` ([shard_size, 1, rows, cols]) and `labels`
  // ([shard_size]) and returns how many examples it wrote (less than shard_size only for the
  // last batch of an epoch without drop_last). Starts the next epoch when this one is used up.
  int64_t next(std::span<float> images, std::span<int32_t> labels);

  int64_t batch_size() const { return batch_size_; }
  int64_t shard_size() const { return batch_size_ / shard_.count; }
  int64_t batches_per_epoch() const;
  int64_t epoch() const { return epoch_; }
  // True when the current epoch has no batch left; the next call to next() starts a new epoch.
  bool epoch_finished() const;

  BatcherState state() const { return {seed_, batch_size_, epoch_, position_}; }
  // Throws mg::Error when the state was saved with another seed or batch size, or is out of range.
  void restore(const BatcherState& state);

 private:
  void start_epoch(int64_t epoch);

  const Dataset& dataset_;
  int64_t batch_size_;
  uint64_t seed_;
  bool shuffle_;
  bool drop_last_;
  Shard shard_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<uint32_t> order_;
};

}  // namespace mg::data
