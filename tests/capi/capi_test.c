/* The C API from C11, as an app uses it (docs/EMBEDDING.md): misuse returns statuses, inference
 * and training match a double-precision reference computed here from the program's own
 * parameters, checkpoints round-trip, and chunked training steps equal whole ones. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"

int check_failures = 0;

enum { kBatch = 4, kSide = 8, kPixels = kSide * kSide, kClasses = 4 };
static const char* const kMlp = "{\"architecture\": \"mlp\", \"image_size\": 8, \"classes\": 4}";

static void test_misuse_without_handles(void) {
  mg_device* device = (mg_device*)1;
  CHECK_STATUS(mg_device_open(NULL, NULL), MG_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mg_last_error(), "NULL") != NULL);
  CHECK_STATUS(mg_device_open("no such device name", &device), MG_ERROR_FAILED);
  CHECK(device == NULL);
  CHECK(strstr(mg_last_error(), "no such device name") != NULL);
  const char* text = NULL;
  CHECK_STATUS(mg_device_description(NULL, &text), MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_run(NULL), MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_train_step(NULL, NULL), MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_set_input(NULL, "images", MG_DTYPE_F32, NULL, 0),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_options_init(NULL), MG_ERROR_INVALID_ARGUMENT);
  size_t copies = 0;
  CHECK_STATUS(mg_program_run_transfers(NULL, &copies, NULL), MG_ERROR_INVALID_ARGUMENT);
  mg_program* program = (mg_program*)1;
  CHECK_STATUS(mg_program_create_classifier(NULL, NULL, NULL, &program), MG_ERROR_INVALID_ARGUMENT);
  CHECK(program == NULL);
  CHECK_OK(mg_program_release(NULL));
  CHECK_OK(mg_device_release(NULL));
  CHECK(strcmp(mg_status_string(MG_OK), "MG_OK") == 0);
  CHECK(strcmp(mg_status_string((mg_status)99), "MG_ERROR_UNKNOWN_STATUS") == 0);
  CHECK(strcmp(mg_version(), "0.1.0") == 0);
}

static void test_inference(mg_device* device) {
  mg_program_options options;
  CHECK_OK(mg_program_options_init(&options));
  options.batch = kBatch;
  options.seed = 7;
  mg_program* program = NULL;
  CHECK_STATUS(mg_program_create_classifier(device, "{not json", &options, &program),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_create_classifier(device,
                                            "{\"architecture\": \"rnn\", \"image_size\": "
                                            "8, \"classes\": 4}",
                                            &options, &program),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mg_last_error(), "rnn") != NULL);
  options.precision = "medium";
  CHECK_STATUS(mg_program_create_classifier(device, kMlp, &options, &program),
               MG_ERROR_INVALID_ARGUMENT);
  options.precision = NULL;
  options.struct_size = 0;
  CHECK_STATUS(mg_program_create_classifier(device, kMlp, &options, &program),
               MG_ERROR_INVALID_ARGUMENT);
  options.struct_size = sizeof options;
  CHECK_OK(mg_program_create_classifier(device, kMlp, &options, &program));
  if (program == NULL) return;

  size_t count = 0;
  CHECK_OK(mg_program_tensor_count(program, MG_TENSOR_INPUT, &count));
  CHECK(count == 1);
  CHECK_OK(mg_program_tensor_count(program, MG_TENSOR_PARAMETER, &count));
  CHECK(count == 6);
  const char* name = NULL;
  CHECK_OK(mg_program_tensor_name(program, MG_TENSOR_OUTPUT, 0, &name));
  CHECK(name != NULL && strcmp(name, "logits") == 0);
  CHECK_STATUS(mg_program_tensor_name(program, MG_TENSOR_OUTPUT, 1, &name),
               MG_ERROR_INVALID_ARGUMENT);
  mg_tensor_info info;
  CHECK_OK(mg_program_tensor_info(program, "images", &info));
  CHECK(info.rank == 4 && info.shape[0] == kBatch && info.shape[3] == kSide);
  CHECK(info.elements == kBatch * kPixels && info.dtype == MG_DTYPE_F32);

  float images[kBatch * kPixels];
  float logits[kBatch * kClasses];
  fill_random(images, kBatch * kPixels, 1);
  CHECK_STATUS(mg_program_get_output(program, "logits", logits, kBatch * kClasses),
               MG_ERROR_INVALID_STATE);
  CHECK_STATUS(mg_program_set_input(program, "images", MG_DTYPE_F32, images, 5),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(mg_last_error(), "images") != NULL);
  CHECK_STATUS(mg_program_set_input(program, "images", MG_DTYPE_I32, images, kBatch * kPixels),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_set_input(program, "pixels", MG_DTYPE_F32, images, kBatch * kPixels),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_set_input(program, "images", MG_DTYPE_F32, NULL, kBatch * kPixels),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(mg_program_train_step(program, NULL), MG_ERROR_INVALID_STATE);
  /* The program stays usable after every error above. */
  CHECK_OK(mg_program_set_input(program, "images", MG_DTYPE_F32, images, kBatch * kPixels));
  CHECK_OK(mg_program_run(program));
  CHECK_STATUS(mg_program_get_output(program, "logits", logits, 3), MG_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mg_program_get_output(program, "logits", logits, kBatch * kClasses));
  double expected[kBatch * kClasses];
  mlp_reference(program, images, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(logits, expected, kBatch * kClasses) < 1e-5);

  /* An asynchronous run, with a write to the weights before it. */
  float bias[kClasses] = {0.5f, -0.25f, 1.0f, 0.0f};
  CHECK_OK(mg_program_write_parameter(program, "model.fc3.bias", bias, kClasses));
  CHECK_STATUS(mg_program_write_parameter(program, "model.fc3.bias", bias, 2),
               MG_ERROR_INVALID_ARGUMENT);
  CHECK_OK(mg_program_start(program));
  CHECK_OK(mg_program_wait(program));
  CHECK_OK(mg_program_get_output(program, "logits", logits, kBatch * kClasses));
  mlp_reference(program, images, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(logits, expected, kBatch * kClasses) < 1e-5);
  CHECK_OK(mg_program_release(program));
}

static mg_program* training_program(mg_device* device, const char* checkpoint) {
  mg_program_options options;
  mg_program_options_init(&options);
  options.kind = MG_PROGRAM_TRAINING;
  options.batch = kBatch;
  options.optimizer = "sgd";
  options.learning_rate = 0.05;
  options.seed = 3;
  mg_program* program = NULL;
  if (checkpoint)
    CHECK_OK(mg_program_create_from_checkpoint(device, checkpoint, &options, &program));
  else
    CHECK_OK(mg_program_create_classifier(device, kMlp, &options, &program));
  return program;
}

static const int kLabels[kBatch] = {0, 1, 2, 3};

static void set_training_batch(mg_program* program, float* images) {
  fill_random(images, kBatch * kPixels, 2);
  CHECK_OK(mg_program_set_input(program, "images", MG_DTYPE_F32, images, kBatch * kPixels));
  CHECK_OK(mg_program_set_input(program, "labels", MG_DTYPE_I32, kLabels, kBatch));
}

static void test_training(mg_device* device, const char* checkpoint) {
  mg_program* program = training_program(device, NULL);
  if (program == NULL) return;
  float images[kBatch * kPixels];
  set_training_batch(program, images);
  double logits[kBatch * kClasses];
  mlp_reference(program, images, kBatch, kPixels, kClasses, logits);
  const double expected_loss = mean_cross_entropy(logits, kLabels, kBatch, kClasses);
  float first = 0, loss = 0;
  CHECK_OK(mg_program_train_step(program, &first));
  CHECK(first > 0 && (first - expected_loss) / expected_loss < 1e-5 &&
        (expected_loss - first) / expected_loss < 1e-5);
  for (int step = 0; step < 5; ++step) CHECK_OK(mg_program_train_step(program, &loss));
  CHECK(loss < first);
  int64_t steps = 0;
  CHECK_OK(mg_program_step_count(program, &steps));
  CHECK(steps == 6);

  CHECK_OK(mg_program_save(program, checkpoint));
  CHECK_STATUS(mg_program_load(program, "/nonexistent/checkpoint.safetensors"), MG_ERROR_FAILED);
  CHECK(strstr(mg_last_error(), "/nonexistent/checkpoint.safetensors") != NULL);

  /* The checkpoint's weights in an inference program give the trained program's logits. */
  mg_program_options options;
  mg_program_options_init(&options);
  options.batch = kBatch;
  mg_program* inference = NULL;
  CHECK_OK(mg_program_create_from_checkpoint(device, checkpoint, &options, &inference));
  if (inference != NULL) {
    float got[kBatch * kClasses];
    CHECK_OK(mg_program_set_input(inference, "images", MG_DTYPE_F32, images, kBatch * kPixels));
    CHECK_OK(mg_program_run(inference));
    CHECK_OK(mg_program_get_output(inference, "logits", got, kBatch * kClasses));
    mlp_reference(program, images, kBatch, kPixels, kClasses, logits);
    CHECK(relative_difference(got, logits, kBatch * kClasses) < 1e-5);
    CHECK_OK(mg_program_release(inference));
  }
  CHECK_OK(mg_program_release(program));
}

/* Two training steps in chunks leave the same weights and loss as two whole steps. */
static void test_chunked_training(mg_device* device, const char* checkpoint) {
  mg_program* whole = training_program(device, checkpoint);
  mg_program* chunked = training_program(device, checkpoint);
  if (whole == NULL || chunked == NULL) return;
  float images[kBatch * kPixels];
  set_training_batch(whole, images);
  set_training_batch(chunked, images);
  int finished = 0;
  CHECK_STATUS(mg_program_run_chunk(chunked, &finished), MG_ERROR_INVALID_STATE);
  size_t chunks = 0;
  CHECK_OK(mg_program_set_chunk_budget(chunked, 0.001, &chunks));
  CHECK(chunks == 1); /* not measured yet */
  float whole_loss = 0, chunked_loss = 0;
  int calls = 0;
  for (int step = 0; step < 2; ++step) {
    CHECK_OK(mg_program_train_step(whole, &whole_loss));
    calls = 0;
    do {
      CHECK_OK(mg_program_run_chunk(chunked, &finished));
      ++calls;
      if (!finished && calls == 1) {
        CHECK_STATUS(mg_program_run(chunked), MG_ERROR_INVALID_STATE);
        CHECK_STATUS(mg_program_save(chunked, checkpoint), MG_ERROR_INVALID_STATE);
      }
    } while (!finished && calls < 10000);
  }
  CHECK(calls > 1); /* the second step ran in several chunks */
  double next_ms = 0;
  CHECK_OK(mg_program_next_chunk_ms(chunked, &next_ms));
  CHECK(next_ms > 0);
  CHECK_OK(mg_program_get_output(chunked, "loss", &chunked_loss, 1));
  CHECK(chunked_loss == whole_loss);
  float a[256 * kPixels], b[256 * kPixels];
  CHECK_OK(mg_program_read_parameter(whole, "model.fc1.weight", a, 256 * kPixels));
  CHECK_OK(mg_program_read_parameter(chunked, "model.fc1.weight", b, 256 * kPixels));
  CHECK(memcmp(a, b, sizeof a) == 0);
  int64_t steps = 0;
  CHECK_OK(mg_program_step_count(chunked, &steps));
  CHECK(steps == 8);
  CHECK_OK(mg_program_release(whole));
  CHECK_OK(mg_program_release(chunked));
}

/* An inference program sharing a training program's parameters runs on the trained weights
 * with no copy, and a write through either is seen by the other. */
static void test_shared_parameters(mg_device* device) {
  mg_program_options options;
  mg_program_options_init(&options);
  options.kind = MG_PROGRAM_TRAINING;
  options.batch = kBatch;
  options.optimizer = "sgd";
  options.learning_rate = 0.05;
  options.seed = 5;
  options.share_parameters = 1;
  mg_program* training = NULL;
  mg_program* inference = NULL;
  mg_program* mismatched = NULL;
  CHECK_OK(mg_program_create_classifier(device, kMlp, &options, &training));
  options.kind = MG_PROGRAM_INFERENCE;
  options.seed = 99; /* ignored: the tensors exist already */
  CHECK_OK(mg_program_create_classifier(device, kMlp, &options, &inference));
  CHECK_STATUS(mg_program_create_classifier(
                   device, "{\"architecture\": \"mlp\", \"image_size\": 12, \"classes\": 4}",
                   &options, &mismatched),
               MG_ERROR_FAILED);
  CHECK(strstr(mg_last_error(), "model.fc1.weight") != NULL);
  options.share_parameters = 2;
  CHECK_STATUS(mg_program_create_classifier(device, kMlp, &options, &mismatched),
               MG_ERROR_INVALID_ARGUMENT);
  if (training == NULL || inference == NULL) return;

  float images[kBatch * kPixels];
  set_training_batch(training, images);
  CHECK_OK(mg_program_train_step(training, NULL));
  CHECK_OK(mg_program_train_step(training, NULL));
  float logits[kBatch * kClasses];
  double expected[kBatch * kClasses];
  CHECK_OK(mg_program_set_input(inference, "images", MG_DTYPE_F32, images, kBatch * kPixels));
  CHECK_OK(mg_program_run(inference));
  CHECK_OK(mg_program_get_output(inference, "logits", logits, kBatch * kClasses));
  mlp_reference(training, images, kBatch, kPixels, kClasses, expected);
  CHECK(relative_difference(logits, expected, kBatch * kClasses) < 1e-5);

  float bias[kClasses] = {1, 2, 3, 4}, read_back[kClasses] = {0};
  CHECK_OK(mg_program_write_parameter(inference, "model.fc3.bias", bias, kClasses));
  CHECK_OK(mg_program_read_parameter(training, "model.fc3.bias", read_back, kClasses));
  CHECK(memcmp(bias, read_back, sizeof bias) == 0);
  CHECK_OK(mg_program_release(inference));
  CHECK_OK(mg_program_release(training));
}

int main(void) {
  test_misuse_without_handles();
  mg_device* device = NULL;
  CHECK_OK(mg_device_open(NULL, &device));
  if (device != NULL) {
    const char* description = NULL;
    CHECK_OK(mg_device_description(device, &description));
    printf("device: %s\n", description);
    char folder[] = "/tmp/meganeura_capi_XXXXXX";
    CHECK(mkdtemp(folder) != NULL);
    char checkpoint[64];
    snprintf(checkpoint, sizeof checkpoint, "%s/mlp.safetensors", folder);
    test_inference(device);
    test_training(device, checkpoint);
    test_chunked_training(device, checkpoint);
    test_shared_parameters(device);
    test_model_folder(device, MEGANEURA_SOURCE_DIR, folder);
    unlink(checkpoint);
    char command[128];
    snprintf(command, sizeof command, "rm -rf %s", folder);
    CHECK(system(command) == 0);
    /* Programs keep the device alive: release it first, then a program still runs. */
    mg_program* program = NULL;
    CHECK_OK(mg_program_create_classifier(device, kMlp, NULL, &program));
    CHECK_OK(mg_device_release(device));
    CHECK_OK(mg_program_run(program));
    CHECK_OK(mg_program_release(program));
  }
  test_adopted_device();
  if (check_failures > 0) {
    fprintf(stderr, "%d checks failed\n", check_failures);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
