#include "io/model_folder.hpp"

#include <algorithm>
#include <optional>

#include "io/atomic_file.hpp"
#include "io/json_limits.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

constexpr const char* kConfigName = "config.json";
// transformers' weights, then diffusers'.
constexpr const char* kWeightsNames[] = {"model", "diffusion_pytorch_model"};
constexpr size_t kMaxNamesPerKind = 10;

nlohmann::json read_json(const std::filesystem::path& file, std::string_view what) {
  const std::vector<std::byte> bytes = read_whole_file(file, what);
  return parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                    std::string(what) + " " + file.string());
}

// A shard name from an index must stay inside the folder.
bool is_inside_folder(const std::filesystem::path& relative) {
  if (relative.empty() || relative.is_absolute()) return false;
  return std::none_of(relative.begin(), relative.end(),
                      [](const std::filesystem::path& part) { return part == ".."; });
}

// Names joined with ", ", at most kMaxNamesPerKind of them, then "and N more".
std::string name_list(const std::vector<std::string>& names, std::string_view separator = ", ") {
  std::string text;
  for (size_t i = 0; i < names.size() && i < kMaxNamesPerKind; ++i) {
    text += (i ? std::string(separator) : "") + names[i];
  }
  if (names.size() > kMaxNamesPerKind) {
    text += " and " + std::to_string(names.size() - kMaxNamesPerKind) + " more";
  }
  return text;
}

struct ShardIndex {
  std::filesystem::path file;
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::set<std::string> shards;                   // distinct shard file names, sorted
};

ShardIndex read_index(const std::filesystem::path& file) {
  const std::string what = "model folder index";
  const nlohmann::json index = read_json(file, what);
  const std::string prefix = what + " " + file.string();
  if (!index.is_object()) throw Error(prefix + " is not a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    throw Error(prefix + " has no \"weight_map\" object mapping tensor names to shard files");
  }
  ShardIndex shard_index{file, {}, {}};
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      throw Error(prefix + ": the weight_map entry of tensor '" + name + "' is not a file name");
    }
    const std::string shard_name = shard.get<std::string>();
    if (!is_inside_folder(shard_name)) {
      throw Error(prefix + ": tensor '" + name + "' is in shard '" + shard_name +
                  "', which is not a file name inside the folder");
    }
    shard_index.weight_map[name] = shard_name;
    shard_index.shards.insert(shard_name);
  }
  if (shard_index.shards.empty()) throw Error(prefix + " lists no tensors in its weight_map");
  return shard_index;
}

// config.json of a folder, or nullopt when it has none.
std::optional<nlohmann::json> read_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kConfigName;
  std::error_code error;
  if (!std::filesystem::exists(file, error)) return std::nullopt;
  nlohmann::json config = read_json(file, "model config");
  if (!config.is_object()) throw Error("model config " + file.string() + " is not a JSON object");
  return config;
}

// Maps the folder's weight files into `files`; returns the index when they are shards.
std::optional<ShardIndex> open_weights(const std::filesystem::path& dir,
                                       const std::string& description,
                                       std::vector<MappedSafetensors>& files) {
  std::error_code error;
  for (const std::string weights_name : kWeightsNames) {
    const std::filesystem::path single = dir / (weights_name + ".safetensors");
    if (std::filesystem::exists(single, error)) {
      files.push_back(MappedSafetensors::open(single, "model weights"));
      return std::nullopt;
    }
    const std::filesystem::path index_file = dir / (weights_name + ".safetensors.index.json");
    if (!std::filesystem::exists(index_file, error)) continue;
    ShardIndex index = read_index(index_file);
    for (const std::string& shard : index.shards) {
      const std::filesystem::path shard_path = dir / shard;
      if (!std::filesystem::exists(shard_path, error)) {
        throw Error(description + ": its index " + index_file.filename().string() +
                    " names shard '" + shard + "', which is missing");
      }
      files.push_back(MappedSafetensors::open(shard_path, "model folder shard"));
    }
    return index;
  }
  const bool has_pickle = std::filesystem::exists(dir / "pytorch_model.bin", error) ||
                          std::filesystem::exists(dir / "diffusion_pytorch_model.bin", error);
  throw Error(description +
              " has no model.safetensors, diffusion_pytorch_model.safetensors or their "
              ".index.json" +
              (has_pickle ? " (its .bin weights are pickles: re-save them with "
                            "save_pretrained(..., safe_serialization=True))"
                          : ""));
}

}  // namespace

ModelFolder ModelFolder::open(const std::filesystem::path& path) {
  ModelFolder folder;
  folder.path_ = path;
  std::optional<ShardIndex> index;
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) {
    folder.description_ = "model file " + path.string();
    folder.files_.push_back(MappedSafetensors::open(path, "model file"));
  } else if (std::filesystem::is_directory(path, error)) {
    folder.description_ = "model folder " + path.string();
    if (std::optional<nlohmann::json> config = read_config(path)) {
      folder.config_ = std::move(*config);
      folder.has_config_ = true;
    }
    index = open_weights(path, folder.description_, folder.files_);
  } else {
    throw Error("no model folder or .safetensors file at " + path.string());
  }
  // Which file holds each tensor, to name both files when shards repeat a name.
  std::map<std::string_view, const MappedSafetensors*> holder;
  for (const MappedSafetensors& file : folder.files_) {
    for (const TensorView& tensor : file.tensors()) {
      const auto [it, inserted] = holder.emplace(tensor.name, &file);
      if (!inserted) {
        throw Error(folder.description_ + ": tensor '" + tensor.name + "' is stored twice, in " +
                    it->second->path().filename().string() + " and " +
                    file.path().filename().string());
      }
      folder.tensors_.emplace(tensor.name, &tensor);
    }
  }
  if (!index) return folder;
  const std::string index_name = index->file.filename().string();
  for (const auto& [name, shard] : index->weight_map) {
    const auto it = holder.find(name);
    if (it == holder.end() || it->second->path() != path / shard) {
      throw Error(folder.description_ + ": its index " + index_name + " puts tensor '" + name +
                  "' in " + shard + ", which lacks it");
    }
  }
  for (const auto& [name, file] : holder) {
    if (!index->weight_map.contains(std::string(name))) {
      throw Error(folder.description_ + ": shard " + file->path().filename().string() +
                  " holds tensor '" + std::string(name) + "', which its index " + index_name +
                  " does not list");
    }
  }
  return folder;
}

std::vector<std::string> ModelFolder::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, tensor] : tensors_) names.push_back(name);
  return names;
}

const TensorView* ModelFolder::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const TensorView& ModelFolder::at(std::string_view name) const {
  if (const TensorView* tensor = find(name)) return *tensor;
  // The names sorted next to the missing one share its longest prefix: likely what was meant.
  std::vector<std::string> nearest;
  const auto after = tensors_.lower_bound(name);
  if (after != tensors_.begin()) nearest.push_back("'" + std::prev(after)->first + "'");
  if (after != tensors_.end()) nearest.push_back("'" + after->first + "'");
  throw Error(description_ + " has no tensor '" + std::string(name) + "'" +
              (nearest.empty() ? " (it holds no tensors)"
                               : " (nearest names: " + name_list(nearest) + ")"));
}

void check_tensors(const ModelFolder& folder, std::string_view model_name,
                   const std::map<std::string, Shape>& expected,
                   const std::set<std::string>& optional,
                   const std::vector<std::string>& ignored_prefixes) {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> wrong_shapes;
  for (const auto& [name, shape] : expected) {
    const TensorView* tensor = folder.find(name);
    if (!tensor) {
      if (!optional.contains(name)) missing.push_back(name);
    } else if (tensor->shape != shape) {
      wrong_shapes.push_back(name + " is " + shape_text(tensor->shape) + ", expected " +
                             shape_text(shape));
    }
  }
  for (const std::string& name : folder.tensor_names()) {
    const bool ignored =
        std::any_of(ignored_prefixes.begin(), ignored_prefixes.end(),
                    [&](const std::string& prefix) { return name.starts_with(prefix); });
    if (!expected.contains(name) && !ignored) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && wrong_shapes.empty()) return;
  std::string problems;
  const auto add = [&](std::string text) { problems += (problems.empty() ? "" : "; ") + text; };
  if (!missing.empty()) add("missing " + name_list(missing));
  if (!unexpected.empty()) add("unexpected " + name_list(unexpected));
  // Shapes hold commas, so these items are separated like the kinds are.
  if (!wrong_shapes.empty()) add(name_list(wrong_shapes, "; "));
  throw Error(folder.description() + " does not match " + std::string(model_name) + ": " +
              problems);
}

}  // namespace mg::io
