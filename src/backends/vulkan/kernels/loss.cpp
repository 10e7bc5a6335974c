// Loss kernels (cross_entropy and its gradient) and max_grad, the routing backward of max.
//
// Cross-entropy rows are short next to a workgroup when there are few classes (a [64, 10]
// classifier), so a workgroup is cut into segments of SEGMENT lanes (a power of two covering the
// row, at most the workgroup) and each segment reduces one row; up to kThreadPerRowClasses
// classes a segment is one lane, which walks its row alone and needs no barrier to reduce it. The
// scalar loss is computed by a single workgroup that walks every row and sums the row losses in a
// fixed order, which keeps the mean deterministic; for many long rows the passes use the per_row
// form instead (one row a segment across the GPU, then a sum), where that one workgroup would
// walk all the logits alone.
#include <algorithm>

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

constexpr uint32_t kGroupSize = 256;
// A language model's rows (tens of thousands of classes) are few next to the compute units, so
// each gets a larger workgroup where the device allows one.
constexpr int64_t kLongRowClasses = 8192;
constexpr uint32_t kLongRowGroupSize = 1024;
// Rows of up to this many classes are reduced by one lane each: the [64, 10] classifier's loss
// in 16-lane segments, whose shared-memory trees cost 12 barriers a round of rows, ran at twice
// the time of one lane a row.
constexpr int64_t kThreadPerRowClasses = 32;

// Segmented reductions shared by both cross-entropy kernels. Every lane runs the same number of
// rounds (rows past the end are dummies) so that barriers stay in uniform control flow.
constexpr std::string_view kSegments = R"glsl(
layout(local_size_x = GROUP) in;
#define SEGMENTS (GROUP / SEGMENT)
shared float partial_a[GROUP];
shared float partial_b[GROUP];

uint lane_id() { return gl_LocalInvocationID.x; }
uint segment_lane() { return gl_LocalInvocationID.x % SEGMENT; }
uint segment_base() { return gl_LocalInvocationID.x - segment_lane(); }

// Maximum of a within each segment; every lane of the segment gets it.
float segment_max(float a) {
  if (SEGMENT == 1u) return a;
  partial_a[lane_id()] = a;
  barrier();
  for (uint width = SEGMENT / 2u; width > 0u; width >>= 1) {
    if (segment_lane() < width) {
      partial_a[lane_id()] = max(partial_a[lane_id()], partial_a[lane_id() + width]);
    }
    barrier();
  }
  float result = partial_a[segment_base()];
  barrier();
  return result;
}

// Sums of a and b within each segment (span SEGMENT) or the whole group (span GROUP).
void sum_pair(inout float a, inout float b, uint span) {
  if (span == 1u) return;
  uint base = gl_LocalInvocationID.x - gl_LocalInvocationID.x % span;
  partial_a[lane_id()] = a;
  partial_b[lane_id()] = b;
  barrier();
  for (uint width = span / 2u; width > 0u; width >>= 1) {
    if (lane_id() - base < width) {
      partial_a[lane_id()] += partial_a[lane_id() + width];
      partial_b[lane_id()] += partial_b[lane_id() + width];
    }
    barrier();
  }
  a = partial_a[base];
  b = partial_b[base];
  barrier();
}

// Log-sum-exp and sum of row n's logits; a dummy row (n >= ROWS) gives zeros.
void row_statistics(uint n, out float lse, out float row_sum) {
  bool real = n < ROWS;
  float peak = -1.0 / 0.0;
  for (uint c = segment_lane(); c < CLASSES; c += SEGMENT) {
    if (real) peak = max(peak, logits[n * CLASSES + c]);
  }
  peak = segment_max(peak);
  if (!real) peak = 0.0;
  float total = 0.0;
  row_sum = 0.0;
  for (uint c = segment_lane(); c < CLASSES; c += SEGMENT) {
    if (real) {
      float value = logits[n * CLASSES + c];
      total += exp(value - peak);
      row_sum += value;
    }
  }
  sum_pair(total, row_sum, SEGMENT);
  lse = real ? peak + log(total) : 0.0;
}

bool counted(uint n) { return n < ROWS && labels[n] != IGNORE_INDEX; }
)glsl";

constexpr std::string_view kLossMain = R"glsl(
void main() {
  float total = 0.0, count = 0.0;
  uint segment = gl_LocalInvocationID.x / SEGMENT;
  for (uint n0 = 0u; n0 < ROWS; n0 += SEGMENTS) {
    uint n = n0 + segment;
    float lse, row_sum;
    row_statistics(n, lse, row_sum);
    if (segment_lane() == 0u && counted(n)) {
      float picked = logits[n * CLASSES + uint(labels[n])];
      float mean_negative_log_p = lse - row_sum / float(CLASSES);
      total += (1.0 - SMOOTHING) * (lse - picked) + SMOOTHING * mean_negative_log_p;
      count += 1.0;
    }
  }
  sum_pair(total, count, GROUP);
  if (gl_LocalInvocationID.x == 0u) loss[0] = total / max(count, 1.0);
}
)glsl";

// The per_row form: each row's term and whether it counts, in [N, 2].
constexpr std::string_view kRowsMain = R"glsl(
void main() {
  uint n = linear_workgroup() * SEGMENTS + gl_LocalInvocationID.x / SEGMENT;
  float lse, row_sum;
  row_statistics(n, lse, row_sum);
  if (n >= ROWS || segment_lane() != 0u) return;
  float term = 0.0, count = 0.0;
  if (counted(n)) {
    float picked = logits[n * CLASSES + uint(labels[n])];
    float mean_negative_log_p = lse - row_sum / float(CLASSES);
    term = (1.0 - SMOOTHING) * (lse - picked) + SMOOTHING * mean_negative_log_p;
    count = 1.0;
  }
  terms[n * 2u] = term;
  terms[n * 2u + 1u] = count;
}
)glsl";

constexpr std::string_view kGradMain = R"glsl(
void main() {
  // Every workgroup counts the rows itself: no other launch could hand it the count.
  float count = 0.0, unused = 0.0;
  for (uint n = lane_id(); n < ROWS; n += GROUP) count += counted(n) ? 1.0 : 0.0;
  sum_pair(count, unused, GROUP);
  float scale = grad[0] / max(count, 1.0);
  uint n = linear_workgroup() * SEGMENTS + gl_LocalInvocationID.x / SEGMENT;
  float lse, row_sum;
  row_statistics(n, lse, row_sum);
  if (n >= ROWS) return;
  bool keep = counted(n);
  int label = labels[n];
  for (uint c = segment_lane(); c < CLASSES; c += SEGMENT) {
    float target = SMOOTHING / float(CLASSES) + (int(c) == label ? 1.0 - SMOOTHING : 0.0);
    float value = (exp(logits[n * CLASSES + c] - lse) - target) * scale;
    grad_logits[n * CLASSES + c] = keep ? value : 0.0;
  }
}
)glsl";

uint32_t group_for(int64_t classes, const target::DeviceTraits& device) {
  return classes >= kLongRowClasses && device.max_workgroup_invocations >= kLongRowGroupSize
             ? kLongRowGroupSize
             : kGroupSize;
}

uint32_t segment_for(int64_t classes, uint32_t group) {
  if (classes <= kThreadPerRowClasses) return 1;
  uint32_t segment = 1;
  while (segment < group && segment < classes) segment *= 2;
  return segment;
}

std::vector<std::pair<std::string, std::string>> cross_entropy_defines(const Node& node,
                                                                       const Shape& logits,
                                                                       uint32_t group) {
  const uint32_t segment = segment_for(logits[1], group);
  return {{"GROUP", glsl_uint(group)},
          {"SEGMENT", glsl_uint(segment)},
          {"ROWS", glsl_uint(logits[0])},
          {"CLASSES", glsl_uint(logits[1])},
          {"SMOOTHING", glsl_float(node.attrs.get_float("label_smoothing", 0.0))},
          {"IGNORE_INDEX", std::to_string(node.attrs.get_int("ignore_index", -100))}};
}

void lower_cross_entropy(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& shape = context.input_type(0).shape;
  Launch launch;
  launch.label = context.label();
  if (node.attrs.get_int("per_row", 0) != 0) {
    const uint32_t group = group_for(shape[1], context.device());
    launch.kernel = "cross_entropy_rows";
    launch.body = std::string(kSegments) + std::string(kRowsMain);
    launch.defines = cross_entropy_defines(node, shape, group);
    launch.operands = {{"logits", node.inputs[0], false},
                       {"labels", node.inputs[1], false},
                       {"terms", context.id(), true}};
    launch.groups = grid_for(static_cast<uint64_t>(shape[0]), group / segment_for(shape[1], group),
                             context.device());
    context.emit(std::move(launch));
    return;
  }
  launch.kernel = "cross_entropy";
  launch.body = std::string(kSegments) + std::string(kLossMain);
  launch.defines = cross_entropy_defines(node, shape, kGroupSize);
  launch.operands = {{"logits", node.inputs[0], false},
                     {"labels", node.inputs[1], false},
                     {"loss", context.id(), true}};
  context.emit(std::move(launch));
}

void lower_cross_entropy_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& shape = context.input_type(0).shape;
  Launch launch;
  launch.label = context.label();
  launch.kernel = "cross_entropy_grad";
  launch.body = std::string(kSegments) + std::string(kGradMain);
  const uint32_t group = group_for(shape[1], context.device());
  launch.defines = cross_entropy_defines(node, shape, group);
  launch.operands = {{"logits", node.inputs[0], false},
                     {"labels", node.inputs[1], false},
                     {"grad", node.inputs[2], false},
                     {"grad_logits", context.id(), true}};
  launch.groups = grid_for(static_cast<uint64_t>(shape[0]), group / segment_for(shape[1], group),
                           context.device());
  context.emit(std::move(launch));
}

// max_grad(x, grad) {axes, keepdims}: one workgroup per reduction group finds the first maximum
// in row-major order (the reference's tie rule) and writes grad there and zeros elsewhere. A grid
// of more than one row of workgroups (grid_for) ends past the last group: those return.
constexpr std::string_view kMaxGrad = R"glsl(
layout(local_size_x = LOCAL) in;
shared float partial_value[LOCAL];
shared uint partial_index[LOCAL];

bool better(float v, uint r, float best, uint best_r) {
  return best_r == 0xffffffffu || v > best || (v == best && r < best_r);
}

void main() {
  uint o = linear_workgroup();
  if (o >= ROWS) return;
  uint lane = gl_LocalInvocationID.x;
  float best = 0.0;
  uint best_r = 0xffffffffu;
  for (uint r = lane; r < LENGTH; r += LOCAL) {
    float v = x[input_index(o, r)];
    if (better(v, r, best, best_r)) { best = v; best_r = r; }
  }
  partial_value[lane] = best;
  partial_index[lane] = best_r;
  barrier();
  for (uint width = LOCAL / 2u; width > 0u; width >>= 1) {
    if (lane < width) {
      float v = partial_value[lane + width];
      uint r = partial_index[lane + width];
      if (r != 0xffffffffu && better(v, r, partial_value[lane], partial_index[lane])) {
        partial_value[lane] = v;
        partial_index[lane] = r;
      }
    }
    barrier();
  }
  uint winner = partial_index[0];
  float g = grad[o];
  for (uint r = lane; r < LENGTH; r += LOCAL) out_[input_index(o, r)] = r == winner ? g : 0.0;
}
)glsl";

void lower_max_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& shape = context.input_type(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> axes = node.attrs.get_ints("axes", {});
  if (axes.empty()) {
    for (int64_t axis = 0; axis < rank; ++axis) axes.push_back(axis);
  }
  for (int64_t& axis : axes) axis = axis < 0 ? axis + rank : axis;
  // Kept axes index the group (the order of max's result), reduced axes the position within
  // it; both enumerate row-major, so a smaller position is an earlier element of x.
  const RowLayout layout = row_layout(shape, axes);
  const int64_t length = layout.row_length;
  uint32_t local = 32;
  while (local < 128 && local < length) local *= 2;

  Launch launch;
  launch.label = context.label();
  launch.kernel = "max_grad";
  launch.body = layout.index_function + std::string(kMaxGrad);
  launch.defines = {
      {"LOCAL", glsl_uint(local)}, {"LENGTH", glsl_uint(length)}, {"ROWS", glsl_uint(layout.rows)}};
  launch.operands = {
      {"x", node.inputs[0], false}, {"grad", node.inputs[1], false}, {"out_", context.id(), true}};
  launch.groups = grid_for(static_cast<uint64_t>(layout.rows), 1, context.device());
  context.emit(std::move(launch));
}

}  // namespace

std::vector<LoweringEntry> loss_lowerings() {
  return {{op::cross_entropy, lower_cross_entropy},
          {op::cross_entropy_grad, lower_cross_entropy_grad},
          {op::max_grad, lower_max_grad}};
}

}  // namespace mg::kernels
