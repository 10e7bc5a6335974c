// Reading back which features an app enabled on its own VkDevice: Vulkan cannot be asked, so
// the app hands over what it gave vkCreateDevice.
#include <algorithm>
#include <cstddef>

#include "backends/vulkan/runtime/device_features.hpp"

namespace mg::gpu::detail {
namespace {

// `into` |= `from` for every VkBool32 member after sType and pNext.
template <typename Struct>
void merge(Struct& into, const void* from) {
  constexpr size_t header = offsetof(VkBaseOutStructure, pNext) + sizeof(void*);
  auto* target = reinterpret_cast<VkBool32*>(reinterpret_cast<char*>(&into) + header);
  const auto* source = reinterpret_cast<const VkBool32*>(static_cast<const char*>(from) + header);
  for (size_t i = 0; i < (sizeof(Struct) - header) / sizeof(VkBool32); ++i)
    target[i] = target[i] | source[i];
}

VkBool32 either(VkBool32 a, VkBool32 b) {
  return a | b;
}

}  // namespace

AppFeatures features_enabled_by_app(uint32_t api_version,
                                    const std::vector<std::string>& extensions, const void* chain,
                                    const VkPhysicalDeviceFeatures* core) {
  AppFeatures app;
  DeviceFeatures& on = app.enabled;
  const auto enabled = [&](uint32_t core_version, const char* extension) {
    return (core_version != 0 && api_version >= core_version) ||
           std::find(extensions.begin(), extensions.end(), extension) != extensions.end();
  };
  on.known.storage8 = enabled(VK_API_VERSION_1_2, VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
  on.known.float16_int8 = enabled(VK_API_VERSION_1_2, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
  on.known.memory_model = enabled(VK_API_VERSION_1_2, VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME);
  on.known.subgroup_size_control =
      enabled(VK_API_VERSION_1_3, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
  on.known.maintenance4 = enabled(VK_API_VERSION_1_3, VK_KHR_MAINTENANCE_4_EXTENSION_NAME);
  on.known.atomic_float = enabled(0, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  on.known.coop_matrix_nv = enabled(0, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  on.known.coop_matrix_khr = enabled(0, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
  on.known.coop_matrix2_nv =
      on.known.coop_matrix_khr && enabled(0, VK_NV_COOPERATIVE_MATRIX_2_EXTENSION_NAME);
  on.known.bf16 = enabled(0, VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
  on.known.executable_properties = enabled(0, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  const bool timeline_known = enabled(VK_API_VERSION_1_2, VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME);

  if (core != nullptr) on.core.features = *core;
  for (auto* link = static_cast<const VkBaseInStructure*>(chain); link != nullptr;
       link = link->pNext) {
    switch (link->sType) {
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2:
        on.core.features = reinterpret_cast<const VkPhysicalDeviceFeatures2*>(link)->features;
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES: {
        const auto& v11 = *reinterpret_cast<const VkPhysicalDeviceVulkan11Features*>(link);
        on.storage16.storageBuffer16BitAccess =
            either(on.storage16.storageBuffer16BitAccess, v11.storageBuffer16BitAccess);
        on.storage16.uniformAndStorageBuffer16BitAccess =
            either(on.storage16.uniformAndStorageBuffer16BitAccess,
                   v11.uniformAndStorageBuffer16BitAccess);
        on.storage16.storagePushConstant16 =
            either(on.storage16.storagePushConstant16, v11.storagePushConstant16);
        break;
      }
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES: {
        const auto& v12 = *reinterpret_cast<const VkPhysicalDeviceVulkan12Features*>(link);
        on.storage8.storageBuffer8BitAccess =
            either(on.storage8.storageBuffer8BitAccess, v12.storageBuffer8BitAccess);
        on.storage8.uniformAndStorageBuffer8BitAccess = either(
            on.storage8.uniformAndStorageBuffer8BitAccess, v12.uniformAndStorageBuffer8BitAccess);
        on.storage8.storagePushConstant8 =
            either(on.storage8.storagePushConstant8, v12.storagePushConstant8);
        on.float16_int8.shaderFloat16 = either(on.float16_int8.shaderFloat16, v12.shaderFloat16);
        on.float16_int8.shaderInt8 = either(on.float16_int8.shaderInt8, v12.shaderInt8);
        on.memory_model.vulkanMemoryModel =
            either(on.memory_model.vulkanMemoryModel, v12.vulkanMemoryModel);
        on.memory_model.vulkanMemoryModelDeviceScope =
            either(on.memory_model.vulkanMemoryModelDeviceScope, v12.vulkanMemoryModelDeviceScope);
        app.timeline_semaphore = app.timeline_semaphore || v12.timelineSemaphore;
        break;
      }
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES: {
        const auto& v13 = *reinterpret_cast<const VkPhysicalDeviceVulkan13Features*>(link);
        on.subgroup_size_control.subgroupSizeControl =
            either(on.subgroup_size_control.subgroupSizeControl, v13.subgroupSizeControl);
        on.subgroup_size_control.computeFullSubgroups =
            either(on.subgroup_size_control.computeFullSubgroups, v13.computeFullSubgroups);
        on.maintenance4.maintenance4 = either(on.maintenance4.maintenance4, v13.maintenance4);
        break;
      }
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES:
        app.timeline_semaphore =
            app.timeline_semaphore ||
            reinterpret_cast<const VkPhysicalDeviceTimelineSemaphoreFeatures*>(link)
                ->timelineSemaphore;
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES:
        merge(on.storage16, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES:
        merge(on.storage8, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES:
        merge(on.float16_int8, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES:
        merge(on.memory_model, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES:
        merge(on.subgroup_size_control, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES:
        merge(on.maintenance4, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT:
        merge(on.atomic_float, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV:
        merge(on.coop_matrix_nv, link);
        break;
      case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR:
        merge(on.executable_properties, link);
        break;
      default:
        // Structs newer than Vulkan's headers here (vulkan_api.hpp) have no case label.
        if (link->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR)
          merge(on.coop_matrix_khr, link);
        else if (link->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV)
          merge(on.coop_matrix2_nv, link);
        else if (link->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR)
          merge(on.bf16, link);
        break;
    }
  }
  app.timeline_semaphore = app.timeline_semaphore && timeline_known;
  // A feature of a group the device does not know (no extension enabled) was not turned on.
  const auto forget = [](bool known, auto& group) {
    if (!known) {
      const VkStructureType type = group.sType;
      group = {};
      group.sType = type;
    }
  };
  forget(on.known.storage8, on.storage8);
  forget(on.known.float16_int8, on.float16_int8);
  forget(on.known.memory_model, on.memory_model);
  forget(on.known.subgroup_size_control, on.subgroup_size_control);
  forget(on.known.maintenance4, on.maintenance4);
  forget(on.known.atomic_float, on.atomic_float);
  forget(on.known.coop_matrix_nv, on.coop_matrix_nv);
  forget(on.known.coop_matrix_khr, on.coop_matrix_khr);
  forget(on.known.coop_matrix2_nv, on.coop_matrix2_nv);
  forget(on.known.bf16, on.bf16);
  forget(on.known.executable_properties, on.executable_properties);
  return app;
}

}  // namespace mg::gpu::detail
