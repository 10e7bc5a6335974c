#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>

#include "backends/vulkan/runtime/gpu.hpp"
#include "cli/arguments.hpp"
#include "cli/bench_timing.hpp"
#include "cli/commands.hpp"
#include "ir/op_names.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"

namespace mg::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: meganeura bench kernels [--filter TEXT] [--runs N] [--rotate MIB] [--small] [--no-fast]
                              [--profile]

Times each kernel family on the chosen device with GPU timestamps and prints one JSON object
per case (name, ms, GFLOP/s or GB/s) and a table at the end; bench/kernels_pytorch.py times the
same cases in PyTorch and bench/compare.py joins both. The first case, "copy", measures the
device-to-device copy bandwidth (a vec4 copy kernel) that the GB/s of memory-bound cases are
compared with.

Each case's inputs are replicated until the copies hold more than --rotate MiB (more than the
GPU's L2 cache), and one run computes the case once on every copy, so no run reads inputs that
the previous one left in the cache. Every dispatch of a run waits for the one before (as kernels
in one CUDA stream do), and a run's time, from the first dispatch's start to the last one's end
(GPU timestamps), is divided by the number of copies. The case's time is the median of --runs
runs after 1 s of warm-up runs (at least 3), which bring the GPU's clocks back up after the
idle time of building the case.

Cases named "... fast" run the same problem with --precision fast (f16 operands on cooperative
matrices, f32 accumulation); PyTorch's twin runs in f16. On a device without cooperative
matrices they run strict, and their JSON says "coop_dispatches": 0. Cases named "... f16" run
the GEMM, SmolLM and SmolVLA products on f16 tensors (operands and result stored in f16) with
--precision fast, as PyTorch's f16 twin does: the like-for-like comparison, with no rounding of
f32 operands. "gemm 4096^3 bf16" runs the GEMM on bf16 tensors with --precision bf16
(bfloat16 operands and result, on a device with bfloat16 cooperative matrices); PyTorch's twin
runs in bfloat16.

A case the device cannot run (the large cases need 256 MiB buffers, more than some devices bind)
is reported on stderr and marked in the table, the other cases still run, and the exit status is
then 1.

  --filter TEXT  only cases whose name contains TEXT (an error when none does)
  --runs N       timed runs per case (default 20)
  --rotate MIB   input bytes to rotate through (default 96; 0 = one copy of the inputs)
  --small        shrink the large cases and rotate 1 MiB (for CPU devices such as Lavapipe, and
                 devices whose buffers hold less than 256 MiB)
  --no-fast      leave out the "... fast", "... f16" and "... bf16" cases
  --profile      also time every dispatch (in separate runs) and print each kernel kind's share
                 of a case under its row ("kernel_ms" in the JSON)
  --device SEL   device index or part of its name
)";

// No more input copies than this, however small the case.
constexpr int64_t kMaxCopies = 128;

struct BenchCase {
  std::string name;
  std::vector<Shape> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> build;
  double flops = 0;  // GFLOP/s for compute-bound cases
  double bytes = 0;  // GB/s (bytes read plus written) for memory-bound cases
  Precision precision = Precision::strict;
  DType dtype = DType::f32;  // of the inputs, and so of the results
};

// The compute-bound cases that also run on cooperative matrices, as "<name> fast".
constexpr std::array<std::string_view, 7> kFastCasePrefixes = {
    "gemm 4096^3", "smollm", "resnet conv 3x3 64->64", "resnet conv 3x3/2", "whisper attention",
    "unet",        "smolvla"};
// The products that also run on f16 tensors in fast precision, as "<name> f16".
constexpr std::array<std::string_view, 4> kF16CasePrefixes = {"gemm 4096^3", "smollm",
                                                              "smolvla expert", "smolvla vision"};
// The products that also run on bf16 tensors in bf16 precision, as "<name> bf16".
constexpr std::array<std::string_view, 1> kBf16CasePrefixes = {"gemm 4096^3"};

Attrs conv_attrs(int64_t stride, int64_t padding) {
  return {{"stride", std::vector<int64_t>{stride, stride}},
          {"padding", std::vector<int64_t>{padding, padding}},
          {"dilation", std::vector<int64_t>{1, 1}},
          {"groups", int64_t{1}}};
}

// The shapes of issue 6: SmolLM2-135M at sequence 128, ResNet-50 at batch 4, the Whisper-tiny
// encoder's attention, an SD U-Net block, and two large problems for the ceilings.
std::vector<BenchCase> bench_cases(bool small) {
  const int64_t s = small ? 8 : 1;  // divides the large extents
  std::vector<BenchCase> cases;
  auto gemm = [&](const std::string& name, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    const double flops = 2.0 * static_cast<double>(m * n * k);
    cases.push_back({name,
                     {ta ? Shape{k, m} : Shape{m, k}, tb ? Shape{n, k} : Shape{k, n}},
                     [=](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                       return {matmul(x[0], x[1], ta, tb)};
                     },
                     flops,
                     0});
  };
  gemm("gemm 4096^3", 4096 / s, 4096 / s, 4096 / s, false, false);
  // y = x W^T with x [128, in] and W [out, in]; dX = dY W; dW = dY^T x. Names give M x N x K.
  auto linear = [&](const std::string& layer, int64_t in, int64_t out) {
    const int64_t tokens = 128;
    auto dims = [](int64_t m, int64_t n, int64_t k) {
      return " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    };
    gemm("smollm " + layer + dims(tokens, out, in), tokens, out, in, false, true);
    gemm("smollm " + layer + " dX" + dims(tokens, in, out), tokens, in, out, false, false);
    gemm("smollm " + layer + " dW" + dims(out, in, tokens), out, in, tokens, true, false);
  };
  linear("q_proj", 576, 576);
  linear("up", 576, 1536);
  linear("down", 1536, 576);
  linear("lm_head", 576, 49152 / s);

  const int64_t elements = (64ll << 20) / s / s;
  cases.push_back(
      {"pointwise add 64M",
       {{elements}, {elements}},
       [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {x[0] + x[1]}; },
       0,
       12.0 * elements});
  // Not a multiple of 4: the vectorised kernel's scalar tail.
  cases.push_back(
      {"pointwise add 64M+2",
       {{elements + 2}, {elements + 2}},
       [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {x[0] + x[1]}; },
       0,
       12.0 * (elements + 2)});
  cases.push_back({"pointwise gelu 64M",
                   {{elements}},
                   [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {gelu(x[0])}; },
                   0,
                   8.0 * elements});
  const int64_t rows = 16384 / s, width = 4096 / s;
  const double matrix_bytes = 4.0 * static_cast<double>(rows * width);
  cases.push_back(
      {"pointwise bias add 16384x4096",
       {{rows, width}, {width}},
       [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {x[0] + x[1]}; },
       0,
       2.0 * matrix_bytes + 4.0 * width});
  cases.push_back(
      {"row sum 16384x4096",
       {{rows, width}},
       [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {sum(x[0], {1})}; },
       0,
       matrix_bytes + 4.0 * rows});
  cases.push_back(
      {"softmax 16384x4096",
       {{rows, width}},
       [](const std::vector<Tensor>& x) -> std::vector<Tensor> { return {softmax(x[0], 1)}; },
       0,
       2.0 * matrix_bytes});

  // Forward, data gradient and weight gradient of one convolution at batch 4.
  auto conv = [&](const std::string& name, int64_t c, int64_t o, int64_t hw, int64_t kernel,
                  int64_t stride) {
    // --small keeps at least a 3 x 3 image (the 7 x 7 stage would vanish).
    const int64_t batch = 4, side = std::max<int64_t>(hw / s, 3), padding = kernel / 2,
                  out = (side + 2 * padding - kernel) / stride + 1;
    const Shape x{batch, c, side, side}, w{o, c, kernel, kernel}, dy{batch, o, out, out};
    const double flops = 2.0 * batch * o * out * out * c * kernel * kernel;
    const Attrs attrs = conv_attrs(stride, padding);
    cases.push_back({name,
                     {x, w},
                     [=](const std::vector<Tensor>& in) -> std::vector<Tensor> {
                       Conv2dOptions options;
                       options.stride = {stride, stride};
                       options.padding = {padding, padding};
                       return {conv2d(in[0], in[1], std::nullopt, options)};
                     },
                     flops,
                     0});
    // A gradient op of the convolution, whose attribute `shape_key` names the shape it restores.
    auto gradient = [&](const std::string& suffix, std::string_view op, const char* shape_key,
                        const Shape& restored, const Shape& first, const Shape& second) {
      cases.push_back(
          {name + suffix,
           {first, second},
           [=](const std::vector<Tensor>& in) -> std::vector<Tensor> {
             Attrs grad_attrs = attrs;
             grad_attrs.set(shape_key, restored);
             Graph& graph = in[0].graph();
             return {Tensor(&graph, graph.add(op, {in[0].id(), in[1].id()}, grad_attrs))};
           },
           flops,
           0});
    };
    gradient(" dX", op::conv2d_grad_input, "input_shape", x, dy, w);
    gradient(" dW", op::conv2d_grad_weight, "weight_shape", w, x, dy);
  };
  conv("resnet conv 7x7/2 3->64 224", 3, 64, 224, 7, 2);
  conv("resnet conv 3x3 64->64 56", 64, 64, 56, 3, 1);
  conv("resnet conv 1x1 256->64 56", 256, 64, 56, 1, 1);
  conv("resnet conv 1x1 512->128 28", 512, 128, 28, 1, 1);
  conv("resnet conv 3x3/2 128->128 56", 128, 128, 56, 3, 2);
  conv("resnet conv 3x3 128->128 28", 128, 128, 28, 3, 1);
  conv("resnet conv 3x3 256->256 14", 256, 256, 14, 3, 1);
  conv("resnet conv 3x3 512->512 7", 512, 512, 7, 3, 1);

  const int64_t heads = 6, tokens = 1500 / s, head_dim = 64;
  const Shape head_shape{1, heads, tokens, head_dim};
  const double attention_flops = 4.0 * heads * tokens * tokens * head_dim;
  cases.push_back({"whisper attention 1500x6x64",
                   {head_shape, head_shape, head_shape},
                   [](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                     return {scaled_dot_product_attention(x[0], x[1], x[2])};
                   },
                   attention_flops,
                   0});
  // What the backward pass adds to a saved forward (q, k, v, out and the log-sum-exp, which the
  // forward kernel writes when the forward is in the graph) and the incoming gradient: the three
  // gradients, as PyTorch's saved forward keeps its log-sum-exp. FLOPs by the usual
  // 2.5x-forward convention.
  cases.push_back({"whisper attention 1500x6x64 bwd",
                   {head_shape, head_shape, head_shape, head_shape, head_shape, {1, heads, tokens}},
                   [=](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                     Graph& graph = x[0].graph();
                     const Attrs attrs{{"causal", int64_t{0}},
                                       {"scale", 1.0 / std::sqrt(static_cast<double>(head_dim))},
                                       {"has_mask", int64_t{0}}};
                     const std::vector<ValueId> grad_inputs{x[0].id(), x[1].id(), x[2].id(),
                                                            x[3].id(), x[4].id(), x[5].id()};
                     std::vector<Tensor> grads;
                     for (std::string_view op :
                          {op::attention_grad_q, op::attention_grad_k, op::attention_grad_v})
                       grads.emplace_back(&graph, graph.add(op, grad_inputs, attrs));
                     return grads;
                   },
                   2.5 * attention_flops,
                   0});

  // One training step's attention: the forward and, from its output, the three gradients (the
  // backward's log-sum-exp written by the forward). FLOPs: forward + backward, 3.5x forward.
  cases.push_back({"whisper attention 1500x6x64 train",
                   {head_shape, head_shape, head_shape, head_shape},
                   [](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                     Graph& graph = x[0].graph();
                     const Tensor y = scaled_dot_product_attention(x[0], x[1], x[2]);
                     std::vector<Tensor> results{y};
                     for (const auto& [leaf, grad] :
                          gradients(graph, y.id(), {x[0].id(), x[1].id(), x[2].id()}, x[3].id()))
                       results.emplace_back(&graph, grad);
                     return results;
                   },
                   3.5 * attention_flops,
                   0});

  // SmolVLA's action expert at a chunk of 50 actions: y = x W^T, x [50, in] and W [out, in].
  auto expert = [&](const std::string& layer, int64_t in, int64_t out) {
    gemm("smolvla expert " + layer + " 50x" + std::to_string(out) + "x" + std::to_string(in), 50,
         out, in, false, true);
  };
  expert("q_proj", 720, 960);
  expert("k_proj", 720, 320);
  expert("o_proj", 960, 720);
  expert("up", 720, 2048);
  expert("down", 2048, 720);
  // SmolVLA's vision tower (SigLIP of SmolVLM2-500M) over one 512 x 512 image's 1,024 patches:
  // the attention projections and the MLP, y = x W^T.
  auto vision = [&](const std::string& layer, int64_t in, int64_t out) {
    const int64_t patches = 1024 / s;
    gemm("smolvla vision " + layer + " " + std::to_string(patches) + "x" + std::to_string(out) +
             "x" + std::to_string(in),
         patches, out, in, false, true);
  };
  vision("q_proj", 768, 768);
  vision("fc1", 768, 3072);
  vision("fc2", 3072, 768);
  // SmolVLA's flow-step attention: the action expert's 50 queries (15 heads over 5 key and value
  // heads) against the backbone's 113 prefix tokens (cross-attention) or those and the 50
  // actions (self-attention), under the additive mask that SmolVLA's blocks give; unmasked too,
  // which tells the mask's cost apart.
  auto flow_attention = [&](int64_t keys, bool masked) {
    const int64_t queries = 50, q_heads = 15, kv_heads = 5, width = 64;
    std::vector<Shape> shapes{
        {1, q_heads, queries, width}, {1, kv_heads, keys, width}, {1, kv_heads, keys, width}};
    if (masked) shapes.push_back({1, 1, queries, keys});
    cases.push_back(
        {"smolvla flow attention 50x" + std::to_string(keys) + " 15/5" + (masked ? " masked" : ""),
         shapes,
         [](const std::vector<Tensor>& x) -> std::vector<Tensor> {
           AttentionOptions options;
           if (x.size() > 3) options.mask = x[3];
           return {scaled_dot_product_attention(x[0], x[1], x[2], options)};
         },
         4.0 * static_cast<double>(q_heads * queries * keys * width), 0});
  };
  flow_attention(113, true);
  flow_attention(163, true);
  flow_attention(163, false);

  // A ResNet block of the SD U-Net: group norm (32 groups), SiLU, 3x3 convolution with bias, at
  // the workload's latent size (32x32) and at SD 1.5's 512-pixel latent (64x64).
  auto unet = [&](int64_t side) {
    const int64_t batch = 2, channels = 320, extent = side / s;
    const std::string size = std::to_string(side);
    const double flops =
        2.0 * static_cast<double>(batch * channels * extent * extent * channels * 9);
    cases.push_back({"unet groupnorm+silu+conv3x3 2x320x" + size + "x" + size,
                     {{batch, channels, extent, extent},
                      {channels},
                      {channels},
                      {channels, channels, 3, 3},
                      {channels}},
                     [](const std::vector<Tensor>& x) -> std::vector<Tensor> {
                       Conv2dOptions options;
                       options.padding = {1, 1};
                       return {conv2d(silu(group_norm(x[0], 32, x[1], x[2])), x[3], x[4], options)};
                     },
                     flops,
                     0});
    // The block's convolution weight gradient, the largest product of its backward pass.
    const Shape plane{batch, channels, extent, extent};
    cases.push_back({"unet conv3x3 dW 2x320x" + size + "x" + size,
                     {plane, plane},
                     [=](const std::vector<Tensor>& in) -> std::vector<Tensor> {
                       Attrs attrs = conv_attrs(1, 1);
                       attrs.set("weight_shape", Shape{channels, channels, 3, 3});
                       Graph& graph = in[0].graph();
                       return {Tensor(&graph, graph.add(op::conv2d_grad_weight,
                                                        {in[0].id(), in[1].id()}, attrs))};
                     },
                     flops,
                     0});
  };
  unet(32);
  unet(64);

  const size_t strict_cases = cases.size();
  const auto add_twins = [&](const auto& prefixes, const std::string& suffix, DType dtype,
                             Precision precision) {
    for (size_t i = 0; i < strict_cases; ++i) {
      const bool twin = std::any_of(prefixes.begin(), prefixes.end(), [&](std::string_view prefix) {
        return cases[i].name.starts_with(prefix);
      });
      if (!twin) continue;
      BenchCase fast = cases[i];
      fast.name += suffix;
      fast.precision = precision;
      fast.dtype = dtype;
      cases.push_back(std::move(fast));
    }
  };
  add_twins(kFastCasePrefixes, " fast", DType::f32, Precision::fast);
  add_twins(kF16CasePrefixes, " f16", DType::f16, Precision::fast);
  add_twins(kBf16CasePrefixes, " bf16", DType::bf16, Precision::bf16);
  return cases;
}

// Device-to-device copy bandwidth (bytes read plus written per second): a compute kernel that
// copies a buffer larger than the L2 cache with vec4 loads and stores, as PyTorch's copy_ is a
// kernel too, timed by GPU timestamps. (vkCmdCopyBuffer on NVIDIA's compute queue ran at a
// fifth of that speed, so it is not the ceiling the kernels are held to.)
double copy_gigabytes_per_second(const std::string& device_selector, uint64_t bytes, int64_t runs) {
  constexpr uint32_t kLocalSize = 256;
  std::unique_ptr<gpu::Device> device = gpu::Device::open(device_selector);
  const gpu::BufferId source = device->create_buffer(bytes, gpu::BufferUse::device, "copy source");
  const gpu::BufferId target = device->create_buffer(bytes, gpu::BufferUse::device, "copy target");
  const uint64_t vectors = bytes / 16;
  gpu::KernelSpec spec;
  spec.label = "copy";
  spec.binding_count = 2;
  spec.defines = {{"COUNT", std::to_string(vectors) + "u"}};
  spec.source =
      "layout(local_size_x = 256) in;\n"
      "layout(std430, binding = 0) readonly buffer Source { vec4 source[]; };\n"
      "layout(std430, binding = 1) writeonly buffer Target { vec4 target[]; };\n"
      "void main() {\n"
      "  uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u +\n"
      "           gl_LocalInvocationID.x;\n"
      "  if (i < COUNT) target[i] = source[i];\n"
      "}\n";
  const gpu::PipelineId pipeline = device->create_pipelines(std::span(&spec, 1)).at(0);
  const uint64_t groups = (vectors + kLocalSize - 1) / kLocalSize;
  const uint32_t columns = static_cast<uint32_t>(std::min<uint64_t>(groups, 32768));
  gpu::Command copy{gpu::Command::Kind::dispatch};
  copy.dispatch.pipeline = pipeline;
  copy.dispatch.bindings = {{source, 0, bytes}, {target, 0, bytes}};
  copy.dispatch.groups = {columns, static_cast<uint32_t>((groups + columns - 1) / columns), 1};
  copy.dispatch.label = "copy";
  const gpu::RecordingId recording = device->record(std::span(&copy, 1), gpu::Timing::whole);
  warm_up([&] { device->submit(recording); });
  std::vector<double> durations;
  for (int64_t run = 0; run < runs; ++run) {
    device->submit(recording);
    durations.push_back(device->timings(recording).at(0).duration_ms);
  }
  return 2.0 * static_cast<double>(bytes) / median(durations) / 1e6;
}

int64_t rotation_copies(const BenchCase& bench, double rotate_bytes) {
  double input_bytes = 0;
  for (const Shape& shape : bench.inputs) input_bytes += 4.0 * element_count(shape);
  const auto copies = static_cast<int64_t>(std::ceil(rotate_bytes / input_bytes));
  return std::clamp<int64_t>(copies, 1, kMaxCopies);
}

struct Measurement {
  double ms = 0;
  int64_t copies = 1;
  size_t dispatches = 0;       // per copy
  size_t coop_dispatches = 0;  // per copy, on cooperative matrices
  // With --profile: per kernel kind (a dispatch label up to its first " %"), the median over
  // runs of its summed GPU time per copy.
  std::map<std::string, double> kernel_ms;
};

std::string kernel_kind(const std::string& label) {
  return label.substr(0, label.find(" %"));
}

// Per-dispatch timestamps serialise a run's dispatches and add their own cost, so the profile
// comes from its own session and runs, apart from the case's timing.
std::map<std::string, double> profile_kernels(const Graph& graph, SessionOptions options,
                                              int64_t runs, int64_t copies) {
  options.time_runs = false;
  options.profile = true;
  Session session(graph, options);
  warm_up([&] { session.run(); });
  std::map<std::string, std::vector<double>> samples;
  for (int64_t run = 0; run < runs; ++run) {
    session.run();
    std::map<std::string, double> sums;
    for (const DispatchProfile& dispatch : session.profile())
      sums[kernel_kind(dispatch.label)] += dispatch.duration_ms / static_cast<double>(copies);
    for (const auto& [kind, ms] : sums) samples[kind].push_back(ms);
  }
  std::map<std::string, double> medians;
  for (auto& [kind, values] : samples) medians[kind] = median(values);
  return medians;
}

Measurement measure(const BenchCase& bench, const std::string& device, int64_t runs,
                    double rotate_bytes, bool profile) {
  Measurement result;
  result.copies = rotation_copies(bench, rotate_bytes);
  Graph graph;
  for (int64_t copy = 0; copy < result.copies; ++copy) {
    const std::string suffix = "_" + std::to_string(copy);
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < bench.inputs.size(); ++i) {
      // Parameters live on the device from the start, so runs copy no inputs in.
      inputs.push_back(parameter(graph, "x" + std::to_string(i) + suffix, bench.inputs[i],
                                 Init::uniform(-1.0, 1.0), bench.dtype));
    }
    const std::vector<Tensor> results = bench.build(inputs);
    for (size_t j = 0; j < results.size(); ++j)
      graph.set_output("y" + std::to_string(j) + suffix, results[j].id());
  }
  SessionOptions options;
  options.device = device;
  options.time_runs = true;
  options.precision = bench.precision;
  // The inputs are parameters only so that runs copy nothing in: every kernel of the case runs
  // in every timed run.
  options.setup = false;
  Session session(graph, options);
  warm_up([&] { session.run(); });
  std::vector<double> durations;
  for (int64_t run = 0; run < runs; ++run) {
    session.run();
    durations.push_back(session.last_run_gpu_ms() / static_cast<double>(result.copies));
  }
  result.ms = median(durations);
  result.dispatches = session.report().dispatches / static_cast<size_t>(result.copies);
  result.coop_dispatches =
      session.report().coop_matrix_dispatches / static_cast<size_t>(result.copies);
  if (profile) result.kernel_ms = profile_kernels(graph, options, runs, result.copies);
  return result;
}

}  // namespace

int bench_command(const std::vector<std::string>& words) {
  if (!words.empty() && words[0] == "workloads")
    return bench_workloads(std::vector<std::string>(words.begin() + 1, words.end()));
  const Arguments arguments("meganeura bench", words, {"filter", "runs", "rotate", "device"},
                            {"small", "no-fast", "profile", "help"});
  if (arguments.has("help") || arguments.positional().empty()) {
    std::fputs(kHelp, stdout);
    return arguments.has("help") ? 0 : 2;
  }
  if (arguments.positional()[0] != "kernels") {
    throw Error("unknown benchmark '" + arguments.positional()[0] +
                "' (try: meganeura bench kernels, or meganeura bench workloads)");
  }
  const bool small = arguments.has("small");
  const int64_t runs = arguments.integer("runs", 20);
  if (runs < 1) throw Error("--runs must be at least 1 (timed runs per case)");
  const int64_t rotate_mib = arguments.integer("rotate", small ? 1 : 96);
  if (rotate_mib < 0) throw Error("--rotate must be 0 or more MiB (0: one copy of the inputs)");
  const double rotate_bytes = static_cast<double>(rotate_mib) * 1048576.0;
  const std::string filter = arguments.text("filter", "");
  const std::string device = arguments.text("device", "");
  std::vector<std::string> table;
  double copy_rate = 0;
  char row[200];

  // A case the device cannot run (a buffer past its limits, say) is reported, and the others
  // still run; the exit status then says that some failed.
  size_t failures = 0;
  const auto report_failure = [&](const std::string& name, const Error& error) {
    std::fprintf(stderr, "meganeura bench: case '%s' failed: %s\n", name.c_str(), error.what());
    std::snprintf(row, sizeof(row), "%-44s failed (see above)", name.c_str());
    table.push_back(row);
    ++failures;
  };

  const uint64_t copy_bytes = (small ? 16ull : 256ull) << 20;
  const std::string copy_name = "copy " + std::to_string(copy_bytes >> 20) + "MiB";
  const std::vector<BenchCase> cases = bench_cases(small);
  const auto selected = [&](const BenchCase& bench) {
    return bench.name.find(filter) != std::string::npos &&
           !(bench.precision != Precision::strict && arguments.has("no-fast"));
  };
  if (copy_name.find(filter) == std::string::npos &&
      std::none_of(cases.begin(), cases.end(), selected)) {
    // The families, each case name's first word, in the order the cases run.
    std::vector<std::string> families{"copy"};
    for (const BenchCase& bench : cases) {
      const std::string family = bench.name.substr(0, bench.name.find(' '));
      if (std::find(families.begin(), families.end(), family) == families.end())
        families.push_back(family);
    }
    std::string listed;
    for (const std::string& family : families) listed += (listed.empty() ? "" : ", ") + family;
    throw Error("no case matches --filter '" + filter + "'" +
                (arguments.has("no-fast") ? " without the fast cases" : "") +
                "; case names start with " + listed + " (run without --filter to see every case)");
  }
  if (copy_name.find(filter) != std::string::npos) {
    try {
      copy_rate = copy_gigabytes_per_second(device, copy_bytes, runs);
      const double ms = 2.0 * static_cast<double>(copy_bytes) / copy_rate / 1e6;
      const nlohmann::json record = {
          {"framework", "meganeura"}, {"case", copy_name}, {"ms", ms}, {"gbps", copy_rate}};
      std::printf("%s\n", record.dump().c_str());
      std::fflush(stdout);
      std::snprintf(row, sizeof(row), "%-44s %10.4f ms %10.1f GB/s", copy_name.c_str(), ms,
                    copy_rate);
      table.push_back(row);
    } catch (const Error& error) {
      report_failure(copy_name, error);
    }
  }

  for (const BenchCase& bench : cases) {
    if (!selected(bench)) continue;
    Measurement measured;
    try {
      measured = measure(bench, device, runs, rotate_bytes, arguments.has("profile"));
    } catch (const Error& error) {
      report_failure(bench.name, error);
      continue;
    }
    const double ms = measured.ms;
    nlohmann::json record = {{"framework", "meganeura"},
                             {"case", bench.name},
                             {"ms", ms},
                             {"copies", measured.copies},
                             {"dispatches", measured.dispatches},
                             {"precision", std::string(precision_name(bench.precision))},
                             {"dtype", std::string(dtype_name(bench.dtype))}};
    if (bench.precision != Precision::strict) record["coop_dispatches"] = measured.coop_dispatches;
    if (!measured.kernel_ms.empty()) record["kernel_ms"] = measured.kernel_ms;
    if (bench.flops > 0) {
      record["gflops"] = bench.flops / ms / 1e6;
      std::snprintf(row, sizeof(row), "%-44s %10.4f ms %10.1f GFLOP/s", bench.name.c_str(), ms,
                    bench.flops / ms / 1e6);
    } else {
      const double rate = bench.bytes / ms / 1e6;
      record["gbps"] = rate;
      const int length = std::snprintf(row, sizeof(row), "%-44s %10.4f ms %10.1f GB/s",
                                       bench.name.c_str(), ms, rate);
      if (copy_rate > 0) {
        std::snprintf(row + length, sizeof(row) - static_cast<size_t>(length), " (%.0f %% of copy)",
                      100.0 * rate / copy_rate);
      }
    }
    std::printf("%s\n", record.dump().c_str());
    std::fflush(stdout);
    table.push_back(row);
    for (const auto& [kind, kind_ms] : measured.kernel_ms) {
      std::snprintf(row, sizeof(row), "    %-40s %10.4f ms", kind.c_str(), kind_ms);
      table.push_back(row);
    }
  }
  for (const std::string& line : table) std::printf("%s\n", line.c_str());
  if (failures == 0) return 0;
  std::fprintf(stderr, "meganeura bench: %zu case(s) failed%s\n", failures,
               small ? ""
                     : "; on a device whose buffers hold less than 256 MiB, --small shrinks "
                       "the large cases");
  return 1;
}

}  // namespace mg::cli
