#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "backends/vulkan/runtime/memory.hpp"

namespace mg::gpu::detail {

// A storage buffer with its own memory. Every buffer can be bound to a kernel and be the source
// or destination of copies and fills. An external buffer belongs to the app that embeds
// Meganeura (docs/EMBEDDING.md): only copies use it, and it is never destroyed here.
struct Buffer {
  VkBuffer handle = VK_NULL_HANDLE;
  Allocation allocation;
  uint64_t bytes = 0;
  BufferUse use = BufferUse::device;
  std::string label;
  bool external = false;

  bool alive() const { return handle != VK_NULL_HANDLE; }
};

// Memory comes from `app` when given (an app's allocator), else from vkAllocateMemory.
Buffer create_buffer(VkDevice device, const PhysicalDevice& physical, uint64_t bytes, BufferUse use,
                     std::string_view label, const AppAllocator* app = nullptr);
void destroy_buffer(VkDevice device, Buffer& buffer);

}  // namespace mg::gpu::detail
