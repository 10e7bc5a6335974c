// Matrix products: batched GEMM with optional operand transposes and broadcast batch axes.
#include "kernels/index_codegen.hpp"
#include "kernels/lowering.hpp"

namespace mg::kernels {
namespace {

constexpr int64_t kTile = 64;

// `uint <name>(uint batch)`: element offset of an operand's matrix for output batch `batch`,
// with broadcast (extent 1) batch axes contributing nothing.
std::string batch_offset_function(const std::string& name, const Shape& operand,
                                  const Shape& batch_shape) {
  const int64_t matrix = operand[operand.size() - 1] * operand[operand.size() - 2];
  const size_t operand_batch_rank = operand.size() - 2;
  const size_t offset = batch_shape.size() - operand_batch_rank;
  std::string text = "uint " + name + "(uint batch) {\n" + coordinates_glsl(batch_shape, "batch");
  text += "  return 0u";
  int64_t stride = matrix;
  for (size_t axis = operand_batch_rank; axis-- > 0;) {
    if (operand[axis] != 1) text += " + c" + std::to_string(axis + offset) + " * " + glsl_uint(stride);
    stride *= operand[axis];
  }
  return text + ";\n}\n";
}

void lower_matmul(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& a_shape = context.input_type(0).shape;
  const Shape& b_shape = context.input_type(1).shape;
  const Shape& out_shape = node.type.shape;
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const bool transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  const int64_t m = out_shape[out_shape.size() - 2];
  const int64_t n = out_shape[out_shape.size() - 1];
  const int64_t k = transpose_a ? a_shape[a_shape.size() - 2] : a_shape[a_shape.size() - 1];
  const Shape batch_shape(out_shape.begin(), out_shape.end() - 2);
  const int64_t batches = element_count(batch_shape);

  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm";
  const bool rowwise = context.device().cpu;
  launch.body = batch_offset_function("a_offset", a_shape, batch_shape) +
                batch_offset_function("b_offset", b_shape, batch_shape) +
                std::string(kernel_source(rowwise ? "gemm_rowwise.comp" : "gemm.comp"));
  launch.defines = {{"M", glsl_uint(m)},
                    {"N", glsl_uint(n)},
                    {"K", glsl_uint(k)},
                    {"TRANSPOSE_A", transpose_a ? "1" : "0"},
                    {"TRANSPOSE_B", transpose_b ? "1" : "0"}};
  launch.operands = {{"a", node.inputs[0], false}, {"b", node.inputs[1], false},
                     {"c", context.id(), true}};
  if (rowwise) {
    launch.groups = grid_for(static_cast<uint64_t>(m * ((n + 3) / 4)), 64, context.device());
    launch.groups[2] = static_cast<uint32_t>(batches);
  } else {
    launch.groups = {static_cast<uint32_t>((n + kTile - 1) / kTile),
                     static_cast<uint32_t>((m + kTile - 1) / kTile), static_cast<uint32_t>(batches)};
  }
  context.emit(std::move(launch));
}

}  // namespace

std::vector<LoweringEntry> gemm_lowerings() { return {{"matmul", lower_matmul}}; }

}  // namespace mg::kernels
