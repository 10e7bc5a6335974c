// The data-movement archetype: every output element reads (at most) one input element at an
// index computed from its coordinates (transpose, slice, pad, concat, gather), plus the
// deterministic row scatter that is gather's gradient.
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

constexpr uint32_t kLocalSize = 256;

std::string main_header(int64_t count) {
  return "layout(local_size_x = " + std::to_string(kLocalSize) +
         ") in;\nvoid main() {\n  uint i = linear_workgroup() * " + glsl_uint(kLocalSize) +
         " + gl_LocalInvocationID.x;\n  if (i >= " + glsl_uint(count) + ") return;\n";
}

std::vector<std::string> coordinate_names(size_t rank, const std::string& prefix = "c") {
  std::vector<std::string> names;
  for (size_t axis = 0; axis < rank; ++axis) names.push_back(prefix + std::to_string(axis));
  return names;
}

// A layout launch of `threads` invocations (kLocalSize a workgroup): one per element of the
// node's result unless a kernel moves several elements a thread.
Launch element_launch(LoweringContext& context, std::string body, int64_t threads) {
  Launch launch;
  launch.label = context.label();
  launch.kernel = "layout";
  launch.body = std::move(body);
  launch.groups = grid_for(static_cast<uint64_t>(threads), kLocalSize, context.device());
  return launch;
}

Launch element_launch(LoweringContext& context, std::string body) {
  return element_launch(context, std::move(body), context.node().type.elements());
}

// A transpose that keeps its innermost axis moves runs of that axis: a thread copies one
// 16-byte vector (4 f32 or 8 f16 values) where that axis is a multiple of it, 8 bytes (4 f16
// values) where it is a multiple of 4 only, from one computed index, so that the index arithmetic
// is paid once for the vector and every access is as wide as the memory's. Such a vector starts
// at a multiple of its length in both tensors, whose bindings start aligned. f16 and bfloat16
// values move as they are.
void lower_transpose(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& out_shape = node.type.shape;
  const Shape& in_shape = context.input_type(0).shape;
  const std::vector<int64_t>& permutation = node.attrs.get_ints("permutation");
  std::vector<std::string> in_coordinates(in_shape.size());
  for (size_t k = 0; k < permutation.size(); ++k)
    in_coordinates[permutation[k]] = "c" + std::to_string(k);
  const size_t rank = out_shape.size();
  const bool half = is_half_dtype(node.type.dtype);
  const bool keeps_innermost = rank > 0 && permutation.back() == static_cast<int64_t>(rank - 1);
  const int64_t innermost = rank > 0 ? out_shape.back() : 0;
  int64_t per_thread = 1;
  std::string vector_type;
  if (keeps_innermost && half && innermost % 8 == 0) {
    per_thread = 8;
    vector_type = "uvec4";
  } else if (keeps_innermost && innermost % 4 == 0) {
    per_thread = 4;
    vector_type = half ? "uvec2" : "uvec4";
  }
  const int64_t threads = node.type.elements() / per_thread;
  std::string body = main_header(threads);
  if (per_thread > 1) {
    const std::string length = glsl_uint(per_thread);
    body = vector_buffer_view("x_runs", 0, false, vector_type) +
           vector_buffer_view("out_runs", 1, true, vector_type) + body;
    body += "  i *= " + length + ";\n" + coordinates_glsl(out_shape, "i");
    body += "  const uint source = " + flat_index_glsl(in_shape, in_coordinates) + ";\n";
    body += "  out_runs[i / " + length + "] = x_runs[source / " + length + "];\n}\n";
  } else {
    body += coordinates_glsl(out_shape, "i");
    body += "  out_[i] = x[" + flat_index_glsl(in_shape, in_coordinates) + "];\n}\n";
  }
  Launch launch = element_launch(context, std::move(body), threads);
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
  if (half) {
    require_f16_tensors(context.label(), "reads or writes", context.device());
    launch.f16_operands = true;
  }
  context.emit(std::move(launch));
}

void lower_slice(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& in_shape = context.input_type(0).shape;
  const int64_t rank = static_cast<int64_t>(in_shape.size());
  int64_t axis = node.attrs.get_int("axis");
  if (axis < 0) axis += rank;
  int64_t start = node.attrs.get_int("start");
  if (start < 0) start += in_shape[axis];
  std::vector<std::string> in_coordinates = coordinate_names(in_shape.size());
  in_coordinates[axis] = "(c" + std::to_string(axis) + " + " + glsl_uint(start) + ")";
  std::string body = main_header(node.type.elements()) + coordinates_glsl(node.type.shape, "i");
  body += "  out_[i] = x[" + flat_index_glsl(in_shape, in_coordinates) + "];\n}\n";
  Launch launch = element_launch(context, std::move(body));
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
  context.emit(std::move(launch));
}

void lower_pad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& in_shape = context.input_type(0).shape;
  const std::vector<int64_t>& pads = node.attrs.get_ints("pads");
  std::string body = main_header(node.type.elements()) + coordinates_glsl(node.type.shape, "i");
  std::string inside = "true";
  std::vector<std::string> in_coordinates;
  for (size_t axis = 0; axis < in_shape.size(); ++axis) {
    const std::string shifted = "s" + std::to_string(axis);
    body += "  int " + shifted + " = int(c" + std::to_string(axis) + ") - " +
            std::to_string(pads[2 * axis]) + ";\n";
    inside += " && " + shifted + " >= 0 && " + shifted + " < " + std::to_string(in_shape[axis]);
    in_coordinates.push_back("uint(" + shifted + ")");
  }
  body += "  out_[i] = (" + inside + ") ? x[" + flat_index_glsl(in_shape, in_coordinates) +
          "] : " + glsl_float(node.attrs.get_float("value", 0.0)) + ";\n}\n";
  Launch launch = element_launch(context, std::move(body));
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
  context.emit(std::move(launch));
}

void lower_concat(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& out_shape = node.type.shape;
  int64_t axis = node.attrs.get_int("axis");
  if (axis < 0) axis += static_cast<int64_t>(out_shape.size());
  std::string body = main_header(node.type.elements()) + coordinates_glsl(out_shape, "i");
  Launch launch;
  int64_t offset = 0;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    const Shape& part_shape = context.input_type(k).shape;
    const std::string name = "part" + std::to_string(k);
    std::vector<std::string> coordinates = coordinate_names(part_shape.size());
    coordinates[axis] = "(c" + std::to_string(axis) + " - " + glsl_uint(offset) + ")";
    offset += part_shape[axis];
    body += std::string(k == 0 ? "  if" : "  else if") + " (c" + std::to_string(axis) + " < " +
            glsl_uint(offset) + ") out_[i] = " + name + "[" +
            flat_index_glsl(part_shape, coordinates) + "];\n";
    launch.operands.push_back({name, node.inputs[k], false});
  }
  body += "}\n";
  Launch element = element_launch(context, std::move(body));
  element.operands = std::move(launch.operands);
  element.operands.push_back({"out_", context.id(), true});
  context.emit(std::move(element));
}

void lower_gather(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& table_shape = context.input_type(0).shape;
  const int64_t rows = table_shape[0];
  const int64_t width = element_count(table_shape) / rows;
  std::string body = main_header(node.type.elements());
  body +=
      "  uint position = i / " + glsl_uint(width) + ", column = i % " + glsl_uint(width) + ";\n";
  // An out-of-range index cannot raise an error on the GPU; it reads zeros instead.
  body += "  int row = indices[position];\n";
  body += "  out_[i] = (row >= 0 && row < " + std::to_string(rows) + ") ? table[uint(row) * " +
          glsl_uint(width) + " + column] : 0.0;\n}\n";
  Launch launch = element_launch(context, std::move(body));
  launch.operands = {{"table", node.inputs[0], false},
                     {"indices", node.inputs[1], false},
                     {"out_", context.id(), true}};
  context.emit(std::move(launch));
}

}  // namespace

// One lane per (position, column) whose position is its row's first adds that row's
// contributions, in position order, to the result. Deterministic without atomics, and the work is
// the positions' rows (an embedding's gradient: the tokens), not the whole table times the
// positions.
Launch scatter_add_rows_launch(const Graph& graph, ValueId id, const DeviceTraits& device) {
  LoweringContext context(graph, id, device);
  const Node& node = context.node();
  const Shape& target_shape = node.type.shape;
  const int64_t rows = target_shape[0];
  const int64_t width = element_count(target_shape) / rows;
  const int64_t positions = context.input_type(1).elements();
  std::string body = main_header(positions * width);
  body += "  uint p = i / " + glsl_uint(width) + ", column = i % " + glsl_uint(width) + ";\n";
  // An index outside the table adds nothing (the GPU cannot raise an error).
  body +=
      "  int row = indices[p];\n  if (row < 0 || row >= " + std::to_string(rows) + ") return;\n";
  body += "  for (uint q = 0u; q < p; ++q) {\n    if (indices[q] == row) return;\n  }\n";
  body += "  float total = 0.0;\n  for (uint q = p; q < " + glsl_uint(positions) + "; ++q) {\n";
  body += "    if (indices[q] == row) total += updates[q * " + glsl_uint(width) + " + column];\n";
  body += "  }\n  uint o = uint(row) * " + glsl_uint(width) + " + column;\n";
  body += "  out_[o] = out_[o] + total;\n}\n";
  Launch add = element_launch(context, std::move(body));
  add.groups = grid_for(static_cast<uint64_t>(positions * width), kLocalSize, device);
  add.operands = {
      {"indices", node.inputs[1], false}, {"updates", node.inputs[2], false}, {"out_", id, true}};
  return add;
}

namespace {

// Two launches: the target copied to the result, then scatter_add_rows_launch's.
void lower_scatter_add(LoweringContext& context) {
  const Node& node = context.node();
  Launch copy =
      element_launch(context, main_header(node.type.elements()) + "  out_[i] = target[i];\n}\n");
  copy.operands = {{"target", node.inputs[0], false}, {"out_", context.id(), true}};
  context.emit(std::move(copy));
  context.emit(scatter_add_rows_launch(context.graph(), context.id(), context.device()));
}

}  // namespace

std::vector<LoweringEntry> layout_lowerings() {
  return {{op::transpose, lower_transpose},
          {op::slice, lower_slice},
          {op::pad, lower_pad},
          {op::concat, lower_concat},
          {op::gather, lower_gather},
          {op::scatter_add, lower_scatter_add}};
}

}  // namespace mg::kernels
