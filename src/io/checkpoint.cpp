#include "io/checkpoint.hpp"

#include <cstdint>

#include "io/json_limits.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

constexpr std::string_view kMetadataKey = "meganeura";
// The entry holds the model configuration, optimizer settings and batcher state: a few levels.
constexpr int kMaxMetadataNesting = 16;

std::string describe(const std::filesystem::path& path) {
  return "checkpoint " + path.string();
}

// A non-negative integer field.
int64_t count_field(const nlohmann::json& header, std::string_view key,
                    const std::filesystem::path& path) {
  const auto it = header.find(key);
  if (it == header.end() || !it->is_number_integer()) {
    throw Error(describe(path) + " is corrupt: its \"meganeura\" metadata has no integer \"" +
                std::string(key) + "\"");
  }
  if (it->is_number_unsigned() ? it->get<uint64_t>() > INT64_MAX : it->get<int64_t>() < 0) {
    throw Error(describe(path) + " is corrupt: its \"" + std::string(key) + "\" is " + it->dump() +
                ", outside 0.." + std::to_string(INT64_MAX));
  }
  return it->get<int64_t>();
}

nlohmann::json optional_field(const nlohmann::json& header, std::string_view key) {
  const auto it = header.find(key);
  return it == header.end() ? nlohmann::json() : *it;
}

}  // namespace

const TensorRecord* Checkpoint::find(std::string_view name) const {
  for (const TensorRecord& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  const nlohmann::json header = {
      {"format", kCheckpointFormat},       {"model", checkpoint.model_config},
      {"step", checkpoint.step},           {"epoch", checkpoint.epoch},
      {"optimizer", checkpoint.optimizer}, {"extra", checkpoint.extra}};
  SafetensorsFile file;
  file.metadata[std::string(kMetadataKey)] = header.dump();
  file.tensors = checkpoint.tensors;
  write_safetensors(path, file);
}

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error("no checkpoint at " + path.string());
  }
  SafetensorsFile file = read_safetensors(path, "checkpoint");
  const auto entry = file.metadata.find(std::string(kMetadataKey));
  if (entry == file.metadata.end()) {
    throw Error(describe(path) +
                " is not a Meganeura checkpoint: its safetensors metadata has no \"meganeura\" "
                "entry (plain weights files cannot be resumed from)");
  }
  const nlohmann::json header =
      parse_json(entry->second, describe(path) + " is corrupt: its \"meganeura\" metadata",
                 kMaxMetadataNesting);
  if (!header.is_object()) {
    throw Error(describe(path) + " is corrupt: its \"meganeura\" metadata is not a JSON object");
  }
  const int64_t format = count_field(header, "format", path);
  if (format != kCheckpointFormat) {
    throw Error(describe(path) + " has format version " + std::to_string(format) +
                ", but this build reads only version " + std::to_string(kCheckpointFormat));
  }
  Checkpoint checkpoint;
  checkpoint.model_config = optional_field(header, "model");
  checkpoint.step = count_field(header, "step", path);
  checkpoint.epoch = count_field(header, "epoch", path);
  checkpoint.optimizer = optional_field(header, "optimizer");
  checkpoint.extra = optional_field(header, "extra");
  checkpoint.tensors = std::move(file.tensors);
  return checkpoint;
}

void check_same_model(const nlohmann::json& expected, const nlohmann::json& found,
                      const std::filesystem::path& path) {
  if (expected == found) return;
  throw Error(describe(path) + " was saved for model " + json_excerpt(found, 200) +
              " but the program is " + json_excerpt(expected, 200));
}

}  // namespace mg::io
