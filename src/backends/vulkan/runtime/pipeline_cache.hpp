#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/vulkan_api.hpp"

namespace mg::gpu::detail {

// The on-disk cache of one device: SPIR-V files keyed by what determines them (source, defines,
// compiler and target, not the device), and the driver's VkPipelineCache blob keyed by the
// device's pipelineCacheUUID, vendor, device and driver version. Everything here is best
// effort: an unreadable or corrupt file is a miss, an unwritable directory is no cache.
class PipelineCache {
 public:
  PipelineCache(VkDevice device, const DeviceInfo& info, uint32_t api_version,
                const std::string& directory);
  ~PipelineCache();
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  VkPipelineCache handle() const { return cache_; }

  // Thread-safe.
  std::optional<std::vector<uint32_t>> load_spirv(const KernelSpec& spec) const;
  void store_spirv(const KernelSpec& spec, const std::vector<uint32_t>& spirv) const;
  // The cache file of `spec`'s SPIR-V, for error messages.
  std::string describe_spirv_file(const KernelSpec& spec) const;

  // Writes the driver's pipeline cache when it grew since it was loaded or last saved.
  void save();

 private:
  std::filesystem::path spirv_path(const KernelSpec& spec) const;

  VkDevice device_;
  uint32_t api_version_;
  std::optional<std::filesystem::path> directory_;
  std::filesystem::path blob_path_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  size_t saved_bytes_ = 0;
};

}  // namespace mg::gpu::detail
