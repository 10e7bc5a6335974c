/* An app outside the Meganeura tree: it builds against the installed headers and library only,
 * trains a small classifier for a few steps and prints its loss. */
#include <stdio.h>

#include "meganeura/meganeura.h"
#include "meganeura/meganeura_vulkan.h"

#define TRY(call)                                                                         \
  do {                                                                                    \
    mg_status status_ = (call);                                                           \
    if (status_ != MG_OK) {                                                               \
      fprintf(stderr, "%s: %s: %s\n", #call, mg_status_string(status_), mg_last_error()); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main(void) {
  mg_device* device = NULL;
  TRY(mg_device_open(NULL, &device));
  mg_program_options options;
  TRY(mg_program_options_init(&options));
  options.kind = MG_PROGRAM_TRAINING;
  options.batch = 2;
  mg_program* program = NULL;
  TRY(mg_program_create_classifier(device,
                                   "{\"architecture\": \"mlp\", \"image_size\": 8, \"classes\": 2}",
                                   &options, &program));
  float images[2 * 64];
  for (int i = 0; i < 2 * 64; ++i) images[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
  const int labels[2] = {0, 1};
  TRY(mg_program_set_input(program, "images", MG_DTYPE_F32, images, 2 * 64));
  TRY(mg_program_set_input(program, "labels", MG_DTYPE_I32, labels, 2));
  float first = 0, loss = 0;
  TRY(mg_program_train_step(program, &first));
  for (int step = 0; step < 10; ++step) TRY(mg_program_train_step(program, &loss));
  printf("meganeura %s: loss %.4f -> %.4f\n", mg_version(), first, loss);
  TRY(mg_program_release(program));
  TRY(mg_device_release(device));
  return loss < first ? 0 : 1;
}
