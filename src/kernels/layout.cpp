// The data-movement archetype: every output element reads (at most) one input element at an
// index computed from its coordinates (transpose, slice, pad, concat, gather), plus the
// deterministic row scatter that is gather's gradient.
#include <algorithm>
#include <optional>

#include "kernels/index_codegen.hpp"
#include "kernels/lowering.hpp"

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

Launch element_launch(LoweringContext& context, std::string body) {
  Launch launch;
  launch.label = context.label();
  launch.kernel = "layout";
  launch.body = std::move(body);
  launch.groups =
      grid_for(static_cast<uint64_t>(context.node().type.elements()), kLocalSize, context.device());
  return launch;
}

// A transpose that swaps two axes of x viewed as [outer, A, B, run] into [outer, B, A, run], the
// run being the trailing elements that move together.
struct AxisSwap {
  int64_t outer = 1, a = 1, b = 1, run = 1;
};

// x's shape and permutation as an AxisSwap, if they are one once unit axes are dropped and axes
// that stay adjacent are merged (the weight swap [O, C, KH, KW] -> [C, O, KH, KW] of a data
// gradient is A = O, B = C, run KH * KW).
std::optional<AxisSwap> as_axis_swap(const Shape& in_shape,
                                     const std::vector<int64_t>& permutation) {
  std::vector<int64_t> rank_of(in_shape.size(), -1);
  int64_t kept = 0;
  for (size_t axis = 0; axis < in_shape.size(); ++axis)
    if (in_shape[axis] != 1) rank_of[axis] = kept++;
  // Groups of kept axes in output order, each a run of consecutive input axes: (first rank,
  // extent).
  std::vector<std::pair<int64_t, int64_t>> groups;
  int64_t last_rank = -2;
  for (const int64_t axis : permutation) {
    const int64_t rank = rank_of[static_cast<size_t>(axis)];
    if (rank < 0) continue;
    if (rank == last_rank + 1 && !groups.empty()) {
      groups.back().second *= in_shape[static_cast<size_t>(axis)];
    } else {
      groups.push_back({rank, in_shape[static_cast<size_t>(axis)]});
    }
    last_rank = rank;
  }
  std::vector<std::pair<int64_t, int64_t>> in_order = groups;
  std::sort(in_order.begin(), in_order.end());
  // The output order of the groups, as positions in input order.
  std::vector<size_t> order;
  for (const auto& group : groups)
    order.push_back(
        static_cast<size_t>(std::find(in_order.begin(), in_order.end(), group) - in_order.begin()));
  const auto extent = [&](size_t k) { return in_order[k].second; };
  using Order = std::vector<size_t>;
  if (order == Order{1, 0}) return AxisSwap{.a = extent(0), .b = extent(1)};
  if (order == Order{1, 0, 2}) return AxisSwap{.a = extent(0), .b = extent(1), .run = extent(2)};
  if (order == Order{0, 2, 1}) return AxisSwap{.outer = extent(0), .a = extent(1), .b = extent(2)};
  if (order == Order{0, 2, 1, 3})
    return AxisSwap{.outer = extent(0), .a = extent(1), .b = extent(2), .run = extent(3)};
  return std::nullopt;
}

// Runs shorter than this go through a tile in shared memory; longer ones are read well enough
// element by element (each warp reads whole runs).
constexpr int64_t kLongestTiledRun = 32;
// Floats of a tile (plus one of padding a row); any Vulkan device has 16 KiB of shared memory.
constexpr int64_t kTileFloats = 3072;

// The swap through T x T tiles of runs: a workgroup reads T rows a (each T runs of B, adjacent in
// x) and writes T rows b (each T runs of A, adjacent in the result), so that both sides move
// whole lines instead of one short run per row (element by element, ResNet's 512-channel weight
// swap, runs of 9, took 12.3 us on the H200: 1.5 TB/s; docs/BENCHMARKS.md run 42). Rows of the
// tile are padded by one float, so that the column reads of a run of 1 spread over the banks.
void lower_tiled_axis_swap(LoweringContext& context, const AxisSwap& swap) {
  const Node& node = context.node();
  int64_t side = 32;
  while (side * side * swap.run > kTileFloats) side /= 2;
  const int64_t line = side * swap.run;
  const int64_t a_tiles = (swap.a + side - 1) / side, b_tiles = (swap.b + side - 1) / side;
  const int64_t tiles = swap.outer * a_tiles * b_tiles;
  const auto u = [](int64_t value) { return glsl_uint(value); };
  std::string body = "layout(local_size_x = " + std::to_string(kLocalSize) +
                     ") in;\nshared float tile[" + std::to_string(side * (line + 1)) + "];\n";
  body += "void main() {\n  uint t = linear_workgroup();\n  if (t >= " + u(tiles) +
          ") return;\n  uint a0 = t / " + u(b_tiles) + " % " + u(a_tiles) + " * " + u(side) +
          ", b0 = t % " + u(b_tiles) + " * " + u(side) + ";\n  uint base = t / " +
          u(a_tiles * b_tiles) + " * " + u(swap.a * swap.b * swap.run) + ";\n";
  body += "  for (uint e = gl_LocalInvocationID.x; e < " + u(side * line) +
          "; e += " + u(kLocalSize) + ") {\n    uint a = e / " + u(line) + ", within = e % " +
          u(line) + ";\n    if (a0 + a < " + u(swap.a) + " && b0 + within / " + u(swap.run) +
          " < " + u(swap.b) + ")\n      tile[a * " + u(line + 1) +
          " + within] = x[base + (a0 + a) * " + u(swap.b * swap.run) + " + b0 * " + u(swap.run) +
          " + within];\n  }\n  barrier();\n";
  body += "  for (uint e = gl_LocalInvocationID.x; e < " + u(side * line) +
          "; e += " + u(kLocalSize) + ") {\n    uint b = e / " + u(line) + ", within = e % " +
          u(line) + ", a = within / " + u(swap.run) + ";\n    if (b0 + b < " + u(swap.b) +
          " && a0 + a < " + u(swap.a) + ")\n      out_[base + (b0 + b) * " + u(swap.a * swap.run) +
          " + a0 * " + u(swap.run) + " + within] = tile[a * " + u(line + 1) + " + b * " +
          u(swap.run) + " + within % " + u(swap.run) + "];\n  }\n}\n";
  Launch launch;
  launch.label = context.label();
  launch.kernel = "transpose";
  launch.body = std::move(body);
  launch.groups = grid_for(static_cast<uint64_t>(tiles) * kLocalSize, kLocalSize, context.device());
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
  context.emit(std::move(launch));
}

void lower_transpose(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& out_shape = node.type.shape;
  const Shape& in_shape = context.input_type(0).shape;
  const std::vector<int64_t>& permutation = node.attrs.get_ints("permutation");
  const std::optional<AxisSwap> swap = as_axis_swap(in_shape, permutation);
  if (swap && swap->run < kLongestTiledRun) {
    lower_tiled_axis_swap(context, *swap);
    return;
  }
  std::vector<std::string> in_coordinates(in_shape.size());
  for (size_t k = 0; k < permutation.size(); ++k)
    in_coordinates[permutation[k]] = "c" + std::to_string(k);
  std::string body = main_header(node.type.elements()) + coordinates_glsl(out_shape, "i");
  body += "  out_[i] = x[" + flat_index_glsl(in_shape, in_coordinates) + "];\n}\n";
  Launch launch = element_launch(context, std::move(body));
  launch.operands = {{"x", node.inputs[0], false}, {"out_", context.id(), true}};
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

void lower_scatter_add(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& target_shape = node.type.shape;
  const int64_t width = element_count(target_shape) / target_shape[0];
  const int64_t positions = context.input_type(1).elements();
  // Each output element sums its own contributions in index order: deterministic, no atomics.
  std::string body = main_header(node.type.elements());
  body += "  int row = int(i / " + glsl_uint(width) + ");\n  uint column = i % " +
          glsl_uint(width) + ";\n  float total = target[i];\n";
  body += "  for (uint p = 0u; p < " + glsl_uint(positions) + "; ++p) {\n";
  body += "    if (indices[p] == row) total += updates[p * " + glsl_uint(width) + " + column];\n";
  body += "  }\n  out_[i] = total;\n}\n";
  Launch launch = element_launch(context, std::move(body));
  launch.operands = {{"target", node.inputs[0], false},
                     {"indices", node.inputs[1], false},
                     {"updates", node.inputs[2], false},
                     {"out_", context.id(), true}};
  context.emit(std::move(launch));
}

}  // namespace

std::vector<LoweringEntry> layout_lowerings() {
  return {
      {"transpose", lower_transpose}, {"slice", lower_slice},   {"pad", lower_pad},
      {"concat", lower_concat},       {"gather", lower_gather}, {"scatter_add", lower_scatter_add}};
}

}  // namespace mg::kernels
