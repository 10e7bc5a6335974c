/* Meganeura on the app's own Vulkan device (docs/EMBEDDING.md): a program runs on the app's
 * VkDevice and submits on the app's queue, signalling a timeline semaphore the app can wait on,
 * and copies inputs from and outputs into the app's VkBuffers on the GPU.
 *
 * The queue: Meganeura submits to it only inside calls that run work (mg_program_run, _start,
 * _train_step, _run_chunk, parameter reads and writes, program creation), from the calling
 * thread. Vulkan requires the app not to use the queue from another thread at the same time. */
#ifndef MEGANEURA_VULKAN_H
#define MEGANEURA_VULKAN_H

#include <vulkan/vulkan.h>

#include "meganeura/meganeura.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device memory from the app, for every buffer Meganeura creates on its device. `allocate` gives
 * requirements->size bytes of memory type `memory_type_index` (Meganeura picks it from the
 * requirements' memoryTypeBits) at *offset, aligned to requirements->alignment, in *memory; for a
 * host-visible type it sets *mapped to the bytes at that offset, mapped for as long as they are
 * allocated. It returns VK_SUCCESS, or an error that fails the call that needed the memory. */
typedef struct mg_vulkan_allocator {
  void* user;
  VkResult (*allocate)(void* user, const VkMemoryRequirements* requirements,
                       uint32_t memory_type_index, VkDeviceMemory* memory, VkDeviceSize* offset,
                       void** mapped);
  void (*free)(void* user, VkDeviceMemory memory, VkDeviceSize offset);
} mg_vulkan_allocator;

typedef struct mg_vulkan_device_desc {
  uint32_t struct_size; /* sizeof(mg_vulkan_device_desc) */
  VkInstance instance;
  VkPhysicalDevice physical_device;
  VkDevice device;
  VkQueue queue;
  uint32_t queue_family_index; /* the queue's family: it must support compute */
  uint32_t api_version;        /* VkApplicationInfo::apiVersion of the instance */
  /* What the app gave vkCreateDevice: its enabled extensions, its pNext chain
   * (VkPhysicalDeviceFeatures2, VkPhysicalDeviceVulkan11/12/13Features, single feature structs)
   * and its pEnabledFeatures. Meganeura needs Vulkan 1.1 and the timelineSemaphore feature; its
   * kernels use f16 storage and arithmetic, subgroup size control, maintenance4 and cooperative
   * matrices only where the app enabled them. */
  const char* const* enabled_extensions;
  uint32_t enabled_extension_count;
  const void* enabled_features;
  const VkPhysicalDeviceFeatures* enabled_core_features;
  /* NULL: Meganeura allocates its memory with vkAllocateMemory. Copied at adoption. */
  const mg_vulkan_allocator* allocator;
} mg_vulkan_device_desc;

/* A device on the app's handles, which stay the app's (released, Meganeura destroys only what
 * it created). A missing requirement returns MG_ERROR_UNSUPPORTED_DEVICE, naming each. */
MG_API mg_status mg_device_adopt_vulkan(const mg_vulkan_device_desc* desc, mg_device** device);

/* The timeline semaphore every Meganeura submission on an adopted device signals, and the value
 * its latest submission signals: wait for that value (in a VkSubmitInfo's wait semaphores, or
 * vkWaitSemaphores) before using what that submission wrote. */
MG_API mg_status mg_device_vulkan_timeline(const mg_device* device, VkSemaphore* semaphore,
                                           uint64_t* value);

/* Every run copies input `name` on the GPU from the app's `buffer` at `offset` (it needs
 * VK_BUFFER_USAGE_TRANSFER_SRC_BIT and the input's size in bytes from `offset`) instead of from
 * host memory; outputs likewise into `buffer` (VK_BUFFER_USAGE_TRANSFER_DST_BIT), after which
 * mg_program_get_output refuses them. `size` is the buffer's size in bytes. Only on an adopted
 * device. */
MG_API mg_status mg_program_bind_input_buffer(mg_program* program, const char* name,
                                              VkBuffer buffer, VkDeviceSize offset,
                                              VkDeviceSize size);
MG_API mg_status mg_program_bind_output_buffer(mg_program* program, const char* name,
                                               VkBuffer buffer, VkDeviceSize offset,
                                               VkDeviceSize size);

#ifdef __cplusplus
}
#endif

#endif /* MEGANEURA_VULKAN_H */
