// save_model_folder (model_folder.hpp): a model folder written into a staging sibling, then
// exchanged with the destination in one rename.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "io/atomic_file.hpp"
#include "io/model_folder.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

// "model-00002-of-00003.safetensors", as transformers numbers shards.
std::string shard_name(const std::string& weights_name, size_t index, size_t count) {
  char numbers[32];
  std::snprintf(numbers, sizeof(numbers), "-%05zu-of-%05zu", index + 1, count);
  return weights_name + numbers + ".safetensors";
}

// A folder next to the destination that is removed unless it was moved into place.
class StagingFolder {
 public:
  StagingFolder(const std::filesystem::path& destination, const std::string& error_prefix)
      : path_(destination.parent_path() /
              ("." + destination.filename().string() + ".tmp." + std::to_string(::getpid()))) {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
    std::filesystem::create_directories(path_, error);
    if (error) {
      throw Error(error_prefix + "cannot create " + path_.string() + ": " + error.message());
    }
  }
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;
  ~StagingFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

[[noreturn]] void fail_rename(const std::string& error_prefix, const std::filesystem::path& from,
                              const std::filesystem::path& to) {
  throw Error(error_prefix + "renaming " + from.string() + " to " + to.string() +
              " failed: " + std::strerror(errno));
}

// Puts the staged folder at `destination`. An existing destination is exchanged with the staged
// folder in one step (renameat2 RENAME_EXCHANGE), so no moment exists without a complete folder
// there; the staged path then holds the old contents, which the caller's StagingFolder removes.
// Every file inside was fsynced as it was written (AtomicFileWriter).
void move_into_place(const std::filesystem::path& staged, const std::filesystem::path& destination,
                     const std::string& error_prefix) {
  std::error_code error;
  if (!std::filesystem::exists(destination, error)) {
    if (::rename(staged.c_str(), destination.c_str()) != 0) {
      fail_rename(error_prefix, staged, destination);
    }
    return;
  }
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, destination.c_str(), RENAME_EXCHANGE) == 0) {
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) fail_rename(error_prefix, staged, destination);
  // Filesystems without exchange: move the old folder aside first. A kill between the two renames
  // leaves it complete under the ".old." name.
  const std::filesystem::path old =
      destination.parent_path() /
      ("." + destination.filename().string() + ".old." + std::to_string(::getpid()));
  std::filesystem::remove_all(old, error);
  if (::rename(destination.c_str(), old.c_str()) != 0) fail_rename(error_prefix, destination, old);
  if (::rename(staged.c_str(), destination.c_str()) != 0) {
    const int rename_error = errno;
    ::rename(old.c_str(), destination.c_str());
    errno = rename_error;
    fail_rename(error_prefix, staged, destination);
  }
  std::filesystem::remove_all(old, error);
}

void check_request(const std::string& prefix, const nlohmann::json& config,
                   const std::vector<SavedTensor>& tensors, const SaveOptions& options) {
  if (!config.is_null() && !config.is_object()) {
    throw Error(prefix + "the config must be a JSON object (or null for no config.json)");
  }
  if (options.dtype != DType::f32 && options.dtype != DType::f16 && options.dtype != DType::bf16) {
    throw Error(prefix + "weights can be stored as f32, f16 or bf16, not " +
                std::string(safetensors_dtype_name(options.dtype)));
  }
  if (options.weights_name.empty() || options.weights_name.find('/') != std::string::npos) {
    throw Error(prefix + "weights name '" + options.weights_name +
                "' must be a plain file name such as model or diffusion_pytorch_model");
  }
  if (options.max_shard_bytes == 0) throw Error(prefix + "max_shard_bytes must be positive");
  std::set<std::string> names;
  for (const SavedTensor& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__") {
      throw Error(prefix + "invalid tensor name '" + tensor.name + "'");
    }
    if (!names.insert(tensor.name).second) {
      throw Error(prefix + "tensor name '" + tensor.name + "' is used twice");
    }
    const std::optional<uint64_t> bytes = stored_tensor_bytes(tensor.shape, StoredDType::f32);
    if (!bytes || *bytes / sizeof(float) != tensor.values.size()) {
      throw Error(prefix + "tensor '" + tensor.name + "' has shape " + shape_text(tensor.shape) +
                  " but " + std::to_string(tensor.values.size()) + " values");
    }
  }
  std::set<std::string> copied;
  for (const std::filesystem::path& file : options.copy_files) {
    const std::string name = file.filename().string();
    std::error_code error;
    if (!std::filesystem::is_regular_file(file, error)) {
      throw Error(prefix + "no file to copy at " + file.string());
    }
    if (name == "config.json" || name.starts_with(options.weights_name + ".") ||
        name.starts_with(options.weights_name + "-") || !copied.insert(name).second) {
      throw Error(prefix + "the copied file " + file.string() +
                  " would replace a file of the same name written here");
    }
  }
}

// Groups tensors (by index) into shards in order, as transformers does: a shard closes when the
// next tensor would take it past the limit; a tensor larger than the limit gets a shard alone.
std::vector<std::vector<size_t>> plan_shards(const std::vector<SavedTensor>& tensors,
                                             size_t element_bytes, uint64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].values.size() * element_bytes;
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
  }
  return shards;
}

}  // namespace

void save_model_folder(const std::filesystem::path& dir, const nlohmann::json& config,
                       const std::vector<SavedTensor>& tensors, const SaveOptions& options) {
  std::filesystem::path destination = dir.lexically_normal();
  if (!destination.has_filename()) destination = destination.parent_path();  // "out/" is "out"
  const std::string prefix = "cannot save model folder " + destination.string() + ": ";
  check_request(prefix, config, tensors, options);
  std::error_code error;
  if (std::filesystem::exists(destination, error) &&
      !std::filesystem::is_directory(destination, error)) {
    throw Error(prefix + "it exists and is not a folder");
  }

  const StagingFolder staging(destination, prefix);
  if (!config.is_null())
    write_file_atomically(staging.path() / "config.json", config.dump(2) + "\n");

  const size_t element_bytes = safetensors_dtype_bytes(options.dtype);
  const std::vector<std::vector<size_t>> shards =
      plan_shards(tensors, element_bytes, options.max_shard_bytes);
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_bytes = 0;
  for (size_t shard = 0; shard < shards.size(); ++shard) {
    const std::string file_name = shards.size() == 1
                                      ? options.weights_name + ".safetensors"
                                      : shard_name(options.weights_name, shard, shards.size());
    std::vector<TensorLayout> layouts;
    for (size_t index : shards[shard]) {
      layouts.push_back({tensors[index].name, options.dtype, tensors[index].shape});
      weight_map[tensors[index].name] = file_name;
      total_bytes += tensors[index].values.size() * element_bytes;
    }
    SafetensorsWriter writer(staging.path() / file_name, {{"format", "pt"}}, std::move(layouts));
    for (size_t index : shards[shard]) {
      writer.write_next(f32_to_bytes(tensors[index].values, options.dtype));
    }
    writer.commit();
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    write_file_atomically(staging.path() / (options.weights_name + ".safetensors.index.json"),
                          index.dump(2) + "\n");
  }
  for (const std::filesystem::path& file : options.copy_files) {
    write_file_atomically(staging.path() / file.filename(),
                          read_whole_file(file, "file to copy into the model folder"));
  }
  move_into_place(staging.path(), destination, prefix);
}

}  // namespace mg::io
