// Index chains (lowering.hpp): one launch for a transpose, rope or concat and the links before it.
// Every link becomes a GLSL function `float vN(uint i)`, its value at flat index i, written in
// terms of the function of its input: a split-K sum adds its partial results there (in their
// order, as the reduction it replaces), a reshape passes the index on, a transpose permutes it,
// a rope reads the two elements of a pair, a concat (the root only) reads the part that holds the
// element, one part through the chain and the others from memory. The root's launch writes
// vRoot(i) for every element.
#include <set>

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg::kernels {
namespace {

constexpr uint32_t kLocalSize = 256;

std::string append_functions(const Graph& graph, ValueId id, const std::set<ValueId>& chain,
                             const std::string& prefix, int& functions,
                             std::vector<Operand>& operands, std::string& text);

// A concat's function: element i lies at `along` on the concatenated axis, between `outer` whole
// blocks of the axis and `inner` elements after it, and is read from the part that holds `along`.
std::string append_concat_function(const Graph& graph, ValueId id, const std::set<ValueId>& chain,
                                   const std::string& prefix, int& functions,
                                   std::vector<Operand>& operands, std::string& text) {
  const Node& node = graph.node(id);
  const Shape& shape = node.type.shape;
  int64_t axis = node.attrs.get_int("axis");
  if (axis < 0) axis += static_cast<int64_t>(shape.size());
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<std::string> parts;
  for (const ValueId input : node.inputs)
    parts.push_back(append_functions(graph, input, chain, prefix, functions, operands, text));
  const std::string name = prefix + "v" + std::to_string(functions++);
  text += "float " + name + "(uint i) {\n";
  text += "  uint inner = i % " + glsl_uint(inner) + ", along = (i / " + glsl_uint(inner) + ") % " +
          glsl_uint(shape[static_cast<size_t>(axis)]) + ", outer = i / " +
          glsl_uint(inner * shape[static_cast<size_t>(axis)]) + ";\n";
  int64_t start = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t length = graph.type(node.inputs[k]).shape[static_cast<size_t>(axis)];
    const std::string index = "(outer * " + glsl_uint(length) + " + along - " + glsl_uint(start) +
                              ") * " + glsl_uint(inner) + " + inner";
    start += length;
    if (k + 1 < parts.size())
      text += "  if (along < " + glsl_uint(start) + ") return " + parts[k] + "(" + index + ");\n";
    else
      text += "  return " + parts[k] + "(" + index + ");\n";
  }
  text += "}\n";
  return name;
}

// Appends to `text` the functions of `id` and of the links it reads, inputs first; values
// outside the chain are read from their buffers, which join `operands`. Functions are named by
// their place in the chain (v0 reads memory), so that the same chain in every layer of a model
// is one kernel; functions and buffers start with `prefix`. Returns the name of `id`'s function.
std::string append_functions(const Graph& graph, ValueId id, const std::set<ValueId>& chain,
                             const std::string& prefix, int& functions,
                             std::vector<Operand>& operands, std::string& text) {
  const Node& node = graph.node(id);
  if (chain.count(id) && node.op == op::concat)
    return append_concat_function(graph, id, chain, prefix, functions, operands, text);
  std::string read;
  if (chain.count(id) && node.op != op::sum)
    read = append_functions(graph, node.inputs[0], chain, prefix, functions, operands, text);
  const std::string name = prefix + "v" + std::to_string(functions++);
  const auto buffer_name = [&] { return prefix + "in" + std::to_string(operands.size()); };
  if (!chain.count(id)) {
    const std::string buffer = buffer_name();
    operands.push_back({buffer, id, false});
    text += "float " + name + "(uint i) {\n  return " + buffer + "[i];\n}\n";
    return name;
  }
  if (node.op == op::sum) {
    // Partial results [S, ...] read straight from their buffer.
    const ValueId partials = node.inputs[0];
    const int64_t count = node.type.elements();
    const int64_t slices = graph.type(partials).elements() / count;
    const std::string buffer = buffer_name();
    operands.push_back({buffer, partials, false});
    text += "float " + name + "(uint i) {\n  return " +
            partials_sum_glsl(buffer, "i", slices, count) + ";\n}\n";
    return name;
  }
  const ValueId input = node.inputs[0];
  if (is_view_op(node.op)) {
    text += "float " + name + "(uint i) {\n  return " + read + "(i);\n}\n";
  } else if (node.op == op::transpose) {
    text +=
        transpose_index_function_glsl(node.attrs.get_ints("permutation"), graph.type(input).shape,
                                      node.type.shape, name + "_from", false);
    text += "float " + name + "(uint i) {\n  return " + read + "(" + name + "_from(i));\n}\n";
  } else {  // rope: element d < D / 2 of a row is a * cos - b * sin, element d + D / 2 is
            // b * cos + a * sin, with a, b the row's elements d and d + D / 2
    const int64_t dim = node.type.shape.back(), half = dim / 2;
    const std::string angle = name + "_angle";
    std::string positions;
    if (node.inputs.size() > 1) {
      positions = buffer_name();
      operands.push_back({positions, node.inputs[1], false});
    }
    text += rope_angle_function(node, angle, positions);
    text += "float " + name + "(uint i) {\n";
    text += "  uint row = i / " + glsl_uint(dim) + ", d = i % " + glsl_uint(dim) + ";\n";
    text +=
        "  uint pair = d % " + glsl_uint(half) + ", first = row * " + glsl_uint(dim) + " + pair;\n";
    text += "  vec2 rotation = " + angle + "(row, pair);\n";
    text += "  float a = " + read + "(first), b = " + read + "(first + " + glsl_uint(half) + ");\n";
    text += "  return d < " + glsl_uint(half) +
            " ? a * rotation.x - b * rotation.y : b * rotation.x + a * rotation.y;\n}\n";
  }
  return name;
}

}  // namespace

bool is_index_chain_root(const Node& node) {
  return (node.op == op::transpose || node.op == op::rope) && node.type.dtype == DType::f32;
}

bool is_index_chain_concat(const Node& node) {
  return node.op == op::concat && node.type.dtype == DType::f32;
}

bool is_index_chain_link(const Node& node) {
  return is_index_chain_root(node) || node.op == op::reshape;
}

std::string index_chain_functions(const Graph& graph, ValueId root,
                                  const std::vector<ValueId>& links, const std::string& prefix,
                                  std::vector<Operand>& operands, std::string& text) {
  std::set<ValueId> chain(links.begin(), links.end());
  chain.insert(root);
  // A chain holds one rope at most (lower_graph), so one table of angle parts.
  int count_of_functions = 0;
  return append_functions(graph, root, chain, prefix, count_of_functions, operands, text);
}

Launch index_chain_launch(const Graph& graph, ValueId root, const std::vector<ValueId>& links,
                          const DeviceTraits& device) {
  Launch launch;
  std::string functions;
  const std::string value_of_root =
      index_chain_functions(graph, root, links, "", launch.operands, functions);
  const int64_t count = graph.node(root).type.elements();
  launch.body = functions + "layout(local_size_x = " + std::to_string(kLocalSize) +
                ") in;\nvoid main() {\n  uint i = linear_workgroup() * " + glsl_uint(kLocalSize) +
                " + gl_LocalInvocationID.x;\n  if (i >= " + glsl_uint(count) + ") return;\n" +
                "  out_[i] = " + value_of_root + "(i);\n}\n";
  launch.operands.push_back({"out_", root, true});
  launch.kernel = "layout";
  launch.label = "fused " + std::to_string(links.size() + 1) + " ops -> " + graph.node(root).op +
                 " %" + std::to_string(root);
  launch.groups = grid_for(static_cast<uint64_t>(count), kLocalSize, device);
  return launch;
}

}  // namespace mg::kernels
