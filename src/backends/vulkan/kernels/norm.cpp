// Normalisation kernels: layer_norm, rms_norm, group_norm, batch_norm and their x-gradients.
// Every element belongs to one statistics group (see src/ops/norm.cpp); one workgroup owns one
// group, so its statistics come from deterministic shared-memory trees and no atomics. The
// group's elements are re-read from global memory on each pass rather than cached, because
// batch_norm groups (N * H * W elements) do not fit in shared memory; only a fused prologue's
// values stay in registers, where a thread walks few steps (CACHED_STEPS below).
#include "backends/vulkan/kernels/norm.hpp"

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
// consecutive channels for layer_norm and rms_norm), read and written as one vec4. With
// CACHED_STEPS (the most steps a thread walks, where a fused prologue computes x or grad_out:
// CACHE_X, CACHE_GRAD_OUT) the loops have that constant trip count, so that the compiler unrolls
// them, and the thread evaluates the prologue once a step, keeping its values in registers for
// the later passes.
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

#if CACHED_STEPS > 0
#define FOR_STEPS                                    \
  for (uint k = 0u; k < uint(CACHED_STEPS); ++k) {   \
    uint s = lane + k * LOCAL;                       \
    if (s >= STEPS) break;
#else
#define FOR_STEPS for (uint s = lane, k = 0u; s < STEPS; s += LOCAL, ++k) {
#endif
#if CACHE_X
#define X_AT(g, s, k) x_cache[k]
#else
#define X_AT(g, s, k) load_x(g, s)
#endif
#if CACHE_GRAD_OUT
#define GRAD_OUT_AT(g, s, k) grad_out_cache[k]
#else
#define GRAD_OUT_AT(g, s, k) load_grad_out(g, s)
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
  // A grid of more than one row of workgroups (grid_for) ends past the last group.
  if (g >= GROUPS) return;
  uint lane = gl_LocalInvocationID.x;
#if CACHE_X
  VALUE x_cache[CACHED_STEPS];
  FOR_STEPS x_cache[k] = load_x(g, s); }
#endif
#if CACHE_GRAD_OUT
  VALUE grad_out_cache[CACHED_STEPS];
  FOR_STEPS grad_out_cache[k] = load_grad_out(g, s); }
#endif
  float mean = 0.0;
  float rstd;
#if RUNNING
  mean = running_mean[g];
  rstd = 1.0 / sqrt(running_var[g] + EPS);
#else
#if CENTRED
  VALUE sums = VALUE(0.0);
  FOR_STEPS sums += X_AT(g, s, k); }
  float total = total_of(sums), unused = 0.0;
  reduce_pair(total, unused);
  mean = total / float(COUNT);
#endif
  VALUE square_sums = VALUE(0.0);
  FOR_STEPS
    VALUE d = X_AT(g, s, k) - mean;
    square_sums += d * d;
  }
  float squares = total_of(square_sums), unused2 = 0.0;
  reduce_pair(squares, unused2);
  rstd = 1.0 / sqrt(squares / float(COUNT) + EPS);
#endif

#if FORWARD
  FOR_STEPS
    VALUE x_value = X_AT(g, s, k);
#if STORE_X
    store_x(g, s, x_value);
#endif
    VALUE value = (x_value - mean) * rstd;
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
  FOR_STEPS
    VALUE gw = GRAD_OUT_AT(g, s, k);
#if HAS_WEIGHT
    gw *= load_weight(g, s);
#endif
    grad_sums += gw;
    grad_dots += gw * ((X_AT(g, s, k) - mean) * rstd);
  }
  grad_sum = total_of(grad_sums);
  grad_dot = total_of(grad_dots);
  reduce_pair(grad_sum, grad_dot);
#endif
  FOR_STEPS
    VALUE value = GRAD_OUT_AT(g, s, k);
#if STORE_GRAD_OUT
    store_grad_out(g, s, value);
#endif
#if HAS_WEIGHT
    value *= load_weight(g, s);
#endif
#if !RUNNING
#if CENTRED
    value -= grad_sum / float(COUNT);
#endif
    value -= (X_AT(g, s, k) - mean) * rstd * (grad_dot / float(COUNT));
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
// store_<name>(g, s, value) for one written (out_ as store_out), over steps of one element or, with
// vec4, of four; operand k is binding k.
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
      // The result is out_, as out is a GLSL keyword.
      const std::string stem = name.back() == '_' ? name.substr(0, name.size() - 1) : name;
      text += "void store_" + stem + "(uint g, uint s, " + value + " value) { " + array + "[" +
              index + "] = value; }\n";
    } else {
      text += value + " load_" + name + "(uint g, uint s) { return " + value + "(" + array + "[" +
              index + "]); }\n";
    }
  }
  return text;
}

// `function`(g, s) as the value of `element`(i) at the step's element or four elements.
std::string element_step_function(const GroupMap& map, const std::string& function,
                                  const std::string& element) {
  if (!map.vec4)
    return "float " + function + "(uint g, uint s) { return " + element +
           "(element_index(g, s)); }\n";
  return "vec4 " + function +
         "(uint g, uint s) {\n  uint i = element_index(g, 4u * s);\n  return vec4(" + element +
         "(i), " + element + "(i + 1u), " + element + "(i + 2u), " + element + "(i + 3u));\n}\n";
}

// store_out(g, s, value) through `store`(i, value), one element at a time.
std::string epilogue_step_function(const GroupMap& map, const std::string& store) {
  if (!map.vec4)
    return "void store_out(uint g, uint s, float value) { " + store +
           "(element_index(g, s), value); }\n";
  return "void store_out(uint g, uint s, vec4 value) {\n  uint i = element_index(g, 4u * s);\n  " +
         store + "(i, value.x);\n  " + store + "(i + 1u, value.y);\n  " + store +
         "(i + 2u, value.z);\n  " + store + "(i + 3u, value.w);\n}\n";
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

// Threads of a workgroup whose prologue DAG reads `dag`'s inputs: one that sums split-K partial
// results (a residual add after a product split over K) loads every element once a partial, so
// the loads, not the elements, are the work its threads share, up to one thread a unit of the
// group (an element, or a vec4), which then loads its partials with no other unit to walk.
uint32_t local_size_for_prologue(const Graph& graph, const PointwiseDag& dag, const GroupMap& map,
                                 const DeviceTraits& device) {
  const int64_t elements = std::max<int64_t>(1, graph.type(dag.output).elements());
  int64_t loads_per_element = 0;
  for (ValueId input : dag.inputs)
    loads_per_element += std::max<int64_t>(1, graph.type(input).elements() / elements);
  const uint32_t by_elements = local_size_for(map.count, map.groups, device);
  if (loads_per_element <= static_cast<int64_t>(dag.inputs.size())) return by_elements;
  const int64_t units = map.vec4 ? map.count / 4 : map.count;
  uint32_t size = local_size_for(map.count * loads_per_element, map.groups, device);
  while (size / 2 >= by_elements && static_cast<int64_t>(size / 2) >= units) size /= 2;
  return size;
}

void lower_norm(LoweringContext& context, Kind kind, bool backward,
                const NormFusion* fusion = nullptr) {
  const Node& node = context.node();
  const Shape& x_shape = context.input_type(0).shape;
  const bool has_weight = node.attrs.get_int("has_weight", 0) != 0;
  const bool has_bias = !backward && kind != Kind::rms && node.attrs.get_int("has_bias", 0) != 0;
  const bool running = kind == Kind::batch && node.attrs.get_int("training", 1) == 0;
  const GroupMap map = group_map(kind, x_shape, node.attrs.get_int("groups", 1));
  const bool prologue = fusion && fusion->prologue, epilogue = fusion && fusion->epilogue;
  const uint32_t local =
      prologue ? local_size_for_prologue(context.graph(), *fusion->prologue, map, context.device())
               : local_size_for(map.count, map.groups, context.device());
  const std::string prologue_name = backward ? "grad_out" : "x";
  // A prologue's values stay in registers between the passes where a thread walks few steps.
  constexpr int64_t kMostCachedSteps = 8;
  const int64_t steps_a_thread = ((map.vec4 ? map.count / 4 : map.count) + local - 1) / local;
  const bool cached = prologue && steps_a_thread <= kMostCachedSteps;

  Launch launch;
  launch.label = context.label();
  launch.kernel = "norm";
  launch.defines = {
      {"LOCAL", glsl_uint(local)},
      {"COUNT", glsl_uint(map.count)},
      {"GROUPS", glsl_uint(map.groups)},
      {"EPS", glsl_float(node.attrs.get_float("eps"))},
      {"FORWARD", backward ? "0" : "1"},
      {"CENTRED", kind == Kind::rms ? "0" : "1"},
      {"RUNNING", running ? "1" : "0"},
      {"HAS_WEIGHT", has_weight ? "1" : "0"},
      {"HAS_BIAS", has_bias ? "1" : "0"},
      {"VEC4", map.vec4 ? "1" : "0"},
      {"STORE_X", prologue && !backward && fusion->prologue_written ? "1" : "0"},
      {"STORE_GRAD_OUT", prologue && backward && fusion->prologue_written ? "1" : "0"},
      {"CACHE_X", cached && !backward ? "1" : "0"},
      {"CACHE_GRAD_OUT", cached && backward ? "1" : "0"},
      {"CACHED_STEPS", std::to_string(cached ? steps_a_thread : 0)}};
  // Input order (src/ops/norm.cpp): x, weight?, bias? (forward only), running_mean?,
  // running_var?, grad_out (backward only). An input that the prologue computes is not read;
  // with an epilogue the result is not written. The fused DAGs' operands follow the norm's own.
  size_t next = 0;
  const auto read = [&](const std::string& name) {
    const ValueId value = node.inputs[next++];
    if (!(prologue && name == prologue_name)) launch.operands.push_back({name, value, false});
  };
  read("x");
  if (has_weight) read("weight");
  if (has_bias) read("bias");
  if (running) {
    read("running_mean");
    read("running_var");
  }
  if (backward) read("grad_out");
  if (prologue && fusion->prologue_written)
    launch.operands.push_back({prologue_name, fusion->prologue->output, true});
  if (!epilogue) launch.operands.push_back({"out_", context.id(), true});
  std::string functions = map.functions + access_functions(map, launch.operands);
  if (prologue || epilogue) functions += std::string(pointwise_functions_glsl());
  if (prologue) {
    functions +=
        pointwise_element_function_glsl(context.graph(), *fusion->prologue, "prologue_element",
                                        launch.operands, {}, "prologue_") +
        element_step_function(map, "load_" + prologue_name, "prologue_element");
    launch.label += " of fused " + std::to_string(fusion->prologue->statements.size()) +
                    " ops -> " + context.graph().node(fusion->prologue->output).op + " %" +
                    std::to_string(fusion->prologue->output);
  }
  if (epilogue) {
    functions +=
        pointwise_store_function_glsl(context.graph(), *fusion->epilogue, fusion->epilogue_input,
                                      "epilogue_store", launch.operands, "epilogue_") +
        epilogue_step_function(map, "epilogue_store");
    launch.label += " + fused " + std::to_string(fusion->epilogue->statements.size()) + " ops -> " +
                    context.graph().node(fusion->epilogue->output).op + " %" +
                    std::to_string(fusion->epilogue->output);
  }
  // Fused DAGs may read f16 values, write f16 ones and round in registers.
  launch.f16_operands = launch_needs_f16(
      context.graph(), launch.operands,
      {prologue ? &*fusion->prologue : nullptr, epilogue ? &*fusion->epilogue : nullptr},
      launch.label, context.device());
  launch.body = functions + std::string(kNormKernel);
  launch.groups = grid_for(static_cast<uint64_t>(map.groups), 1, context.device());
  context.emit(std::move(launch));
}

Kind kind_of(std::string_view op) {
  if (op == op::layer_norm || op == op::layer_norm_grad) return Kind::layer;
  if (op == op::rms_norm || op == op::rms_norm_grad) return Kind::rms;
  if (op == op::group_norm || op == op::group_norm_grad) return Kind::group;
  return Kind::batch;
}

bool is_gradient(std::string_view op) {
  return op == op::layer_norm_grad || op == op::rms_norm_grad || op == op::group_norm_grad ||
         op == op::batch_norm_grad;
}

template <Kind kind, bool backward>
void lower(LoweringContext& context) {
  lower_norm(context, kind, backward);
}

}  // namespace

bool is_norm_op(std::string_view op) {
  return op == op::layer_norm || op == op::rms_norm || op == op::group_norm ||
         op == op::batch_norm || is_gradient(op);
}

size_t norm_prologue_input(const Node& node) {
  return is_gradient(node.op) ? node.inputs.size() - 1 : 0;
}

uint32_t norm_fusion_bindings(const Graph& graph, ValueId id, const NormFusion& fusion) {
  // Its own inputs but the one a prologue computes, and its result or the epilogue's.
  uint32_t bindings =
      static_cast<uint32_t>(graph.node(id).inputs.size()) - (fusion.prologue ? 1 : 0) + 1;
  const auto bound_inputs = [&](const PointwiseDag& dag) {
    uint32_t count = 0;
    for (ValueId input : dag.inputs)
      count += graph.node(input).is_uniform_constant() || input == id ? 0 : 1;
    return count + static_cast<uint32_t>(dag.extra_outputs.size());
  };
  if (fusion.prologue)
    bindings += bound_inputs(*fusion.prologue) + (fusion.prologue_written ? 1 : 0);
  return bindings + (fusion.epilogue ? bound_inputs(*fusion.epilogue) : 0);
}

Launch norm_with_fusion(const Graph& graph, ValueId id, const NormFusion& fusion,
                        const DeviceTraits& device) {
  LoweringContext context(graph, id, device);
  lower_norm(context, kind_of(graph.node(id).op), is_gradient(graph.node(id).op), &fusion);
  return std::move(context.launches().at(0));
}

std::vector<LoweringEntry> norm_lowerings() {
  return {
      {op::layer_norm, lower<Kind::layer, false>}, {op::layer_norm_grad, lower<Kind::layer, true>},
      {op::rms_norm, lower<Kind::rms, false>},     {op::rms_norm_grad, lower<Kind::rms, true>},
      {op::group_norm, lower<Kind::group, false>}, {op::group_norm_grad, lower<Kind::group, true>},
      {op::batch_norm, lower<Kind::batch, false>}, {op::batch_norm_grad, lower<Kind::batch, true>}};
}

}  // namespace mg::kernels
