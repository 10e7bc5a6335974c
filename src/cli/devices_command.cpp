#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "backends/vulkan/runtime/cache_file.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "cli/arguments.hpp"
#include "cli/bench_workloads.hpp"
#include "cli/commands.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"
#include "models/llama.hpp"
#include "plan/program.hpp"
#include "plan/roofline.hpp"
#include "runtime/kernel_specs.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura devices [--verbose] [--bench-compile [--program NAME] [--batch N]
                        [--precision P] [--plan-only] [--dispatches] [--costs] [--graph]
                        [--compile]]
                        [--device SEL]

Lists every Vulkan device, one line each, and marks with '*' the one that would be used
(discrete > integrated > virtual > CPU, or MEGANEURA_DEVICE / --device).

  --verbose         also list each device's limits, compute units (where the driver reports
                    them), cooperative-matrix shapes and whether it has workgroup-scope
                    cooperative matrices (VK_NV_cooperative_matrix2, which the fast GEMM uses
                    for large products), with their limits, granularities and whether they
                    load through tensor addressing
  --bench-compile   build a workload's program twice on the chosen device, first with an
                    empty kernel cache (cold) then with the cache it filled (warm), and print
                    the time of building its graph and the parts of each build (opening the
                    device, planning, allocation, pipelines, recording, the rest), with the
                    pipelines' SPIR-V and driver time summed over kernels and the slowest kernel;
                    for the cold build also the 8 longest kernel builds, each with when it
                    started
  --program NAME    the program --bench-compile builds: cnn (the Fashion-MNIST CNN, batch 64,
                    Adam; the default), smollm2-135m (the smollm2-135m workload's training
                    step: sequence 128, batch 1, AdamW, weights not drawn), smolvla (the
                    smolvla workload's training step: batch 1, backbone frozen, AdamW),
                    smolvla-chunk (its action chunk: the backbone once, then 10 flow steps),
                    smollm2-135m-decode (that workload's decode step: one token over a
                    cache of 192),
                    resnet-50 (the resnet-50 workload's training step: 224x224 images, SGD
                    with momentum, weights not drawn), whisper-tiny (the whisper-tiny
                    workload's training step: 30 s of audio, 4 decoder tokens, AdamW, weights
                    not drawn), sd-unet (the sd-unet workload's training step: Stable
                    Diffusion 1.5's U-Net over 64x64 latents, 77 context tokens, AdamW,
                    weights not drawn), sd-unet-inference (its evaluation: the U-Net's
                    forward) or sd-unet-sampler (its sampler's step: one latent, classifier-
                    free guidance over the U-Net at batch 2)
  --batch N         resnet-50's images a step (default 4, the workload's compile figure; 256
                    is its throughput cell), sd-unet's (default 1; 4 is its other training
                    cell) or sd-unet-inference's (default 2, its inference cell); the other
                    programs have their workloads' batches
  --precision P     strict (the default), fast or bf16: the program's precision (fast and
                    bf16: the cooperative-matrix kernels where the device has them)
  --plan-only       with --bench-compile: open no device; plan the program for an H200's traits
                    (132 compute units, NV and KHR cooperative matrices, bfloat16 ones,
                    workgroup-scope ones, f16 storage) and the environment's MEGANEURA_* switches, as a build there
                    would; make every launch's kernel source as a build does before it asks
                    for pipelines, and the reports a build makes; print the fastest of five
                    repeats of each part, the barriers between dispatches, the transient
                    memory (its arenas, and the most that is live at once), the bytes the
                    dispatches bind and their arithmetic (each bound value counted once a
                    dispatch, as the roofline reports do) and a checksum of
                    the dispatch list, memory plan, regions and kernel sources (equal
                    checksums: the same program)
  --dispatches      with --plan-only: also print the planned program's dispatch list, one
                    line a dispatch (what `bench workloads --trace` writes beside a trace)
  --costs           with --plan-only: also print each dispatch of a run with the MB it binds
                    and its GFLOP (as the totals count them), then those summed by kernel,
                    most bytes first: where two plans' bytes differ
  --graph           with --plan-only: also print the planned program's graph after every
                    pass, one node a line, whose %N the dispatch labels name
  --compile         with --plan-only: also compile every distinct kernel to validated SPIR-V,
                    as a build does before it hands them to the driver (the kernels of an
                    H200's fast and bf16 paths, which no other device here runs); a kernel
                    that does not compile is an error that names it
  --device SEL      device index or part of its name
)";

std::string_view scalar_name(gpu::ScalarType type) {
  switch (type) {
    case gpu::ScalarType::f16:
      return "f16";
    case gpu::ScalarType::bf16:
      return "bf16";
    case gpu::ScalarType::f32:
      return "f32";
    case gpu::ScalarType::f64:
      return "f64";
    case gpu::ScalarType::i8:
      return "i8";
    case gpu::ScalarType::u8:
      return "u8";
    case gpu::ScalarType::i32:
      return "i32";
    case gpu::ScalarType::u32:
      return "u32";
    case gpu::ScalarType::other:
      break;
  }
  return "other";
}

void print_details(const gpu::DeviceInfo& info) {
  const gpu::DeviceCaps& caps = info.caps;
  std::printf(
      "    max storage buffer range %llu MiB, max allocation %llu MiB, workgroup <= %u "
      "invocations, %u storage buffers per kernel\n",
      static_cast<unsigned long long>(caps.max_storage_buffer_range >> 20),
      static_cast<unsigned long long>(caps.max_memory_allocation_size >> 20),
      caps.max_workgroup_invocations, caps.max_storage_buffers_per_stage);
  if (caps.compute_units > 0)
    std::printf("    %u compute units (kernels and splits are planned for them)\n",
                caps.compute_units);
  else
    std::printf("    compute units not reported by the driver (planned as %lld, an H200's)\n",
                static_cast<long long>(kernels::kAssumedComputeUnits));
  for (const gpu::CoopMatrixConfig& config : caps.coop_matrix) {
    std::printf("    cooperative matrix (%s) %ux%ux%u  %s x %s + %s -> %s\n",
                config.khr ? "KHR" : "NV", config.m, config.n, config.k,
                scalar_name(config.a).data(), scalar_name(config.b).data(),
                scalar_name(config.c).data(), scalar_name(config.result).data());
  }
  const gpu::WorkgroupCoopMatrixCaps& workgroup = caps.workgroup_coop_matrix;
  std::printf("    workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2): %s\n",
              workgroup.available ? "yes" : "no");
  if (!workgroup.available) return;
  std::printf(
      "      workgroups <= %u invocations, matrices <= %u a side, %u bytes of shared memory "
      "reserved, tensor-addressing loads %s\n",
      workgroup.max_workgroup_invocations, workgroup.max_dimension,
      workgroup.reserved_shared_memory_bytes, workgroup.tensor_addressing ? "yes" : "no");
  for (const gpu::WorkgroupCoopMatrixConfig& config : workgroup.configs)
    std::printf("      multiples of %ux%ux%u  %s x %s + %s -> %s, %u invocations\n",
                config.m_granularity, config.n_granularity, config.k_granularity,
                scalar_name(config.a).data(), scalar_name(config.b).data(),
                scalar_name(config.c).data(), scalar_name(config.result).data(),
                config.workgroup_invocations);
}

// The graph --bench-compile builds, whether its builds draw random weights, and what it holds.
struct CompiledProgram {
  Graph graph;
  bool initialise_parameters = true;
  std::string contents = "forward, gradients, optimizer";
};

CompiledProgram program_to_compile(const std::string& name, std::optional<int64_t> batch) {
  if (batch && name != "resnet-50" && name != "sd-unet" && name != "sd-unet-inference")
    throw Error("--batch sets the resnet-50, sd-unet and sd-unet-inference programs' images; the " +
                name + " program has its workload's batch");
  if (name == "resnet-50")
    return {resnet50_workload_training_graph(batch.value_or(kResNet50CompileBatch)), false};
  if (name == "sd-unet") return {sd_unet_workload_training_graph(batch.value_or(1)), false};
  if (name == "sd-unet-inference")
    return {sd_unet_workload_inference_graph(batch.value_or(2)), false, "forward"};
  if (name == "sd-unet-sampler")
    return {sd_unet_workload_sampler_graph(), false, "one guided sampler step"};
  if (name == "whisper-tiny") return {whisper_tiny_workload_training_graph(), false};
  if (name == "cnn")
    return {models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{}),
            true};
  if (name == "smollm2-135m") {
    const models::LlamaConfig config =
        models::llama_config_from_json(smollm2_135m_config(), "smollm2-135m");
    Graph graph = models::llama_loss_graph(config, 1, kSmolLM2WorkloadSeq);
    OptimizerConfig optimizer;
    optimizer.kind = OptimizerConfig::Kind::adamw;
    optimizer.learning_rate = 1e-4;
    add_training(graph, graph.output(models::kLoss), optimizer);
    // As the workload's compile figures: drawing weights takes time in proportion to the model.
    return {std::move(graph), false};
  }
  if (name == "smollm2-135m-decode") {
    const models::LlamaConfig config =
        models::llama_config_from_json(smollm2_135m_config(), "smollm2-135m");
    const int64_t cache = kSmolLM2WorkloadSeq + kSmolLM2WorkloadDecodeTokens;
    return {models::llama_decode_graph(config, cache), false,
            "one token's step over a cache of " + std::to_string(cache)};
  }
  if (name == "smolvla") {
    const models::SmolVLAConfig config = smolvla_workload_config();
    return {smolvla_workload_training_graph(config, smolvla_workload_optimizer()), false};
  }
  if (name == "smolvla-chunk") {
    const models::SmolVLAConfig config = smolvla_workload_config();
    return {models::smolvla_chunk_graph(config, 1, config.tokenizer_max_length, config.num_steps),
            false, "backbone, " + std::to_string(config.num_steps) + " flow steps"};
  }
  throw Error("unknown --program \"" + name +
              "\": use cnn, smollm2-135m, smollm2-135m-decode, smolvla, smolvla-chunk, resnet-50, "
              "whisper-tiny, sd-unet, sd-unet-inference or sd-unet-sampler");
}

// What --bench-compile builds: the program, its batch where it has a choice, the precision.
struct CompileRequest {
  std::string program;
  std::optional<int64_t> batch;
  Precision precision = Precision::strict;
};

void bench_compile(const std::string& device, const CompileRequest& request) {
  const auto graph_start = std::chrono::steady_clock::now();
  const CompiledProgram program = program_to_compile(request.program, request.batch);
  const double graph_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - graph_start).count();
  std::printf("%s graph (%s): %.3f s, %zu nodes, %s precision\n", request.program.c_str(),
              program.contents.c_str(), graph_seconds, program.graph.size(),
              std::string(precision_name(request.precision)).c_str());
  const std::filesystem::path cache = std::filesystem::temp_directory_path() /
                                      ("meganeura-bench-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(cache);
  SessionOptions options;
  options.device = device;
  options.precision = request.precision;
  options.switches = Switches::from_environment({{"MEGANEURA_CACHE_DIR", cache.string()}});
  options.initialise_parameters = program.initialise_parameters;
  for (const char* label : {"cold", "warm"}) {
    Session session(program.graph, options);
    const BuildReport& report = session.report();
    const double rest = report.build_seconds - report.device_seconds - report.plan_seconds -
                        report.allocation_seconds - report.pipeline_seconds - report.record_seconds;
    std::printf(
        "%s build: %.3f s (device %.3f s, plan %.3f s, allocation %.3f s, pipelines %.3f s, "
        "record %.3f s, rest %.3f s; %u pipelines, %u SPIR-V cache hits, %zu dispatches)\n"
        "  pipelines summed over kernels: SPIR-V %.3f s, driver %.3f s; slowest '%s' %.3f s\n",
        label, report.build_seconds, report.device_seconds, report.plan_seconds,
        report.allocation_seconds, report.pipeline_seconds, report.record_seconds, rest,
        report.pipelines, report.spirv_cache_hits, report.dispatches, report.spirv_seconds,
        report.driver_seconds, report.slowest_kernel.c_str(), report.slowest_kernel_seconds);
    if (std::string_view(label) != "cold") continue;
    std::printf("  longest kernel builds (started at, SPIR-V, driver):\n");
    for (const BuildReport::KernelBuildTime& kernel : report.slowest_kernels)
      std::printf("    %.3f s  %.3f s  %.3f s  %s\n", kernel.start_seconds, kernel.spirv_seconds,
                  kernel.driver_seconds, kernel.kernel.c_str());
  }
  std::filesystem::remove_all(cache);
}

// The H200's largest device-local heap, as its driver reports it (about 140 GiB).
constexpr uint64_t kH200MemoryBytes = uint64_t{140} << 30;

// The traits device_target gives an H200 (NVIDIA's driver), its fragment layout excepted.
target::DeviceTraits h200_traits() {
  target::DeviceTraits traits;
  traits.subgroup_size = 32;
  traits.compute_units = 132;
  traits.max_shared_memory_bytes = 49152;
  traits.max_workgroup_invocations = 1024;
  traits.max_workgroup_count_x = 2147483647;
  traits.max_storage_buffers = 1048576;
  traits.coop_matrix_f16_nv = true;
  traits.coop_matrix_f16_khr = true;
  traits.coop_matrix_bf16_khr = true;
  traits.workgroup_coop_matrix_f16 = true;
  traits.workgroup_tensor_loads = true;
  traits.workgroup_narrow_blocks = true;
  traits.workgroup_coop_matrix_bf16 = true;
  traits.f16_tensors = true;
  traits.name = "H200 (traits only)";
  return traits;
}

// A checksum of everything a build takes from `program`: each launch's kernel source, defines,
// grid, operands, regions and barrier, the memory plan and the dispatch list.
uint64_t program_checksum(const plan::Program& program) {
  using gpu::detail::fnv1a64;
  uint64_t checksum = fnv1a64(plan::describe_memory(program));
  checksum = fnv1a64(plan::describe_dispatches(program), checksum);
  for (const std::vector<plan::PlannedLaunch>* launches : {&program.setup, &program.launches}) {
    for (const plan::PlannedLaunch& planned : *launches) {
      const kernels::Launch& launch = vulkan::glsl_launch(planned.launch);
      checksum = fnv1a64(kernels::launch_source(program.graph, launch), checksum);
      std::string facts = planned.barrier_before ? "barrier;" : ";";
      for (const auto& [name, value] : launch.defines) facts += name + "=" + value + ";";
      for (uint32_t extent : launch.groups) facts += std::to_string(extent) + ";";
      for (size_t k = 0; k < planned.regions.size(); ++k) {
        const target::Operand& operand = planned.launch.operands[k];
        facts += std::to_string(operand.value) + (operand.write ? "w@" : "r@") +
                 std::to_string(planned.regions[k].arena) + ":" +
                 std::to_string(planned.regions[k].offset) + "+" +
                 std::to_string(planned.regions[k].bytes) + ";";
      }
      checksum = fnv1a64(facts, checksum);
    }
  }
  return checksum;
}

// Compiles every distinct kernel of `program` to validated SPIR-V, as a build does before it
// hands them to the driver; throws naming the first kernel that does not compile.
void compile_kernels(const plan::Program& program) {
  const auto start = std::chrono::steady_clock::now();
  const runtime::ProgramKernels kernels = runtime::program_kernels(program);
  for (const gpu::KernelSpec& spec : kernels.specs) {
    try {
      gpu::compile_glsl(spec);
    } catch (const std::exception& error) {
      throw Error("kernel '" + spec.label + "' does not compile to SPIR-V: " + error.what());
    }
  }
  std::printf("compiled %zu kernels to SPIR-V in %.2f s\n", kernels.specs.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// One line a dispatch of `program`'s runs: its index, kernel, the MB it binds and its GFLOP
// (plan::launch_costs, which the plan-only totals sum) and its label; then the same summed by
// kernel, most bytes first.
void print_costs(const plan::Program& program) {
  const std::vector<plan::LaunchCost> costs = plan::launch_costs(program);
  struct KernelTotal {
    plan::LaunchCost cost;
    size_t dispatches = 0;
  };
  std::map<std::string, KernelTotal> by_kernel;
  std::printf("   #  kernel                            MB      GFLOP  label\n");
  for (size_t t = 0; t < costs.size(); ++t) {
    const auto& launch = program.launches[t].launch;
    std::printf("%4zu  %-24s %12.3f %10.4f  %s\n", t, launch.kernel.c_str(), costs[t].bytes * 1e-6,
                costs[t].flops * 1e-9, launch.label.c_str());
    KernelTotal& total = by_kernel[launch.kernel];
    total.cost.bytes += costs[t].bytes;
    total.cost.flops += costs[t].flops;
    ++total.dispatches;
  }
  std::vector<std::pair<std::string, KernelTotal>> ranked(by_kernel.begin(), by_kernel.end());
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second.cost.bytes > b.second.cost.bytes;
  });
  std::printf("by kernel:                          MB      GFLOP  dispatches\n");
  for (const auto& [kernel, total] : ranked)
    std::printf("      %-24s %12.3f %10.4f  %zu\n", kernel.c_str(), total.cost.bytes * 1e-6,
                total.cost.flops * 1e-9, total.dispatches);
}

void bench_plan(const CompileRequest& request, bool print_dispatches, bool print_costs_too,
                bool print_graph, bool compile) {
  const auto now = [] { return std::chrono::steady_clock::now(); };
  const auto seconds_since = [&](std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(now() - since).count();
  };
  auto phase = now();
  const CompiledProgram compiled = program_to_compile(request.program, request.batch);
  std::printf("%s graph (%s): %.3f s, %zu nodes, %s precision\n", request.program.c_str(),
              compiled.contents.c_str(), seconds_since(phase), compiled.graph.size(),
              std::string(precision_name(request.precision)).c_str());
  target::DeviceTraits traits = h200_traits();
  traits.fast_precision = request.precision != Precision::strict;
  traits.bf16_operands = request.precision == Precision::bf16;
  traits.switches = Switches::from_environment();
  const vulkan::VulkanTarget target(traits);
  plan::PlanOptions options;
  options.alignment = 256;
  options.arena_limit = uint64_t{1} << 32;
  options.column_limit = plan::column_limit_for(options.arena_limit, kH200MemoryBytes);
  // As a session places the leaves (their memory is allocated while it plans).
  const plan::LeafLayout leaf_layout = plan::layout_leaves(compiled.graph, options);
  options.leaf_layout = &leaf_layout;
  // The fastest of a few repeats: the machine's other work adds to single timings.
  constexpr int kRepeats = 5;
  double plan_seconds = 1e30, source_seconds = 1e30, report_seconds = 1e30;
  plan::Program program;
  size_t kernel_count = 0;
  plan::LaunchCost total;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    phase = now();
    program = plan::build_program(compiled.graph, target, options);
    plan_seconds = std::min(plan_seconds, seconds_since(phase));
    phase = now();
    kernel_count = runtime::program_kernels(program).specs.size();
    source_seconds = std::min(source_seconds, seconds_since(phase));
    phase = now();
    const std::string memory = plan::describe_memory(program);
    const std::string dispatches = plan::describe_dispatches(program);
    const std::vector<plan::LaunchCost> costs = plan::launch_costs(program);
    report_seconds = std::min(report_seconds, seconds_since(phase));
    total = {};
    for (const plan::LaunchCost& cost : costs) {
      total.flops += cost.flops;
      total.bytes += cost.bytes;
    }
  }
  std::printf(
      "fastest of %d: plan %.4f s, kernels %.4f s (%zu distinct), reports %.4f s; %zu "
      "dispatches, %zu setup, %zu barriers, transient memory %.1f MiB (%.1f MiB live at most), "
      "%.1f GiB bound and %.3f TFLOP by the shapes, checksum %016llx\n",
      kRepeats, plan_seconds, source_seconds, kernel_count, report_seconds, program.launches.size(),
      program.setup.size(), static_cast<size_t>(program.memory.barriers),
      static_cast<double>(program.memory.physical_transient_bytes) / (1 << 20),
      static_cast<double>(program.memory.peak_live_bytes) / (1 << 20), total.bytes / (1 << 30),
      total.flops * 1e-12, static_cast<unsigned long long>(program_checksum(program)));
  if (compile) compile_kernels(program);
  if (print_dispatches) std::fputs(plan::describe_dispatches(program).c_str(), stdout);
  if (print_costs_too) print_costs(program);
  if (print_graph) std::fputs(program.graph.to_string().c_str(), stdout);
}

}  // namespace

int devices_command(const std::vector<std::string>& words) {
  const Arguments arguments(
      "meganeura devices", words, {"device", "program", "batch", "precision"},
      {"bench-compile", "plan-only", "dispatches", "costs", "graph", "compile", "verbose", "help"});
  if (arguments.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  arguments.expect_at_most_positional(0);
  for (const char* option : {"dispatches", "costs", "graph", "compile"}) {
    if (arguments.has(option) && !(arguments.has("bench-compile") && arguments.has("plan-only")))
      throw Error(std::string("--") + option +
                  (std::string_view(option) == "compile" ? " compiles" : " prints") +
                  " what a planned program holds; add --bench-compile --plan-only");
  }
  if (!arguments.has("bench-compile") &&
      (arguments.has("program") || arguments.has("batch") || arguments.has("precision")))
    throw Error(
        "--program, --batch and --precision choose what --bench-compile "
        "builds; add --bench-compile");
  CompileRequest request;
  request.program = arguments.text("program", "cnn");
  if (arguments.has("batch"))
    request.batch = arguments.integer("batch", kResNet50CompileBatch, 1, 4096);
  request.precision = parse_precision(arguments.text("precision", "strict"));
  if (arguments.has("bench-compile") && arguments.has("plan-only")) {
    bench_plan(request, arguments.has("dispatches"), arguments.has("costs"), arguments.has("graph"),
               arguments.has("compile"));
    return 0;
  }
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const uint32_t chosen = gpu::choose_device(devices, arguments.text("device", ""));
  for (const gpu::DeviceInfo& info : devices) {
    std::printf("%s %s\n", info.index == chosen ? "*" : " ", gpu::describe_device(info).c_str());
    if (arguments.has("verbose")) print_details(info);
  }
  if (arguments.has("bench-compile")) bench_compile(arguments.text("device", ""), request);
  return 0;
}

}  // namespace mg::cli
