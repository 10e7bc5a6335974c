#include "backends/vulkan/runtime/device_features.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace mg::gpu::detail {
namespace {

struct Availability {
  uint32_t api_version;
  const std::vector<std::string>& extensions;
  std::vector<const char*>& to_enable;

  // A group is known through its core version or its extension; the extension is enabled only
  // when the core version does not already provide it.
  bool group(uint32_t core_version, const char* extension) {
    if (core_version != 0 && api_version >= core_version) return true;
    if (std::find(extensions.begin(), extensions.end(), extension) == extensions.end())
      return false;
    to_enable.push_back(extension);
    return true;
  }
};

template <typename Struct>
void append(void**& tail, Struct& group, bool known) {
  if (!known) return;
  *tail = &group;
  tail = &group.pNext;
}

}  // namespace

VkPhysicalDeviceFeatures2* DeviceFeatures::chain() {
  void** tail = &core.pNext;
  append(tail, storage16, true);  // core since Vulkan 1.1, the minimum we run on
  append(tail, storage8, known.storage8);
  append(tail, float16_int8, known.float16_int8);
  append(tail, memory_model, known.memory_model);
  append(tail, subgroup_size_control, known.subgroup_size_control);
  append(tail, maintenance4, known.maintenance4);
  append(tail, atomic_float, known.atomic_float);
  append(tail, coop_matrix_nv, known.coop_matrix_nv);
  append(tail, coop_matrix_khr, known.coop_matrix_khr);
  append(tail, coop_matrix2_nv, known.coop_matrix2_nv);
  append(tail, bf16, known.bf16);
  append(tail, executable_properties, known.executable_properties);
  *tail = nullptr;
  return &core;
}

DeviceFeatures query_features(VkPhysicalDevice device, uint32_t api_version,
                              const std::vector<std::string>& extensions) {
  DeviceFeatures features;
  Availability available{api_version, extensions, features.extensions};
  features.known.storage8 = available.group(VK_API_VERSION_1_2, VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
  features.known.float16_int8 =
      available.group(VK_API_VERSION_1_2, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
  features.known.memory_model =
      available.group(VK_API_VERSION_1_2, VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME);
  features.known.subgroup_size_control =
      available.group(VK_API_VERSION_1_3, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
  features.known.maintenance4 =
      available.group(VK_API_VERSION_1_3, VK_KHR_MAINTENANCE_4_EXTENSION_NAME);
  features.known.atomic_float = available.group(0, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
  features.known.coop_matrix_nv = available.group(0, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  features.known.coop_matrix_khr = available.group(0, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
  // Workgroup-scope matrices are KHR cooperative matrices of a wider scope.
  features.known.coop_matrix2_nv = features.known.coop_matrix_khr &&
                                   available.group(0, VK_NV_COOPERATIVE_MATRIX_2_EXTENSION_NAME);
  features.known.bf16 = available.group(0, VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
  features.known.executable_properties =
      available.group(0, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  vkGetPhysicalDeviceFeatures2(device, features.chain());
  return features;
}

DeviceFeatures features_to_enable(const DeviceFeatures& supported, bool validation,
                                  bool kernel_statistics) {
  DeviceFeatures on;
  on.known = supported.known;
  on.extensions = supported.extensions;
  if (!kernel_statistics) {
    // Capturing statistics may keep more of each compilation around in the driver.
    on.known.executable_properties = false;
    std::erase_if(on.extensions, [](const char* name) {
      return std::string_view(name) == VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    });
  }
  if (validation) {
    // Debian's validation layer (1.3.239) predates these extensions and reports every device
    // and pipeline that uses them, so validated runs leave them off: the fast kernels then use
    // the NV cooperative matrices (which the layer knows) or fall back to strict.
    on.known.coop_matrix_khr = false;
    on.known.bf16 = false;
    std::erase_if(on.extensions, [](const char* name) {
      return std::string_view(name) == VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME ||
             std::string_view(name) == VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME;
    });
  }

  const auto& core = supported.core.features;
  on.core.features.shaderInt16 = core.shaderInt16;
  on.core.features.shaderInt64 = core.shaderInt64;
  on.core.features.shaderFloat64 = core.shaderFloat64;

  on.storage16.storageBuffer16BitAccess = supported.storage16.storageBuffer16BitAccess;
  on.storage16.uniformAndStorageBuffer16BitAccess =
      supported.storage16.uniformAndStorageBuffer16BitAccess;
  on.storage16.storagePushConstant16 = supported.storage16.storagePushConstant16;

  on.storage8.storageBuffer8BitAccess = supported.storage8.storageBuffer8BitAccess;
  on.storage8.uniformAndStorageBuffer8BitAccess =
      supported.storage8.uniformAndStorageBuffer8BitAccess;
  on.storage8.storagePushConstant8 = supported.storage8.storagePushConstant8;

  on.float16_int8.shaderFloat16 = supported.float16_int8.shaderFloat16;
  on.float16_int8.shaderInt8 = supported.float16_int8.shaderInt8;

  on.memory_model.vulkanMemoryModel = supported.memory_model.vulkanMemoryModel;
  on.memory_model.vulkanMemoryModelDeviceScope =
      supported.memory_model.vulkanMemoryModelDeviceScope;

  on.subgroup_size_control.subgroupSizeControl =
      supported.subgroup_size_control.subgroupSizeControl;
  on.subgroup_size_control.computeFullSubgroups =
      supported.subgroup_size_control.computeFullSubgroups;

  // SPIR-V 1.6 from glslang declares the workgroup size with LocalSizeId, which needs this.
  on.maintenance4.maintenance4 = supported.maintenance4.maintenance4;

  on.atomic_float.shaderBufferFloat32Atomics = supported.atomic_float.shaderBufferFloat32Atomics;
  on.atomic_float.shaderBufferFloat32AtomicAdd =
      supported.atomic_float.shaderBufferFloat32AtomicAdd;

  on.coop_matrix_nv.cooperativeMatrix = supported.coop_matrix_nv.cooperativeMatrix;
  on.coop_matrix_khr.cooperativeMatrix = supported.coop_matrix_khr.cooperativeMatrix;
  on.coop_matrix2_nv.cooperativeMatrixWorkgroupScope =
      supported.coop_matrix2_nv.cooperativeMatrixWorkgroupScope;
  on.coop_matrix2_nv.cooperativeMatrixFlexibleDimensions =
      supported.coop_matrix2_nv.cooperativeMatrixFlexibleDimensions;
  on.coop_matrix2_nv.cooperativeMatrixTensorAddressing =
      supported.coop_matrix2_nv.cooperativeMatrixTensorAddressing;

  on.bf16.shaderBFloat16Type = supported.bf16.shaderBFloat16Type;
  on.bf16.shaderBFloat16CooperativeMatrix = supported.bf16.shaderBFloat16CooperativeMatrix;

  on.executable_properties.pipelineExecutableInfo =
      supported.executable_properties.pipelineExecutableInfo;
  return on;
}

}  // namespace mg::gpu::detail
