/* A Llama folder that transformers' save_pretrained wrote (tests/fixtures/model_folders), through
 * the C API: its logits and loss must be those transformers computed (reference.json), and a
 * folder the API saves must load back to the same logits. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"

enum { kSeq = 16 };

/* The numbers of the JSON array under "key" in `text` (at most `capacity`); their count. */
static int json_numbers(const char* text, const char* key, double* values, int capacity) {
  char quoted[64];
  snprintf(quoted, sizeof quoted, "\"%s\":", key);
  const char* at = strstr(text, quoted);
  if (at == NULL) return 0;
  at = strchr(at, '[');
  int count = 0;
  while (at != NULL && *at != ']' && count < capacity) {
    char* end = NULL;
    const double value = strtod(at + 1, &end);
    if (end == at + 1) break;
    values[count++] = value;
    at = end;
    while (*at == ' ') ++at;
  }
  return count;
}

static double json_number(const char* text, const char* key) {
  char quoted[64];
  snprintf(quoted, sizeof quoted, "\"%s\":", key);
  const char* at = strstr(text, quoted);
  return at == NULL ? NAN : strtod(at + strlen(quoted), NULL);
}

static char* read_text(const char* path) {
  FILE* file = fopen(path, "rb");
  if (file == NULL) return NULL;
  fseek(file, 0, SEEK_END);
  const long size = ftell(file);
  fseek(file, 0, SEEK_SET);
  char* text = malloc((size_t)size + 1);
  text[fread(text, 1, (size_t)size, file)] = '\0';
  fclose(file);
  return text;
}

static double relative_l2(const float* got, const double* expected, int count) {
  double difference = 0, norm = 0;
  for (int i = 0; i < count; ++i) {
    difference += (got[i] - expected[i]) * (got[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return sqrt(difference / norm);
}

void test_model_folder(mg_device* device, const char* source_dir, const char* scratch) {
  char folder[512], path[600];
  snprintf(folder, sizeof folder, "%s/tests/fixtures/model_folders/llama_tiny_f32", source_dir);
  snprintf(path, sizeof path, "%s/reference.json", folder);
  char* reference = read_text(path);
  CHECK(reference != NULL);
  if (reference == NULL) return;
  double ids_read[kSeq];
  CHECK(json_numbers(reference, "input_ids", ids_read, kSeq) == kSeq);
  int ids[kSeq], labels[kSeq];
  for (int t = 0; t < kSeq; ++t) ids[t] = (int)ids_read[t];
  for (int t = 0; t < kSeq; ++t) labels[t] = t + 1 < kSeq ? ids[t + 1] : -100;
  mg_tensor_info info;
  mg_program_options options;
  mg_program_options_init(&options);
  options.sequence_length = kSeq;
  mg_program* inference = NULL;
  CHECK_STATUS(
      mg_program_create_from_model_folder(device, "/nonexistent/folder", &options, &inference),
      MG_ERROR_FAILED);
  CHECK(strstr(mg_last_error(), "/nonexistent/folder") != NULL);
  CHECK_OK(mg_program_create_from_model_folder(device, folder, &options, &inference));
  if (inference != NULL) {
    CHECK_OK(mg_program_tensor_info(inference, "logits", &info));
    const int count = (int)info.elements;
    double* expected = malloc(sizeof(double) * (size_t)count);
    float* logits = malloc(sizeof(float) * (size_t)count);
    float* reloaded = malloc(sizeof(float) * (size_t)count);
    CHECK(json_numbers(reference, "logits", expected, count) == count);
    CHECK_OK(mg_program_set_input(inference, "input_ids", MG_DTYPE_I32, ids, kSeq));
    CHECK_OK(mg_program_run(inference));
    CHECK_OK(mg_program_get_output(inference, "logits", logits, (size_t)count));
    CHECK(relative_l2(logits, expected, count) < 1e-4);

    snprintf(path, sizeof path, "%s/saved_llama", scratch);
    CHECK_OK(mg_program_save(inference, path));
    mg_program* saved = NULL;
    CHECK_OK(mg_program_create_from_model_folder(device, path, &options, &saved));
    if (saved != NULL) {
      CHECK_OK(mg_program_set_input(saved, "input_ids", MG_DTYPE_I32, ids, kSeq));
      CHECK_OK(mg_program_run(saved));
      CHECK_OK(mg_program_get_output(saved, "logits", reloaded, (size_t)count));
      CHECK(memcmp(logits, reloaded, sizeof(float) * (size_t)count) == 0);
      CHECK_OK(mg_program_release(saved));
    }
    free(expected);
    free(logits);
    free(reloaded);
    CHECK_OK(mg_program_release(inference));
  }

  options.kind = MG_PROGRAM_TRAINING;
  mg_program* training = NULL;
  CHECK_OK(mg_program_create_from_model_folder(device, folder, &options, &training));
  if (training != NULL) {
    float loss = 0;
    CHECK_OK(mg_program_set_input(training, "input_ids", MG_DTYPE_I32, ids, kSeq));
    CHECK_OK(mg_program_set_input(training, "labels", MG_DTYPE_I32, labels, kSeq));
    CHECK_OK(mg_program_train_step(training, &loss));
    const double expected_loss = json_number(reference, "loss");
    CHECK(fabs(loss - expected_loss) < 1e-5 * expected_loss);
    CHECK_OK(mg_program_release(training));
  }
  free(reference);
}
