// Normalisation kernels: layer_norm, rms_norm, group_norm, batch_norm and their x-gradients.
// Every element belongs to one statistics group (see src/ops/norm.cpp); one workgroup owns one
// group, so its statistics come from deterministic shared-memory trees and no atomics. The
// group's elements are re-read from global memory on each pass rather than cached, because
// batch_norm groups (N * H * W elements) do not fit in shared memory.
#include <algorithm>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

enum class Kind { layer, rms, group, batch };

// Two passes (mean, then squared deviations) as the reference does: one-pass E[x^2] - E[x]^2
// loses the 1e-5 budget on rows with a large mean. A thread walks STEPS steps of its group,
// each a VALUE: one element, or with VEC4 four consecutive elements of one channel (or of
// consecutive channels for layer_norm and rms_norm), read and written as one vec4.
constexpr std::string_view kNormKernel = R"glsl(
layout(local_size_x = LOCAL) in;
shared float partial_a[LOCAL];
shared float partial_b[LOCAL];

#if VEC4
#define VALUE vec4
#define STEPS (COUNT / 4u)
float total_of(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
#else
#define VALUE float
#define STEPS COUNT
float total_of(float v) { return v; }
#endif

// Sums a and b over the workgroup; every invocation gets both totals.
void reduce_pair(inout float a, inout float b) {
  uint lane = gl_LocalInvocationID.x;
  partial_a[lane] = a;
  partial_b[lane] = b;
  barrier();
  for (uint width = LOCAL / 2u; width > 0u; width >>= 1) {
    if (lane < width) {
      partial_a[lane] += partial_a[lane + width];
      partial_b[lane] += partial_b[lane + width];
    }
    barrier();
  }
  a = partial_a[0];
  b = partial_b[0];
  barrier();
}

void main() {
  uint g = linear_workgroup();
  uint lane = gl_LocalInvocationID.x;
  float mean = 0.0;
  float rstd;
#if RUNNING
  mean = running_mean[g];
  rstd = 1.0 / sqrt(running_var[g] + EPS);
#else
#if CENTRED
  VALUE sums = VALUE(0.0);
  for (uint s = lane; s < STEPS; s += LOCAL) sums += load_x(g, s);
  float total = total_of(sums), unused = 0.0;
  reduce_pair(total, unused);
  mean = total / float(COUNT);
#endif
  VALUE square_sums = VALUE(0.0);
  for (uint s = lane; s < STEPS; s += LOCAL) {
    VALUE d = load_x(g, s) - mean;
    square_sums += d * d;
  }
  float squares = total_of(square_sums), unused2 = 0.0;
  reduce_pair(squares, unused2);
  rstd = 1.0 / sqrt(squares / float(COUNT) + EPS);
#endif

#if FORWARD
  for (uint s = lane; s < STEPS; s += LOCAL) {
    VALUE value = (load_x(g, s) - mean) * rstd;
#if HAS_WEIGHT
    value *= load_weight(g, s);
#endif
#if HAS_BIAS
    value += load_bias(g, s);
#endif
    store_out(g, s, value);
  }
#else
  // dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat)), gw = grad_out * weight.
  float grad_sum = 0.0, grad_dot = 0.0;
#if !RUNNING
  VALUE grad_sums = VALUE(0.0), grad_dots = VALUE(0.0);
  for (uint s = lane; s < STEPS; s += LOCAL) {
    VALUE gw = load_grad_out(g, s);
#if HAS_WEIGHT
    gw *= load_weight(g, s);
#endif
    grad_sums += gw;
    grad_dots += gw * ((load_x(g, s) - mean) * rstd);
  }
  grad_sum = total_of(grad_sums);
  grad_dot = total_of(grad_dots);
  reduce_pair(grad_sum, grad_dot);
#endif
  for (uint s = lane; s < STEPS; s += LOCAL) {
    VALUE value = load_grad_out(g, s);
#if HAS_WEIGHT
    value *= load_weight(g, s);
#endif
#if !RUNNING
#if CENTRED
    value -= grad_sum / float(COUNT);
#endif
    value -= (load_x(g, s) - mean) * rstd * (grad_dot / float(COUNT));
#endif
    store_out(g, s, value * rstd);
  }
#endif
}
)glsl";

// Where the elements of statistics group g live: flat index and channel of its e-th element.
struct GroupMap {
  int64_t groups = 0;
  int64_t count = 0;  // elements per group
  // Four consecutive elements of a group are adjacent in memory from every multiple of 4, and
  // of one channel unless the channel is the element itself (layer_norm, rms_norm).
  bool vec4 = false;
  bool channel_per_element = false;
  std::string functions;
};

GroupMap group_map(Kind kind, const Shape& x, int64_t norm_groups) {
  const int64_t elements = element_count(x);
  GroupMap map;
  std::string index, channel;
  if (kind == Kind::layer || kind == Kind::rms) {
    const int64_t length = x.back();
    map.groups = elements / length;
    map.count = length;
    map.vec4 = length % 4 == 0;
    map.channel_per_element = true;
    index = "g * " + glsl_uint(length) + " + e";
    channel = "e";
  } else {
    const int64_t channels = x[1];
    const int64_t inner = elements / (x[0] * channels);
    map.vec4 = inner % 4 == 0;
    if (kind == Kind::group) {
      // A (sample, channel group) pair is one contiguous run of channels_per_group * inner.
      const int64_t per_group = channels / norm_groups;
      map.groups = x[0] * norm_groups;
      map.count = per_group * inner;
      index = "g * " + glsl_uint(map.count) + " + e";
      channel = "(g % " + glsl_uint(norm_groups) + ") * " + glsl_uint(per_group) + " + e / " +
                glsl_uint(inner);
    } else {
      map.groups = channels;
      map.count = x[0] * inner;
      index = "(e / " + glsl_uint(inner) + ") * " + glsl_uint(channels * inner) + " + g * " +
              glsl_uint(inner) + " + e % " + glsl_uint(inner);
      channel = "g";
    }
  }
  map.functions = "uint element_index(uint g, uint e) { return " + index + "; }\n" +
                  "uint channel_of(uint g, uint e) { return " + channel + "; }\n";
  return map;
}

// load_<name>(g, s) for an operand read per element, or per channel (weight, bias), and
// store_out(g, s, value), over steps of one element or, with vec4, of four.
std::string access_functions(const GroupMap& map, const std::vector<Operand>& operands) {
  std::string text;
  const std::string value = map.vec4 ? "vec4" : "float";
  const std::string element = map.vec4 ? "4u * s" : "s";
  for (size_t binding = 0; binding < operands.size(); ++binding) {
    const std::string& name = operands[binding].name;
    if (name == "running_mean" || name == "running_var") continue;
    const bool per_channel = name == "weight" || name == "bias";
    const bool view = map.vec4 && (!per_channel || map.channel_per_element);
    if (view) text += vector_buffer_view(name + "_x4", binding, operands[binding].write);
    const std::string at =
        per_channel ? "channel_of(g, " + element + ")" : "element_index(g, " + element + ")";
    const std::string array = view ? name + "_x4" : name;
    const std::string index = view ? at + " / 4u" : at;
    if (operands[binding].write) {
      text += "void store_out(uint g, uint s, " + value + " value) { " + array + "[" + index +
              "] = value; }\n";
    } else {
      text += value + " load_" + name + "(uint g, uint s) { return " + value + "(" + array + "[" +
              index + "]); }\n";
    }
  }
  return text;
}

// Threads of the workgroup that owns one group. With fewer groups than twice the compute units
// a workgroup's threads are all that pull its group through a compute unit, so it takes up to
// 1024 of them, about 16 elements each (U-Net's group_norm, 64 groups of 40960, was slow on 256
// threads of scalar loads). Many groups keep at
// most 256, and so do CPU devices running their own kernels (each workgroup one CPU thread).
uint32_t local_size_for(int64_t count, int64_t groups, const DeviceTraits& device) {
  constexpr int64_t kElementsPerThread = 16;
  const bool few_groups = !use_cpu_kernels(device) && groups < 2 * device.compute_units;
  const uint32_t most =
      std::min<uint32_t>(few_groups ? 1024 : 256, device.max_workgroup_invocations);
  const int64_t per_thread = few_groups ? kElementsPerThread : 1;
  // A power of two (the reduction tree halves it) within the device's limit, which need not be
  // one (384 invocations on some mobile GPUs) and may be below 256 (Vulkan guarantees 128).
  uint32_t size = 32;
  while (size * 2 <= most && size * per_thread < count) size *= 2;
  return size;
}

void lower_norm(LoweringContext& context, Kind kind, bool backward) {
  const Node& node = context.node();
  const Shape& x_shape = context.input_type(0).shape;
  const bool has_weight = node.attrs.get_int("has_weight", 0) != 0;
  const bool has_bias = !backward && kind != Kind::rms && node.attrs.get_int("has_bias", 0) != 0;
  const bool running = kind == Kind::batch && node.attrs.get_int("training", 1) == 0;
  const GroupMap map = group_map(kind, x_shape, node.attrs.get_int("groups", 1));
  const uint32_t local = local_size_for(map.count, map.groups, context.device());

  Launch launch;
  launch.label = context.label();
  launch.kernel = "norm";
  launch.defines = {{"LOCAL", glsl_uint(local)},
                    {"COUNT", glsl_uint(map.count)},
                    {"EPS", glsl_float(node.attrs.get_float("eps"))},
                    {"FORWARD", backward ? "0" : "1"},
                    {"CENTRED", kind == Kind::rms ? "0" : "1"},
                    {"RUNNING", running ? "1" : "0"},
                    {"HAS_WEIGHT", has_weight ? "1" : "0"},
                    {"HAS_BIAS", has_bias ? "1" : "0"},
                    {"VEC4", map.vec4 ? "1" : "0"}};
  // Input order (src/ops/norm.cpp): x, weight?, bias? (forward only), running_mean?,
  // running_var?, grad_out (backward only).
  size_t next = 0;
  launch.operands.push_back({"x", node.inputs[next++], false});
  if (has_weight) launch.operands.push_back({"weight", node.inputs[next++], false});
  if (has_bias) launch.operands.push_back({"bias", node.inputs[next++], false});
  if (running) {
    launch.operands.push_back({"running_mean", node.inputs[next++], false});
    launch.operands.push_back({"running_var", node.inputs[next++], false});
  }
  if (backward) launch.operands.push_back({"grad_out", node.inputs[next++], false});
  launch.operands.push_back({"out_", context.id(), true});
  launch.body = map.functions + access_functions(map, launch.operands) + std::string(kNormKernel);
  launch.groups = grid_for(static_cast<uint64_t>(map.groups), 1, context.device());
  context.emit(std::move(launch));
}

template <Kind kind, bool backward>
void lower(LoweringContext& context) {
  lower_norm(context, kind, backward);
}

}  // namespace

std::vector<LoweringEntry> norm_lowerings() {
  return {
      {op::layer_norm, lower<Kind::layer, false>}, {op::layer_norm_grad, lower<Kind::layer, true>},
      {op::rms_norm, lower<Kind::rms, false>},     {op::rms_norm_grad, lower<Kind::rms, true>},
      {op::group_norm, lower<Kind::group, false>}, {op::group_norm_grad, lower<Kind::group, true>},
      {op::batch_norm, lower<Kind::batch, false>}, {op::batch_norm_grad, lower<Kind::batch, true>}};
}

}  // namespace mg::kernels
