#pragma once
#include <string>
#include <vector>

#include "backends/vulkan/runtime/vulkan_api.hpp"

namespace mg::gpu::detail {

// The optional device features kernels may use, one Vulkan struct per feature group, with
// whether the device knows each group (through its core version or an extension). A group the
// device does not know must stay out of the pNext chain.
struct DeviceFeatures {
  VkPhysicalDeviceFeatures2 core =
      vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  VkPhysicalDevice16BitStorageFeatures storage16 = vk_struct<VkPhysicalDevice16BitStorageFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
  VkPhysicalDevice8BitStorageFeatures storage8 = vk_struct<VkPhysicalDevice8BitStorageFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES);
  VkPhysicalDeviceShaderFloat16Int8Features float16_int8 =
      vk_struct<VkPhysicalDeviceShaderFloat16Int8Features>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  VkPhysicalDeviceVulkanMemoryModelFeatures memory_model =
      vk_struct<VkPhysicalDeviceVulkanMemoryModelFeatures>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES);
  VkPhysicalDeviceSubgroupSizeControlFeatures subgroup_size_control =
      vk_struct<VkPhysicalDeviceSubgroupSizeControlFeatures>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
  VkPhysicalDeviceMaintenance4Features maintenance4 =
      vk_struct<VkPhysicalDeviceMaintenance4Features>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES);
  VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic_float =
      vk_struct<VkPhysicalDeviceShaderAtomicFloatFeaturesEXT>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT);
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop_matrix_nv =
      vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR coop_matrix_khr =
      vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesKHR>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR);
  VkPhysicalDeviceCooperativeMatrix2FeaturesNV coop_matrix2_nv =
      vk_struct<VkPhysicalDeviceCooperativeMatrix2FeaturesNV>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV);
  VkPhysicalDeviceShaderBfloat16FeaturesKHR bf16 =
      vk_struct<VkPhysicalDeviceShaderBfloat16FeaturesKHR>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executable_properties =
      vk_struct<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);

  struct Known {
    bool storage8 = false, float16_int8 = false, memory_model = false,
         subgroup_size_control = false, maintenance4 = false, atomic_float = false,
         coop_matrix_nv = false, coop_matrix_khr = false, coop_matrix2_nv = false, bf16 = false,
         executable_properties = false;
  } known;

  // Extensions a device needs enabled for the groups that are not core in its version.
  std::vector<const char*> extensions;

  // Links the known groups behind `core` and returns it. Call again after copying: the chain
  // points into this object.
  VkPhysicalDeviceFeatures2* chain();
};

// Reads what the device supports.
DeviceFeatures query_features(VkPhysicalDevice device, uint32_t api_version,
                              const std::vector<std::string>& extensions);

// The subset of `supported` Meganeura turns on (no robustness features: they cost speed and
// the planner keeps every access in bounds). `validation`: the validation layer is on;
// `kernel_statistics`: the driver should report each kernel's statistics (registers, shared
// memory, ...) for tuning kernels (Switches::kernel_stats).
DeviceFeatures features_to_enable(const DeviceFeatures& supported, bool validation,
                                  bool kernel_statistics);

// The features an app enabled on a device it created (docs/EMBEDDING.md), read from the pNext
// chain and pEnabledFeatures it gave vkCreateDevice: a group counts as known when the device's
// `api_version` has it in core or the app enabled its extension (`extensions`).
struct AppFeatures {
  DeviceFeatures enabled;
  bool timeline_semaphore = false;
};
AppFeatures features_enabled_by_app(uint32_t api_version,
                                    const std::vector<std::string>& extensions, const void* chain,
                                    const VkPhysicalDeviceFeatures* core);

}  // namespace mg::gpu::detail
