#include "backends/vulkan/runtime/pipeline_cache.hpp"

#include <cstdio>
#include <cstring>

#include "backends/vulkan/runtime/cache_file.hpp"
#include "backends/vulkan/runtime/shader_compiler.hpp"
#include "backends/vulkan/runtime/vk_result.hpp"

namespace mg::gpu::detail {
namespace {

constexpr uint32_t kSpirvMagic = 0x07230203;
constexpr uint32_t kOpEntryPoint = 15;
constexpr uint32_t kOpFunctionEnd = 56;

// A structural check of a module read from the cache (its checksum only proves that the file is
// what was written): the header, every instruction's word count inside the module, an entry
// point, and the function's end as the last instruction, which a truncated module lacks. A
// driver handed a malformed module may crash instead of failing.
bool well_formed_spirv(const std::vector<uint32_t>& spirv) {
  if (spirv.size() < 5 || spirv[0] != kSpirvMagic || spirv[3] == 0) return false;
  bool entry_point = false;
  uint32_t last_opcode = 0;
  for (size_t at = 5; at < spirv.size();) {
    const uint32_t words = spirv[at] >> 16;
    if (words == 0 || words > spirv.size() - at) return false;
    last_opcode = spirv[at] & 0xFFFF;
    entry_point = entry_point || last_opcode == kOpEntryPoint;
    at += words;
  }
  return entry_point && last_opcode == kOpFunctionEnd;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string blob_name(const DeviceInfo& info) {
  auto uuid = std::as_bytes(std::span(info.pipeline_cache_uuid));
  uint64_t key = fnv1a64(uuid);
  key = fnv1a64(std::to_string(info.vendor_id) + ":" + std::to_string(info.device_id) + ":" +
                    std::to_string(info.driver_version),
                key);
  char ids[32];
  std::snprintf(ids, sizeof ids, "%04x-%04x-", info.vendor_id, info.device_id);
  return ids + hex(key) + ".bin";
}

}  // namespace

PipelineCache::PipelineCache(VkDevice device, const DeviceInfo& info, uint32_t api_version,
                             const std::string& directory)
    : device_(device), api_version_(api_version) {
  if (!directory.empty()) directory_ = std::filesystem::path(directory);
  std::vector<std::byte> blob;
  if (directory_) {
    blob_path_ = *directory_ / "pipelines" / blob_name(info);
    if (auto stored = read_cache_file(blob_path_)) blob = std::move(*stored);
  }
  auto create = vk_struct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  create.initialDataSize = blob.size();
  create.pInitialData = blob.data();
  // Drivers check the blob's own header; one they refuse is replaced by an empty cache.
  if (vkCreatePipelineCache(device_, &create, nullptr, &cache_) != VK_SUCCESS) {
    create.initialDataSize = 0;
    create.pInitialData = nullptr;
    blob.clear();
    check(vkCreatePipelineCache(device_, &create, nullptr, &cache_), "creating a pipeline cache");
  }
  saved_bytes_ = blob.size();
}

PipelineCache::~PipelineCache() {
  vkDestroyPipelineCache(device_, cache_, nullptr);
}

std::filesystem::path PipelineCache::spirv_path(const KernelSpec& spec) const {
  uint64_t key = fnv1a64(compiler_identity(api_version_));
  key = fnv1a64(std::string_view("\0", 1), key);
  key = fnv1a64(full_source(spec), key);
  if (spec.khr_cooperative_matrix) key = fnv1a64("SPV_KHR_cooperative_matrix", key);
  if (spec.bf16_operands) key = fnv1a64("SPV_KHR_bfloat16", key);
  if (spec.bf16_buffers) key = fnv1a64("bfloat16 buffers", key);
  if (spec.matrix_loads == MatrixLoads::tensor_at_element) key = fnv1a64("tensor loads", key);
  if (spec.matrix_loads == MatrixLoads::tensor_at_buffer_start)
    key = fnv1a64("tensor loads from the buffer start", key);
  return *directory_ / "spirv" / (hex(key) + ".spv");
}

std::optional<std::vector<uint32_t>> PipelineCache::load_spirv(const KernelSpec& spec) const {
  if (!directory_) return std::nullopt;
  const std::filesystem::path path = spirv_path(spec);
  auto bytes = read_cache_file(path);
  if (!bytes) return std::nullopt;
  std::vector<uint32_t> spirv(bytes->size() / 4);
  std::memcpy(spirv.data(), bytes->data(), spirv.size() * 4);
  if (bytes->size() % 4 != 0 || !well_formed_spirv(spirv)) {
    std::fprintf(stderr, "meganeura: kernel cache file %s holds malformed SPIR-V; rebuilding it\n",
                 path.c_str());
    return std::nullopt;
  }
  return spirv;
}

std::string PipelineCache::describe_spirv_file(const KernelSpec& spec) const {
  return directory_ ? spirv_path(spec).string() : "(no kernel cache)";
}

void PipelineCache::store_spirv(const KernelSpec& spec, const std::vector<uint32_t>& spirv) const {
  if (directory_) write_cache_file(spirv_path(spec), std::as_bytes(std::span(spirv)));
}

void PipelineCache::save() {
  if (!directory_) return;
  size_t bytes = 0;
  if (vkGetPipelineCacheData(device_, cache_, &bytes, nullptr) != VK_SUCCESS) return;
  if (bytes == saved_bytes_) return;
  std::vector<std::byte> blob(bytes);
  if (vkGetPipelineCacheData(device_, cache_, &bytes, blob.data()) != VK_SUCCESS) return;
  blob.resize(bytes);
  if (write_cache_file(blob_path_, blob)) saved_bytes_ = bytes;
}

}  // namespace mg::gpu::detail
