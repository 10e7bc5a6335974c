#include "backends/vulkan/runtime/buffer.hpp"

#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {

Buffer create_buffer(VkDevice device, const PhysicalDevice& physical, uint64_t bytes, BufferUse use,
                     std::string_view label, const AppAllocator* app) {
  if (bytes == 0) throw Error("buffer '" + std::string(label) + "' has size 0");
  uint64_t limit = physical.info.caps.max_memory_allocation_size;
  if (limit != 0 && bytes > limit)
    throw Error("cannot allocate " + std::to_string(bytes) + " bytes (" + human_bytes(bytes) +
                ") for buffer '" + std::string(label) +
                "': larger than the device's largest single allocation (maxMemoryAllocationSize " +
                std::to_string(limit) + " bytes, " + human_bytes(limit) + ")");

  auto info = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  info.size = bytes;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  Buffer buffer;
  buffer.bytes = bytes;
  buffer.use = use;
  buffer.label = label;
  check(vkCreateBuffer(device, &info, nullptr, &buffer.handle),
        "creating buffer '" + buffer.label + "' of " + std::to_string(bytes) + " bytes");

  try {
    VkMemoryRequirements requirements;
    vkGetBufferMemoryRequirements(device, buffer.handle, &requirements);
    buffer.allocation = allocate_memory(device, physical, requirements, use, bytes, label, app);
    check(vkBindBufferMemory(device, buffer.handle, buffer.allocation.memory,
                             buffer.allocation.offset),
          "binding memory to buffer '" + buffer.label + "'");
  } catch (...) {
    destroy_buffer(device, buffer);
    throw;
  }
  return buffer;
}

void destroy_buffer(VkDevice device, Buffer& buffer) {
  if (buffer.handle != VK_NULL_HANDLE && !buffer.external)
    vkDestroyBuffer(device, buffer.handle, nullptr);
  free_memory(device, buffer.allocation);
  buffer.handle = VK_NULL_HANDLE;
}

}  // namespace mg::gpu::detail
