#pragma once
#include <atomic>
#include <cstdint>

#include "backends/vulkan/runtime/vulkan_api.hpp"

namespace mg::gpu::detail {

// Owns the VkInstance and, with validation, the validation layer's debug messenger, which
// prints each message to stderr and counts it.
class Instance {
 public:
  explicit Instance(bool validation);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  uint32_t api_version() const { return api_version_; }
  bool validation() const { return messenger_ != VK_NULL_HANDLE; }
  uint32_t validation_message_count() const { return messages_.load(); }

 private:
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                   VkDebugUtilsMessageTypeFlagsEXT types,
                                                   const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                   void* user);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  uint32_t api_version_ = VK_API_VERSION_1_1;
  std::atomic<uint32_t> messages_{0};
};

}  // namespace mg::gpu::detail
