#include "backends/vulkan/runtime/instance.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

bool validation_layer_installed() {
  uint32_t count = 0;
  vkEnumerateInstanceLayerProperties(&count, nullptr);
  std::vector<VkLayerProperties> layers(count);
  vkEnumerateInstanceLayerProperties(&count, layers.data());
  for (const auto& layer : layers)
    if (std::strcmp(layer.layerName, kValidationLayer) == 0) return true;
  return false;
}

VkDebugUtilsMessengerCreateInfoEXT messenger_info(void* user,
                                                  PFN_vkDebugUtilsMessengerCallbackEXT callback) {
  auto info = vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(
      VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  // Info and verbose messages are the loader chatting, not problems in our use of Vulkan.
  info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  info.pfnUserCallback = callback;
  info.pUserData = user;
  return info;
}

// Keeps the Vulkan drivers loaded for the rest of the process. The loader unloads a driver with
// the last instance and loads it again for the next, and glibc never gives back the static TLS
// space that a driver library takes when loaded (NVIDIA's takes some): after some tens of
// sessions in one process the driver no longer loads and vkCreateInstance reports no driver.
// One bare instance that is never destroyed keeps every driver loaded once; the process's exit
// reclaims it. Where validation is asked for, a second kept instance holds the validation layer
// loaded too, or it would be unloaded and loaded again with every device.
void keep_drivers_loaded(uint32_t api_version, bool validation) {
  const auto keep = [api_version](bool with_layer) {
    auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "meganeura (keeps the drivers loaded)";
    app.apiVersion = api_version;
    auto create = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    create.pApplicationInfo = &app;
    const char* layers[] = {kValidationLayer};
    if (with_layer) {
      create.enabledLayerCount = 1;
      create.ppEnabledLayerNames = layers;
    }
    VkInstance kept = VK_NULL_HANDLE;
    // A failure here is reported by the instance that follows.
    vkCreateInstance(&create, nullptr, &kept);
  };
  static std::once_flag bare, validated;
  std::call_once(bare, keep, false);
  if (validation) std::call_once(validated, keep, true);
}

}  // namespace

Instance::Instance(bool validation) {
  if (validation && !validation_layer_installed())
    throw Error(
        "Vulkan validation was requested (MEGANEURA_VALIDATE=1 or a test) but "
        "VK_LAYER_KHRONOS_validation is not installed: install the vulkan-validationlayers "
        "package");

  // The loader of a Vulkan 1.0 system lacks vkEnumerateInstanceVersion.
  auto enumerate_version = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(
      vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (enumerate_version != nullptr) enumerate_version(&loader_version);
  if (loader_version < VK_API_VERSION_1_1)
    throw Error(
        "the Vulkan loader supports only Vulkan 1.0; Meganeura needs 1.1 or newer "
        "(update libvulkan1)");
  api_version_ = loader_version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : loader_version;
  keep_drivers_loaded(api_version_, validation);

  auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "meganeura";
  app.pEngineName = "meganeura";
  app.apiVersion = api_version_;

  std::vector<const char*> layers;
  std::vector<const char*> extensions;
  auto debug_info = messenger_info(this, &Instance::on_message);
  auto create = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  create.pApplicationInfo = &app;
  if (validation) {
    layers.push_back(kValidationLayer);
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    // Chained so that messages about instance creation and destruction are seen too.
    create.pNext = &debug_info;
  }
  create.enabledLayerCount = static_cast<uint32_t>(layers.size());
  create.ppEnabledLayerNames = layers.data();
  create.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  create.ppEnabledExtensionNames = extensions.data();

  VkResult result = vkCreateInstance(&create, nullptr, &instance_);
  if (result == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw Error(
        "no Vulkan driver found: install your GPU's Vulkan driver, or mesa-vulkan-drivers "
        "for the CPU fallback (Lavapipe)");
  check(result, "creating the Vulkan instance");

  if (validation) {
    auto create_messenger = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    result = create_messenger != nullptr
                 ? create_messenger(instance_, &debug_info, nullptr, &messenger_)
                 : VK_ERROR_EXTENSION_NOT_PRESENT;
    if (result != VK_SUCCESS) {
      vkDestroyInstance(instance_, nullptr);
      check(result, "creating the validation message callback");
    }
  }
}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy_messenger = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    destroy_messenger(instance_, messenger_, nullptr);
  }
  vkDestroyInstance(instance_, nullptr);
}

VKAPI_ATTR VkBool32 VKAPI_CALL
Instance::on_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT,
                     const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
  static_cast<Instance*>(user)->messages_.fetch_add(1);
  std::fprintf(stderr, "vulkan validation: %s\n", data->pMessage);
  return VK_FALSE;  // never abort the call that triggered the message
}

}  // namespace mg::gpu::detail
