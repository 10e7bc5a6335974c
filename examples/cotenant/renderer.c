#include "renderer.h"

#include <stdio.h>
#include <string.h>

#include "scene_frag.h"
#include "scene_vert.h"

#define VK_TRY(call)                                                 \
  do {                                                               \
    VkResult result_ = (call);                                       \
    if (result_ != VK_SUCCESS) {                                     \
      fprintf(stderr, "cotenant: %s failed (%d)\n", #call, result_); \
      return 0;                                                      \
    }                                                                \
  } while (0)

typedef struct Push {
  float time;
  int shading_iterations;
} Push;

/* The first device with a graphics and compute queue, discrete GPUs first. */
static int choose_device(Renderer* r) {
  VkPhysicalDevice devices[16];
  uint32_t count = 16;
  VkResult listed = vkEnumeratePhysicalDevices(r->instance, &count, devices);
  if (listed != VK_SUCCESS && listed != VK_INCOMPLETE) return 0;
  int best_score = -1;
  for (uint32_t d = 0; d < count; ++d) {
    VkPhysicalDeviceProperties properties;
    vkGetPhysicalDeviceProperties(devices[d], &properties);
    if (properties.apiVersion < VK_API_VERSION_1_2) continue;
    VkQueueFamilyProperties families[16];
    uint32_t family_count = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(devices[d], &family_count, families);
    const VkQueueFlags wanted = VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT;
    for (uint32_t f = 0; f < family_count; ++f) {
      if ((families[f].queueFlags & wanted) != wanted) continue;
      const int score = properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? 3
                        : properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? 2
                                                                                          : 1;
      if (score > best_score) {
        best_score = score;
        r->physical = devices[d];
        r->family = f;
        r->api_version =
            properties.apiVersion < VK_API_VERSION_1_3 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_3;
        memcpy(r->device_name, properties.deviceName, sizeof r->device_name);
      }
      break;
    }
  }
  return best_score >= 0;
}

/* Every Vulkan 1.1/1.2/1.3 feature the device has is enabled, timeline semaphores among them
 * (Meganeura needs those; it uses the others where present). */
static int create_device(Renderer* r) {
  memset(&r->features, 0, sizeof r->features);
  memset(&r->features11, 0, sizeof r->features11);
  memset(&r->features12, 0, sizeof r->features12);
  memset(&r->features13, 0, sizeof r->features13);
  r->features.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  r->features11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
  r->features12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  r->features13.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES;
  r->features.pNext = &r->features11;
  r->features11.pNext = &r->features12;
  if (r->api_version >= VK_API_VERSION_1_3) r->features12.pNext = &r->features13;
  vkGetPhysicalDeviceFeatures2(r->physical, &r->features);
  /* Robust access costs speed and neither the scene nor Meganeura needs it. */
  r->features.features.robustBufferAccess = VK_FALSE;
  r->features13.robustImageAccess = VK_FALSE;
  if (!r->features12.timelineSemaphore) {
    fprintf(stderr, "cotenant: %s has no timeline semaphores\n", r->device_name);
    return 0;
  }
  float priority = 1;
  VkDeviceQueueCreateInfo queue = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = r->family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkDeviceCreateInfo create = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &r->features;
  create.queueCreateInfoCount = 1;
  create.pQueueCreateInfos = &queue;
  VK_TRY(vkCreateDevice(r->physical, &create, NULL, &r->device));
  vkGetDeviceQueue(r->device, r->family, 0, &r->queue);
  return 1;
}

static int create_target(Renderer* r) {
  VkImageCreateInfo image = {VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO};
  image.imageType = VK_IMAGE_TYPE_2D;
  image.format = VK_FORMAT_R8G8B8A8_UNORM;
  image.extent.width = r->size;
  image.extent.height = r->size;
  image.extent.depth = 1;
  image.mipLevels = 1;
  image.arrayLayers = 1;
  image.samples = VK_SAMPLE_COUNT_1_BIT;
  image.tiling = VK_IMAGE_TILING_OPTIMAL;
  image.usage = VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | VK_IMAGE_USAGE_TRANSFER_SRC_BIT;
  VK_TRY(vkCreateImage(r->device, &image, NULL, &r->image));
  VkMemoryRequirements requirements;
  vkGetImageMemoryRequirements(r->device, r->image, &requirements);
  VkPhysicalDeviceMemoryProperties memory;
  vkGetPhysicalDeviceMemoryProperties(r->physical, &memory);
  VkMemoryAllocateInfo allocate = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = requirements.size;
  for (uint32_t type = 0; type < memory.memoryTypeCount; ++type) {
    if (requirements.memoryTypeBits & (1u << type)) {
      allocate.memoryTypeIndex = type;
      if (memory.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) break;
    }
  }
  VK_TRY(vkAllocateMemory(r->device, &allocate, NULL, &r->image_memory));
  VK_TRY(vkBindImageMemory(r->device, r->image, r->image_memory, 0));
  VkImageViewCreateInfo view = {VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO};
  view.image = r->image;
  view.viewType = VK_IMAGE_VIEW_TYPE_2D;
  view.format = image.format;
  view.subresourceRange.aspectMask = VK_IMAGE_ASPECT_COLOR_BIT;
  view.subresourceRange.levelCount = 1;
  view.subresourceRange.layerCount = 1;
  VK_TRY(vkCreateImageView(r->device, &view, NULL, &r->view));

  VkAttachmentDescription attachment = {0};
  attachment.format = image.format;
  attachment.samples = VK_SAMPLE_COUNT_1_BIT;
  attachment.loadOp = VK_ATTACHMENT_LOAD_OP_CLEAR;
  attachment.storeOp = VK_ATTACHMENT_STORE_OP_STORE;
  attachment.stencilLoadOp = VK_ATTACHMENT_LOAD_OP_DONT_CARE;
  attachment.stencilStoreOp = VK_ATTACHMENT_STORE_OP_DONT_CARE;
  attachment.initialLayout = VK_IMAGE_LAYOUT_UNDEFINED;
  attachment.finalLayout = VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL;
  VkAttachmentReference reference = {0, VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL};
  VkSubpassDescription subpass = {0};
  subpass.pipelineBindPoint = VK_PIPELINE_BIND_POINT_GRAPHICS;
  subpass.colorAttachmentCount = 1;
  subpass.pColorAttachments = &reference;
  VkRenderPassCreateInfo pass = {VK_STRUCTURE_TYPE_RENDER_PASS_CREATE_INFO};
  pass.attachmentCount = 1;
  pass.pAttachments = &attachment;
  pass.subpassCount = 1;
  pass.pSubpasses = &subpass;
  VK_TRY(vkCreateRenderPass(r->device, &pass, NULL, &r->render_pass));
  VkFramebufferCreateInfo framebuffer = {VK_STRUCTURE_TYPE_FRAMEBUFFER_CREATE_INFO};
  framebuffer.renderPass = r->render_pass;
  framebuffer.attachmentCount = 1;
  framebuffer.pAttachments = &r->view;
  framebuffer.width = r->size;
  framebuffer.height = r->size;
  framebuffer.layers = 1;
  VK_TRY(vkCreateFramebuffer(r->device, &framebuffer, NULL, &r->framebuffer));
  return 1;
}

static int create_shader(Renderer* r, const uint32_t* code, size_t bytes, VkShaderModule* out) {
  VkShaderModuleCreateInfo module = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  module.codeSize = bytes;
  module.pCode = code;
  VK_TRY(vkCreateShaderModule(r->device, &module, NULL, out));
  return 1;
}

static int create_pipeline(Renderer* r) {
  VkPushConstantRange push = {VK_SHADER_STAGE_VERTEX_BIT | VK_SHADER_STAGE_FRAGMENT_BIT, 0,
                              sizeof(Push)};
  VkPipelineLayoutCreateInfo layout = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout.pushConstantRangeCount = 1;
  layout.pPushConstantRanges = &push;
  VK_TRY(vkCreatePipelineLayout(r->device, &layout, NULL, &r->layout));
  VkShaderModule vertex, fragment;
  if (!create_shader(r, scene_vert, sizeof scene_vert, &vertex) ||
      !create_shader(r, scene_frag, sizeof scene_frag, &fragment))
    return 0;
  VkPipelineShaderStageCreateInfo stages[2] = {
      {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO},
      {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO}};
  stages[0].stage = VK_SHADER_STAGE_VERTEX_BIT;
  stages[0].module = vertex;
  stages[0].pName = "main";
  stages[1].stage = VK_SHADER_STAGE_FRAGMENT_BIT;
  stages[1].module = fragment;
  stages[1].pName = "main";
  VkPipelineVertexInputStateCreateInfo vertex_input = {
      VK_STRUCTURE_TYPE_PIPELINE_VERTEX_INPUT_STATE_CREATE_INFO};
  VkPipelineInputAssemblyStateCreateInfo assembly = {
      VK_STRUCTURE_TYPE_PIPELINE_INPUT_ASSEMBLY_STATE_CREATE_INFO};
  assembly.topology = VK_PRIMITIVE_TOPOLOGY_TRIANGLE_LIST;
  VkViewport viewport = {0, 0, (float)r->size, (float)r->size, 0, 1};
  VkRect2D scissor = {{0, 0}, {r->size, r->size}};
  VkPipelineViewportStateCreateInfo viewports = {
      VK_STRUCTURE_TYPE_PIPELINE_VIEWPORT_STATE_CREATE_INFO};
  viewports.viewportCount = 1;
  viewports.pViewports = &viewport;
  viewports.scissorCount = 1;
  viewports.pScissors = &scissor;
  VkPipelineRasterizationStateCreateInfo raster = {
      VK_STRUCTURE_TYPE_PIPELINE_RASTERIZATION_STATE_CREATE_INFO};
  raster.polygonMode = VK_POLYGON_MODE_FILL;
  raster.cullMode = VK_CULL_MODE_NONE;
  raster.lineWidth = 1;
  VkPipelineMultisampleStateCreateInfo multisample = {
      VK_STRUCTURE_TYPE_PIPELINE_MULTISAMPLE_STATE_CREATE_INFO};
  multisample.rasterizationSamples = VK_SAMPLE_COUNT_1_BIT;
  VkPipelineColorBlendAttachmentState blend = {0};
  blend.blendEnable = VK_TRUE;
  blend.srcColorBlendFactor = VK_BLEND_FACTOR_SRC_ALPHA;
  blend.dstColorBlendFactor = VK_BLEND_FACTOR_ONE_MINUS_SRC_ALPHA;
  blend.colorBlendOp = VK_BLEND_OP_ADD;
  blend.srcAlphaBlendFactor = VK_BLEND_FACTOR_ONE;
  blend.dstAlphaBlendFactor = VK_BLEND_FACTOR_ZERO;
  blend.alphaBlendOp = VK_BLEND_OP_ADD;
  blend.colorWriteMask = VK_COLOR_COMPONENT_R_BIT | VK_COLOR_COMPONENT_G_BIT |
                         VK_COLOR_COMPONENT_B_BIT | VK_COLOR_COMPONENT_A_BIT;
  VkPipelineColorBlendStateCreateInfo blending = {
      VK_STRUCTURE_TYPE_PIPELINE_COLOR_BLEND_STATE_CREATE_INFO};
  blending.attachmentCount = 1;
  blending.pAttachments = &blend;
  VkGraphicsPipelineCreateInfo pipeline = {VK_STRUCTURE_TYPE_GRAPHICS_PIPELINE_CREATE_INFO};
  pipeline.stageCount = 2;
  pipeline.pStages = stages;
  pipeline.pVertexInputState = &vertex_input;
  pipeline.pInputAssemblyState = &assembly;
  pipeline.pViewportState = &viewports;
  pipeline.pRasterizationState = &raster;
  pipeline.pMultisampleState = &multisample;
  pipeline.pColorBlendState = &blending;
  pipeline.layout = r->layout;
  pipeline.renderPass = r->render_pass;
  VkResult created =
      vkCreateGraphicsPipelines(r->device, VK_NULL_HANDLE, 1, &pipeline, NULL, &r->pipeline);
  vkDestroyShaderModule(r->device, vertex, NULL);
  vkDestroyShaderModule(r->device, fragment, NULL);
  VK_TRY(created);
  return 1;
}

int renderer_create(Renderer* r, uint32_t size, uint32_t triangles, int shading_iterations) {
  memset(r, 0, sizeof *r);
  r->size = size;
  r->triangles = triangles;
  r->shading_iterations = shading_iterations;
  VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "meganeura cotenant";
  app.apiVersion = VK_API_VERSION_1_3;
  VkInstanceCreateInfo instance = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  instance.pApplicationInfo = &app;
  VK_TRY(vkCreateInstance(&instance, NULL, &r->instance));
  if (!choose_device(r)) {
    fprintf(stderr, "cotenant: no Vulkan 1.2 device with a graphics and compute queue\n");
    return 0;
  }
  if (!create_device(r) || !create_target(r) || !create_pipeline(r)) return 0;
  VkCommandPoolCreateInfo pool = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = r->family;
  VK_TRY(vkCreateCommandPool(r->device, &pool, NULL, &r->pool));
  VkCommandBufferAllocateInfo allocate = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  allocate.commandPool = r->pool;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  VK_TRY(vkAllocateCommandBuffers(r->device, &allocate, &r->commands));
  VkFenceCreateInfo fence = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  fence.flags = VK_FENCE_CREATE_SIGNALED_BIT;
  VK_TRY(vkCreateFence(r->device, &fence, NULL, &r->fence));
  return 1;
}

mg_vulkan_device_desc renderer_device_desc(const Renderer* r) {
  mg_vulkan_device_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.instance = r->instance;
  desc.physical_device = r->physical;
  desc.device = r->device;
  desc.queue = r->queue;
  desc.queue_family_index = r->family;
  desc.api_version = VK_API_VERSION_1_3;
  desc.enabled_features = &r->features;
  return desc;
}

int renderer_submit_frame(Renderer* r, float time) {
  VK_TRY(vkResetFences(r->device, 1, &r->fence));
  VK_TRY(vkResetCommandBuffer(r->commands, 0));
  VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  VK_TRY(vkBeginCommandBuffer(r->commands, &begin));
  VkClearValue clear = {{{0.05f, 0.05f, 0.1f, 1.0f}}};
  VkRenderPassBeginInfo pass = {VK_STRUCTURE_TYPE_RENDER_PASS_BEGIN_INFO};
  pass.renderPass = r->render_pass;
  pass.framebuffer = r->framebuffer;
  pass.renderArea.extent.width = r->size;
  pass.renderArea.extent.height = r->size;
  pass.clearValueCount = 1;
  pass.pClearValues = &clear;
  vkCmdBeginRenderPass(r->commands, &pass, VK_SUBPASS_CONTENTS_INLINE);
  vkCmdBindPipeline(r->commands, VK_PIPELINE_BIND_POINT_GRAPHICS, r->pipeline);
  Push push = {time, r->shading_iterations};
  vkCmdPushConstants(r->commands, r->layout,
                     VK_SHADER_STAGE_VERTEX_BIT | VK_SHADER_STAGE_FRAGMENT_BIT, 0, sizeof push,
                     &push);
  vkCmdDraw(r->commands, 3 * r->triangles, 1, 0, 0);
  vkCmdEndRenderPass(r->commands);
  VK_TRY(vkEndCommandBuffer(r->commands));
  VkSubmitInfo submit = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &r->commands;
  VK_TRY(vkQueueSubmit(r->queue, 1, &submit, r->fence));
  return 1;
}

int renderer_wait_frame(Renderer* r) {
  VK_TRY(vkWaitForFences(r->device, 1, &r->fence, VK_TRUE, 10ull * 1000 * 1000 * 1000));
  return 1;
}

void renderer_destroy(Renderer* r) {
  if (r->device != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(r->device);
    vkDestroyFence(r->device, r->fence, NULL);
    vkDestroyCommandPool(r->device, r->pool, NULL);
    vkDestroyPipeline(r->device, r->pipeline, NULL);
    vkDestroyPipelineLayout(r->device, r->layout, NULL);
    vkDestroyFramebuffer(r->device, r->framebuffer, NULL);
    vkDestroyRenderPass(r->device, r->render_pass, NULL);
    vkDestroyImageView(r->device, r->view, NULL);
    vkDestroyImage(r->device, r->image, NULL);
    vkFreeMemory(r->device, r->image_memory, NULL);
    vkDestroyDevice(r->device, NULL);
  }
  if (r->instance != VK_NULL_HANDLE) vkDestroyInstance(r->instance, NULL);
}
