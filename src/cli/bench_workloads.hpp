#pragma once
// The pieces of `meganeura bench workloads`: each workload is a function in its own file
// (bench_<workload>_workload.cpp) that times its cells and returns one JSON record in the format
// of bench/workloads_pytorch.py; bench_workloads.cpp lists them and prints the table.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/smolvla.hpp"

namespace mg::cli {

struct WorkloadOptions {
  std::string device;     // --device
  int64_t runs = 20;      // --runs
  std::string trace_dir;  // --trace: Chrome traces (per-dispatch GPU times) of each program
};

// With options.trace_dir set, builds `graph` again with per-dispatch timestamps, runs it after
// `prepare` set its inputs, and writes the trace as trace_dir/<name>.json and the dispatch list
// (kernels, grids, barriers) as trace_dir/<name>.dispatches.txt.
void write_workload_trace(const WorkloadOptions& options, const std::string& name,
                          const Graph& graph, SessionOptions session_options,
                          const std::function<void(Session&)>& prepare);

// Wall-clock milliseconds of one run (the host's waits included), median of `runs` after the
// warm-up of bench_timing.hpp.
double median_ms(const std::function<void()>& run, int64_t runs);
// GPU milliseconds of one run of a session built with time_runs (every dispatch waiting for the
// one before), median of max(runs, 3) after the same warm-up.
double gpu_ms(Session& session, int64_t runs);
// The reports of a cold and a warm build of `graph`, each on a device opened afresh, the first
// over a new kernel cache and the second over the cache the first filled.
std::pair<BuildReport, BuildReport> compile_reports(const Graph& graph, SessionOptions options);
// A build's compile time: building the program on an open device, the device's opening left out
// (a process opens one device and builds all its programs on it, and PyTorch's compile time
// likewise starts with CUDA ready); compile_parts_json reports the opening beside it.
double compile_seconds(const BuildReport& report);
// {"cold": {...}, "warm": {...}} with the parts of each build (BuildReport's *_seconds).
nlohmann::json compile_parts_json(const std::pair<BuildReport, BuildReport>& builds);
std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint64_t seed);
// The device bytes a built program holds: persistent, shared and transient (as placed).
uint64_t device_bytes(const BuildReport& report);
// {"transient_logical_bytes", "transient_physical_bytes", "planner_saving"} of a build.
nlohmann::json planner_json(const BuildReport& report);

// The workloads. Each record: framework, model, mode, device, config, timings (milliseconds as
// *_ms, GPU time as *_gpu_ms, compile_s / compile_warm_s, rates as *_per_second), memory and
// outputs.
nlohmann::json bench_smollm2_135m(Precision precision, const WorkloadOptions& options);
nlohmann::json bench_resnet50(Precision precision, const WorkloadOptions& options);
nlohmann::json bench_whisper_tiny(Precision precision, const WorkloadOptions& options);
nlohmann::json bench_smolvla(Precision precision, const WorkloadOptions& options);
nlohmann::json bench_sd_unet(Precision precision, const WorkloadOptions& options);
// The smolvla workload's model (SmolVLA's defaults over SmolVLM2-500M cut to 16 layers), its
// optimizer (AdamW, clipping) and its training step at batch 1 (backbone frozen).
models::SmolVLAConfig smolvla_workload_config();
OptimizerConfig smolvla_workload_optimizer();
Graph smolvla_workload_training_graph(const models::SmolVLAConfig& config,
                                      const OptimizerConfig& optimizer);
// The resnet-50 workload's training step at `batch` 224x224 images (torchvision's resnet50,
// 1000 classes, SGD with momentum); its compile figures build it at kResNet50CompileBatch.
constexpr int64_t kResNet50CompileBatch = 4;
Graph resnet50_workload_training_graph(int64_t batch);
// SmolLM2-135M's config.json (the smollm2-135m workload's model).
nlohmann::json smollm2_135m_config();
// The smollm2-135m workload's prompt (its training and inference sequence) and the tokens it
// decodes after it, into a KV cache of both.
inline constexpr int64_t kSmolLM2WorkloadSeq = 128, kSmolLM2WorkloadDecodeTokens = 64;
// Stable Diffusion 1.5's unet/config.json (the sd-unet workload's model).
nlohmann::json stable_diffusion_15_unet_config();
// The sd-unet workload's training step at `batch` 64x64 latents with 77 context tokens (AdamW).
Graph sd_unet_workload_training_graph(int64_t batch);
// Its evaluation program at `batch` (the workload's inference cell: 2), and its sampler's step:
// one latent, with classifier-free guidance (the U-Net over 2).
Graph sd_unet_workload_inference_graph(int64_t batch);
Graph sd_unet_workload_sampler_graph();
// The whisper-tiny workload's training step: 30 s of audio, 4 decoder tokens (AdamW).
Graph whisper_tiny_workload_training_graph();

}  // namespace mg::cli
