// Normalisation kernels: layer_norm, rms_norm, group_norm, batch_norm and their x-gradients.
// Every element belongs to one statistics group (see src/ops/norm.cpp); one workgroup owns one
// group, so its statistics come from deterministic shared-memory trees and no atomics. The
// group's elements are re-read from global memory on each pass rather than cached, because
// batch_norm groups (N * H * W elements) do not fit in shared memory.
#include <algorithm>

#include "kernels/index_codegen.hpp"
#include "kernels/lowering.hpp"

namespace mg::kernels {
namespace {

enum class Kind { layer, rms, group, batch };

// Two passes (mean, then squared deviations) as the reference does: one-pass E[x^2] - E[x]^2
// loses the 1e-5 budget on rows with a large mean.
constexpr std::string_view kNormKernel = R"glsl(
layout(local_size_x = LOCAL) in;
shared float partial_a[LOCAL];
shared float partial_b[LOCAL];

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
  float total = 0.0, unused = 0.0;
  for (uint e = lane; e < COUNT; e += LOCAL) total += x[element_index(g, e)];
  reduce_pair(total, unused);
  mean = total / float(COUNT);
#endif
  float squares = 0.0, unused2 = 0.0;
  for (uint e = lane; e < COUNT; e += LOCAL) {
    float d = x[element_index(g, e)] - mean;
    squares += d * d;
  }
  reduce_pair(squares, unused2);
  rstd = 1.0 / sqrt(squares / float(COUNT) + EPS);
#endif

#if FORWARD
  for (uint e = lane; e < COUNT; e += LOCAL) {
    uint i = element_index(g, e);
    float value = (x[i] - mean) * rstd;
#if HAS_WEIGHT
    value *= weight[channel_of(g, e)];
#endif
#if HAS_BIAS
    value += bias[channel_of(g, e)];
#endif
    out_[i] = value;
  }
#else
  // dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat)), gw = grad_out * weight.
  float grad_sum = 0.0, grad_dot = 0.0;
#if !RUNNING
  for (uint e = lane; e < COUNT; e += LOCAL) {
    uint i = element_index(g, e);
    float gw = grad_out[i];
#if HAS_WEIGHT
    gw *= weight[channel_of(g, e)];
#endif
    grad_sum += gw;
    grad_dot += gw * ((x[i] - mean) * rstd);
  }
  reduce_pair(grad_sum, grad_dot);
#endif
  for (uint e = lane; e < COUNT; e += LOCAL) {
    uint i = element_index(g, e);
    float value = grad_out[i];
#if HAS_WEIGHT
    value *= weight[channel_of(g, e)];
#endif
#if !RUNNING
#if CENTRED
    value -= grad_sum / float(COUNT);
#endif
    value -= (x[i] - mean) * rstd * (grad_dot / float(COUNT));
#endif
    out_[i] = value * rstd;
  }
#endif
}
)glsl";

// Where the elements of statistics group g live: flat index and channel of its e-th element.
struct GroupMap {
  int64_t groups = 0;
  int64_t count = 0;  // elements per group
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
    index = "g * " + glsl_uint(length) + " + e";
    channel = "e";
  } else {
    const int64_t channels = x[1];
    const int64_t inner = elements / (x[0] * channels);
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

uint32_t local_size_for(int64_t count) {
  uint32_t size = 32;
  while (size < 256 && size < count) size *= 2;
  return size;
}

void lower_norm(LoweringContext& context, Kind kind, bool backward) {
  const Node& node = context.node();
  const Shape& x_shape = context.input_type(0).shape;
  const bool has_weight = node.attrs.get_int("has_weight", 0) != 0;
  const bool has_bias = !backward && kind != Kind::rms && node.attrs.get_int("has_bias", 0) != 0;
  const bool running = kind == Kind::batch && node.attrs.get_int("training", 1) == 0;
  const GroupMap map = group_map(kind, x_shape, node.attrs.get_int("groups", 1));
  const uint32_t local = local_size_for(map.count);

  Launch launch;
  launch.label = context.label();
  launch.kernel = "norm";
  launch.body = map.functions + std::string(kNormKernel);
  launch.defines = {{"LOCAL", glsl_uint(local)},
                    {"COUNT", glsl_uint(map.count)},
                    {"EPS", glsl_float(node.attrs.get_float("eps"))},
                    {"FORWARD", backward ? "0" : "1"},
                    {"CENTRED", kind == Kind::rms ? "0" : "1"},
                    {"RUNNING", running ? "1" : "0"},
                    {"HAS_WEIGHT", has_weight ? "1" : "0"},
                    {"HAS_BIAS", has_bias ? "1" : "0"}};
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
  launch.groups = grid_for(static_cast<uint64_t>(map.groups), 1, context.device());
  context.emit(std::move(launch));
}

template <Kind kind, bool backward>
void lower(LoweringContext& context) {
  lower_norm(context, kind, backward);
}

}  // namespace

std::vector<LoweringEntry> norm_lowerings() {
  return {{"layer_norm", lower<Kind::layer, false>}, {"layer_norm_grad", lower<Kind::layer, true>},
          {"rms_norm", lower<Kind::rms, false>},     {"rms_norm_grad", lower<Kind::rms, true>},
          {"group_norm", lower<Kind::group, false>}, {"group_norm_grad", lower<Kind::group, true>},
          {"batch_norm", lower<Kind::batch, false>}, {"batch_norm_grad", lower<Kind::batch, true>}};
}

}  // namespace mg::kernels
