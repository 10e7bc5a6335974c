#include "backends/vulkan/runtime/vk_result.hpp"

#include <string>

#include "meganeura/error.hpp"

namespace mg::gpu::detail {

std::string_view result_words(VkResult result) {
  switch (result) {
    case VK_SUCCESS:
      return "success";
    case VK_NOT_READY:
      return "not ready";
    case VK_TIMEOUT:
      return "timed out";
    case VK_INCOMPLETE:
      return "incomplete result";
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      return "out of device memory";
    case VK_ERROR_INITIALIZATION_FAILED:
      return "driver initialization failed";
    case VK_ERROR_DEVICE_LOST:
      return "device lost (driver reset or GPU crash)";
    case VK_ERROR_MEMORY_MAP_FAILED:
      return "memory mapping failed";
    case VK_ERROR_LAYER_NOT_PRESENT:
      return "a requested Vulkan layer is not installed";
    case VK_ERROR_EXTENSION_NOT_PRESENT:
      return "a requested Vulkan extension is not supported";
    case VK_ERROR_FEATURE_NOT_PRESENT:
      return "a requested device feature is not supported";
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      return "no compatible Vulkan driver";
    case VK_ERROR_TOO_MANY_OBJECTS:
      return "too many objects of this kind";
    case VK_ERROR_FRAGMENTED_POOL:
      return "pool fragmented";
    case VK_ERROR_OUT_OF_POOL_MEMORY:
      return "descriptor pool exhausted";
    case VK_ERROR_INVALID_SHADER_NV:
      return "the driver rejected the shader";
    case VK_ERROR_UNKNOWN:
      return "unknown driver error";
    default:
      return "unexpected driver error";
  }
}

void check(VkResult result, std::string_view what) {
  if (result == VK_SUCCESS) return;
  Error::Kind kind = Error::Kind::input;
  if (result == VK_ERROR_OUT_OF_HOST_MEMORY || result == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
      result == VK_ERROR_OUT_OF_POOL_MEMORY) {
    kind = Error::Kind::out_of_memory;
  } else if (result == VK_ERROR_DEVICE_LOST) {
    kind = Error::Kind::device_lost;
  }
  throw Error(std::string(what) + ": " + std::string(result_words(result)), kind);
}

}  // namespace mg::gpu::detail
