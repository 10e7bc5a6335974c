/* Meganeura's C API: train and run neural networks on a Vulkan device from any language or app
 * (docs/EMBEDDING.md). libmeganeura.so exports exactly these functions.
 *
 * Conventions:
 * - Every function returns an mg_status (MG_OK on success), except mg_version, mg_last_error
 *   and mg_status_string, which cannot fail. No C++ exception ever leaves a function.
 * - On failure, mg_last_error() returns a one-line message naming what was wrong and how to fix
 *   it; it stays valid until the next failing call on the same thread. Outputs are untouched.
 * - Handles are opaque. A null handle or pointer where one is needed, a size that does not match,
 *   an unknown tensor name or a call out of order returns an error status, never crashes. After
 *   any error the handles stay usable.
 * - A handle is used from one thread at a time. Programs keep their device alive: a device may
 *   be released before the programs built on it.
 * - Releasing a null handle is a no-op that returns MG_OK. */
#ifndef MEGANEURA_H
#define MEGANEURA_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define MG_API __attribute__((visibility("default")))
#else
#define MG_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MG_VERSION_MAJOR 0
#define MG_VERSION_MINOR 1
#define MG_VERSION_PATCH 0

typedef enum mg_status {
  MG_OK = 0,
  MG_ERROR_INVALID_ARGUMENT = 1,   /* null handle or pointer, wrong size or dtype, unknown name */
  MG_ERROR_INVALID_STATE = 2,      /* out of order: an output before a run, a training step on an
                                      inference program, a chunked run under way */
  MG_ERROR_UNSUPPORTED_DEVICE = 3, /* an adopted device lacks a feature or extension (named) */
  MG_ERROR_FAILED = 4,        /* the library refused: a missing or bad file, a Vulkan error, ... */
  MG_ERROR_OUT_OF_MEMORY = 5, /* host memory ran out */
  MG_ERROR_INTERNAL = 6       /* a bug in Meganeura: please report the message */
} mg_status;

typedef enum mg_dtype {
  MG_DTYPE_F32 = 0,
  MG_DTYPE_I32 = 1,
  MG_DTYPE_F16 = 2,
  MG_DTYPE_BF16 = 3
} mg_dtype;

typedef enum mg_program_kind {
  MG_PROGRAM_INFERENCE = 0, /* forward only: inputs to outputs */
  MG_PROGRAM_TRAINING = 1   /* forward, backward and the optimizer update in one run */
} mg_program_kind;

typedef enum mg_tensor_role {
  MG_TENSOR_INPUT = 0,
  MG_TENSOR_OUTPUT = 1,
  MG_TENSOR_PARAMETER = 2 /* weights and optimizer state: persistent between runs */
} mg_tensor_role;

typedef struct mg_device mg_device;
typedef struct mg_program mg_program;

#define MG_MAX_RANK 8

typedef struct mg_tensor_info {
  mg_dtype dtype; /* as stored; f16 and bf16 tensors read and write as f32 */
  uint32_t rank;
  int64_t shape[MG_MAX_RANK];
  int64_t elements;
} mg_tensor_info;

typedef struct mg_program_options {
  uint32_t struct_size;    /* sizeof(mg_program_options), set by mg_program_options_init */
  mg_program_kind kind;    /* default MG_PROGRAM_INFERENCE */
  int64_t batch;           /* examples per run; default 1 */
  int64_t sequence_length; /* language models: tokens per example; default 16 */
  const char* precision;   /* "strict" (default, NULL), "fast" or "bf16" */
  const char* optimizer;   /* training: "adam" (default, NULL), "adamw" or "sgd" */
  double learning_rate;    /* training; default 1e-3 */
  uint64_t seed;           /* initialisation of weights a program does not load; default 0 */
  /* 1: the program's parameters and optimizer state are the device's shared tensors, by name,
   * so that programs sharing them hold one copy: a training program's steps change the weights
   * an inference program on the same device runs with, in place. The first program to declare a
   * name creates (and initialises or loads) it; later ones must declare the same shape. Finish
   * one program's run (mg_program_wait) before another that shares its tensors reads, writes or
   * runs on them. Default 0: the program's own copy. */
  int32_t share_parameters;
} mg_program_options;

/* "0.1.0" */
MG_API const char* mg_version(void);
/* The message of the last failing call on this thread ("" when none failed). */
MG_API const char* mg_last_error(void);
/* "MG_OK", "MG_ERROR_INVALID_ARGUMENT", ... */
MG_API const char* mg_status_string(mg_status status);

/* ---- Devices ---- */

/* Opens a Vulkan device of its own: `selector` NULL or "" picks automatically (discrete >
 * integrated > virtual > CPU, or MEGANEURA_DEVICE), else an index or part of the name.
 * Adopting the app's own device: mg_device_adopt_vulkan in meganeura_vulkan.h. */
MG_API mg_status mg_device_open(const char* selector, mg_device** device);
/* One line: name, kind, subgroup size, memory... Valid while the device lives. */
MG_API mg_status mg_device_description(const mg_device* device, const char** text);
MG_API mg_status mg_device_release(mg_device* device);

/* ---- Programs ---- */

MG_API mg_status mg_program_options_init(mg_program_options* options);

/* An image classifier (docs/EMBEDDING.md): `config_json` as in a checkpoint's model entry, e.g.
 * {"architecture": "cnn", "image_size": 28, "classes": 10}; NULL for that default. Inputs
 * "images" f32 [batch, 1, size, size] and, training, "labels" i32 [batch]; outputs "logits"
 * and, training, "loss". Weights start from options->seed. */
MG_API mg_status mg_program_create_classifier(mg_device* device, const char* config_json,
                                              const mg_program_options* options,
                                              mg_program** program);
/* A classifier from a checkpoint that `meganeura train` or mg_program_save wrote: its weights,
 * and for training programs its optimizer state and step. */
MG_API mg_status mg_program_create_from_checkpoint(mg_device* device, const char* path,
                                                   const mg_program_options* options,
                                                   mg_program** program);
/* A Llama-family model folder (config.json + safetensors): inference has input "input_ids" i32
 * [batch, sequence_length] and output "logits"; training adds input "labels" i32 (-100 ignored)
 * and output "loss". */
MG_API mg_status mg_program_create_from_model_folder(mg_device* device, const char* folder,
                                                     const mg_program_options* options,
                                                     mg_program** program);
MG_API mg_status mg_program_release(mg_program* program);

/* Tensors by role: `count` of them, the name of the `index`th (valid while the program lives),
 * and the type of one by name (any role). */
MG_API mg_status mg_program_tensor_count(const mg_program* program, mg_tensor_role role,
                                         size_t* count);
MG_API mg_status mg_program_tensor_name(const mg_program* program, mg_tensor_role role,
                                        size_t index, const char** name);
MG_API mg_status mg_program_tensor_info(const mg_program* program, const char* name,
                                        mg_tensor_info* info);

/* Copies `count` values (exactly the input's element count) into input `name`. f32 data fills
 * f32, f16 and bf16 inputs; i32 data fills i32 inputs. Inputs keep their value across runs. */
MG_API mg_status mg_program_set_input(mg_program* program, const char* name, mg_dtype dtype,
                                      const void* data, size_t count);
/* Runs the program once on its inputs and waits. For a training program this is one step (the
 * optimizer's learning rate and bias corrections are set for the step count). */
MG_API mg_status mg_program_run(mg_program* program);
/* One training step; `loss` (may be NULL) receives the step's loss. */
MG_API mg_status mg_program_train_step(mg_program* program, float* loss);
/* Steps run so far (training programs; includes a loaded checkpoint's). */
MG_API mg_status mg_program_step_count(const mg_program* program, int64_t* steps);
/* Copies output `name` of the last finished run as f32 into `data` (`count` = its elements). */
MG_API mg_status mg_program_get_output(mg_program* program, const char* name, float* data,
                                       size_t count);

/* Parameters and optimizer state by name, as f32 (blocking; after any run in flight). */
MG_API mg_status mg_program_read_parameter(mg_program* program, const char* name, float* data,
                                           size_t count);
MG_API mg_status mg_program_write_parameter(mg_program* program, const char* name,
                                            const float* data, size_t count);

/* Saves the weights: a classifier as a checkpoint file (with optimizer state and step when
 * training; `meganeura infer --checkpoint` reads it), a language model as a model folder. */
MG_API mg_status mg_program_save(mg_program* program, const char* path);
/* Loads a classifier checkpoint's weights (and, training, its optimizer state and step). */
MG_API mg_status mg_program_load(mg_program* program, const char* path);

/* The copies each run records and the bytes they move: inputs from host staging or from the app's
 * buffers bound copied, outputs into them, and new values of optimizer state that the program
 * could not write in place. 0 copies when every input and output is bound in place (app buffers,
 * meganeura_vulkan.h) and nothing else is copied. Either pointer may be NULL. */
MG_API mg_status mg_program_run_transfers(const mg_program* program, size_t* copies,
                                          uint64_t* bytes);

/* ---- Asynchronous and chunked runs ---- */

/* Starts a run (a training step for training programs) without waiting; mg_program_wait waits
 * for it. Outputs and parameters are read after the wait. */
MG_API mg_status mg_program_start(mg_program* program);
MG_API mg_status mg_program_wait(mg_program* program);

/* Splits each run into chunks of at most `budget_ms` of GPU time, measured on the device by one
 * profiled run; `chunks` (may be NULL) receives their number. A single kernel longer than the
 * budget is a chunk of its own. 0 turns chunking off. */
MG_API mg_status mg_program_set_chunk_budget(mg_program* program, double budget_ms, size_t* chunks);
/* Submits the next chunk of the current run (starting a run, or a training step, if none is
 * under way) without waiting for it, so that an app can give the GPU one chunk per frame.
 * `finished` receives 1 when that chunk was the run's last: mg_program_wait then waits for it.
 * Needs mg_program_set_chunk_budget first. */
MG_API mg_status mg_program_run_chunk(mg_program* program, int* finished);
/* The measured GPU time in milliseconds of the chunk mg_program_run_chunk submits next (0 until
 * the first chunked run has measured it), so that an app can submit chunks while they fit in
 * the GPU time a frame leaves. */
MG_API mg_status mg_program_next_chunk_ms(mg_program* program, double* milliseconds);

#ifdef __cplusplus
}
#endif

#endif /* MEGANEURA_H */
