// Kernels of round_to_f16, round_to_bf16, widen_f16 and half_matmul: the workgroup GEMM's
// operands and product (gemm_workgroup.hpp), and the conversions around f32 kernels for f16
// and bf16 tensors (passes/half_storage.cpp).
#include "backends/vulkan/kernels/gemm_workgroup.hpp"

#include <optional>
#include <string>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "ir/op_names.hpp"

namespace mg::kernels {
namespace {

// Four values an invocation, read and written as one vector through views of both buffers (the
// planner aligns every value to 256 bytes), the last invocation converting the 0-3 values past
// the last whole vector one by one: 16-byte reads run much closer to the memory's bandwidth than
// scalar ones. The conversion to f16 rounds to nearest even; the one from f16 is exact.
constexpr const char* kConvertF16 = R"glsl(
layout(std430, set = 0, binding = 0) readonly buffer x_quads { X_QUAD x4[]; };
layout(std430, set = 0, binding = 1) writeonly buffer y_quads { Y_QUAD y4[]; };
layout(local_size_x = 256) in;
void main() {
  const uint quad = linear_workgroup() * 256u + gl_LocalInvocationID.x;
  if (quad < COUNT / 4u) {
    y4[quad] = Y_QUAD(x4[quad]);
  } else if (quad == COUNT / 4u) {
    for (uint i = quad * 4u; i < COUNT; ++i) y[i] = Y_SCALAR(x[i]);
  }
}
)glsl";

// round_to_bf16 (f32 -> bfloat16), four values an invocation as kConvertF16, in integer
// arithmetic on the f32 bits (GLSL here has no bfloat16 type): adding just under half of the
// dropped range plus the kept lowest bit rounds to nearest with ties to even, a carry into the
// exponent giving the next value (infinity past the top); a NaN keeps its sign and stays a
// quiet NaN (ir/half.hpp's bf16_bits).
constexpr const char* kConvertBf16 = R"glsl(
layout(std430, set = 0, binding = 0) readonly buffer x_quads { vec4 x4[]; };
layout(std430, set = 0, binding = 1) writeonly buffer y_quads { uvec2 y4[]; };
layout(local_size_x = 256) in;
uint bf16_bits(float value) {
  const uint bits = floatBitsToUint(value);
  if (isnan(value)) return (bits >> 16) | 0x40u;
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}
void main() {
  const uint quad = linear_workgroup() * 256u + gl_LocalInvocationID.x;
  if (quad < COUNT / 4u) {
    const vec4 v = x4[quad];
    y4[quad] = uvec2(bf16_bits(v.x) | (bf16_bits(v.y) << 16), bf16_bits(v.z) | (bf16_bits(v.w) << 16));
  } else if (quad == COUNT / 4u) {
    for (uint i = quad * 4u; i < COUNT; ++i) y[i] = uint16_t(bf16_bits(x[i]));
  }
}
)glsl";

void lower_bf16_rounding(LoweringContext& context) {
  const int64_t count = element_count(context.node().type.shape);
  require_f16_tensors(context.label(), "converts into", context.device());
  Launch launch;
  launch.label = context.label();
  launch.kernel = context.node().op;
  launch.body = kConvertBf16;
  launch.defines = {{"COUNT", glsl_uint(count)}};
  launch.operands = {{"x", context.node().inputs[0], false}, {"y", context.id(), true}};
  launch.f16_operands = true;
  launch.groups = grid_for(static_cast<uint64_t>(count / 4 + 1), 256, context.device());
  context.emit(std::move(launch));
}

// round_to_f16 (f32 -> f16) and widen_f16 (f16 -> f32).
void lower_f16_conversion(LoweringContext& context) {
  const bool to_f16 = context.node().type.dtype == DType::f16;
  const int64_t count = element_count(context.node().type.shape);
  require_f16_tensors(context.label(), to_f16 ? "converts into" : "converts from",
                      context.device());
  Launch launch;
  launch.label = context.label();
  launch.kernel = context.node().op;
  launch.body = kConvertF16;
  launch.defines = {{"COUNT", glsl_uint(count)},
                    {"X_QUAD", to_f16 ? "vec4" : "f16vec4"},
                    {"Y_QUAD", to_f16 ? "f16vec4" : "vec4"},
                    {"Y_SCALAR", to_f16 ? "float16_t" : "float"}};
  launch.operands = {{"x", context.node().inputs[0], false}, {"y", context.id(), true}};
  launch.f16_operands = true;
  launch.groups = grid_for(static_cast<uint64_t>(count / 4 + 1), 256, context.device());
  context.emit(std::move(launch));
}

// The elements between the matrices an operand of shape `operand` gives consecutive entries of
// a product over `batch_shape`: a matrix an entry, or 0 for one matrix every entry shares;
// nothing where it broadcasts along some batch axes only.
std::optional<int64_t> entry_stride(const Shape& operand, const Shape& batch_shape) {
  const Shape operand_batch(operand.begin(), operand.end() - 2);
  if (element_count(operand_batch) == 1) return 0;
  if (operand_batch != batch_shape) return std::nullopt;
  return operand[operand.size() - 2] * operand[operand.size() - 1];
}

void lower_half_matmul(LoweringContext& context) {
  const Node& node = context.node();
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const bool transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  const MatmulShape shape = matmul_shape(context.graph(), node);
  const int64_t m = shape.m, n = shape.n, k = shape.k;
  const bool bfloat16 = context.input_type(0).dtype == DType::bf16;
  if (!workgroup_gemm_takes_f16_product(context.graph(), node, context.device())) {
    if (use_coop_gemm(context.device())) return emit_half_matmul_on_subgroups(context);
    throw Error(context.label() + " (" + std::to_string(m) + " x " + std::to_string(n) + " x " +
                std::to_string(k) + ") multiplies f16 operands on cooperative matrices, which '" +
                context.device().name +
                "' does not run in this session (fast precision and the coop GEMM's switches); "
                "the passes that write it (workgroup GEMM, f16 storage) check this");
  }
  // workgroup_gemm_takes_f16_product found a block.
  const WorkgroupGemmBlock block = *workgroup_gemm_block(m, n, context.device());
  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm_workgroup_coopmat";
  launch.files = {kernel_source("gemm_workgroup.comp")};
  launch.defines = {
      {"GEMM_M", glsl_uint(m)},
      {"GEMM_N", glsl_uint(n)},
      {"GEMM_K", glsl_uint(k)},
      {"BLOCK_M", std::to_string(block.m)},
      {"BLOCK_N", std::to_string(block.n)},
      {"BLOCK_K", std::to_string(kWorkgroupGemmBlockK)},
      {"A_TRANSPOSED", transpose_a ? "1" : "0"},
      {"B_TRANSPOSED", transpose_b ? "1" : "0"},
      {"ODD_STEPS", (k / kWorkgroupGemmBlockK) % 2 == 1 ? "1" : "0"},
      {"F16_RESULT", is_half_dtype(node.type.dtype) ? "1" : "0"},
      {"SPLIT_ROWS", block.split_rows ? "1" : "0"},
      {"INVOCATIONS", std::to_string(block.invocations)},
      {"A_BATCH_STRIDE", glsl_uint(*entry_stride(context.input_type(0).shape, shape.batch_shape))},
      {"B_BATCH_STRIDE", glsl_uint(*entry_stride(context.input_type(1).shape, shape.batch_shape))},
      {"C_BATCH_STRIDE", glsl_uint(m * n)}};
  launch.operands = {
      {"a", node.inputs[0], false}, {"b", node.inputs[1], false}, {"c", context.id(), true}};
  launch.f16_operands = true;
  // The kernel is written for f16 operands; bf16 ones are the same module with its f16 type
  // made bfloat16, the operands' buffers included.
  launch.bf16_operands = bfloat16;
  launch.bf16_buffers = bfloat16;
  // Workgroup scope is a KHR matrix property: the NV extension has only subgroups.
  launch.khr_cooperative_matrix = true;
  launch.tensor_loads = block.split_rows;
  launch.groups = tiled_grid(launch.label, n, block.n, m, block.m, shape.batches, context.device());
  context.emit(std::move(launch));
}

}  // namespace

// The roundings read M K + K N values, the product does M N K multiply-adds: the product must
// be long enough along both M and N for its speed to pay for them. With the rates of the
// workgroup and subgroup kernels and of a rounding on the GPU the rule was tuned on, the two
// break even where M N / (M + N) is somewhat over 300; the bound, half the harmonic mean of M and
// N, is 512 (SmolLM's lm_head, 128 x 49152, stays below it and on the subgroup kernel).
constexpr int64_t kMinHalfHarmonicMean = 512;

std::optional<WorkgroupGemmBlock> workgroup_gemm_block(int64_t m, int64_t n,
                                                       const DeviceTraits& device) {
  if (const std::optional<Switches::WorkgroupBlock>& forced = device.switches.workgroup_block;
      forced && device.workgroup_forced_block && m % forced->m == 0 && n % forced->n == 0)
    return forced_workgroup_block(*forced);
  if (device.workgroup_tensor_loads && m % kSplitRowsBlock.m == 0 && n % kSplitRowsBlock.n == 0)
    return kSplitRowsBlock;
  if (m % kWholeBlock.m == 0 && n % kWholeBlock.n == 0) return kWholeBlock;
  if (!device.workgroup_narrow_blocks) return std::nullopt;
  const bool tall = m % kNarrowBlock.m == 0;
  if (!tall && m % kLowNarrowBlock.m != 0) return std::nullopt;
  if (n % kNarrowBlock.n == 0) return tall ? kNarrowBlock : kLowNarrowBlock;
  if (n % kNarrowerBlock.n == 0) return tall ? kNarrowerBlock : kLowNarrowerBlock;
  return std::nullopt;
}

bool workgroup_gemm_suits(int64_t m, int64_t n, int64_t k, const DeviceTraits& device,
                          OperandsIn operands, int64_t batches) {
  if (!use_coop_gemm(device) || !device.workgroup_coop_matrix_f16) return false;
  // With bfloat16 operands, f32 ones are rounded to bfloat16 in memory (rounding them to f16
  // would lose bfloat16's range), which needs the device's bfloat16 workgroup-scope matrices.
  if (device.bf16_operands && operands != OperandsIn::f16 && !device.workgroup_coop_matrix_bf16)
    return false;
  const std::optional<WorkgroupGemmBlock> block = workgroup_gemm_block(m, n, device);
  if (!block || k % kWorkgroupGemmBlockK != 0) return false;
  if (const std::optional<bool> forced = device.switches.workgroup_gemm) return *forced;
  const int64_t blocks = (m / block->m) * (n / block->n) * batches;
  if (blocks < device.compute_units) return false;
  return operands == OperandsIn::f16 || m * n >= kMinHalfHarmonicMean * (m + n);
}

namespace {

// Whether the product `node` of f16 operands (or bf16 ones, in bf16 precision on a device with
// their workgroup-scope matrices) takes the workgroup GEMM, whatever its result.
bool takes_f16_operands(const Graph& graph, const Node& node, const DeviceTraits& device) {
  // It loads both operands as f16 (bf16) matrices: a product of an f16 and an f32 operand (half
  // products) stays on the subgroup GEMM.
  const DType a = graph.type(node.inputs[0]).dtype, b = graph.type(node.inputs[1]).dtype;
  const bool f16 = a == DType::f16 && b == DType::f16;
  const bool bf16 = a == DType::bf16 && b == DType::bf16 && device.bf16_operands &&
                    device.workgroup_coop_matrix_bf16;
  if (node.attrs.has("k_splits") || !(f16 || bf16)) return false;
  const MatmulShape shape = matmul_shape(graph, node);
  const int64_t m = shape.m, n = shape.n, k = shape.k, batches = shape.batches;
  // Each operand a matrix an entry or one for all: the kernel offsets whole matrices by the
  // entry. Its offsets are 32-bit.
  if (!entry_stride(graph.type(node.inputs[0]).shape, shape.batch_shape) ||
      !entry_stride(graph.type(node.inputs[1]).shape, shape.batch_shape) ||
      batches > static_cast<int64_t>(device.max_workgroup_count_x))
    return false;
  constexpr int64_t kOffsetLimit = int64_t{1} << 32;
  if (m * n * batches >= kOffsetLimit || m * k * batches >= kOffsetLimit ||
      k * n * batches >= kOffsetLimit)
    return false;
  return workgroup_gemm_suits(m, n, k, device, OperandsIn::f16, batches);
}

// Whether the block of `node`'s product stores its accumulator as f16: not where the
// accumulator's rows or columns are a step's depth, whose f16 matrix would be B's type
// (BLOCK_K x BLOCK_N) or A's (rows x BLOCK_K), which the KHR form cannot give two uses.
bool block_stores_f16(const Graph& graph, const Node& node, const DeviceTraits& device) {
  const MatmulShape shape = matmul_shape(graph, node);
  const std::optional<WorkgroupGemmBlock> block = workgroup_gemm_block(shape.m, shape.n, device);
  return block && block->accumulator_rows() != kWorkgroupGemmBlockK &&
         block->n != kWorkgroupGemmBlockK;
}

}  // namespace

bool workgroup_gemm_takes_f16_product(const Graph& graph, const Node& node,
                                      const DeviceTraits& device) {
  return takes_f16_operands(graph, node, device) &&
         (!is_half_dtype(node.type.dtype) || block_stores_f16(graph, node, device));
}

bool workgroup_gemm_writes_half_result(const Graph& graph, const Node& node,
                                       const DeviceTraits& device) {
  return takes_f16_operands(graph, node, device) && block_stores_f16(graph, node, device);
}

namespace {

// Whether the workgroup GEMM reads the 16-bit images and columns of the convolution routes below
// in this session's format: f16, or bfloat16 with bfloat16 operands (which must not lose f32's
// range to f16), which needs the device's bfloat16 workgroup-scope matrices.
bool reads_convolution_operands(const DeviceTraits& device) {
  return !device.bf16_operands || device.workgroup_coop_matrix_bf16;
}

}  // namespace

bool images_side_by_side_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                              const DeviceTraits& device) {
  if (!reads_convolution_operands(device)) return false;
  const std::optional<bool> forced = device.switches.columns_side_by_side;
  if (batch < 2 || (forced && !*forced)) return false;
  if (!forced && plane >= kWidestSubgroupBlockColumns) return false;
  return workgroup_gemm_suits(m, batch * plane, k, device, OperandsIn::f16);
}

bool half_columns_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                       const DeviceTraits& device) {
  const std::optional<bool> forced = device.switches.half_columns;
  if (!reads_convolution_operands(device) || (forced && !*forced) ||
      device.switches.columns_side_by_side == false)
    return false;
  if (batch < 2 && !forced) return false;
  return workgroup_gemm_suits(m, batch * plane, k, device, OperandsIn::f16);
}

bool half_images_suit(int64_t m, int64_t k, int64_t batch, int64_t plane,
                      const DeviceTraits& device) {
  if (!reads_convolution_operands(device) || device.switches.half_images == false ||
      images_side_by_side_suit(m, k, batch, plane, device))
    return false;
  return workgroup_gemm_suits(m, plane, k, device, OperandsIn::f16, batch);
}

std::vector<LoweringEntry> workgroup_gemm_lowerings() {
  return {{op::round_to_f16, lower_f16_conversion},
          {op::round_to_bf16, lower_bf16_rounding},
          {op::widen_f16, lower_f16_conversion},
          {op::half_matmul, lower_half_matmul}};
}

}  // namespace mg::kernels
