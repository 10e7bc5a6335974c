#include "backends/vulkan/runtime/memory.hpp"

#include <cstdio>

#include "backends/vulkan/runtime/fault_injection.hpp"
#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

constexpr uint32_t kNoMemoryType = UINT32_MAX;

struct MemoryWish {
  VkMemoryPropertyFlags required;
  VkMemoryPropertyFlags preferred;
};

MemoryWish wish_for(BufferUse use) {
  constexpr VkMemoryPropertyFlags host =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  switch (use) {
    case BufferUse::device:
      return {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};
    case BufferUse::upload:
      return {host, 0};
    // Cached memory makes host reads of results fast.
    case BufferUse::download:
      return {host, VK_MEMORY_PROPERTY_HOST_CACHED_BIT};
  }
  return {host, 0};
}

uint32_t choose_memory_type(const VkPhysicalDeviceMemoryProperties& memory, uint32_t allowed,
                            MemoryWish wish) {
  uint32_t fallback = kNoMemoryType;
  for (uint32_t i = 0; i < memory.memoryTypeCount; ++i) {
    VkMemoryPropertyFlags flags = memory.memoryTypes[i].propertyFlags;
    if ((allowed & (1u << i)) == 0 || (flags & wish.required) != wish.required) continue;
    if ((flags & wish.preferred) == wish.preferred) return i;
    if (fallback == kNoMemoryType) fallback = i;
  }
  return fallback;
}

std::string describe_request(uint64_t bytes, std::string_view label) {
  return "cannot allocate " + std::to_string(bytes) + " bytes (" + human_bytes(bytes) +
         ") for buffer '" + std::string(label) + "'";
}

Allocation allocate_from_app(const AppAllocator& app, const VkMemoryRequirements& requirements,
                             uint32_t type, BufferUse use, uint64_t requested_bytes,
                             std::string_view label) {
  Allocation allocation;
  allocation.app = &app;
  const VkResult result = app.allocate(app.user, &requirements, type, &allocation.memory,
                                       &allocation.offset, &allocation.mapped);
  if (result != VK_SUCCESS || allocation.memory == VK_NULL_HANDLE)
    throw Error(describe_request(requested_bytes, label) + ": the app's allocator refused (" +
                std::string(result_words(result)) + ")");
  std::string fault;
  if (allocation.offset % requirements.alignment != 0)
    fault = "an offset not aligned to " + std::to_string(requirements.alignment);
  else if (use != BufferUse::device && allocation.mapped == nullptr)
    fault = "no mapped pointer for host-visible memory";
  if (!fault.empty()) {
    app.free(app.user, allocation.memory, allocation.offset);
    throw Error(describe_request(requested_bytes, label) + ": the app's allocator gave " + fault);
  }
  return allocation;
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

Allocation allocate_memory(VkDevice device, const PhysicalDevice& physical,
                           const VkMemoryRequirements& requirements, BufferUse use,
                           uint64_t requested_bytes, std::string_view label,
                           const AppAllocator* app) {
  uint32_t type = choose_memory_type(physical.memory, requirements.memoryTypeBits, wish_for(use));
  if (type == kNoMemoryType)
    throw Error(describe_request(requested_bytes, label) +
                ": the device has no suitable memory type for this use");
  uint64_t heap_bytes =
      physical.memory.memoryHeaps[physical.memory.memoryTypes[type].heapIndex].size;
  if (requirements.size > heap_bytes)
    throw Error(describe_request(requested_bytes, label) +
                    ": larger than the device's memory heap (" + std::to_string(heap_bytes) +
                    " bytes, " + human_bytes(heap_bytes) + ")",
                Error::Kind::out_of_memory);

  if (app != nullptr)
    return allocate_from_app(*app, requirements, type, use, requested_bytes, label);

  auto info = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  info.allocationSize = requirements.size;
  info.memoryTypeIndex = type;
  Allocation allocation;
  VkResult result = injected_allocation_result();
  if (result == VK_SUCCESS) result = vkAllocateMemory(device, &info, nullptr, &allocation.memory);
  if (result != VK_SUCCESS)
    throw Error(describe_request(requested_bytes, label) + ": " +
                    std::string(result_words(result)) + " (the heap holds " +
                    human_bytes(heap_bytes) + ")",
                result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY
                    ? Error::Kind::out_of_memory
                    : Error::Kind::input);
  if (use != BufferUse::device) {
    result = vkMapMemory(device, allocation.memory, 0, VK_WHOLE_SIZE, 0, &allocation.mapped);
    if (result != VK_SUCCESS) {
      vkFreeMemory(device, allocation.memory, nullptr);
      check(result, "mapping buffer '" + std::string(label) + "'");
    }
  }
  return allocation;
}

void free_memory(VkDevice device, Allocation& allocation) {
  // Freeing implicitly unmaps.
  if (allocation.memory != VK_NULL_HANDLE && allocation.app != nullptr)
    allocation.app->free(allocation.app->user, allocation.memory, allocation.offset);
  else if (allocation.memory != VK_NULL_HANDLE)
    vkFreeMemory(device, allocation.memory, nullptr);
  allocation = {};
}

}  // namespace mg::gpu::detail
