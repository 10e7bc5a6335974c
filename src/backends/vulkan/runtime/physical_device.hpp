#pragma once
#include <cstdint>
#include <vector>

#include "backends/vulkan/runtime/device_features.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/instance.hpp"

namespace mg::gpu::detail {

inline constexpr uint32_t kNoQueueFamily = UINT32_MAX;

// Everything read about one physical device before opening it.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  DeviceInfo info;
  uint32_t api_version = 0;  // the device's, capped by the instance's
  uint32_t compute_queue_family = kNoQueueFamily;
  uint32_t timestamp_valid_bits = 0;  // of that queue family
  VkPhysicalDeviceLimits limits{};
  VkPhysicalDeviceMemoryProperties memory{};
  DeviceFeatures features;
};

// What Meganeura reads about one physical device (`index` in the driver's enumeration order)
// of an instance of `instance_api_version`.
PhysicalDevice describe_physical_device(VkInstance instance, uint32_t instance_api_version,
                                        bool validation, VkPhysicalDevice handle, uint32_t index);

// Sets the caps that follow from `out.features` (f16, bf16, float atomics): after changing the
// features to those enabled on a device the app created.
void read_feature_caps(PhysicalDevice& out);

// Every physical device of the instance, in the driver's enumeration order.
std::vector<PhysicalDevice> enumerate_physical_devices(const Instance& instance);

}  // namespace mg::gpu::detail
