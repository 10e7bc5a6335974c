// `meganeura bench workloads`: the study's workloads as whole programs (random weights at the
// real configurations), one JSON line per (workload, precision) in the format that
// bench/workloads_pytorch.py prints for PyTorch, and a table.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/arguments.hpp"
#include "cli/bench_workloads.hpp"
#include "cli/commands.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura bench workloads [--filter NAME] [--runs N] [--precision P] [--device SEL]
                                 [--trace DIR]

Times the study's workloads end to end with random weights at their real configurations, and
prints one JSON object per workload and precision (the format of bench/workloads_pytorch.py,
which times the same cells in PyTorch; bench/compare.py --workloads joins the two) and a table:

  smollm2-135m   SmolLM2-135M (LlamaForCausalLM), batch 1, seq 128: the forward to every
                 position's logits (inference; their argmax comes back to the host), a
                 training step (loss, gradients, AdamW), and greedy decode of 64 tokens
                 after a 128-token prefill (decode tokens/s)
  resnet-50      torchvision's ResNet-50, 224x224 images, 1000 classes: inference at batch 4
                 (batch norm with running statistics), a training step at batch 4 (batch
                 statistics, gradients, SGD with momentum), and training throughput at batch
                 64 and 256 (training_b64_images_per_second, training_b256_...)
  whisper-tiny   Whisper-tiny (WhisperForConditionalGeneration), batch 1, 80 x 3000 log-mel
                 (30 s): the encoder alone (encoder_ms), the encoder and 4 decoder tokens to
                 logits (inference), a training step on them (loss, gradients, AdamW), one
                 decode step over the KV cache, and the real-time factor of transcribing 30 s
                 (features, cross kv, greedy decoding of up to 64 tokens)
  smolvla        SmolVLA (LeRobot's defaults over SmolVLM2-500M cut to 16 layers), one
                 512x512 camera, 48 instruction tokens, batch 1: one action chunk (latency:
                 the backbone once, then 10 Euler steps over a chunk of 50) and one
                 flow-matching training step of the expert (backbone frozen, AdamW)
  sd-unet        Stable Diffusion 1.5's UNet2DConditionModel (its exact config): one
                 evaluation at 64x64 latents, batch 2, 77 text tokens of width 768
                 (inference), a training step (noise MSE, AdamW) at batch 1 (training) and
                 4 (training_b4), and 50 DDIM steps with classifier-free guidance on one
                 latent (ddim50_ms: the step program replayed 50 times, median of 3)

Each figure is the median wall-clock time of --runs runs after 1 s of warm-up (at least 3
runs), the host's upload and download included; *_gpu_ms is the GPU time of one run with every
dispatch waiting for the one before (the median of --runs runs after the same warm-up), so it
exceeds the wall-clock figure where a program's independent dispatches overlap. compile_s
builds the training program with an empty kernel cache (cold), compile_warm_s again with the
cache it filled, each on a device opened afresh whose opening is left out (compile_parts gives
it, as device_s, with the build's other parts: planning, allocation, pipelines, recording; and
for the pipelines, GLSL to SPIR-V and the driver's time summed over kernels, and the slowest
kernel with its time). Memory: the training program's device memory (weights, optimizer state,
transient values as placed), that of SmolLM2's inference and SmolVLA's chunk programs (each
counting the weights it shares with the training program, and its own f16 copies of fixed
weights), and the planner's saving on transient values against giving each its own bytes.

  --filter NAME   only workloads whose name contains NAME
  --runs N        timed runs a cell (default 20)
  --precision P   strict, fast, bf16 or both (strict and fast; the default)
  --device SEL    device index or part of its name (default: best available)
  --trace DIR     also write a Chrome trace (per-dispatch GPU times, FLOPs and bytes) of
                  each program as DIR/<workload>-<precision>-<program>.json
                  (bench/trace_top.py sums them up, with GB/s) and its dispatch list as
                  .dispatches.txt beside it (bench/trace_epochs.py reads both, epoch by
                  epoch); the programs: inference (SmolVLA: chunk) and training, Whisper's
                  encoder as well, ResNet-50's training at batch 4 and 256 (training-b4,
                  training-b256)
)";

// One line of the table: the record's timings by name.
std::string table_row(const std::string& name, Precision precision, const nlohmann::json& record) {
  std::string row = name;
  row.resize(std::max<size_t>(row.size(), 14), ' ');
  row += " " + std::string(precision_name(precision));
  row.resize(std::max<size_t>(row.size(), 22), ' ');
  for (const auto& [key, value] : record["timings"].items()) {
    if (!value.is_number()) continue;
    char cell[96];
    std::snprintf(cell, sizeof(cell), "  %s %.3f", key.c_str(), value.get<double>());
    row += cell;
  }
  return row;
}

}  // namespace

int bench_workloads(const std::vector<std::string>& words) {
  const Arguments arguments("meganeura bench workloads", words,
                            {"filter", "runs", "precision", "device", "trace"}, {"help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (!arguments.positional().empty())
    throw Error("unexpected '" + arguments.positional()[0] +
                "' (see meganeura bench workloads --help)");
  const int64_t runs = arguments.integer("runs", 20);
  if (runs < 1) throw Error("--runs must be at least 1");
  const std::string precision = arguments.text("precision", "both");
  std::vector<Precision> precisions;
  if (precision == "both") {
    precisions = {Precision::strict, Precision::fast};
  } else {
    precisions = {parse_precision(precision)};
  }
  const std::string filter = arguments.text("filter", "");
  const std::string device = arguments.text("device", "");
  const WorkloadOptions options{device, runs, arguments.text("trace", "")};
  struct Workload {
    std::string name;
    std::function<nlohmann::json(Precision, const WorkloadOptions&)> run;
  };
  const std::vector<Workload> workloads = {{"smollm2-135m", bench_smollm2_135m},
                                           {"resnet-50", bench_resnet50},
                                           {"whisper-tiny", bench_whisper_tiny},
                                           {"smolvla", bench_smolvla},
                                           {"sd-unet", bench_sd_unet}};
  std::vector<std::string> table;
  size_t selected = 0;
  for (const Workload& workload : workloads) {
    if (workload.name.find(filter) == std::string::npos) continue;
    ++selected;
    for (Precision p : precisions) {
      const nlohmann::json record = workload.run(p, options);
      std::printf("%s\n", record.dump().c_str());
      std::fflush(stdout);
      const std::string row = table_row(workload.name, p, record);
      table.push_back(row);
    }
  }
  if (selected == 0) {
    std::string names;
    for (const Workload& workload : workloads) names += (names.empty() ? "" : ", ") + workload.name;
    throw Error("no workload matches --filter '" + filter + "' (" + names + ")");
  }
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  return 0;
}

}  // namespace mg::cli
