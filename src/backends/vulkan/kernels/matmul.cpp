// Matmul: batched products with optional operand transposes and broadcast batch axes, and the
// half_matmul of f16 operands, on the GEMM that suits the product and the device: the
// cooperative-matrix GEMM (fast precision), gemm_cpu.comp on CPU devices, else gemm.comp; each
// stores through the fused epilogue's store_c (gemm_epilogue.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/gemm_epilogue.hpp"
#include "backends/vulkan/kernels/gemm_workgroup.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

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
    if (operand[axis] != 1)
      text += " + c" + std::to_string(axis + offset) + " * " + glsl_uint(stride);
    stride *= operand[axis];
  }
  return text + ";\n}\n";
}

}  // namespace

MatmulShape matmul_shape(const Graph& graph, const Node& node) {
  const Shape& a_shape = graph.type(node.inputs[0]).shape;
  const Shape& out_shape = node.type.shape;
  MatmulShape shape;
  shape.transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  shape.transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  shape.m = out_shape[out_shape.size() - 2];
  shape.n = out_shape[out_shape.size() - 1];
  shape.k = shape.transpose_a ? a_shape[a_shape.size() - 2] : a_shape[a_shape.size() - 1];
  // A split-K node (ops/k_split.hpp) computes `splits` partial products [splits, batch..., M, N]
  // in one launch: workgroup z runs K slice z / batches of batch entry z % batches.
  shape.split = node.attrs.has("k_splits");
  shape.splits = node.attrs.get_int("k_splits", 1);
  shape.batch_shape = Shape(out_shape.begin() + (shape.split ? 1 : 0), out_shape.end() - 2);
  shape.batches = element_count(shape.batch_shape);
  return shape;
}

namespace {

bool matmul_runs_coop(const MatmulShape& shape, const DeviceTraits& device) {
  return use_coop_gemm(device) &&
         coop_gemm_suits(shape.m, shape.m * shape.n * shape.k * shape.batches, shape.k,
                         shape.transpose_b, device);
}

}  // namespace

bool packed_columns(const Graph& graph, ValueId columns, const DeviceTraits& device) {
  const Node& node = graph.node(columns);
  if (node.op != op::im2col || node.attrs.get_ints("output_size").at(1) % 4 != 0 ||
      images_side_by_side(node.attrs))
    return false;
  // Packed pairs are f16 in memory, which a GEMM of bfloat16 operands would misread.
  if (!device.switches.packed_columns || device.bf16_operands) return false;
  ValueId consumer = kNoValue;
  for (size_t i = static_cast<size_t>(columns) + 1; i < graph.size(); ++i) {
    const std::vector<ValueId>& inputs = graph.nodes()[i].inputs;
    if (std::find(inputs.begin(), inputs.end(), columns) == inputs.end()) continue;
    if (consumer != kNoValue) return false;
    consumer = static_cast<ValueId>(i);
  }
  if (consumer == kNoValue) return false;
  const Node& product = graph.node(consumer);
  if (product.op != op::matmul || product.inputs[0] == columns || product.inputs[1] != columns)
    return false;
  return matmul_runs_coop(matmul_shape(graph, graph.node(consumer)), device) ||
         use_cpu_kernels(device);
}

bool stores_f32_product(const Graph& graph, const Node& node, const DeviceTraits& device) {
  return node.op == op::matmul || (node.op == op::half_matmul && node.type.dtype == DType::f32 &&
                                   !workgroup_gemm_takes_f16_product(graph, node, device));
}

ValueId joined_split_attention(const Graph& graph, const Node& node, const DeviceTraits& device) {
  if (!stores_f32_product(graph, node, device) || device.switches.no_fusion ||
      !device.switches.join_slices)
    return kNoValue;
  const auto source = [&](ValueId value) {
    while (graph.node(value).op == op::reshape) value = graph.node(value).inputs[0];
    return value;
  };
  const ValueId combine = source(node.inputs[0]);
  if (graph.node(combine).op != op::attention_combine || source(node.inputs[1]) == combine ||
      graph.type(combine).dtype != DType::f32)
    return kNoValue;
  // gemm_few_rows.comp, which strict products of few rows run on, reads buffers alone.
  const MatmulShape shape = matmul_shape(graph, node);
  const bool few_rows = !matmul_runs_coop(shape, device) && !use_cpu_kernels(device) &&
                        !shape.split &&
                        few_rows_gemm_suits(shape.m, shape.k, shape.transpose_b, device);
  return few_rows ? kNoValue : combine;
}

namespace {

// Every GEMM kernel stores through store_c (gemm_epilogue.hpp), which applies `epilogue` and
// writes transpose `moved_to`'s value where given.
void emit_matmul(LoweringContext& context, const MatmulEpilogue* epilogue,
                 ValueId moved_to = kNoValue) {
  const Node& node = context.node();
  const Shape& a_shape = context.input_type(0).shape;
  const Shape& b_shape = context.input_type(1).shape;
  const MatmulShape shape = matmul_shape(context.graph(), context.node());
  const auto [m, n, k, splits, batches, split, transpose_a, transpose_b, batch_shape] = shape;
  const int64_t k_slice = split ? k_slice_length(k, splits) : k;

  // f16 operands (half_matmul: both, or one beside an f32 one) are read as f16 and the result
  // stored as f16 where it is f16; they run on cooperative matrices whatever the product's size
  // (passes/half_storage.cpp, passes/half_products.cpp). bf16 operands (both, or one beside an
  // f32 one, in bf16 precision) likewise, into an f32 result.
  const DType a_dtype = context.input_type(0).dtype, b_dtype = context.input_type(1).dtype;
  const bool bfloat16 = a_dtype == DType::bf16 || b_dtype == DType::bf16;
  const bool half_a = is_half_dtype(a_dtype), half_b = is_half_dtype(b_dtype);
  const bool half_operands = half_a || half_b;
  if (bfloat16 && ((a_dtype != b_dtype && (a_dtype == DType::f16 || b_dtype == DType::f16)) ||
                   !context.device().bf16_operands || node.type.dtype == DType::bf16))
    throw Error("internal: " + context.label() +
                " multiplies bf16 operands, which the subgroup GEMM reads (beside each other or an "
                "f32 operand) only in bf16 precision, into an f32 result (the passes that write "
                "it check this)");
  const bool half_result = node.type.dtype == DType::f16;
  const bool coop =
      half_operands ? use_coop_gemm(context.device()) : matmul_runs_coop(shape, context.device());
  if (half_operands && !coop)
    throw Error(context.label() +
                " multiplies f16 operands, which only the cooperative-matrix "
                "GEMM reads, and this session does not run it on '" +
                context.device().name + "'; the f16 storage pass checks this");
  // Only where the loads below are generated: packed_columns asks the same questions.
  const bool packed_b = packed_columns(context.graph(), node.inputs[1], context.device());
  // A split attention's joined result is read from its partials, bound as a.
  const ValueId joined = joined_split_attention(context.graph(), node, context.device());
  const ValueId a_value =
      joined == kNoValue ? node.inputs[0] : context.graph().node(joined).inputs[0];
  const std::string joined_a =
      joined == kNoValue ? std::string() : join_slices_functions(context.graph(), joined);
  if (coop || use_cpu_kernels(context.device())) {
    const std::string t =
        transpose_a ? "k * " + glsl_uint(m) + " + m" : "m * " + glsl_uint(k) + " + k";
    const std::string u =
        transpose_b ? "n * " + glsl_uint(k) + " + k" : "k * " + glsl_uint(n) + " + n";
    // An element of an operand buffer as a float.
    const auto element = [&](const std::string& buffer, const std::string& index, bool half) {
      const std::string read = buffer + "[" + index + "]";
      return half ? "float(" + read + ")" : read;
    };
    const std::string a_read = joined == kNoValue ? element("a", "a_offset(z) + " + t, half_a)
                                                  : "joined_a(a_offset(z) + " + t + ")";
    std::string functions = joined_a + batch_offset_function("a_offset", a_shape, batch_shape) +
                            batch_offset_function("b_offset", b_shape, batch_shape) +
                            "float load_a(uint z, uint m, uint k) { return " + a_read + "; }\n";
    // Packed columns hold element e in half e % 2 of word e / 2 (lower_im2col).
    if (packed_b) {
      functions += vector_buffer_view("b_halves", 1, false, "uint") +
                   "float load_b(uint z, uint k, uint n) {\n  uint e = b_offset(z) + " + u +
                   ";\n  return unpackHalf2x16(b_halves[e / 2u])[e % 2u];\n}\n";
    } else {
      functions += "float load_b(uint z, uint k, uint n) { return " +
                   element("b", "b_offset(z) + " + u, half_b) + "; }\n";
    }
    // Four consecutive elements along an operand's contiguous extent (A's k, or m where A is
    // transposed; B's n, or k where B is transposed), for the cooperative-matrix GEMM's vector
    // loads: with that extent a multiple of 4, a vec4 (or four halves) starts 16-byte (8-byte)
    // aligned and lies wholly inside or outside each edge, whatever the other extents (50
    // action rows, a 113-token prefix). An f16 operand whose contiguous extent is a multiple of
    // 8 is read 8 halves (one uvec4) at a time, likewise.
    const int64_t a_run = transpose_a ? m : k, b_run = transpose_b ? k : n;
    const bool half_a_units = coop && half_a && a_run % 8 == 0;
    const bool half_b_units = coop && half_b && b_run % 8 == 0 && !packed_b;
    const bool vector_a = coop && !half_a_units && a_run % 4 == 0;
    const bool vector_b = coop && !half_b_units && b_run % 4 == 0;
    // `signature` returning the four elements of `operand` (binding `binding`) from `index`, a
    // multiple of 4: one vec4, or four halves unpacked (bfloat16 ones as the upper halves of
    // their f32 bits).
    const auto vector_load = [bfloat16](const std::string& signature, const std::string& operand,
                                        uint32_t binding, bool halves, const std::string& index) {
      const std::string view = operand + (halves ? "_halves4" : "4");
      if (!halves)
        return vector_buffer_view(view, binding, false) + signature + " { return " + view + "[(" +
               index + ") / 4u]; }\n";
      const std::string unpacked =
          bfloat16 ? "vec4(uintBitsToFloat(pairs.x << 16), uintBitsToFloat(pairs.x & 0xFFFF0000u), "
                     "uintBitsToFloat(pairs.y << 16), uintBitsToFloat(pairs.y & 0xFFFF0000u))"
                   : "vec4(unpackHalf2x16(pairs.x), unpackHalf2x16(pairs.y))";
      return vector_buffer_view(view, binding, false, "uvec2") + signature +
             " {\n  uvec2 pairs = " + view + "[(" + index + ") / 4u];\n  return " + unpacked +
             ";\n}\n";
    };
    if (vector_a)
      functions += joined == kNoValue
                       ? vector_load("vec4 load_a4(uint z, uint m, uint k)", "a", 0, half_a,
                                     "a_offset(z) + " + t)
                       : "vec4 load_a4(uint z, uint m, uint k) { return joined_a4(a_offset(z) + " +
                             t + "); }\n";
    if (vector_b)
      functions += vector_load("vec4 load_b4(uint z, uint k, uint n)", "b", 1, packed_b || half_b,
                               "b_offset(z) + " + u);
    if (half_a_units)
      functions += vector_buffer_view("a_units", 0, false, "uvec4") +
                   "uvec4 load_a8(uint z, uint m, uint k) { return a_units[(a_offset(z) + " + t +
                   ") / 8u]; }\n";
    if (half_b_units)
      functions += vector_buffer_view("b_units", 1, false, "uvec4") +
                   "uvec4 load_b8(uint z, uint k, uint n) { return b_units[(b_offset(z) + " + u +
                   ") / 8u]; }\n";
    if (split)
      functions = split_k_functions(functions, batches, k, splits, vector_a, vector_b, half_a_units,
                                    half_b_units);
    Launch bindings;
    bindings.operands = {{"a", a_value, false}, {"b", node.inputs[1], false}};
    functions += matmul_store_function(context.graph(), context.id(), epilogue, bindings, moved_to);
    if (coop) {
      const GeneratedGemm gemm{
          .m = m,
          .n = n,
          .k = k_slice,
          .entries = batches * splits,
          .a_m_contiguous = transpose_a,
          .b_k_contiguous = transpose_b,
          .vector_a = vector_a,
          .vector_b = vector_b,
          // f16 results leave through store_c, which rounds them: an f16 fragment would have
          // B's type, which the KHR rewrite refuses.
          .row_major_c = epilogue == nullptr && !half_result && moved_to == kNoValue,
          .half_a = half_a,
          .half_b = half_b,
          .half_a_units = half_a_units,
          .half_b_units = half_b_units,
          .bfloat16_operands = bfloat16,
          .functions = std::move(functions)};
      emit_coop_gemm(context, gemm, std::move(bindings.operands));
    } else {
      emit_cpu_gemm(context, CpuGemm{m, n, k_slice, batches * splits, std::move(functions)},
                    std::move(bindings.operands));
    }
    return;
  }
  Launch launch;
  launch.label = context.label();
  launch.operands = {{"a", a_value, false}, {"b", node.inputs[1], false}};
  launch.body = batch_offset_function("a_offset", a_shape, batch_shape) +
                batch_offset_function("b_offset", b_shape, batch_shape) +
                matmul_store_function(context.graph(), context.id(), epilogue, launch, moved_to);
  emit_buffer_gemm(context,
                   BufferGemm{.m = m,
                              .n = n,
                              .k = k,
                              .batches = batches,
                              .splits = split ? splits : 0,
                              .transpose_a = transpose_a,
                              .transpose_b = transpose_b,
                              .row_major_c = epilogue == nullptr && moved_to == kNoValue,
                              .joined_a = joined_a},
                   std::move(launch));
}

void lower_matmul(LoweringContext& context) {
  emit_matmul(context, nullptr);
}

}  // namespace

void emit_half_matmul_on_subgroups(LoweringContext& context) {
  emit_matmul(context, nullptr);
}

std::vector<Launch> lower_matmul_with_epilogue(const Graph& graph, ValueId matmul,
                                               const MatmulEpilogue* epilogue, ValueId moved_to,
                                               const DeviceTraits& device, std::string label) {
  LoweringContext context(graph, matmul, device);
  emit_matmul(context, epilogue, moved_to);
  for (Launch& launch : context.launches()) launch.label = label;
  return std::move(context.launches());
}

std::vector<LoweringEntry> gemm_lowerings() {
  return {{op::matmul, lower_matmul}};
}

}  // namespace mg::kernels
