#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/pipeline_cache.hpp"

namespace mg::gpu::detail {

// A compute pipeline and what recording needs to know about its interface.
struct Pipeline {
  VkPipeline handle = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t binding_count = 0;
  uint32_t push_constant_bytes = 0;
  std::string label;
};

// Pipeline layouts shared by every kernel with the same binding count and push-constant size.
class PipelineLayouts {
 public:
  explicit PipelineLayouts(VkDevice device) : device_(device) {}
  ~PipelineLayouts();
  PipelineLayouts(const PipelineLayouts&) = delete;
  PipelineLayouts& operator=(const PipelineLayouts&) = delete;

  struct Layout {
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
  };
  Layout get(uint32_t binding_count, uint32_t push_constant_bytes);

 private:
  VkDevice device_;
  std::map<std::pair<uint32_t, uint32_t>, Layout> layouts_;
};

struct PipelineBuildOptions {
  uint32_t vulkan_api_version = VK_API_VERSION_1_1;
  bool validate_spirv = false;
  // Print the driver's statistics of every pipeline to stderr (MEGANEURA_KERNEL_STATS); needs
  // VK_KHR_pipeline_executable_properties enabled.
  bool print_statistics = false;
};

// Compiles (or loads from `cache`) and creates one pipeline per spec on a small thread pool.
// `layouts[i]` is the layout of `specs[i]`. On any failure every pipeline made here is
// destroyed and the error of the first failing spec is thrown.
std::vector<VkPipeline> build_pipelines(VkDevice device, PipelineCache& cache,
                                        std::span<const KernelSpec> specs,
                                        std::span<const VkPipelineLayout> layouts,
                                        PipelineBuildOptions options, CompileStats& stats);

}  // namespace mg::gpu::detail
