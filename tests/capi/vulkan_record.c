/* Buffers of the app bound in place and runs recorded into the app's own command buffers, on a
 * device adopted from the test's app: kernels read the app's input buffer and write its output
 * buffer with no copy (the program's copy count says so) and give the double-precision reference;
 * runs, training steps and chunks of steps recorded into a command buffer the test submits itself
 * give bit for bit what submitted runs give; a training program recorded in one command buffer
 * with an inference program sharing its weights is seen by it. */
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "vulkan_app.h"

enum { kBatch = 4, kPixels = 64, kClasses = 4, kHidden = 256 };
static const char* const kMlp = "{\"architecture\": \"mlp\", \"image_size\": 8, \"classes\": 4}";
static const VkDeviceSize kImageBytes = sizeof(float) * kBatch * kPixels;
static const VkDeviceSize kLogitBytes = sizeof(float) * kBatch * kClasses;

static mg_program* mlp_program(mg_device* device, mg_program_kind kind, uint64_t seed, int shared) {
  mg_program_options options;
  mg_program_options_init(&options);
  options.kind = kind;
  options.batch = kBatch;
  options.seed = seed;
  options.learning_rate = 0.01;
  options.share_parameters = shared;
  mg_program* program = NULL;
  CHECK_OK(mg_program_create_classifier(device, kMlp, &options, &program));
  return program;
}

static void set_batch(mg_program* program, float* images, int* labels, unsigned seed) {
  fill_random(images, kBatch * kPixels, seed);
  CHECK_OK(mg_program_set_input(program, "images", MG_DTYPE_F32, images, kBatch * kPixels));
  if (labels == NULL) return;
  for (int i = 0; i < kBatch; ++i) labels[i] = (i * 3 + (int)seed) % kClasses;
  CHECK_OK(mg_program_set_input(program, "labels", MG_DTYPE_I32, labels, kBatch));
}

static int same_weights(mg_program* a, mg_program* b) {
  static float x[kHidden * kPixels], y[kHidden * kPixels];
  CHECK_OK(mg_program_read_parameter(a, "model.fc1.weight", x, kHidden * kPixels));
  CHECK_OK(mg_program_read_parameter(b, "model.fc1.weight", y, kHidden * kPixels));
  return memcmp(x, y, sizeof x) == 0;
}

static VkDeviceSize storage_alignment(const App* app) {
  VkPhysicalDeviceProperties properties;
  vkGetPhysicalDeviceProperties(app->physical, &properties);
  return properties.limits.minStorageBufferOffsetAlignment;
}

/* An inference program reading the app's input buffer (at an aligned offset) and writing its
 * output buffer in place, over two batches, and the misuse of in-place binding. */
static void inference_in_place(const App* app, mg_device* device) {
  mg_program* program = mlp_program(device, MG_PROGRAM_INFERENCE, 11, 0);
  if (program == NULL) return;
  size_t copies = 0;
  uint64_t bytes = 0;
  CHECK_OK(mg_program_run_transfers(program, &copies, &bytes));
  CHECK(copies == 2 && bytes == kImageBytes + kLogitBytes);

  const VkDeviceSize alignment = storage_alignment(app);
  const VkBufferUsageFlags storage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkDeviceMemory input_memory, output_memory;
  char* input = NULL;
  float* output = NULL;
  VkBuffer input_buffer =
      create_host_buffer(app, alignment + kImageBytes, storage, &input_memory, (void**)&input);
  VkBuffer output_buffer =
      create_host_buffer(app, kLogitBytes, storage, &output_memory, (void**)&output);
  const VkDeviceSize input_size = alignment + kImageBytes;
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, alignment, input_size,
                                            VK_BUFFER_USAGE_TRANSFER_SRC_BIT, MG_BUFFER_IN_PLACE),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mg_last_error(), "STORAGE_BUFFER") != NULL);
  if (alignment > 4) {
    CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, 4, input_size,
                                              storage, MG_BUFFER_IN_PLACE),
                 MG_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(mg_last_error(), "alignment") != NULL);
  }
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, alignment, kImageBytes,
                                            storage, MG_BUFFER_IN_PLACE),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_bind_input_buffer(program, "images", input_buffer, alignment, input_size,
                                            storage, (mg_buffer_binding)7),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mg_program_bind_input_buffer(program, "images", input_buffer, alignment, input_size,
                                        storage, MG_BUFFER_IN_PLACE));
  CHECK_OK(mg_program_bind_output_buffer(program, "logits", output_buffer, 0, kLogitBytes, storage,
                                         MG_BUFFER_IN_PLACE));
  CHECK_OK(mg_program_run_transfers(program, &copies, &bytes));
  CHECK(copies == 0 && bytes == 0);

  float* images = (float*)(input + alignment);
  double expected[kBatch * kClasses];
  for (unsigned batch = 0; batch < 2; ++batch) {
    fill_random(images, kBatch * kPixels, 21 + batch);
    memset(output, 0, kLogitBytes);
    CHECK_OK(mg_program_run(program));
    mlp_reference(program, images, kBatch, kPixels, kClasses, expected);
    CHECK(relative_difference(output, expected, kBatch * kClasses) < 1e-5);
  }
  CHECK_STATUS(mg_program_set_input(program, "images", MG_DTYPE_F32, images, kBatch * kPixels),
               MG_ERROR_FAILED);
  CHECK_OK(mg_program_release(program));
  destroy_host_buffer(app, input_buffer, input_memory);
  destroy_host_buffer(app, output_buffer, output_memory);
}

/* Training steps reading images and labels from the app's buffers and writing the loss into one,
 * in place, give the weights and losses of steps on host inputs. */
static void training_in_place(const App* app, mg_device* device) {
  mg_program* host = mlp_program(device, MG_PROGRAM_TRAINING, 3, 0);
  mg_program* bound = mlp_program(device, MG_PROGRAM_TRAINING, 3, 0);
  if (host == NULL || bound == NULL) return;
  const VkBufferUsageFlags storage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkDeviceMemory memory[3];
  float* images = NULL;
  int* labels = NULL;
  float* loss = NULL;
  VkBuffer buffers[3] = {
      create_host_buffer(app, kImageBytes, storage, &memory[0], (void**)&images),
      create_host_buffer(app, sizeof(int) * kBatch, storage, &memory[1], (void**)&labels),
      create_host_buffer(app, sizeof(float), storage, &memory[2], (void**)&loss)};
  set_batch(host, images, labels, 31);
  size_t host_copies = 0, bound_copies = 0;
  uint64_t host_bytes = 0, bound_bytes = 0;
  CHECK_OK(mg_program_run_transfers(host, &host_copies, &host_bytes));
  CHECK_OK(mg_program_bind_input_buffer(bound, "images", buffers[0], 0, kImageBytes, storage,
                                        MG_BUFFER_IN_PLACE));
  CHECK_OK(mg_program_bind_input_buffer(bound, "labels", buffers[1], 0, sizeof(int) * kBatch,
                                        storage, MG_BUFFER_IN_PLACE));
  CHECK_OK(mg_program_bind_output_buffer(bound, "loss", buffers[2], 0, sizeof(float), storage,
                                         MG_BUFFER_IN_PLACE));
  CHECK_OK(mg_program_run_transfers(bound, &bound_copies, &bound_bytes));
  CHECK(host_copies - bound_copies == 3);
  CHECK(host_bytes - bound_bytes == kImageBytes + sizeof(int) * kBatch + sizeof(float));
  for (int step = 0; step < 2; ++step) {
    float host_loss = 0;
    CHECK_OK(mg_program_train_step(host, &host_loss));
    *loss = 0;
    CHECK_OK(mg_program_run(bound));
    CHECK(*loss == host_loss && host_loss > 0);
  }
  CHECK(same_weights(host, bound));
  CHECK_OK(mg_program_release(host));
  CHECK_OK(mg_program_release(bound));
  for (int i = 0; i < 3; ++i) destroy_host_buffer(app, buffers[i], memory[i]);
}

void test_in_place_buffers(const App* app, mg_device* device) {
  inference_in_place(app, device);
  training_in_place(app, device);
}

typedef struct AppCommands {
  VkCommandPool pool;
  VkCommandBuffer buffer;
} AppCommands;

static int begin(const App* app, AppCommands* commands) {
  if (commands->pool == VK_NULL_HANDLE) {
    VkCommandPoolCreateInfo pool = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pool.queueFamilyIndex = app->family;
    if (vkCreateCommandPool(app->device, &pool, NULL, &commands->pool) != VK_SUCCESS) return 0;
    VkCommandBufferAllocateInfo allocate = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    allocate.commandPool = commands->pool;
    allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    allocate.commandBufferCount = 1;
    if (vkAllocateCommandBuffers(app->device, &allocate, &commands->buffer) != VK_SUCCESS) return 0;
  }
  VkCommandBufferBeginInfo info = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  return vkResetCommandBuffer(commands->buffer, 0) == VK_SUCCESS &&
         vkBeginCommandBuffer(commands->buffer, &info) == VK_SUCCESS;
}

/* A recorded inference run gives the submitted run's logits; two runs with different inputs
 * recorded into one command buffer give the second's. */
static void inference_recorded(const App* app, mg_device* device, AppCommands* commands) {
  mg_program* program = mlp_program(device, MG_PROGRAM_INFERENCE, 11, 0);
  if (program == NULL || !begin(app, commands)) return;
  float images[kBatch * kPixels], submitted[kBatch * kClasses], recorded[kBatch * kClasses];
  set_batch(program, images, NULL, 41);
  CHECK_OK(mg_program_run(program));
  CHECK_OK(mg_program_get_output(program, "logits", submitted, kBatch * kClasses));
  VkSemaphore semaphore = VK_NULL_HANDLE;
  uint64_t value = 0;
  CHECK_STATUS(mg_program_record_run(NULL, commands->buffer, &semaphore, &value),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_record_run(program, VK_NULL_HANDLE, &semaphore, &value),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_record_run(program, commands->buffer, NULL, &value),
               MG_ERROR_INVALID_ARGUMENT);
  int finished = 0;
  CHECK_STATUS(mg_program_record_chunk(NULL, commands->buffer, &finished, &semaphore, &value),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_record_chunk(program, commands->buffer, NULL, &semaphore, &value),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_record_chunk(program, commands->buffer, &finished, &semaphore, &value),
               MG_ERROR_INVALID_STATE);
  CHECK_STATUS(
      mg_program_bind_input_buffer(NULL, "images", VK_NULL_HANDLE, 0, 0, 0, MG_BUFFER_IN_PLACE),
      MG_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mg_program_record_run(program, commands->buffer, &semaphore, &value));
  CHECK(semaphore != VK_NULL_HANDLE && value > 0);
  CHECK(submit_and_wait(app, commands->buffer, semaphore, value));
  CHECK_OK(mg_program_get_output(program, "logits", recorded, kBatch * kClasses));
  CHECK(memcmp(recorded, submitted, sizeof recorded) == 0);

  CHECK(begin(app, commands));
  CHECK_OK(mg_program_record_run(program, commands->buffer, &semaphore, &value));
  set_batch(program, images, NULL, 42);
  uint64_t second = 0;
  CHECK_OK(mg_program_record_run(program, commands->buffer, &semaphore, &second));
  CHECK(second > value);
  CHECK(submit_and_wait(app, commands->buffer, semaphore, second));
  CHECK_OK(mg_program_wait(program));
  CHECK_OK(mg_program_get_output(program, "logits", recorded, kBatch * kClasses));
  double expected[kBatch * kClasses];
  mlp_reference(program, images, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(recorded, expected, kBatch * kClasses) < 1e-5);
  CHECK_OK(mg_program_release(program));
}

/* Four training steps: one recorded whole, one recorded as the chunked run that measures the
 * chunks, two in chunks recorded into one command buffer; they give bit for bit the weights and
 * loss of four whole steps submitted by Meganeura. */
static void training_recorded(const App* app, mg_device* device, AppCommands* commands) {
  mg_program* whole = mlp_program(device, MG_PROGRAM_TRAINING, 3, 0);
  mg_program* recorded = mlp_program(device, MG_PROGRAM_TRAINING, 3, 0);
  if (whole == NULL || recorded == NULL) return;
  float images[kBatch * kPixels];
  int labels[kBatch];
  set_batch(whole, images, labels, 51);
  set_batch(recorded, images, labels, 51);
  VkSemaphore semaphore = VK_NULL_HANDLE;
  uint64_t value = 0;
  CHECK(begin(app, commands));
  CHECK_OK(mg_program_record_run(recorded, commands->buffer, &semaphore, &value));
  CHECK(submit_and_wait(app, commands->buffer, semaphore, value));
  CHECK_OK(mg_program_train_step(whole, NULL));

  /* The measuring run (whole, with a timestamp around each dispatch) recorded too. */
  int finished = 0;
  size_t chunk_count = 0;
  CHECK_OK(mg_program_set_chunk_budget(recorded, 0.001, NULL));
  CHECK(begin(app, commands));
  CHECK_OK(mg_program_record_chunk(recorded, commands->buffer, &finished, &semaphore, &value));
  CHECK(finished == 1);
  CHECK(submit_and_wait(app, commands->buffer, semaphore, value));
  CHECK_OK(mg_program_wait(recorded));
  CHECK_OK(mg_program_set_chunk_budget(recorded, 0.001, &chunk_count));
  CHECK(chunk_count > 2);
  CHECK_OK(mg_program_train_step(whole, NULL));

  CHECK(begin(app, commands));
  int chunks = 0, steps = 0;
  while (steps < 2 && chunks < 10000) {
    CHECK_OK(mg_program_record_chunk(recorded, commands->buffer, &finished, &semaphore, &value));
    if (chunks == 0)
      CHECK_STATUS(mg_program_record_run(recorded, commands->buffer, &semaphore, &value),
                   MG_ERROR_INVALID_STATE);
    ++chunks;
    steps += finished;
  }
  CHECK(chunks > 2);
  CHECK(submit_and_wait(app, commands->buffer, semaphore, value));
  float whole_loss = 0, recorded_loss = 0;
  CHECK_OK(mg_program_train_step(whole, NULL));
  CHECK_OK(mg_program_train_step(whole, &whole_loss));
  CHECK_OK(mg_program_wait(recorded));
  CHECK_OK(mg_program_get_output(recorded, "loss", &recorded_loss, 1));
  CHECK(recorded_loss == whole_loss);
  CHECK(same_weights(whole, recorded));
  int64_t count = 0;
  CHECK_OK(mg_program_step_count(recorded, &count));
  CHECK(count == 4);
  CHECK_OK(mg_program_release(whole));
  CHECK_OK(mg_program_release(recorded));
}

/* Live adaptation in one command buffer: a training step and then an inference run of a program
 * sharing its weights; the inference runs on the updated weights. */
static void shared_weights_recorded(const App* app, mg_device* device, AppCommands* commands) {
  mg_program* training = mlp_program(device, MG_PROGRAM_TRAINING, 7, 1);
  mg_program* inference = mlp_program(device, MG_PROGRAM_INFERENCE, 7, 1);
  if (training == NULL || inference == NULL) return;
  float images[kBatch * kPixels], before[kHidden * kPixels], logits[kBatch * kClasses];
  int labels[kBatch];
  set_batch(training, images, labels, 61);
  set_batch(inference, images, NULL, 62);
  CHECK_OK(mg_program_read_parameter(inference, "model.fc1.weight", before, kHidden * kPixels));
  VkSemaphore semaphore = VK_NULL_HANDLE;
  uint64_t value = 0;
  CHECK(begin(app, commands));
  CHECK_OK(mg_program_record_run(training, commands->buffer, &semaphore, &value));
  CHECK_OK(mg_program_record_run(inference, commands->buffer, &semaphore, &value));
  CHECK(submit_and_wait(app, commands->buffer, semaphore, value));
  CHECK_OK(mg_program_get_output(inference, "logits", logits, kBatch * kClasses));
  double expected[kBatch * kClasses];
  mlp_reference(training, images, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(logits, expected, kBatch * kClasses) < 1e-5);
  float after[kHidden * kPixels];
  CHECK_OK(mg_program_read_parameter(inference, "model.fc1.weight", after, kHidden * kPixels));
  CHECK(memcmp(before, after, sizeof after) != 0);
  CHECK_OK(mg_program_release(inference));
  CHECK_OK(mg_program_release(training));
}

void test_recorded_runs(const App* app, mg_device* device) {
  AppCommands commands = {VK_NULL_HANDLE, VK_NULL_HANDLE};
  inference_recorded(app, device, &commands);
  training_recorded(app, device, &commands);
  shared_weights_recorded(app, device, &commands);
  if (commands.pool != VK_NULL_HANDLE) vkDestroyCommandPool(app->device, commands.pool, NULL);

  /* A device Meganeura opened has no app command buffers to record into. */
  mg_device* own = NULL;
  CHECK_OK(mg_device_open(NULL, &own));
  mg_program* program = own != NULL ? mlp_program(own, MG_PROGRAM_INFERENCE, 1, 0) : NULL;
  VkSemaphore semaphore = VK_NULL_HANDLE;
  uint64_t value = 0;
  if (program != NULL)
    CHECK_STATUS(mg_program_record_run(program, (VkCommandBuffer)(uintptr_t)1, &semaphore, &value),
                 MG_ERROR_INVALID_STATE);
  CHECK_OK(mg_program_release(program));
  CHECK_OK(mg_device_release(own));
}
