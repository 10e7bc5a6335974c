// The C API on the app's own Vulkan device (include/meganeura/meganeura_vulkan.h).
#include <cstddef>

#include "backends/vulkan/runtime/adopted_device.hpp"
#include "capi/handles.hpp"
#include "meganeura/meganeura_vulkan.h"
#include "runtime/shared_device.hpp"

namespace mg::capi {
namespace {

gpu::VulkanAccess& adopted_access(const mg_device& device) {
  gpu::VulkanAccess* access = gpu::vulkan_access(gpu_device(*device.shared));
  if (access == nullptr || access->timeline() == VK_NULL_HANDLE)
    fail(MG_ERROR_INVALID_STATE,
         "the device was opened by Meganeura, not adopted: the app's Vulkan handles belong to "
         "devices made with mg_device_adopt_vulkan");
  return *access;
}

void bind_buffer(mg_program* program, const char* name, VkBuffer buffer, VkDeviceSize offset,
                 VkDeviceSize size, bool input) {
  require(program, "program");
  require(name, "name");
  if (buffer == VK_NULL_HANDLE) fail(MG_ERROR_INVALID_ARGUMENT, "buffer is VK_NULL_HANDLE");
  mg_device device{program->device, {}};
  gpu::VulkanAccess& access = adopted_access(device);
  const mg_tensor_role role = input ? MG_TENSOR_INPUT : MG_TENSOR_OUTPUT;
  const mg_program::Tensor* entry = nullptr;
  for (const mg_program::Tensor& candidate : program->tensors[role])
    if (candidate.name == name) entry = &candidate;
  if (entry == nullptr)
    fail(MG_ERROR_INVALID_ARGUMENT,
         std::string("the program has no ") + (input ? "input '" : "output '") + name + "'");
  const uint64_t bytes = entry->type.bytes();
  if (offset > size || bytes > size - offset)
    fail(MG_ERROR_INVALID_ARGUMENT, "'" + entry->name + "' takes " + std::to_string(bytes) +
                                        " bytes, which do not fit at offset " +
                                        std::to_string(offset) + " of a buffer of " +
                                        std::to_string(size));
  if (program->chunked_run_under_way)
    fail(MG_ERROR_INVALID_STATE, "binding a buffer during a chunked run");
  if (input && !program->session->has_input(entry->name)) return;  // pruned: never read
  const gpu::BufferId imported =
      access.import_buffer(buffer, size, "the app's buffer for '" + entry->name + "'");
  if (input)
    program->session->bind_input(entry->name, imported, offset);
  else
    program->session->bind_output(entry->name, imported, offset);
}

}  // namespace
}  // namespace mg::capi

using namespace mg::capi;

extern "C" {

mg_status mg_device_adopt_vulkan(const mg_vulkan_device_desc* desc, mg_device** device) {
  return guarded([&] {
    require(device, "device (the result pointer)");
    *device = nullptr;
    require(desc, "desc");
    // A description from an app built against an older header ends before the newer fields.
    const uint32_t oldest = offsetof(mg_vulkan_device_desc, allocator);
    if (desc->struct_size < oldest || desc->struct_size > sizeof(mg_vulkan_device_desc))
      fail(MG_ERROR_INVALID_ARGUMENT, "desc->struct_size must be sizeof(mg_vulkan_device_desc)");
    const bool has_allocator =
        desc->struct_size >= offsetof(mg_vulkan_device_desc, allocator) + sizeof(desc->allocator);
    if (desc->enabled_extension_count > 0 && desc->enabled_extensions == nullptr)
      fail(MG_ERROR_INVALID_ARGUMENT, "desc->enabled_extensions is NULL but its count is not 0");
    mg::gpu::AppVulkanDevice app;
    app.instance = desc->instance;
    app.physical_device = desc->physical_device;
    app.device = desc->device;
    app.queue = desc->queue;
    app.queue_family = desc->queue_family_index;
    app.api_version = desc->api_version;
    for (uint32_t i = 0; i < desc->enabled_extension_count; ++i) {
      require(desc->enabled_extensions[i], "an entry of desc->enabled_extensions");
      app.enabled_extensions.emplace_back(desc->enabled_extensions[i]);
    }
    app.enabled_features = desc->enabled_features;
    app.enabled_core_features = desc->enabled_core_features;
    if (has_allocator && desc->allocator != nullptr) {
      app.allocator.user = desc->allocator->user;
      app.allocator.allocate = desc->allocator->allocate;
      app.allocator.free = desc->allocator->free;
    }
    std::shared_ptr<mg::gpu::Device> adopted;
    try {
      adopted = mg::gpu::adopt_vulkan_device(app, mg::Switches::from_environment());
    } catch (const mg::Error& error) {
      fail(MG_ERROR_UNSUPPORTED_DEVICE, error.what());
    }
    auto result = std::make_unique<mg_device>();
    result->shared = mg::share_device(adopted);
    result->tensors = mg::make_shared_tensors(result->shared);
    result->description = mg::gpu::describe_device(adopted->info()) + " | the app's device";
    *device = result.release();
  });
}

mg_status mg_device_vulkan_timeline(const mg_device* device, VkSemaphore* semaphore,
                                    uint64_t* value) {
  return guarded([&] {
    require(device, "device");
    require(semaphore, "semaphore");
    require(value, "value");
    mg::gpu::VulkanAccess& access = adopted_access(*device);
    *semaphore = access.timeline();
    *value = access.timeline_value();
  });
}

mg_status mg_program_bind_input_buffer(mg_program* program, const char* name, VkBuffer buffer,
                                       VkDeviceSize offset, VkDeviceSize size) {
  return guarded([&] { bind_buffer(program, name, buffer, offset, size, true); });
}

mg_status mg_program_bind_output_buffer(mg_program* program, const char* name, VkBuffer buffer,
                                        VkDeviceSize offset, VkDeviceSize size) {
  return guarded([&] { bind_buffer(program, name, buffer, offset, size, false); });
}

}  // extern "C"
