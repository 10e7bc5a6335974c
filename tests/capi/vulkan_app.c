/* The C API tests' Vulkan app (vulkan_app.h). */
#include "vulkan_app.h"

#include <string.h>

#include "checks.h"

int create_instance(App* app) {
  VkApplicationInfo info = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
  info.pApplicationName = "meganeura capi test";
  info.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo create = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  create.pApplicationInfo = &info;
  if (vkCreateInstance(&create, NULL, &app->instance) != VK_SUCCESS) return 0;
  uint32_t count = 1;
  VkResult listed = vkEnumeratePhysicalDevices(app->instance, &count, &app->physical);
  if ((listed != VK_SUCCESS && listed != VK_INCOMPLETE) || count == 0) return 0;
  VkQueueFamilyProperties families[16];
  uint32_t family_count = 16;
  vkGetPhysicalDeviceQueueFamilyProperties(app->physical, &family_count, families);
  for (app->family = 0; app->family < family_count; ++app->family)
    if (families[app->family].queueFlags & VK_QUEUE_COMPUTE_BIT) return 1;
  return 0;
}

int create_device(App* app, int timeline) {
  float priority = 1;
  VkDeviceQueueCreateInfo queue = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = app->family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  memset(&app->features12, 0, sizeof app->features12);
  app->features12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  app->features12.timelineSemaphore = timeline ? VK_TRUE : VK_FALSE;
  memset(&app->features, 0, sizeof app->features);
  app->features.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  app->features.pNext = &app->features12;
  VkDeviceCreateInfo create = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &app->features;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  if (vkCreateDevice(app->physical, &create, NULL, &app->device) != VK_SUCCESS) return 0;
  vkGetDeviceQueue(app->device, app->family, 0, &app->queue);
  return 1;
}

VkBuffer create_host_buffer(const App* app, VkDeviceSize bytes, VkBufferUsageFlags usage,
                            VkDeviceMemory* memory, void** mapped) {
  VkBufferCreateInfo create = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  create.size = bytes;
  create.usage = usage;
  VkBuffer buffer = VK_NULL_HANDLE;
  if (vkCreateBuffer(app->device, &create, NULL, &buffer) != VK_SUCCESS) return VK_NULL_HANDLE;
  VkMemoryRequirements requirements;
  vkGetBufferMemoryRequirements(app->device, buffer, &requirements);
  VkPhysicalDeviceMemoryProperties properties;
  vkGetPhysicalDeviceMemoryProperties(app->physical, &properties);
  const VkMemoryPropertyFlags wanted =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  VkMemoryAllocateInfo allocate = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = requirements.size;
  for (uint32_t type = 0; type < properties.memoryTypeCount; ++type) {
    if ((requirements.memoryTypeBits & (1u << type)) &&
        (properties.memoryTypes[type].propertyFlags & wanted) == wanted) {
      allocate.memoryTypeIndex = type;
      break;
    }
  }
  CHECK(vkAllocateMemory(app->device, &allocate, NULL, memory) == VK_SUCCESS);
  CHECK(vkBindBufferMemory(app->device, buffer, *memory, 0) == VK_SUCCESS);
  CHECK(vkMapMemory(app->device, *memory, 0, bytes, 0, mapped) == VK_SUCCESS);
  return buffer;
}

void destroy_host_buffer(const App* app, VkBuffer buffer, VkDeviceMemory memory) {
  vkDestroyBuffer(app->device, buffer, NULL);
  vkFreeMemory(app->device, memory, NULL);
}

int submit_and_wait(const App* app, VkCommandBuffer commands, VkSemaphore semaphore,
                    uint64_t value) {
  if (vkEndCommandBuffer(commands) != VK_SUCCESS) return 0;
  VkTimelineSemaphoreSubmitInfo timeline = {VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo submit = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.pNext = &timeline;
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &semaphore;
  if (vkQueueSubmit(app->queue, 1, &submit, VK_NULL_HANDLE) != VK_SUCCESS) return 0;
  VkSemaphoreWaitInfo wait = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wait.semaphoreCount = 1;
  wait.pSemaphores = &semaphore;
  wait.pValues = &value;
  return vkWaitSemaphores(app->device, &wait, 10ull * 1000 * 1000 * 1000) == VK_SUCCESS;
}
