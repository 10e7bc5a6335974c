#include "data/batcher.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "io/json_limits.hpp"
#include "meganeura/error.hpp"

namespace mg::data {

std::vector<uint32_t> epoch_order(int64_t count, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<uint32_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0u);
  if (!shuffle || order.empty()) return order;
  // Mixing the epoch into the seed gives each epoch its own order while keeping it a pure
  // function of (seed, epoch).
  std::mt19937_64 random(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
  // Fisher-Yates with a multiply-shift range reduction: std::shuffle and
  // std::uniform_int_distribution are implementation-defined, this is not.
  for (size_t i = order.size() - 1; i > 0; --i) {
    const auto j = static_cast<size_t>((static_cast<unsigned __int128>(random()) * (i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

nlohmann::json BatcherState::to_json() const {
  return {{"seed", seed}, {"batch_size", batch_size}, {"epoch", epoch}, {"position", position}};
}

BatcherState BatcherState::from_json(const nlohmann::json& json) {
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!json.is_object() || !json.contains(key) || !json[key].is_number_integer()) {
      throw Error(std::string("batcher state ") + io::json_excerpt(json) + " has no integer \"" +
                  key + "\"");
    }
    return json[key];
  };
  return {field("seed").get<uint64_t>(), field("batch_size").get<int64_t>(),
          field("epoch").get<int64_t>(), field("position").get<int64_t>()};
}

Batcher::Batcher(const Dataset& dataset, int64_t batch_size, uint64_t seed, bool shuffle,
                 bool drop_last, Shard shard)
    : dataset_(dataset),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle),
      drop_last_(drop_last),
      shard_(shard) {
  if (batch_size <= 0)
    throw Error("batch size must be positive, got " + std::to_string(batch_size));
  if (shard.count <= 0 || shard.index < 0 || shard.index >= shard.count)
    throw Error("shard " + std::to_string(shard.index) + " of " + std::to_string(shard.count) +
                " does not exist");
  if (shard.count > 1 && (!drop_last || batch_size % shard.count != 0))
    throw Error("a batch of " + std::to_string(batch_size) + " cannot be split into " +
                std::to_string(shard.count) +
                " equal shards: give a batch size they divide (and full batches only)");
  if (dataset.count <= 0) throw Error("cannot make batches from an empty dataset");
  if (drop_last && batch_size > dataset.count) {
    throw Error("batch size " + std::to_string(batch_size) + " is larger than the dataset (" +
                std::to_string(dataset.count) + " examples), so every batch would be dropped");
  }
  start_epoch(0);
}

int64_t Batcher::batches_per_epoch() const {
  return drop_last_ ? dataset_.count / batch_size_
                    : (dataset_.count + batch_size_ - 1) / batch_size_;
}

bool Batcher::epoch_finished() const {
  const int64_t remaining = dataset_.count - position_;
  return drop_last_ ? remaining < batch_size_ : remaining <= 0;
}

void Batcher::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  position_ = 0;
  order_ = epoch_order(dataset_.count, seed_, epoch, shuffle_);
}

int64_t Batcher::next(std::span<float> images, std::span<int32_t> labels) {
  const auto image_size = static_cast<size_t>(dataset_.image_size());
  const int64_t rows = shard_size();
  if (images.size() < static_cast<size_t>(rows) * image_size ||
      labels.size() < static_cast<size_t>(rows)) {
    throw Error("batch buffers hold " + std::to_string(images.size()) + " pixels and " +
                std::to_string(labels.size()) + " labels, but a batch of " + std::to_string(rows) +
                " needs " + std::to_string(rows * dataset_.image_size()) + " and " +
                std::to_string(rows));
  }
  if (epoch_finished()) start_epoch(epoch_ + 1);
  // Shards exist only with full batches (drop_last), so only a single shard is ever short.
  const int64_t count = std::min(batch_size_, dataset_.count - position_);
  const int64_t first = position_ + shard_.index * rows;
  const int64_t copied = std::min(rows, count);
  for (int64_t i = 0; i < copied; ++i) {
    const size_t example = order_[static_cast<size_t>(first + i)];
    std::memcpy(images.data() + i * image_size, dataset_.images.data() + example * image_size,
                image_size * sizeof(float));
    labels[i] = dataset_.labels[example];
  }
  position_ += count;
  return copied;
}

void Batcher::restore(const BatcherState& state) {
  if (state.seed != seed_ || state.batch_size != batch_size_) {
    throw Error("cannot resume batches saved with seed " + std::to_string(state.seed) +
                " and batch size " + std::to_string(state.batch_size) + " into a run with seed " +
                std::to_string(seed_) + " and batch size " + std::to_string(batch_size_));
  }
  if (state.epoch < 0 || state.position < 0 || state.position > dataset_.count) {
    throw Error("cannot resume batches at epoch " + std::to_string(state.epoch) + " position " +
                std::to_string(state.position) + ": the dataset has " +
                std::to_string(dataset_.count) + " examples");
  }
  start_epoch(state.epoch);
  position_ = state.position;
}

}  // namespace mg::data
