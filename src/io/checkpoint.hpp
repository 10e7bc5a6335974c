#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/safetensors.hpp"

namespace mg::io {

// The checkpoint format version this build writes and reads (docs/CHECKPOINTS.md).
inline constexpr int64_t kCheckpointFormat = 1;

// A training checkpoint: a safetensors file whose "meganeura" metadata entry holds JSON text
// {"format", "model", "step", "epoch", "optimizer", "extra"}; tensors are parameters
// ("model.layers.0.weight") and optimizer state ("optimizer.<param>.m"), named by the caller.
struct Checkpoint {
  nlohmann::json model_config;
  int64_t step = 0;
  int64_t epoch = 0;
  nlohmann::json optimizer;
  nlohmann::json extra;
  std::vector<TensorRecord> tensors;

  // nullptr when no tensor has that name.
  const TensorRecord* find(std::string_view name) const;
};

// Atomic: an interrupted save leaves the previous checkpoint at `path` intact.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);

// Throws mg::Error naming `path` when it is missing ("no checkpoint at ..."), is not a Meganeura
// checkpoint, has an unsupported format version, or is truncated or corrupt.
Checkpoint load_checkpoint(const std::filesystem::path& path);

// Throws mg::Error "checkpoint P was saved for model {...} but the program is {...}" when the
// model configurations differ.
void check_same_model(const nlohmann::json& expected, const nlohmann::json& found,
                      const std::filesystem::path& path);

}  // namespace mg::io
