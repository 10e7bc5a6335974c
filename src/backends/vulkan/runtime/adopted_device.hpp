#pragma once
// A gpu::Device on the Vulkan instance, device and queue of an app that embeds Meganeura
// (docs/EMBEDDING.md): it submits on the app's queue, signals a timeline semaphore the app can
// wait on, and copies from and into buffers the app owns. Vulkan types cross this header, so
// only Vulkan-specific embedding code (src/capi) includes it.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/memory.hpp"
#include "backends/vulkan/runtime/vulkan_api.hpp"

namespace mg::gpu {

struct AppVulkanDevice {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  uint32_t api_version = 0;  // VkApplicationInfo::apiVersion of the app's instance
  std::vector<std::string> enabled_extensions;  // as given to vkCreateDevice
  // The pNext chain given to vkCreateDevice (VkPhysicalDeviceFeatures2, VkPhysicalDeviceVulkan1x
  // Features, single feature structs) and its pEnabledFeatures; either may be null.
  const void* enabled_features = nullptr;
  const VkPhysicalDeviceFeatures* enabled_core_features = nullptr;
  // Device memory for every buffer comes from here when `allocate` is set.
  detail::AppAllocator allocator;
};

// Vulkan-only access to a device, for embedding.
class VulkanAccess {
 public:
  // Every submission on an adopted device signals this semaphore, to timeline_value() as it is
  // right after that submission; VK_NULL_HANDLE on a device Meganeura opened itself.
  virtual VkSemaphore timeline() const = 0;
  virtual uint64_t timeline_value() const = 0;
  // The semaphore that the app's submission of a command buffer Meganeura recorded into
  // (Device::record_into) signals, at the value record_into returned.
  virtual VkSemaphore app_timeline() const = 0;
  // A buffer of the app for copies in and out of a program (it needs the transfer usages). It
  // stays the app's: destroy_buffer and the device's end only forget it.
  virtual BufferId import_buffer(VkBuffer buffer, uint64_t bytes, std::string_view label) = 0;

 protected:
  ~VulkanAccess() = default;
};

// Checks that the app's device has what Meganeura needs (Vulkan 1.1, a compute queue, timeline
// semaphores), throwing one mg::Error naming every missing feature or extension; kernels then use
// only the optional features the app enabled.
std::unique_ptr<Device> adopt_vulkan_device(const AppVulkanDevice& app, const Switches& switches);

// The Vulkan side of `device`, or nullptr when it is not a Vulkan device.
VulkanAccess* vulkan_access(Device& device);

}  // namespace mg::gpu
