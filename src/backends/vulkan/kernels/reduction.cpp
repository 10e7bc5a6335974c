// The row-reduction archetype: each output element combines the input elements along a set of
// reduced axes. Long rows get one workgroup with a shared-memory tree; short rows one thread, and
// so do many rows adjacent in memory (column sums such as the sum of split-K partial results
// over their leading axis), where consecutive threads then read consecutive words.
// Softmax and log-softmax are three passes over one row inside one workgroup, reading the row
// once into registers when it is short enough.
#include <algorithm>

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

constexpr uint32_t kGroupSize = 128;
constexpr int64_t kThreadPerRowLimit = 16;
// Rows at least this long, when there are few of them, take workgroups of kLongRowGroupSize.
constexpr int64_t kLongRow = 8192;
constexpr uint32_t kLongRowGroupSize = 1024;
// A column sum takes one thread per output from this many outputs on (32 workgroups): enough to
// spread over a GPU, where a workgroup per output would read every word on its own.
constexpr int64_t kColumnThreadsMinRows = 4096;
// Short rows share a workgroup: each gets the fewest lanes (a power of two) that read at most
// this many of its elements each, while the workgroups still number several a compute unit.
constexpr int64_t kShortRowElementsPerLane = 16;
constexpr int64_t kShortRowGroupsPerUnit = 4;
// Elements a lane loads before it adds them, in the row loops (MEGANEURA_REDUCTION_UNROLL=0: one).
constexpr int64_t kReductionUnroll = 4;
// Softmax rows up to this many elements a thread (4096 at 128 threads) stay in registers.
constexpr int64_t kSoftmaxCachedPerThread = 32;

std::vector<int64_t> reduced_axes_of(const Node& node, int64_t rank) {
  if (node.op == op::sum_to_f16) return {0};  // its leading axis, always
  std::vector<int64_t> axes = node.attrs.has("axes")
                                  ? node.attrs.get_ints("axes")
                                  : std::vector<int64_t>{node.attrs.get_int("axis")};
  if (axes.empty()) {
    for (int64_t axis = 0; axis < rank; ++axis) axes.push_back(axis);
  }
  for (int64_t& axis : axes) {
    if (axis < 0) axis += rank;
  }
  return axes;
}

enum class ReductionKind { sum, max, argmax };

// The lanes of a workgroup of `group` that reduce one row: all of them for long or few rows;
// fewer for many short ones (batch norm's per-image, per-channel planes of 49 or 196 elements),
// whose lanes a whole workgroup would leave mostly idle behind a tree of barriers.
int64_t lanes_per_row(const RowLayout& layout, int64_t group, const DeviceTraits& device) {
  int64_t lanes = group;
  while (lanes > 2 && (lanes / 2) * kShortRowElementsPerLane >= layout.row_length &&
         layout.rows * (lanes / 2) >= group * kShortRowGroupsPerUnit * device.compute_units)
    lanes /= 2;
  return lanes;
}

// Whether `axes` are the leading axes 0, 1, ... of the shape: the rows kept are then adjacent in
// memory, each reduced position a block of all of them.
bool leading_axes(std::vector<int64_t> axes) {
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// The threads that share a column of vector_column_sum: doubled up to 8 while the threads
// give each compute unit fewer than 512 and each still adds at least 4 reduced positions.
int64_t column_row_groups(const RowLayout& layout, const DeviceTraits& device) {
  constexpr int64_t kMostRowGroups = 8, kThreadsPerUnit = 4 * kGroupSize;
  const int64_t quads = layout.rows / 4;
  int64_t groups = 1;
  while (groups < kMostRowGroups && quads * groups < kThreadsPerUnit * device.compute_units &&
         layout.row_length >= 4 * groups)
    groups *= 2;
  return groups;
}

// Sums over leading axes (the slices of split-K and split attention partial results) with a
// multiple of 4 outputs: each thread adds four adjacent outputs as one vec4 per reduced
// position, a quarter of the scalar path's loads. Where those threads would leave most of the
// GPU idle (a split-K gradient of 36,864 weights is 9,216 vec4 columns), several threads share
// a column, each adding every groups-th reduced position, and the first adds up their totals
// from shared memory (ResNet's 44 partial 3x3 weight gradients).
// With f16_result the vec4 of sums is rounded to f16 and stored as one f16vec4.
Launch vector_column_sum(LoweringContext& context, const RowLayout& layout,
                         const std::string& finalize, bool f16_result) {
  const int64_t quads = layout.rows / 4;
  const int64_t groups = column_row_groups(layout, context.device());
  const int64_t columns = kGroupSize / groups;  // per workgroup
  std::string body = std::string(f16_result ? pointwise_functions_glsl() : "") +
                     vector_buffer_view("x4", 0, false) +
                     vector_buffer_view("out4", 1, true, f16_result ? "f16vec4" : "vec4");
  body += "layout(local_size_x = " + std::to_string(kGroupSize) + ") in;\n";
  if (groups > 1)
    body +=
        "shared vec4 partial[" + std::to_string(groups) + "][" + std::to_string(columns) + "];\n";
  body += "void main() {\n";
  body += "  uint column = gl_LocalInvocationID.x % " + glsl_uint(columns) +
          ", group = gl_LocalInvocationID.x / " + glsl_uint(columns) + ";\n";
  body += "  uint o = linear_workgroup() * " + glsl_uint(columns) + " + column;\n";
  body += "  vec4 total = vec4(0.0);\n";
  body += "  if (o < " + glsl_uint(quads) + ") {\n";
  // As in the row loops (emit_reduction): four positions' loads a step, added in order.
  const std::string length = glsl_uint(layout.row_length), step = glsl_uint(groups);
  const std::string at = " * " + glsl_uint(quads) + " + o]";
  body += "    uint r = group;\n";
  if (context.device().switches.reduction_unroll) {
    const std::string last = glsl_uint(kReductionUnroll - 1), span = glsl_uint(kReductionUnroll);
    body += "    for (; r + " + last + " * " + step + " < " + length + "; r += " + span + " * " +
            step + ") {\n";
    for (int64_t k = 0; k < kReductionUnroll; ++k)
      body += "      vec4 v" + std::to_string(k) + " = x4[(r + " + glsl_uint(k) + " * " + step +
              ")" + at + ";\n";
    for (int64_t k = 0; k < kReductionUnroll; ++k)
      body += "      total += v" + std::to_string(k) + ";\n";
    body += "    }\n";
  }
  body += "    for (; r < " + length + "; r += " + step + ") total += x4[r" + at + ";\n";
  body += "  }\n";
  if (groups > 1) {
    body += "  partial[group][column] = total;\n  barrier();\n";
    body += "  if (group != 0u) return;\n";
    body +=
        "  for (uint g = 1u; g < " + glsl_uint(groups) + "; ++g) total += partial[g][column];\n";
  }
  const std::string stored = f16_result ? "f16vec4(mg_round_f16(value.x), mg_round_f16(value.y), "
                                          "mg_round_f16(value.z), mg_round_f16(value.w))"
                                        : "value";
  body += "  vec4 value = " + finalize + ";\n";
  body += "  if (o < " + glsl_uint(quads) + ") out4[o] = " + stored + ";\n}\n";
  Launch launch;
  launch.label = context.label();
  launch.kernel = "reduction";
  launch.body = std::move(body);
  launch.operands = {{"x", context.node().inputs[0], false}, {"out_", context.id(), true}};
  launch.f16_operands = f16_result;
  launch.groups =
      grid_for(static_cast<uint64_t>(quads), static_cast<uint32_t>(columns), context.device());
  return launch;
}

// Sums, or selects the maximum keeping the index of its first occurrence (max, argmax). The
// result is `finalize` applied to `total` (sum) or to `best` / `best_index` (max, argmax); with
// f16_result (sum_to_f16) it is rounded to f16 in registers, as the reference rounds it, and
// stored as f16.
// With `prologue` (a sum, mean or max), each element is that pointwise DAG evaluated at the
// element's index (pointwise_element_function_glsl), whose inputs the launch reads instead of
// the reduction's input; its sibling, if any, totals the exported value in `total1` and stores
// `sibling_finalize` of it as out1_.
void emit_reduction(LoweringContext& context, ReductionKind kind, const std::string& finalize,
                    bool f16_result = false, const ReductionPrologue* prologue = nullptr,
                    const std::string& sibling_finalize = "") {
  const Node& node = context.node();
  if (f16_result) require_f16_tensors(context.label(), "writes", context.device());
  const Shape& in_shape = context.input_type(0).shape;
  const std::vector<int64_t> reduced_axes =
      reduced_axes_of(node, static_cast<int64_t>(in_shape.size()));
  const RowLayout layout = row_layout(in_shape, reduced_axes);
  const bool innermost_kept =
      std::find(reduced_axes.begin(), reduced_axes.end(),
                static_cast<int64_t>(in_shape.size()) - 1) == reduced_axes.end();
  const bool thread_per_row = layout.row_length <= kThreadPerRowLimit ||
                              (innermost_kept && layout.rows >= kColumnThreadsMinRows);
  const bool selecting = kind != ReductionKind::sum;
  if (!selecting && !prologue && thread_per_row && layout.rows % 4 == 0 &&
      leading_axes(reduced_axes)) {
    context.emit(vector_column_sum(context, layout, finalize, f16_result));
    return;
  }

  // A few long rows (a language model's logits) leave most compute units idle with a workgroup
  // each: they get larger workgroups where the device allows.
  const uint32_t group = !thread_per_row && layout.rows <= 4 * context.device().compute_units &&
                                 layout.row_length >= kLongRow &&
                                 context.device().max_workgroup_invocations >= kLongRowGroupSize
                             ? kLongRowGroupSize
                             : kGroupSize;
  std::string body =
      std::string(f16_result || prologue ? pointwise_functions_glsl() : "") + layout.index_function;
  const bool sibling = prologue && prologue->sibling != kNoValue;
  std::vector<Operand> operands;
  if (prologue) {
    body += pointwise_element_function_glsl(
        context.graph(), prologue->dag, "element", operands,
        sibling ? std::vector<size_t>{prologue->sibling_statement} : std::vector<size_t>{});
  } else {
    operands.push_back({"x", node.inputs[0], false});
  }
  operands.push_back({"out_", context.id(), true});
  if (sibling) operands.push_back({"out1_", prologue->sibling, true});
  body +=
      "bool better(float v, uint i, float best, uint best_index) {\n"
      "  return best_index == 0xffffffffu || v > best || (v == best && i < best_index);\n}\n";
  body += "layout(local_size_x = " + std::to_string(group) + ") in;\n";
  body += "shared float partial_value[" + std::to_string(group) + "];\n";
  body += "shared uint partial_index[" + std::to_string(group) + "];\n";
  if (sibling) body += "shared float partial_value1[" + std::to_string(group) + "];\n";
  const int64_t lanes = thread_per_row ? 1 : lanes_per_row(layout, group, context.device());
  const int64_t rows_per_group = thread_per_row ? group : group / lanes;
  body += "void main() {\n  uint lane = gl_LocalInvocationID.x;\n";
  body += "  float total = 0.0, best = 0.0;\n  uint best_index = 0xffffffffu;\n";
  if (sibling) body += "  float total1 = 0.0;\n";
  // The positions this lane visits: first, first + step, ... below end.
  std::string first, end, step;
  if (thread_per_row) {
    body += "  uint o = linear_workgroup() * " + glsl_uint(kGroupSize) + " + lane;\n";
    body += "  if (o >= " + glsl_uint(layout.rows) + ") return;\n";
    first = "0u", end = glsl_uint(layout.row_length), step = "1u";
  } else if (lanes == group) {
    // A grid of more than one row of workgroups (grid_for) ends past the last row.
    body += "  uint o = linear_workgroup();\n";
    body += "  if (o >= " + glsl_uint(layout.rows) + ") return;\n";
    first = "lane", end = glsl_uint(layout.row_length), step = glsl_uint(group);
  } else {
    // Every lane reaches the barriers below, those of a row past the last included.
    body += "  uint slot = lane / " + glsl_uint(lanes) + ", row_lane = lane % " + glsl_uint(lanes) +
            ";\n";
    body += "  uint o = linear_workgroup() * " + glsl_uint(rows_per_group) + " + slot;\n";
    body += "  uint row_end = o < " + glsl_uint(layout.rows) + " ? " +
            glsl_uint(layout.row_length) + " : 0u;\n";
    first = "row_lane", end = "row_end", step = glsl_uint(lanes);
  }
  // Element `position` into v<name> (and the sibling's value into e<name>), then folded into the
  // totals: the loads of an unrolled step are all issued before the first is added.
  const auto load = [&](const std::string& name, const std::string& position) {
    std::string text = "    float v" + name + " = " +
                       (prologue ? "element(input_index(o, " + position + "))"
                                 : "x[input_index(o, " + position + ")]") +
                       ";\n";
    if (sibling) text += "    float e" + name + " = exported0;\n";
    return text;
  };
  const auto fold = [&](const std::string& name, const std::string& position) {
    std::string text = selecting ? "    if (better(v" + name + ", " + position +
                                       ", best, best_index)) { best = v" + name +
                                       "; best_index = " + position + "; }\n"
                                 : "    total += v" + name + ";\n";
    if (sibling) text += "    total1 += e" + name + ";\n";
    return text;
  };
  // Several elements a step keep that many loads in flight a lane, where one would wait for
  // each; they fold in the order of the plain loop, so the results are the same to the bit.
  const int64_t unroll = context.device().switches.reduction_unroll ? kReductionUnroll : 1;
  body += "  uint r = " + first + ";\n";
  if (unroll > 1) {
    body += "  for (; r + " + std::to_string(unroll - 1) + "u * " + step + " < " + end +
            "; r += " + std::to_string(unroll) + "u * " + step + ") {\n";
    std::string loads, folds;
    for (int64_t u = 0; u < unroll; ++u) {
      const std::string name = std::to_string(u);
      const std::string position = u == 0 ? "r" : "r + " + name + "u * " + step;
      body += "    uint r" + name + " = " + position + ";\n";
      loads += load(name, "r" + name);
      folds += fold(name, "r" + name);
    }
    body += loads + folds + "  }\n";
  }
  body +=
      "  for (; r < " + end + "; r += " + step + ") {\n" + load("", "r") + fold("", "r") + "  }\n";
  if (!thread_per_row) {
    body += "  partial_value[lane] = " + std::string(selecting ? "best" : "total") +
            ";\n  partial_index[lane] = best_index;\n";
    if (sibling) body += "  partial_value1[lane] = total1;\n";
    body += "  barrier();\n";
    // The tree runs within each row's lanes, whose slots in the shared arrays are adjacent.
    body += "  for (uint width = " + glsl_uint(lanes / 2) +
            "; width > 0u; width >>= 1) {\n    if (" +
            std::string(lanes != group ? "row_lane" : "lane") + " < width) {\n";
    if (selecting) {
      body +=
          "      float v = partial_value[lane + width];\n"
          "      uint r = partial_index[lane + width];\n"
          "      if (r != 0xffffffffu && better(v, r, partial_value[lane], partial_index[lane])) "
          "{\n"
          "        partial_value[lane] = v;\n        partial_index[lane] = r;\n      }\n";
    } else {
      body += "      partial_value[lane] += partial_value[lane + width];\n";
      if (sibling) body += "      partial_value1[lane] += partial_value1[lane + width];\n";
    }
    body += "    }\n    barrier();\n  }\n";
    body += lanes != group
                ? "  if (row_lane != 0u || o >= " + glsl_uint(layout.rows) + ") return;\n"
                : "  if (lane != 0u) return;\n";
    body +=
        "  total = partial_value[lane];\n  best = partial_value[lane];\n  best_index = "
        "partial_index[lane];\n";
    if (sibling) body += "  total1 = partial_value1[lane];\n";
  }
  if (sibling) body += "  out1_[o] = " + sibling_finalize + ";\n";
  body += "  out_[o] = " + (f16_result ? "float16_t(mg_round_f16(" + finalize + "))" : finalize) +
          ";\n}\n";

  Launch launch;
  launch.label = context.label();
  launch.kernel = "reduction";
  launch.body = std::move(body);
  launch.operands = std::move(operands);
  // A prologue may read f16 inputs, write f16 values beside and round in registers.
  launch.f16_operands =
      launch_needs_f16(context.graph(), launch.operands, {prologue ? &prologue->dag : nullptr},
                       launch.label, context.device());
  launch.groups = thread_per_row
                      ? grid_for(static_cast<uint64_t>(layout.rows), kGroupSize, context.device())
                      : grid_for(static_cast<uint64_t>(layout.rows),
                                 static_cast<uint32_t>(rows_per_group), context.device());
  context.emit(std::move(launch));
}

void lower_sum(LoweringContext& context) {
  emit_reduction(context, ReductionKind::sum, "total");
}

void lower_sum_to_f16(LoweringContext& context) {
  emit_reduction(context, ReductionKind::sum, "total", true);
}

// The result of a sum or mean node `id` from its total `total` (a GLSL variable).
std::string sum_or_mean_of(const Graph& graph, ValueId id, const std::string& total) {
  const Node& node = graph.node(id);
  if (node.op != op::mean) return total;
  const int64_t count = graph.type(node.inputs[0]).elements() / node.type.elements();
  return total + " / " + glsl_float(static_cast<double>(count));
}

void lower_mean(LoweringContext& context) {
  emit_reduction(context, ReductionKind::sum,
                 sum_or_mean_of(context.graph(), context.id(), "total"));
}

void lower_max(LoweringContext& context) {
  emit_reduction(context, ReductionKind::max, "best");
}

void lower_argmax(LoweringContext& context) {
  emit_reduction(context, ReductionKind::argmax, "int(best_index)");
}

void emit_softmax(LoweringContext& context, bool logarithm) {
  const Node& node = context.node();
  const Shape& shape = node.type.shape;
  const RowLayout layout =
      row_layout(shape, reduced_axes_of(node, static_cast<int64_t>(shape.size())));
  const std::string group = glsl_uint(kGroupSize);
  const std::string length = glsl_uint(layout.row_length);
  std::string body = "#extension GL_EXT_control_flow_attributes : enable\n" + layout.index_function;
  body += "layout(local_size_x = " + std::to_string(kGroupSize) + ") in;\n";
  body += "shared float partial[" + std::to_string(kGroupSize) + "];\n";
  body +=
      "float reduce_group(float value, bool take_max) {\n  uint lane = gl_LocalInvocationID.x;\n";
  body += "  partial[lane] = value;\n  barrier();\n";
  body += "  for (uint width = " + glsl_uint(kGroupSize / 2) + "; width > 0u; width >>= 1) {\n";
  body +=
      "    if (lane < width) partial[lane] = take_max ? max(partial[lane], partial[lane + width])"
      " : partial[lane] + partial[lane + width];\n    barrier();\n  }\n";
  body += "  float result = partial[0];\n  barrier();\n  return result;\n}\n";
  // A grid of more than one row of workgroups (grid_for) ends past the last row.
  body += "void main() {\n  uint o = linear_workgroup();\n  if (o >= " + glsl_uint(layout.rows) +
          ") return;\n  uint lane = gl_LocalInvocationID.x;\n";
  body += "  float row_max = -1.0 / 0.0;\n";
  const int64_t per_thread = (layout.row_length + kGroupSize - 1) / kGroupSize;
  const std::string result =
      logarithm ? "value - row_max - log(total)" : "exp(value - row_max) / total";
  if (per_thread <= kSoftmaxCachedPerThread) {
    // The row fits in registers: one read of global memory instead of three.
    const std::string count = std::to_string(per_thread);
    body += "  float row[" + count + "];\n";
    body += "  [[unroll]] for (uint c = 0u; c < " + count + "u; ++c) {\n";
    body += "    uint r = lane + c * " + group + ";\n";
    body += "    row[c] = r < " + length + " ? x[input_index(o, r)] : -1.0 / 0.0;\n";
    body += "    row_max = max(row_max, row[c]);\n  }\n";
    body += "  row_max = reduce_group(row_max, true);\n  float total = 0.0;\n";
    body +=
        "  [[unroll]] for (uint c = 0u; c < " + count + "u; ++c) total += exp(row[c] - row_max);\n";
    body += "  total = reduce_group(total, false);\n";
    body += "  [[unroll]] for (uint c = 0u; c < " + count + "u; ++c) {\n";
    body += "    uint r = lane + c * " + group + ";\n    float value = row[c];\n";
    body += "    if (r < " + length + ") out_[input_index(o, r)] = " + result + ";\n  }\n}\n";
  } else {
    body += "  for (uint r = lane; r < " + length + "; r += " + group +
            ") row_max = max(row_max, x[input_index(o, r)]);\n";
    body += "  row_max = reduce_group(row_max, true);\n  float total = 0.0;\n";
    body += "  for (uint r = lane; r < " + length + "; r += " + group +
            ") total += exp(x[input_index(o, r)] - row_max);\n";
    body += "  total = reduce_group(total, false);\n";
    body += "  for (uint r = lane; r < " + length + "; r += " + group + ") {\n";
    body += "    uint index = input_index(o, r);\n    float value = x[index];\n";
    body += "    out_[index] = " + result + ";\n  }\n}\n";
  }
  Launch launch;
  launch.label = context.label();
  launch.kernel = "softmax";
  launch.body = std::move(body);
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
  launch.groups = grid_for(static_cast<uint64_t>(layout.rows), 1, context.device());
  context.emit(std::move(launch));
}

void lower_softmax(LoweringContext& context) {
  emit_softmax(context, false);
}
void lower_log_softmax(LoweringContext& context) {
  emit_softmax(context, true);
}

}  // namespace

Launch reduction_with_prologue(const Graph& graph, ValueId id, const ReductionPrologue& prologue,
                               const DeviceTraits& device) {
  LoweringContext context(graph, id, device);
  const bool sibling = prologue.sibling != kNoValue;
  if (graph.node(id).op == op::max)
    emit_reduction(context, ReductionKind::max, "best", false, &prologue);
  else
    emit_reduction(context, ReductionKind::sum, sum_or_mean_of(graph, id, "total"), false,
                   &prologue, sibling ? sum_or_mean_of(graph, prologue.sibling, "total1") : "");
  Launch launch = std::move(context.launches().at(0));
  launch.label += " of fused " + std::to_string(prologue.dag.statements.size()) + " ops -> " +
                  graph.node(prologue.dag.output).op + " %" + std::to_string(prologue.dag.output);
  if (sibling)
    launch.label +=
        " + " + graph.node(prologue.sibling).op + " %" + std::to_string(prologue.sibling);
  return launch;
}

std::vector<LoweringEntry> reduction_lowerings() {
  return {{op::sum, lower_sum},
          {op::sum_to_f16, lower_sum_to_f16},
          {op::mean, lower_mean},
          {op::max, lower_max},
          {op::argmax, lower_argmax},
          {op::softmax, lower_softmax},
          {op::log_softmax, lower_log_softmax}};
}

}  // namespace mg::kernels
