/* The C API tests' Vulkan app: an instance, a device made as an app makes it, and its buffers and
 * submissions (vulkan_app.c). */
#ifndef MEGANEURA_CAPI_VULKAN_APP_H
#define MEGANEURA_CAPI_VULKAN_APP_H

#include "meganeura/meganeura_vulkan.h"

typedef struct App {
  VkInstance instance;
  VkPhysicalDevice physical;
  uint32_t family;
  VkDevice device;
  VkQueue queue;
  VkPhysicalDeviceVulkan12Features features12;
  VkPhysicalDeviceFeatures2 features;
} App;

/* A Vulkan 1.2 instance, its first device and a compute queue family; 0 on failure. */
int create_instance(App* app);
/* The device, with or without the timelineSemaphore feature; 0 on failure. */
int create_device(App* app, int timeline);
/* A host-visible, coherent buffer of `bytes` with `usage`, mapped at *mapped. */
VkBuffer create_host_buffer(const App* app, VkDeviceSize bytes, VkBufferUsageFlags usage,
                            VkDeviceMemory* memory, void** mapped);
void destroy_host_buffer(const App* app, VkBuffer buffer, VkDeviceMemory memory);
/* Ends `commands`, submits it on the app's queue signalling `semaphore` at `value` and waits for
 * that value on the host; 1 on success. */
int submit_and_wait(const App* app, VkCommandBuffer commands, VkSemaphore semaphore,
                    uint64_t value);

/* The tests of recording into the app's command buffers and of buffers bound in place
 * (vulkan_record.c), on a device adopted from `app`. */
void test_in_place_buffers(const App* app, mg_device* device);
void test_recorded_runs(const App* app, mg_device* device);

#endif
