#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/physical_device.hpp"

namespace mg::gpu::detail {

// Device memory handed out by an app that embeds Meganeura (docs/EMBEDDING.md): `allocate`
// gives requirements.size bytes of memory type `type` at an offset aligned to
// requirements.alignment, with a pointer to them when the type is host visible; `free` takes
// them back.
struct AppAllocator {
  void* user = nullptr;
  VkResult (*allocate)(void* user, const VkMemoryRequirements* requirements, uint32_t type,
                       VkDeviceMemory* memory, VkDeviceSize* offset, void** mapped) = nullptr;
  void (*free)(void* user, VkDeviceMemory memory, VkDeviceSize offset) = nullptr;
};

// A range of one VkDeviceMemory (all of it unless an app's allocator gave it), mapped for its
// whole life when host visible.
struct Allocation {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  void* mapped = nullptr;
  const AppAllocator* app = nullptr;  // gave the memory, and takes it back
};

// Allocates memory for `requirements` in a memory type that suits `use`, from `app` when given.
// Throws mg::Error naming the bytes, the label and the limit that was hit.
Allocation allocate_memory(VkDevice device, const PhysicalDevice& physical,
                           const VkMemoryRequirements& requirements, BufferUse use,
                           uint64_t requested_bytes, std::string_view label,
                           const AppAllocator* app = nullptr);

void free_memory(VkDevice device, Allocation& allocation);

// "1.5 GiB" style size for messages.
std::string human_bytes(uint64_t bytes);

}  // namespace mg::gpu::detail
