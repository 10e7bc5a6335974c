#include "backends/vulkan/kernels/lowering.hpp"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>
#include <unordered_map>

#include "backends/vulkan/kernels/embedded_sources.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

const std::unordered_map<std::string_view, LoweringFunction>& lowering_table() {
  static const auto table = [] {
    std::unordered_map<std::string_view, LoweringFunction> entries;
    for (const auto& family :
         {pointwise_lowerings(), layout_lowerings(), reduction_lowerings(), gemm_lowerings(),
          workgroup_gemm_lowerings(), conv_lowerings(), columns_lowerings(), winograd_lowerings(),
          pool_lowerings(), norm_lowerings(), attention_lowerings(), loss_lowerings()}) {
      for (const LoweringEntry& entry : family) entries.emplace(entry.op, entry.lower);
    }
    return entries;
  }();
  return table;
}

const char* glsl_element_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::i32:
      return "int";
    case DType::u32:
      return "uint";
    case DType::f16:
      return "float16_t";
    default:
      return nullptr;
  }
}

// Shared by every kernel: 2-D grids for large launches (see grid_for), and LOAD_ROW4, elements
// d .. d + 3 of the float row at `start` of a buffer as a vec4, zero past `extent` (d < extent).
constexpr std::string_view kPrelude = R"glsl(
uint linear_workgroup() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }
#define LOAD_ROW4(buffer, start, d, extent)                     \
  vec4(buffer[(start) + (d)],                                  \
       (d) + 1u < (extent) ? buffer[(start) + (d) + 1u] : 0.0, \
       (d) + 2u < (extent) ? buffer[(start) + (d) + 2u] : 0.0, \
       (d) + 3u < (extent) ? buffer[(start) + (d) + 3u] : 0.0)
)glsl";

}  // namespace

void require_f16_tensors(const std::string& label, const std::string& does,
                         const DeviceTraits& device) {
  if (device.f16_tensors) return;
  throw Error(label + " " + does +
              " an f16 tensor, which needs f16 storage buffers and f16 arithmetic; '" +
              device.name + "' lacks them: keep the graph's tensors f32 there");
}

std::string buffer_declarations(const Graph& graph, const Launch& launch) {
  std::string text;
  if (launch.f16_operands)
    text +=
        "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
        "#extension GL_EXT_shader_16bit_storage : require\n";
  for (size_t k = 0; k < launch.operands.size(); ++k) {
    const Operand& operand = launch.operands[k];
    const DType dtype = graph.type(operand.value).dtype;
    // A bf16 value is its bit pattern, except in a kernel whose f16 type becomes bfloat16.
    const char* element = dtype == DType::bf16 ? (launch.bf16_buffers ? "float16_t" : "uint16_t")
                                               : glsl_element_type(dtype);
    if (!element || (is_half_dtype(dtype) && !launch.f16_operands)) {
      throw Error(launch.label + ": operand '" + operand.name + "' has dtype " +
                  std::string(dtype_name(dtype)) +
                  ", which the strict f32 kernels do not support yet");
    }
    text += "layout(std430, set = 0, binding = " + std::to_string(k) + ") ";
    text += operand.write ? "buffer " : "readonly buffer ";
    text += "buffer_" + operand.name + " { " + element + " " + operand.name + "[]; };\n";
  }
  text += kPrelude;
  return text;
}

std::array<uint32_t, 3> grid_for(uint64_t count, uint32_t local_size, const DeviceTraits& device) {
  const uint64_t groups = std::max<uint64_t>(1, (count + local_size - 1) / local_size);
  const uint64_t limit = device.max_workgroup_count_x;
  if (groups <= limit) return {static_cast<uint32_t>(groups), 1, 1};
  const uint64_t rows = (groups + limit - 1) / limit;
  return {static_cast<uint32_t>(limit), static_cast<uint32_t>(rows), 1};
}

std::array<uint32_t, 3> tiled_grid(const std::string& label, int64_t columns, int64_t tile_columns,
                                   int64_t rows, int64_t tile_rows, int64_t entries,
                                   const DeviceTraits& device) {
  const int64_t groups_x = (columns + tile_columns - 1) / tile_columns;
  const int64_t groups_y = (rows + tile_rows - 1) / tile_rows;
  const int64_t limit = device.max_workgroup_count_x;
  if (groups_x > limit || groups_y > limit || entries > limit) {
    throw Error(label + ": grid " + std::to_string(groups_x) + " x " + std::to_string(groups_y) +
                " x " + std::to_string(entries) + " exceeds the device's workgroup count limit " +
                std::to_string(limit));
  }
  return {static_cast<uint32_t>(groups_x), static_cast<uint32_t>(groups_y),
          static_cast<uint32_t>(entries)};
}

bool is_companion_op(std::string_view op) {
  return is_attention_companion_op(op) || op == op::winograd_grad_tiles;
}

bool is_companion_producer_op(std::string_view op) {
  return op == op::scaled_dot_product_attention || op == op::attention_combine ||
         op == op::attention_grad_k || op == op::winograd_tiles;
}

bool can_write_companion(const Graph& graph, ValueId producer, ValueId companion,
                         const DeviceTraits& device) {
  if (graph.node(companion).op == op::winograd_grad_tiles)
    return can_pair_winograd_tiles(graph, producer, companion);
  return can_write_attention_companion(graph, producer, companion, device);
}

std::vector<Launch> lower_with_companions(const Graph& graph, ValueId producer,
                                          const std::vector<ValueId>& companions,
                                          const DeviceTraits& device,
                                          const AttentionForwardFusion* fused) {
  if (graph.node(producer).op == op::winograd_tiles)
    return lower_winograd_tiles_pair(graph, producer, companions.at(0), device);
  return lower_attention_with_companions(graph, producer, companions, device, fused);
}

std::vector<Launch> lower_node(const Graph& graph, ValueId id, const DeviceTraits& device) {
  const Node& node = graph.node(id);
  const auto& table = lowering_table();
  auto it = table.find(node.op);
  if (it == table.end()) {
    throw Error("op '" + node.op + "' (%" + std::to_string(id) + ", " + type_string(node.type) +
                ") has no GPU kernel for " + device.name);
  }
  LoweringContext context(graph, id, device);
  it->second(context);
  return std::move(context.launches());
}

std::vector<std::string> lowered_ops() {
  std::vector<std::string> names;
  for (const auto& [op, unused] : lowering_table()) names.emplace_back(op);
  std::sort(names.begin(), names.end());
  return names;
}

std::string launch_source(const Graph& graph, const Launch& launch) {
  std::string source = buffer_declarations(graph, launch) + launch.body;
  for (std::string_view file : launch.files) source += file;
  return source;
}

std::string_view kernel_source(std::string_view file_name) {
  for (const EmbeddedSource& source : embedded_sources()) {
    if (source.file_name == file_name) return source.text;
  }
  throw Error("internal: no embedded kernel named " + std::string(file_name));
}

void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard lock(mutex);
  if (warned.insert(message).second) std::cerr << "meganeura: " << message << "\n";
}

}  // namespace mg::kernels
