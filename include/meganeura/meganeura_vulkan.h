/* Meganeura on the app's own Vulkan device (docs/EMBEDDING.md): a program runs on the app's
 * VkDevice and submits on the app's queue, signalling a timeline semaphore the app can wait on,
 * or records its work into the app's own command buffers; its kernels read inputs from and write
 * outputs into the app's VkBuffers in place (or runs copy them on the GPU).
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

typedef enum mg_buffer_binding {
  /* The kernels read the input from (write the output into) the app's buffer itself: no copy.
   * Needs VK_BUFFER_USAGE_STORAGE_BUFFER_BIT and an offset that is a multiple of the device's
   * minStorageBufferOffsetAlignment; an output must be a value each run computes. */
  MG_BUFFER_IN_PLACE = 0,
  /* Every run copies the input from (the output into) the app's buffer on the GPU. Needs
   * VK_BUFFER_USAGE_TRANSFER_SRC_BIT for an input, VK_BUFFER_USAGE_TRANSFER_DST_BIT for an
   * output. */
  MG_BUFFER_COPIED = 1
} mg_buffer_binding;

/* Binds input `name` to the app's `buffer`, whose `size` bytes and `usage` are those it was
 * created with: the tensor lies at `offset`, as stored (mg_program_tensor_info's dtype, row-major,
 * its size rounded up to 4 bytes in place). From then on runs read it there instead of from
 * mg_program_set_input, which refuses it. Outputs likewise, after which mg_program_get_output
 * refuses them. The buffer stays the app's: keep it alive while the program may run on it or a
 * recorded command buffer holds it, and order the app's own reads and writes of it against runs
 * (a run's writes are visible after its timeline value; the app's own writes before a run
 * submitted or recorded after them are seen by it). Only on an adopted device. */
MG_API mg_status mg_program_bind_input_buffer(mg_program* program, const char* name,
                                              VkBuffer buffer, VkDeviceSize offset,
                                              VkDeviceSize size, VkBufferUsageFlags usage,
                                              mg_buffer_binding binding);
MG_API mg_status mg_program_bind_output_buffer(mg_program* program, const char* name,
                                               VkBuffer buffer, VkDeviceSize offset,
                                               VkDeviceSize size, VkBufferUsageFlags usage,
                                               mg_buffer_binding binding);

/* Records the program's next run (a training step for training programs, and first the work
 * over fixed values when it is due) into the app's `commands` instead of submitting it:
 * a primary command buffer in the recording state, outside a render pass, from a pool of the
 * adopted queue's family. The app submits it on the adopted queue with a signal of `*semaphore`
 * (the device's app timeline) at `*value` (VkTimelineSemaphoreSubmitInfo) — the value of the last
 * record call into it when there are several — once, and submits the command buffers Meganeura
 * recorded into in the order they were recorded. Contract (docs/EMBEDDING.md):
 * - The recorded commands start with a barrier over all the app's earlier work on the queue and
 *   end with one that makes their writes visible to all later work and to the host.
 * - They bind compute pipelines, descriptor sets and push constants of Meganeura's: the app
 *   binds its own again before its next dispatch (graphics state is untouched).
 * - What they use (Meganeura's buffers, descriptor sets, pipelines) stays valid until the program
 *   is released, rebinds a buffer or sets a new chunk budget, which wait for the value first.
 * - mg_program_wait, outputs and parameter reads and writes wait for the value (a command buffer
 *   that will never be submitted must have its value signalled from the host, vkSignalSemaphore,
 *   else those calls fail after 60 s). Staging an input over one that a run recorded two runs
 *   before reads waits for that run: with new host inputs each run, record at most two runs
 *   into one command buffer.
 * Refused during a chunked run. */
MG_API mg_status mg_program_record_run(mg_program* program, VkCommandBuffer commands,
                                       VkSemaphore* semaphore, uint64_t* value);
/* The same for the next chunk of a chunked run (mg_program_set_chunk_budget; the first chunked
 * run measures the chunks, wait for it before recording more): `finished` receives 1 when the
 * chunk was the run's last. Any number of chunks may go into one command buffer. */
MG_API mg_status mg_program_record_chunk(mg_program* program, VkCommandBuffer commands,
                                         int* finished, VkSemaphore* semaphore, uint64_t* value);

#ifdef __cplusplus
}
#endif

#endif /* MEGANEURA_VULKAN_H */
