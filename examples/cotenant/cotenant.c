/* The co-tenancy case study (docs/EMBEDDING.md): an app renders a scene offscreen at a fixed
 * frame rate on its own Vulkan device while Meganeura fine-tunes a classifier on the same device
 * and queue, one chunk of a training step after each frame. It reports frame times and missed
 * frames with and without training, and training steps per second in both settings. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "renderer.h"

typedef struct Settings {
  double hz;
  double seconds;
  uint32_t size;
  uint32_t triangles;
  int shading;
  int batch;
  double budget_ms;
  int chunks_per_frame;
  double train_ms_per_frame; /* > 0: chunks after each frame while their measured time fits */
  const char* model;
  int record; /* 1: chunks recorded into the app's own command buffers, which it submits */
} Settings;

typedef struct FrameStats {
  int frames;
  int missed;
  double p50_ms, p99_ms, max_ms;
  int steps;
  double seconds;
} FrameStats;

static double now_seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

static void sleep_until(double when) {
  struct timespec until;
  until.tv_sec = (time_t)when;
  until.tv_nsec = (long)((when - (double)until.tv_sec) * 1e9);
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

#define MG_TRY(call)                                                              \
  do {                                                                            \
    mg_status status_ = (call);                                                   \
    if (status_ != MG_OK) {                                                       \
      fprintf(stderr, "cotenant: %s: %s: %s\n", #call, mg_status_string(status_), \
              mg_last_error());                                                   \
      return 0;                                                                   \
    }                                                                             \
  } while (0)

/* With --record, the app's own command buffers that Meganeura records a frame's chunks into: two,
 * so that one is recorded while the GPU may still run the other, each reused once the app
 * timeline shows its last submission done. */
typedef struct TrainingCommands {
  VkCommandBuffer buffers[2];
  uint64_t values[2];
  VkSemaphore semaphore;
  VkCommandBuffer recording; /* the one of this frame, begun */
} TrainingCommands;

static int begin_training_commands(Renderer* renderer, TrainingCommands* commands, int frame) {
  const int slot = frame % 2;
  if (commands->values[slot] > 0) {
    VkSemaphoreWaitInfo wait = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wait.semaphoreCount = 1;
    wait.pSemaphores = &commands->semaphore;
    wait.pValues = &commands->values[slot];
    if (vkWaitSemaphores(renderer->device, &wait, 10ull * 1000 * 1000 * 1000) != VK_SUCCESS)
      return 0;
  }
  VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  commands->recording = commands->buffers[slot];
  return vkResetCommandBuffer(commands->recording, 0) == VK_SUCCESS &&
         vkBeginCommandBuffer(commands->recording, &begin) == VK_SUCCESS;
}

/* Submits the frame's training command buffer, signalling the app timeline at `value`. */
static int submit_training_commands(Renderer* renderer, TrainingCommands* commands, int frame,
                                    uint64_t value) {
  if (vkEndCommandBuffer(commands->recording) != VK_SUCCESS) return 0;
  VkTimelineSemaphoreSubmitInfo timeline = {VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  timeline.signalSemaphoreValueCount = 1;
  timeline.pSignalSemaphoreValues = &value;
  VkSubmitInfo submit = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.pNext = &timeline;
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &commands->recording;
  submit.signalSemaphoreCount = 1;
  submit.pSignalSemaphores = &commands->semaphore;
  commands->values[frame % 2] = value;
  return vkQueueSubmit(renderer->queue, 1, &submit, VK_NULL_HANDLE) == VK_SUCCESS;
}

/* Renders `frames` frames on the fixed schedule; with `program`, runs chunks of its training
 * steps after each frame: submitted by Meganeura, or with `commands` recorded into the app's
 * command buffer, which the app submits. A frame is missed when it finishes after its slot. */
static int run_frames(Renderer* renderer, mg_program* program, TrainingCommands* commands,
                      const Settings* settings, int frames, FrameStats* stats) {
  const double period = 1.0 / settings->hz;
  double* times = malloc(sizeof(double) * (size_t)frames);
  memset(stats, 0, sizeof *stats);
  const double start = now_seconds();
  for (int frame = 0; frame < frames; ++frame) {
    const double slot_start = start + frame * period;
    sleep_until(slot_start);
    const double submitted = now_seconds();
    if (!renderer_submit_frame(renderer, (float)(submitted - start))) return 0;
    if (program != NULL && commands != NULL && !begin_training_commands(renderer, commands, frame))
      return 0;
    uint64_t value = 0;
    double spent_ms = 0;
    for (int chunk = 0; program != NULL; ++chunk) {
      if (settings->train_ms_per_frame > 0) {
        double next_ms = 0;
        MG_TRY(mg_program_next_chunk_ms(program, &next_ms));
        if ((chunk > 0 && spent_ms + next_ms > settings->train_ms_per_frame) || chunk >= 1000)
          break;
        spent_ms += next_ms;
      } else if (chunk >= settings->chunks_per_frame) {
        break;
      }
      int finished = 0;
      if (commands != NULL)
        MG_TRY(mg_program_record_chunk(program, commands->recording, &finished,
                                       &commands->semaphore, &value));
      else
        MG_TRY(mg_program_run_chunk(program, &finished));
      stats->steps += finished;
    }
    if (program != NULL && commands != NULL &&
        !submit_training_commands(renderer, commands, frame, value))
      return 0;
    if (!renderer_wait_frame(renderer)) return 0;
    const double done = now_seconds();
    times[frame] = (done - submitted) * 1e3;
    if (done > slot_start + period) ++stats->missed;
  }
  stats->seconds = now_seconds() - start;
  stats->frames = frames;
  qsort(times, (size_t)frames, sizeof(double), compare_doubles);
  stats->p50_ms = times[frames / 2];
  stats->p99_ms = times[(int)floor(0.99 * (frames - 1))];
  stats->max_ms = times[frames - 1];
  free(times);
  return 1;
}

static mg_program* create_training(mg_device* device, const Settings* settings) {
  char config[128];
  snprintf(config, sizeof config, "{\"architecture\": \"%s\", \"image_size\": 28, \"classes\": 10}",
           settings->model);
  mg_program_options options;
  mg_program_options_init(&options);
  options.kind = MG_PROGRAM_TRAINING;
  options.batch = settings->batch;
  options.seed = 1;
  mg_program* program = NULL;
  if (mg_program_create_classifier(device, config, &options, &program) != MG_OK) {
    fprintf(stderr, "cotenant: %s\n", mg_last_error());
    return NULL;
  }
  /* A fixed batch of synthetic 28x28 images and labels: the run measures co-tenancy, and the
   * falling loss shows the steps really train. */
  const size_t pixels = (size_t)settings->batch * 28 * 28;
  float* images = malloc(sizeof(float) * pixels);
  int* labels = malloc(sizeof(int) * (size_t)settings->batch);
  unsigned state = 12345;
  for (size_t i = 0; i < pixels; ++i) {
    state = state * 1664525u + 1013904223u;
    images[i] = (float)(state >> 8) / 16777216.0f;
  }
  for (int i = 0; i < settings->batch; ++i) labels[i] = i % 10;
  mg_status status = mg_program_set_input(program, "images", MG_DTYPE_F32, images, pixels);
  if (status == MG_OK)
    status = mg_program_set_input(program, "labels", MG_DTYPE_I32, labels, (size_t)settings->batch);
  free(images);
  free(labels);
  if (status != MG_OK) {
    fprintf(stderr, "cotenant: %s\n", mg_last_error());
    mg_program_release(program);
    return NULL;
  }
  return program;
}

/* Whole training steps with nothing else on the GPU, for `seconds`. */
static int standalone_steps_per_second(mg_program* program, double seconds, double* rate,
                                       float* first_loss) {
  MG_TRY(mg_program_train_step(program, first_loss)); /* the first runs the setup too */
  int steps = 0;
  const double start = now_seconds();
  do {
    MG_TRY(mg_program_train_step(program, NULL));
    ++steps;
  } while (now_seconds() - start < seconds || steps < 2);
  *rate = steps / (now_seconds() - start);
  return 1;
}

static void print_stats(const char* label, const FrameStats* stats) {
  printf("%-22s frames %5d  p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms  missed %d", label,
         stats->frames, stats->p50_ms, stats->p99_ms, stats->max_ms, stats->missed);
  if (stats->steps > 0) printf("  steps/s %.2f", stats->steps / stats->seconds);
  printf("\n");
}

static int parse(int argc, char** argv, Settings* s) {
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(flag, "--help") == 0 || value == NULL) {
      printf(
          "usage: cotenant [--hz 90] [--seconds 5] [--size 1024] [--triangles 20000] "
          "[--shading 16]\n"
          "                [--model cnn|mlp] [--batch 64] [--budget-ms 2] "
          "[--chunks-per-frame 1 | --train-ms-per-frame MS]\n"
          "                [--record 0|1]   (1: chunks recorded into the app's own command "
          "buffers)\n");
      return strcmp(flag, "--help") == 0 ? -1 : 0;
    }
    ++i;
    if (strcmp(flag, "--hz") == 0)
      s->hz = atof(value);
    else if (strcmp(flag, "--seconds") == 0)
      s->seconds = atof(value);
    else if (strcmp(flag, "--size") == 0)
      s->size = (uint32_t)atoi(value);
    else if (strcmp(flag, "--triangles") == 0)
      s->triangles = (uint32_t)atoi(value);
    else if (strcmp(flag, "--shading") == 0)
      s->shading = atoi(value);
    else if (strcmp(flag, "--model") == 0)
      s->model = value;
    else if (strcmp(flag, "--batch") == 0)
      s->batch = atoi(value);
    else if (strcmp(flag, "--budget-ms") == 0)
      s->budget_ms = atof(value);
    else if (strcmp(flag, "--chunks-per-frame") == 0)
      s->chunks_per_frame = atoi(value);
    else if (strcmp(flag, "--train-ms-per-frame") == 0)
      s->train_ms_per_frame = atof(value);
    else if (strcmp(flag, "--record") == 0)
      s->record = atoi(value);
    else {
      fprintf(stderr, "cotenant: unknown option %s (--help lists them)\n", flag);
      return 0;
    }
  }
  if (s->hz <= 0 || s->seconds <= 0 || s->size == 0 || s->batch < 1 || s->budget_ms <= 0 ||
      s->chunks_per_frame < 1) {
    fprintf(stderr,
            "cotenant: --hz, --seconds, --size, --batch, --budget-ms and "
            "--chunks-per-frame must be positive\n");
    return 0;
  }
  return 1;
}

static int run(const Settings* settings, Renderer* renderer) {
  mg_vulkan_device_desc desc = renderer_device_desc(renderer);
  mg_device* device = NULL;
  MG_TRY(mg_device_adopt_vulkan(&desc, &device));
  mg_program* program = create_training(device, settings);
  mg_device_release(device);
  if (program == NULL) return 0;
  const int frames = (int)(settings->hz * settings->seconds);

  FrameStats alone, shared;
  double standalone_rate = 0;
  float first_loss = 0, last_loss = 0;
  size_t chunks = 0;
  /* The driver finishes compiling the scene's pipeline on its first frames. */
  FrameStats warm_up;
  int ok = run_frames(renderer, NULL, NULL, settings, 5, &warm_up) &&
           run_frames(renderer, NULL, NULL, settings, frames, &alone) &&
           standalone_steps_per_second(program, settings->seconds, &standalone_rate, &first_loss);
  if (ok) {
    /* The first chunked run is whole and measures every dispatch; the runs after it are cut. */
    int finished = 0;
    MG_TRY(mg_program_set_chunk_budget(program, settings->budget_ms, NULL));
    MG_TRY(mg_program_run_chunk(program, &finished));
    MG_TRY(mg_program_wait(program));
    MG_TRY(mg_program_set_chunk_budget(program, settings->budget_ms, &chunks));
    TrainingCommands commands = {{VK_NULL_HANDLE, VK_NULL_HANDLE}, {0, 0}, VK_NULL_HANDLE, NULL};
    if (settings->record) {
      VkCommandBufferAllocateInfo allocate = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
      allocate.commandPool = renderer->pool;
      allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
      allocate.commandBufferCount = 2;
      ok = vkAllocateCommandBuffers(renderer->device, &allocate, commands.buffers) == VK_SUCCESS;
    }
    ok = ok && run_frames(renderer, program, settings->record ? &commands : NULL, settings, frames,
                          &shared);
    /* The last recorded chunks finish before their command buffers go. */
    if (settings->record && ok) MG_TRY(mg_program_wait(program));
    if (commands.buffers[0] != VK_NULL_HANDLE)
      vkFreeCommandBuffers(renderer->device, renderer->pool, 2, commands.buffers);
  }
  if (ok) {
    /* Finish the step under way, so that the loss is that of a whole step. */
    for (int finished = 0; !finished;) MG_TRY(mg_program_run_chunk(program, &finished));
    MG_TRY(mg_program_wait(program));
    MG_TRY(mg_program_get_output(program, "loss", &last_loss, 1));
  }
  mg_program_release(program);
  if (!ok) return 0;

  printf("device %s, %ux%u, %u triangles, %.0f Hz (%.2f ms a frame)\n", renderer->device_name,
         settings->size, settings->size, settings->triangles, settings->hz, 1e3 / settings->hz);
  printf("training: %s batch %d, %zu chunks a step under %.2f ms each, %s, ", settings->model,
         settings->batch, chunks, settings->budget_ms,
         settings->record ? "recorded into the app's command buffers" : "submitted by Meganeura");
  if (settings->train_ms_per_frame > 0)
    printf("as many a frame as fit in %.2f ms\n", settings->train_ms_per_frame);
  else
    printf("%d a frame\n", settings->chunks_per_frame);
  print_stats("rendering alone", &alone);
  print_stats("rendering + training", &shared);
  printf("%-22s steps/s %.2f (training with %.0f%% of it while rendering); loss %.4f -> %.4f\n",
         "training alone", standalone_rate, 100.0 * shared.steps / shared.seconds / standalone_rate,
         first_loss, last_loss);
  printf(
      "{\"example\": \"cotenant\", \"device\": \"%s\", \"hz\": %.1f, \"size\": %u, "
      "\"triangles\": %u, \"model\": \"%s\", \"batch\": %d, \"budget_ms\": %.3f, "
      "\"train_ms_per_frame\": %.3f, \"recorded\": %s, "
      "\"chunks_per_step\": %zu, \"alone\": {\"p50_ms\": %.4f, \"p99_ms\": %.4f, \"missed\": %d, "
      "\"frames\": %d}, \"with_training\": {\"p50_ms\": %.4f, \"p99_ms\": %.4f, \"missed\": %d, "
      "\"frames\": %d, \"steps_per_s\": %.3f}, \"standalone_steps_per_s\": %.3f, "
      "\"loss_first\": %.5f, \"loss_last\": %.5f}\n",
      renderer->device_name, settings->hz, settings->size, settings->triangles, settings->model,
      settings->batch, settings->budget_ms, settings->train_ms_per_frame,
      settings->record ? "true" : "false", chunks, alone.p50_ms, alone.p99_ms, alone.missed,
      alone.frames, shared.p50_ms, shared.p99_ms, shared.missed, shared.frames,
      shared.steps / shared.seconds, standalone_rate, first_loss, last_loss);
  return 1;
}

int main(int argc, char** argv) {
  Settings settings = {90, 5, 1024, 20000, 16, 64, 2.0, 1, 0, "cnn", 0};
  const int parsed = parse(argc, argv, &settings);
  if (parsed <= 0) return parsed < 0 ? 0 : 2;
  Renderer renderer;
  int ok = renderer_create(&renderer, settings.size, settings.triangles, settings.shading) &&
           run(&settings, &renderer);
  renderer_destroy(&renderer);
  return ok ? 0 : 1;
}
