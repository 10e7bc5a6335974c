#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/physical_device.hpp"

namespace mg::gpu::detail {

// One VkDeviceMemory, mapped for its whole life when host visible.
struct Allocation {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
};

// Allocates memory for `requirements` in a memory type that suits `use`. Throws mg::Error
// naming the bytes, the label and the limit that was hit.
Allocation allocate_memory(VkDevice device, const PhysicalDevice& physical,
                           const VkMemoryRequirements& requirements, BufferUse use,
                           uint64_t requested_bytes, std::string_view label);

void free_memory(VkDevice device, Allocation& allocation);

// "1.5 GiB" style size for messages.
std::string human_bytes(uint64_t bytes);

}  // namespace mg::gpu::detail
