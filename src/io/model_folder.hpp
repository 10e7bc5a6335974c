#pragma once
// Hugging Face model folders: config.json plus safetensors weights, single-file or sharded, as
// transformers' and diffusers' save_pretrained write them (docs/MODEL_FOLDERS.md).
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.hpp"
#include "io/tensor_values.hpp"

namespace mg::io {

class ModelFolder {
 public:
  // `path` is a folder holding config.json (optional) and weights, looked for in this order:
  // model.safetensors, model.safetensors.index.json (shards listed in its weight_map),
  // diffusion_pytorch_model.safetensors, diffusion_pytorch_model.safetensors.index.json. A path to
  // one .safetensors file (a torchvision-style state dict, no config) is accepted too. Every
  // weight file is memory-mapped once and its header fully validated; the index must agree with
  // its shards (each listed shard present, each tensor in the shard the index names, none in two
  // shards, none a shard holds unlisted). Any problem throws mg::Error naming the file.
  static ModelFolder open(const std::filesystem::path& path);

  ModelFolder(ModelFolder&&) = default;
  ModelFolder& operator=(ModelFolder&&) = default;
  ModelFolder(const ModelFolder&) = delete;
  ModelFolder& operator=(const ModelFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // "model folder DIR" or "model file FILE": how errors name it.
  const std::string& description() const { return description_; }
  const nlohmann::json& config() const { return config_; }  // empty object without config.json
  bool has_config() const { return has_config_; }
  // The weight files, in the order they were opened (one for a single-file folder).
  const std::vector<MappedSafetensors>& files() const { return files_; }

  std::vector<std::string> tensor_names() const;  // sorted
  // nullptr when absent. Views stay valid while this folder (moved or not) lives.
  const TensorView* find(std::string_view name) const;
  // Throws mg::Error naming the folder, the tensor and the nearest names it does hold.
  const TensorView& at(std::string_view name) const;

 private:
  std::filesystem::path path_;
  ModelFolder() = default;

  std::string description_;
  nlohmann::json config_ = nlohmann::json::object();
  bool has_config_ = false;
  std::vector<MappedSafetensors> files_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;
};

// Checks that a folder holds exactly the tensors a model expects, and throws one mg::Error that
// lists, by name, every missing tensor, every unexpected one and every one whose shape differs,
// e.g. "model folder X does not match LlamaForCausalLM: missing model.norm.weight; unexpected
// foo.bar; model.embed_tokens.weight is [100, 64], expected [128, 64]" (at most 10 names per kind,
// then "and N more"). `optional` names may be absent (lm_head.weight with tied embeddings);
// tensors whose names start with one of `ignored_prefixes` are allowed extras.
void check_tensors(const ModelFolder& folder, std::string_view model_name,
                   const std::map<std::string, Shape>& expected,
                   const std::set<std::string>& optional = {},
                   const std::vector<std::string>& ignored_prefixes = {});

struct SavedTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

struct SaveOptions {
  DType dtype = DType::f32;  // f32, f16 or bf16 on disk (rounded to nearest, ties to even)
  // A folder whose tensors take more bytes than this is split into shards,
  // <weights_name>-00001-of-0000N.safetensors, listed in <weights_name>.safetensors.index.json.
  uint64_t max_shard_bytes = 5ull << 30;
  std::string weights_name = "model";  // "diffusion_pytorch_model" for diffusers
  // Files copied into the folder under their own names (tokenizer.json, generation_config.json).
  std::vector<std::filesystem::path> copy_files;
};

// Writes a model folder as save_pretrained does: config.json (unless `config` is null), the
// weights with metadata {"format": "pt"}, the index when sharded, and the copied files. All of it
// is written into a temporary sibling folder that then replaces `dir` in one atomic exchange, so
// a failure or a kill leaves `dir` as it was (a stale ".NAME.tmp.PID" sibling at worst). Throws
// mg::Error naming the folder and the tensor or file at fault.
void save_model_folder(const std::filesystem::path& dir, const nlohmann::json& config,
                       const std::vector<SavedTensor>& tensors, const SaveOptions& options = {});

}  // namespace mg::io
