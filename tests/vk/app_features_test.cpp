// Reading which features an app enabled on its own VkDevice from what it gave vkCreateDevice
// (device_features.hpp, features_enabled_by_app): the Vulkan 1.x structs, single feature structs
// and pEnabledFeatures all count, and nothing counts whose extension the app did not enable.
#include <gtest/gtest.h>

#include "backends/vulkan/runtime/device_features.hpp"

namespace mg::gpu::detail {
namespace {

TEST(AppFeatures, VulkanStructsOfTheDeviceVersionAreRead) {
  auto v11 = vk_struct<VkPhysicalDeviceVulkan11Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  v11.storageBuffer16BitAccess = VK_TRUE;
  auto v12 = vk_struct<VkPhysicalDeviceVulkan12Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  v12.shaderFloat16 = VK_TRUE;
  v12.timelineSemaphore = VK_TRUE;
  auto v13 = vk_struct<VkPhysicalDeviceVulkan13Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
  v13.maintenance4 = VK_TRUE;
  v11.pNext = &v12;
  v12.pNext = &v13;
  const AppFeatures app = features_enabled_by_app(VK_API_VERSION_1_3, {}, &v11, nullptr);
  EXPECT_TRUE(app.timeline_semaphore);
  EXPECT_TRUE(app.enabled.storage16.storageBuffer16BitAccess);
  EXPECT_TRUE(app.enabled.float16_int8.shaderFloat16);
  EXPECT_FALSE(app.enabled.float16_int8.shaderInt8);
  EXPECT_TRUE(app.enabled.maintenance4.maintenance4);
  EXPECT_FALSE(app.enabled.subgroup_size_control.subgroupSizeControl);
}

TEST(AppFeatures, SingleStructsNeedTheirExtensionBelowTheirCoreVersion) {
  auto timeline = vk_struct<VkPhysicalDeviceTimelineSemaphoreFeatures>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES);
  timeline.timelineSemaphore = VK_TRUE;
  auto half = vk_struct<VkPhysicalDeviceShaderFloat16Int8Features>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
  half.shaderFloat16 = VK_TRUE;
  auto atomics = vk_struct<VkPhysicalDeviceShaderAtomicFloatFeaturesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT);
  atomics.shaderBufferFloat32AtomicAdd = VK_TRUE;
  timeline.pNext = &half;
  half.pNext = &atomics;

  // Vulkan 1.1 without the extensions: none of them is on.
  AppFeatures app = features_enabled_by_app(VK_API_VERSION_1_1, {}, &timeline, nullptr);
  EXPECT_FALSE(app.timeline_semaphore);
  EXPECT_FALSE(app.enabled.known.float16_int8);
  EXPECT_FALSE(app.enabled.float16_int8.shaderFloat16);
  EXPECT_FALSE(app.enabled.atomic_float.shaderBufferFloat32AtomicAdd);

  app = features_enabled_by_app(
      VK_API_VERSION_1_1,
      {VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME,
       VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME},
      &timeline, nullptr);
  EXPECT_TRUE(app.timeline_semaphore);
  EXPECT_TRUE(app.enabled.float16_int8.shaderFloat16);
  EXPECT_TRUE(app.enabled.atomic_float.shaderBufferFloat32AtomicAdd);
  EXPECT_FALSE(app.enabled.atomic_float.shaderBufferFloat32Atomics);
}

TEST(AppFeatures, CoreFeaturesComeFromFeatures2OrEnabledFeatures) {
  VkPhysicalDeviceFeatures core{};
  core.shaderInt64 = VK_TRUE;
  AppFeatures app = features_enabled_by_app(VK_API_VERSION_1_2, {}, nullptr, &core);
  EXPECT_TRUE(app.enabled.core.features.shaderInt64);
  EXPECT_FALSE(app.timeline_semaphore);

  auto features2 =
      vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  features2.features.shaderInt16 = VK_TRUE;
  app = features_enabled_by_app(VK_API_VERSION_1_2, {}, &features2, nullptr);
  EXPECT_TRUE(app.enabled.core.features.shaderInt16);
  EXPECT_FALSE(app.enabled.core.features.shaderInt64);
}

}  // namespace
}  // namespace mg::gpu::detail
