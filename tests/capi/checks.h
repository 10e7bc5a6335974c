/* The C API tests' checks: each failure is printed and counted; main returns non-zero if any. */
#ifndef MEGANEURA_CAPI_CHECKS_H
#define MEGANEURA_CAPI_CHECKS_H

#include <stdio.h>

#include "meganeura/meganeura.h"

extern int check_failures;

#define CHECK(condition)                                                            \
  do {                                                                              \
    if (!(condition)) {                                                             \
      ++check_failures;                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
    }                                                                               \
  } while (0)

/* `call` returns `expected`; otherwise prints the status and mg_last_error(). */
#define CHECK_STATUS(call, expected)                                                         \
  do {                                                                                       \
    mg_status check_status_ = (call);                                                        \
    if (check_status_ != (expected)) {                                                       \
      ++check_failures;                                                                      \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s: %s\n", __FILE__, __LINE__, #call, \
              mg_status_string(check_status_), mg_status_string(expected), mg_last_error()); \
    }                                                                                        \
  } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, MG_OK)

/* The MLP classifier (models/classifier.cpp: fc1, fc2, fc3 with ReLU between) computed in double
 * from the program's parameters as mg_program_read_parameter gives them: the independent
 * reference of the tests. `logits` holds batch x classes. */
void mlp_reference(mg_program* program, const float* images, int batch, int pixels, int classes,
                   double* logits);
/* Mean cross-entropy of logits (batch x classes) against labels. */
double mean_cross_entropy(const double* logits, const int* labels, int batch, int classes);
/* Fills `values` with uniform values in [-1, 1) from a fixed xorshift sequence. */
void fill_random(float* values, int count, unsigned seed);
/* max |a - b| / max(1, max |b|) */
double relative_difference(const float* a, const double* b, int count);

/* The Llama model-folder tests (model_folder.c): the fixture under `source_dir`, files written
 * under `scratch`. */
void test_model_folder(mg_device* device, const char* source_dir, const char* scratch);

/* The adopted-device tests (vulkan_adopt.c). */
void test_adopted_device(void);

#endif
