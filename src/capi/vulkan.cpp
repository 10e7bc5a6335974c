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
                 VkDeviceSize size, VkBufferUsageFlags usage, mg_buffer_binding binding,
                 bool input) {
  require(program, "program");
  require(name, "name");
  if (buffer == VK_NULL_HANDLE) fail(MG_ERROR_INVALID_ARGUMENT, "buffer is VK_NULL_HANDLE");
  if (binding != MG_BUFFER_IN_PLACE && binding != MG_BUFFER_COPIED)
    fail(MG_ERROR_INVALID_ARGUMENT, "binding is neither MG_BUFFER_IN_PLACE nor MG_BUFFER_COPIED");
  mg_device device{program->device, {}, {}};
  gpu::VulkanAccess& access = adopted_access(device);
  const mg_tensor_role role = input ? MG_TENSOR_INPUT : MG_TENSOR_OUTPUT;
  const mg_program::Tensor* entry = nullptr;
  for (const mg_program::Tensor& candidate : program->tensors[role])
    if (candidate.name == name) entry = &candidate;
  if (entry == nullptr)
    fail(MG_ERROR_INVALID_ARGUMENT,
         std::string("the program has no ") + (input ? "input '" : "output '") + name + "'");
  const bool in_place = binding == MG_BUFFER_IN_PLACE;
  const std::string what = (input ? "input '" : "output '") + entry->name + "'";
  const VkBufferUsageFlags needed = in_place ? VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
                                    : input  ? VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                                             : VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  if ((usage & needed) == 0)
    fail(MG_ERROR_INVALID_ARGUMENT,
         what + (in_place ? " bound in place needs a buffer with VK_BUFFER_USAGE_STORAGE_BUFFER_BIT"
                 : input  ? " bound copied needs a buffer with VK_BUFFER_USAGE_TRANSFER_SRC_BIT"
                          : " bound copied needs a buffer with VK_BUFFER_USAGE_TRANSFER_DST_BIT"));
  // Kernels bind whole 4-byte words.
  const uint64_t bytes = in_place ? (entry->type.bytes() + 3) / 4 * 4 : entry->type.bytes();
  if (offset > size || bytes > size - offset)
    fail(MG_ERROR_INVALID_ARGUMENT,
         what + " takes " + std::to_string(bytes) + " bytes, which do not fit at offset " +
             std::to_string(offset) + " of a buffer of " + std::to_string(size));
  if (program->chunked_run_under_way)
    fail(MG_ERROR_INVALID_STATE, "binding a buffer during a chunked run");
  if (input && !program->session->has_input(entry->name)) return;  // pruned: never read
  const gpu::BufferId imported =
      access.import_buffer(buffer, size, "the app's buffer for '" + entry->name + "'");
  const Session::Binding mode = in_place ? Session::Binding::in_place : Session::Binding::copied;
  try {
    if (input)
      program->session->bind_input(entry->name, imported, offset, mode);
    else
      program->session->bind_output(entry->name, imported, offset, mode);
  } catch (const Error& error) {
    fail(MG_ERROR_INVALID_ARGUMENT, error.what());
  }
}

// The record calls' common part: the app's timeline and the value its submission signals.
void report_recorded(const mg_program& program, const Session::Recorded& recorded,
                     VkSemaphore* semaphore, uint64_t* value) {
  mg_device device{program.device, {}, {}};
  *semaphore = adopted_access(device).app_timeline();
  *value = recorded.signal_value;
}

void require_recordable(mg_program* program, VkCommandBuffer commands, VkSemaphore* semaphore,
                        uint64_t* value) {
  require(program, "program");
  if (commands == VK_NULL_HANDLE) fail(MG_ERROR_INVALID_ARGUMENT, "commands is VK_NULL_HANDLE");
  require(semaphore, "semaphore");
  require(value, "value");
  mg_device device{program->device, {}, {}};
  adopted_access(device);
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
                                       VkDeviceSize offset, VkDeviceSize size,
                                       VkBufferUsageFlags usage, mg_buffer_binding binding) {
  return guarded([&] { bind_buffer(program, name, buffer, offset, size, usage, binding, true); });
}

mg_status mg_program_bind_output_buffer(mg_program* program, const char* name, VkBuffer buffer,
                                        VkDeviceSize offset, VkDeviceSize size,
                                        VkBufferUsageFlags usage, mg_buffer_binding binding) {
  return guarded([&] { bind_buffer(program, name, buffer, offset, size, usage, binding, false); });
}

mg_status mg_program_record_run(mg_program* program, VkCommandBuffer commands,
                                VkSemaphore* semaphore, uint64_t* value) {
  return guarded([&] {
    require_recordable(program, commands, semaphore, value);
    refuse_during_chunked_run(*program, "mg_program_record_run");
    prepare_step(*program);
    const mg::Session::Recorded recorded = program->session->record_run(commands);
    program->run_in_flight = true;
    program->has_outputs = true;
    if (program->kind == MG_PROGRAM_TRAINING) ++program->steps;
    report_recorded(*program, recorded, semaphore, value);
  });
}

mg_status mg_program_record_chunk(mg_program* program, VkCommandBuffer commands, int* finished,
                                  VkSemaphore* semaphore, uint64_t* value) {
  return guarded([&] {
    require(finished, "finished");
    *finished = 0;
    require_recordable(program, commands, semaphore, value);
    if (program->session->chunk_count() == 0)
      fail(MG_ERROR_INVALID_STATE,
           "mg_program_record_chunk needs mg_program_set_chunk_budget first");
    if (!program->chunked_run_under_way) prepare_step(*program);
    program->chunked_run_under_way = true;
    const mg::Session::Recorded recorded = program->session->record_next_chunk(commands);
    report_recorded(*program, recorded, semaphore, value);
    if (!recorded.last_chunk) return;
    program->chunked_run_under_way = false;
    program->has_outputs = true;
    if (program->kind == MG_PROGRAM_TRAINING) ++program->steps;
    *finished = 1;
  });
}

}  // extern "C"
