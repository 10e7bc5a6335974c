/* The co-tenant app's own Vulkan side: a device with one graphics+compute queue, and a scene of
 * triangles drawn offscreen by a graphics pipeline, one submission per frame. */
#ifndef COTENANT_RENDERER_H
#define COTENANT_RENDERER_H

#include <vulkan/vulkan.h>

#include "meganeura/meganeura_vulkan.h"

typedef struct Renderer {
  VkInstance instance;
  VkPhysicalDevice physical;
  uint32_t api_version;
  uint32_t family;
  VkDevice device;
  VkQueue queue;
  /* What vkCreateDevice was given, for mg_device_adopt_vulkan. */
  VkPhysicalDeviceFeatures2 features;
  VkPhysicalDeviceVulkan11Features features11;
  VkPhysicalDeviceVulkan12Features features12;
  VkPhysicalDeviceVulkan13Features features13;
  char device_name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];

  uint32_t size;
  VkImage image;
  VkDeviceMemory image_memory;
  VkImageView view;
  VkRenderPass render_pass;
  VkFramebuffer framebuffer;
  VkPipelineLayout layout;
  VkPipeline pipeline;
  VkCommandPool pool;
  VkCommandBuffer commands;
  VkFence fence;
  uint32_t triangles;
  int shading_iterations;
} Renderer;

/* Creates everything; returns 0 and prints why on failure. `size` is the square target's side. */
int renderer_create(Renderer* renderer, uint32_t size, uint32_t triangles, int shading_iterations);
void renderer_destroy(Renderer* renderer);
/* The description mg_device_adopt_vulkan needs. */
mg_vulkan_device_desc renderer_device_desc(const Renderer* renderer);
/* Records and submits one frame at `time` seconds (signalling the renderer's fence). */
int renderer_submit_frame(Renderer* renderer, float time);
/* Waits for the frame's fence. */
int renderer_wait_frame(Renderer* renderer);

#endif
