/* Meganeura on a Vulkan device this test creates as an app would: a device without timeline
 * semaphores is refused with the feature named; on one with them, a program reads its input from
 * and writes its output into the app's own buffers, the app waits on the timeline, and every
 * buffer's memory comes from the app's allocator (at an offset, to check it is honoured). */
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "vulkan_app.h"

enum { kBatch = 4, kPixels = 64, kClasses = 4 };

/* The test's allocator: one VkDeviceMemory per request, handed out at offset `alignment` of it. */
typedef struct Allocator {
  const App* app;
  int live, total;
} Allocator;

static VkResult allocate_memory(void* user, const VkMemoryRequirements* requirements, uint32_t type,
                                VkDeviceMemory* memory, VkDeviceSize* offset, void** mapped) {
  Allocator* allocator = user;
  VkMemoryAllocateInfo allocate = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  allocate.allocationSize = requirements->size + requirements->alignment;
  allocate.memoryTypeIndex = type;
  VkResult result = vkAllocateMemory(allocator->app->device, &allocate, NULL, memory);
  if (result != VK_SUCCESS) return result;
  *offset = requirements->alignment;
  VkPhysicalDeviceMemoryProperties properties;
  vkGetPhysicalDeviceMemoryProperties(allocator->app->physical, &properties);
  if (properties.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
    void* base = NULL;
    result = vkMapMemory(allocator->app->device, *memory, 0, VK_WHOLE_SIZE, 0, &base);
    if (result != VK_SUCCESS) return result;
    *mapped = (char*)base + *offset;
  }
  ++allocator->live;
  ++allocator->total;
  return VK_SUCCESS;
}

static void free_memory(void* user, VkDeviceMemory memory, VkDeviceSize offset) {
  Allocator* allocator = user;
  CHECK(offset > 0);
  vkFreeMemory(allocator->app->device, memory, NULL);
  --allocator->live;
}

static mg_vulkan_device_desc describe(const App* app) {
  mg_vulkan_device_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.struct_size = sizeof desc;
  desc.instance = app->instance;
  desc.physical_device = app->physical;
  desc.device = app->device;
  desc.queue = app->queue;
  desc.queue_family_index = app->family;
  desc.api_version = VK_API_VERSION_1_2;
  desc.enabled_features = &app->features;
  return desc;
}

static void test_missing_timeline(App* app) {
  if (!create_device(app, 0)) {
    CHECK(!"creating a device without timeline semaphores");
    return;
  }
  mg_vulkan_device_desc desc = describe(app);
  mg_device* device = (mg_device*)1;
  CHECK_STATUS(mg_device_adopt_vulkan(&desc, &device), MG_ERROR_UNSUPPORTED_DEVICE);
  CHECK(device == NULL);
  CHECK(strstr(mg_last_error(), "timelineSemaphore") != NULL);
  desc.struct_size = 3;
  CHECK_STATUS(mg_device_adopt_vulkan(&desc, &device), MG_ERROR_INVALID_ARGUMENT);
  desc = describe(app);
  desc.queue = VK_NULL_HANDLE;
  CHECK_STATUS(mg_device_adopt_vulkan(&desc, &device), MG_ERROR_UNSUPPORTED_DEVICE);
  CHECK(strstr(mg_last_error(), "VkQueue") != NULL);
  vkDestroyDevice(app->device, NULL);
}

static void run_on_app_buffers(App* app, mg_device* device) {
  mg_program_options options;
  mg_program_options_init(&options);
  options.batch = kBatch;
  options.seed = 11;
  mg_program* program = NULL;
  CHECK_OK(mg_program_create_classifier(
      device, "{\"architecture\": \"mlp\", \"image_size\": 8, \"classes\": 4}", &options,
      &program));
  if (program == NULL) return;
  VkDeviceMemory input_memory, output_memory;
  float* input = NULL;
  float* output = NULL;
  const VkDeviceSize input_bytes = sizeof(float) * kBatch * kPixels;
  const VkDeviceSize output_bytes = sizeof(float) * kBatch * kClasses;
  VkBuffer input_buffer = create_host_buffer(app, input_bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                             &input_memory, (void**)&input);
  VkBuffer output_buffer = create_host_buffer(app, output_bytes, VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                              &output_memory, (void**)&output);
  const VkBufferUsageFlags source = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, 4, input_bytes, source,
                                            MG_BUFFER_COPIED),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", VK_NULL_HANDLE, 0, input_bytes,
                                            source, MG_BUFFER_COPIED),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, 0, input_bytes,
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT, MG_BUFFER_COPIED),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mg_last_error(), "TRANSFER_SRC") != NULL);
  CHECK_OK(mg_program_bind_input_buffer(program, "images", input_buffer, 0, input_bytes, source,
                                        MG_BUFFER_COPIED));
  CHECK_OK(mg_program_bind_output_buffer(program, "logits", output_buffer, 0, output_bytes,
                                         VK_BUFFER_USAGE_TRANSFER_DST_BIT, MG_BUFFER_COPIED));
  size_t copies = 0;
  CHECK_OK(mg_program_run_transfers(program, &copies, NULL));
  CHECK(copies == 2); /* the input from the app's buffer and the output into the app's */

  fill_random(input, kBatch * kPixels, 5);
  memset(output, 0, output_bytes);
  CHECK_STATUS(mg_program_set_input(program, "images", MG_DTYPE_F32, input, kBatch * kPixels),
               MG_ERROR_FAILED);
  CHECK_OK(mg_program_start(program));
  VkSemaphore timeline = VK_NULL_HANDLE;
  uint64_t value = 0;
  CHECK_OK(mg_device_vulkan_timeline(device, &timeline, &value));
  CHECK(timeline != VK_NULL_HANDLE && value > 0);
  VkSemaphoreWaitInfo wait = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wait.semaphoreCount = 1;
  wait.pSemaphores = &timeline;
  wait.pValues = &value;
  CHECK(vkWaitSemaphores(app->device, &wait, 10ull * 1000 * 1000 * 1000) == VK_SUCCESS);
  double expected[kBatch * kClasses];
  mlp_reference(program, input, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(output, expected, kBatch * kClasses) < 1e-5);
  float unused[kBatch * kClasses];
  CHECK_STATUS(mg_program_get_output(program, "logits", unused, kBatch * kClasses),
               MG_ERROR_FAILED);
  CHECK_OK(mg_program_wait(program));
  CHECK_OK(mg_program_release(program));
  vkDestroyBuffer(app->device, input_buffer, NULL);
  vkDestroyBuffer(app->device, output_buffer, NULL);
  vkFreeMemory(app->device, input_memory, NULL);
  vkFreeMemory(app->device, output_memory, NULL);
}

void test_adopted_device(void) {
  App app;
  memset(&app, 0, sizeof app);
  if (!create_instance(&app)) {
    CHECK(!"creating a Vulkan 1.2 instance with a compute queue");
    return;
  }
  test_missing_timeline(&app);
  if (!create_device(&app, 1)) {
    CHECK(!"creating a device with timeline semaphores");
    vkDestroyInstance(app.instance, NULL);
    return;
  }
  Allocator counts = {&app, 0, 0};
  mg_vulkan_allocator allocator = {&counts, allocate_memory, NULL};
  mg_vulkan_device_desc desc = describe(&app);
  desc.allocator = &allocator;
  mg_device* device = NULL;
  CHECK_STATUS(mg_device_adopt_vulkan(&desc, &device), MG_ERROR_UNSUPPORTED_DEVICE);
  CHECK(strstr(mg_last_error(), "allocator") != NULL);
  allocator.free = free_memory;
  CHECK_OK(mg_device_adopt_vulkan(&desc, &device));
  if (device != NULL) {
    run_on_app_buffers(&app, device);
    test_in_place_buffers(&app, device);
    test_recorded_runs(&app, device);
    CHECK_OK(mg_device_release(device));
  }
  CHECK(counts.total > 0);
  CHECK(counts.live == 0);
  /* Meganeura left the app's device and queue alive and idle-able. */
  CHECK(vkDeviceWaitIdle(app.device) == VK_SUCCESS);
  vkDestroyDevice(app.device, NULL);
  vkDestroyInstance(app.instance, NULL);
}
