#include "backends/vulkan/runtime/spirv_cooperative_matrix.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "backends/vulkan/runtime/spirv_words.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

using namespace spirv;

enum Use : uint32_t { kMatrixA = 0, kMatrixB = 1, kAccumulator = 2 };
constexpr uint32_t kRowMajor = 0, kColumnMajor = 1;

// What the rewrite needs to know before emitting: the role of every matrix type, the values of
// the boolean constants (the NV column-major operands) and an existing 32-bit unsigned type.
struct ModuleFacts {
  std::map<uint32_t, Use> use_of_type;
  std::map<uint32_t, bool> bool_constants;
  std::optional<uint32_t> uint_type;
};

ModuleFacts gather_facts(std::span<const uint32_t> module) {
  ModuleFacts facts;
  std::map<uint32_t, uint32_t> type_of_value;
  std::vector<uint32_t> matrix_types;
  // (source type, result type) of every conversion: KHR converts only between matrices of one
  // use, so a matrix converted into an A operand is an A matrix too.
  std::vector<std::pair<uint32_t, uint32_t>> conversions;
  const auto assign = [&](uint32_t type, Use use) {
    auto [it, inserted] = facts.use_of_type.emplace(type, use);
    if (!inserted && it->second != use)
      throw Error(
          "internal: a cooperative-matrix type is used in two roles of a multiply-add; the "
          "KHR rewrite needs distinct A, B and accumulator types (different shapes)");
  };
  for_each_instruction(module, [&](const Instruction& instruction) {
    const auto opcode = static_cast<spv::Op>(instruction.opcode);
    bool has_result = false, has_result_type = false;
    spv::HasResultAndType(opcode, &has_result, &has_result_type);
    if (has_result && has_result_type && instruction.operands.size() >= 2)
      type_of_value[instruction.operands[1]] = instruction.operands[0];
    switch (opcode) {
      case spv::OpTypeInt:
        if (instruction.operands[1] == 32 && instruction.operands[2] == 0)
          facts.uint_type = instruction.operands[0];
        break;
      case spv::OpConstantTrue:
      case spv::OpConstantFalse:
        facts.bool_constants[instruction.operands[1]] = opcode == spv::OpConstantTrue;
        break;
      case spv::OpTypeCooperativeMatrixNV:
        matrix_types.push_back(instruction.operands[0]);
        break;
      case spv::OpFConvert:
      case spv::OpSConvert:
      case spv::OpUConvert:
      case spv::OpConvertFToS:
      case spv::OpConvertFToU:
      case spv::OpConvertSToF:
      case spv::OpConvertUToF:
        // Matrix types come before any code, so a conversion between matrices is known here.
        if (std::find(matrix_types.begin(), matrix_types.end(), instruction.operands[0]) !=
            matrix_types.end())
          conversions.emplace_back(type_of_value.at(instruction.operands[2]),
                                   instruction.operands[0]);
        break;
      case spv::OpCooperativeMatrixMulAddNV:
        assign(type_of_value.at(instruction.operands[2]), kMatrixA);
        assign(type_of_value.at(instruction.operands[3]), kMatrixB);
        assign(type_of_value.at(instruction.operands[4]), kAccumulator);
        assign(instruction.operands[0], kAccumulator);
        break;
      default:
        break;
    }
  });
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [source, result] : conversions) {
      const bool source_known = facts.use_of_type.count(source) != 0;
      const bool result_known = facts.use_of_type.count(result) != 0;
      if (source_known && result_known) {
        assign(source, facts.use_of_type.at(result));  // they must agree
      } else if (source_known || result_known) {
        assign(source_known ? result : source,
               facts.use_of_type.at(source_known ? source : result));
        changed = true;
      }
    }
  }
  for (uint32_t type : matrix_types) {
    if (!facts.use_of_type.count(type))
      throw Error(
          "internal: a cooperative-matrix type takes no part in a multiply-add, so its "
          "KHR use (A, B or accumulator) is unknown");
  }
  return facts;
}

// SPV_NV_tensor_addressing and SPV_NV_cooperative_matrix2 enumerants (newer than Debian's headers).
constexpr uint32_t kCapabilityCooperativeMatrixTensorAddressingNv = 5433;
constexpr uint32_t kCapabilityTensorAddressingNv = 5439;
constexpr uint32_t kOpCooperativeMatrixLoadTensorNv = 5367;
constexpr uint32_t kOpTypeTensorLayoutNv = 5370;
constexpr uint32_t kOpTypeTensorViewNv = 5371;
constexpr uint32_t kOpCreateTensorLayoutNv = 5372;
constexpr uint32_t kOpTensorLayoutSetDimensionNv = 5373;
constexpr uint32_t kOpTensorLayoutSetStrideNv = 5374;
constexpr uint32_t kOpTensorLayoutSliceNv = 5375;
constexpr uint32_t kOpCreateTensorViewNv = 5377;
constexpr uint32_t kTensorAddressingTensorView = 0x1;
constexpr uint32_t kClampModeUndefined = 0;

struct MatrixShape {
  uint32_t rows, cols;  // ids of the constants
};

struct AccessChain {
  uint32_t pointer_type, base;
  std::vector<uint32_t> indices;
};

}  // namespace

std::vector<uint32_t> nv_to_khr_cooperative_matrix(std::span<const uint32_t> nv_module) {
  if (nv_module.size() < kHeaderWords || nv_module[0] != spv::MagicNumber)
    throw Error("internal: not a SPIR-V module");
  const ModuleFacts facts = gather_facts(nv_module);

  std::vector<uint32_t> out(nv_module.begin(), nv_module.begin() + kHeaderWords);
  uint32_t bound = nv_module[kBoundWord];
  const auto fresh_id = [&] { return bound++; };
  // uint constants 0, 1 and 2 serve as both the Use and the MemoryLayout operands; they are
  // emitted just before the first matrix type, after the constants that type refers to.
  std::optional<std::array<uint32_t, 3>> small_constants;
  const auto constant = [&](uint32_t value) {
    if (!small_constants) throw Error("internal: cooperative-matrix use before its type");
    return (*small_constants)[value];
  };
  const auto layout = [&](uint32_t column_major_id) {
    auto it = facts.bool_constants.find(column_major_id);
    if (it == facts.bool_constants.end())
      throw Error("internal: a cooperative-matrix load or store has a non-constant layout");
    return constant(it->second ? kColumnMajor : kRowMajor);
  };

  for_each_instruction(nv_module, [&](const Instruction& instruction) {
    const auto& operands = instruction.operands;
    switch (static_cast<spv::Op>(instruction.opcode)) {
      case spv::OpCapability:
        if (operands[0] == spv::CapabilityCooperativeMatrixNV) {
          append_instruction(out, spv::OpCapability, {kCapabilityCooperativeMatrixKhr});
          return;
        }
        break;
      case spv::OpExtension:
        if (literal_string(operands) == "SPV_NV_cooperative_matrix") {
          append_extension(out, "SPV_KHR_cooperative_matrix");
          return;
        }
        break;
      case spv::OpTypeCooperativeMatrixNV:
        if (!small_constants) {
          uint32_t uint_type = 0;
          if (facts.uint_type) {
            uint_type = *facts.uint_type;
          } else {
            uint_type = fresh_id();
            append_instruction(out, spv::OpTypeInt, {uint_type, 32, 0});
          }
          small_constants.emplace();
          for (uint32_t value = 0; value < 3; ++value) {
            (*small_constants)[value] = fresh_id();
            append_instruction(out, spv::OpConstant, {uint_type, (*small_constants)[value], value});
          }
        }
        append_instruction(out, kOpTypeCooperativeMatrixKhr,
                           {operands[0], operands[1], operands[2], operands[3], operands[4],
                            constant(facts.use_of_type.at(operands[0]))});
        return;
      case spv::OpCooperativeMatrixLoadNV:
        // NV: type, result, pointer, stride, column-major [, memory access]
        // KHR: type, result, pointer, layout, stride [, memory operand]
        append_instruction(
            out, kOpCooperativeMatrixLoadKhr,
            {operands[0], operands[1], operands[2], layout(operands[4]), operands[3]},
            operands.subspan(5));
        return;
      case spv::OpCooperativeMatrixStoreNV:
        // NV: pointer, object, stride, column-major [, memory access]
        // KHR: pointer, object, layout, stride [, memory operand]
        append_instruction(out, kOpCooperativeMatrixStoreKhr,
                           {operands[0], operands[1], layout(operands[3]), operands[2]},
                           operands.subspan(4));
        return;
      case spv::OpCooperativeMatrixMulAddNV:
        append_instruction(out, kOpCooperativeMatrixMulAddKhr, {}, operands);
        return;
      case spv::OpCooperativeMatrixLengthNV:
        append_instruction(out, kOpCooperativeMatrixLengthKhr, {}, operands);
        return;
      default:
        break;
    }
    append_instruction(out, instruction.opcode, {}, operands);
  });
  out[kBoundWord] = bound;
  return out;
}

std::vector<uint32_t> khr_loads_to_tensor_loads(std::span<const uint32_t> khr_module,
                                                MatrixLoads loads) {
  const bool from_buffer_start = loads == MatrixLoads::tensor_at_buffer_start;
  if (khr_module.size() < kHeaderWords || khr_module[0] != spv::MagicNumber)
    throw Error("internal: not a SPIR-V module");
  std::map<uint32_t, MatrixShape> matrix_shapes;
  std::map<uint32_t, uint32_t> uint_constants;  // id -> value
  std::map<uint32_t, AccessChain> access_chains;
  std::optional<uint32_t> uint_type, bool_type, false_constant;
  for_each_instruction(khr_module, [&](const Instruction& instruction) {
    const auto& operands = instruction.operands;
    switch (instruction.opcode) {
      case spv::OpTypeInt:
        if (operands[1] == 32 && operands[2] == 0) uint_type = operands[0];
        break;
      case spv::OpTypeBool:
        bool_type = operands[0];
        break;
      case spv::OpConstantFalse:
        false_constant = operands[1];
        break;
      case spv::OpConstant:
        if (uint_type && operands[0] == *uint_type) uint_constants[operands[1]] = operands[2];
        break;
      case kOpTypeCooperativeMatrixKhr:
        matrix_shapes[operands[0]] = {operands[3], operands[4]};
        break;
      case spv::OpAccessChain:
      case spv::OpInBoundsAccessChain:
        access_chains[operands[1]] = {
            operands[0], operands[2], {operands.begin() + 3, operands.end()}};
        break;
      default:
        break;
    }
  });
  if (!uint_type) throw Error("internal: a cooperative-matrix module without a uint type");

  std::vector<uint32_t> out(khr_module.begin(), khr_module.begin() + kHeaderWords);
  uint32_t bound = khr_module[kBoundWord];
  const auto fresh_id = [&] { return bound++; };
  std::map<uint32_t, uint32_t> constant_of_value;
  for (const auto& [id, value] : uint_constants) constant_of_value.emplace(value, id);
  // Constants the rewrite needs but the module lacks are declared with the layout types.
  std::vector<std::pair<uint32_t, uint32_t>> new_constants;  // (id, value)
  const auto uint_constant = [&](uint32_t value) {
    auto [it, inserted] = constant_of_value.emplace(value, 0);
    if (inserted) {
      it->second = fresh_id();
      new_constants.emplace_back(it->second, value);
    }
    return it->second;
  };
  const uint32_t zero = uint_constant(0), one = uint_constant(1), two = uint_constant(2);
  const uint32_t clamp_undefined = uint_constant(kClampModeUndefined);
  const uint32_t layout_type = fresh_id(), view_type = fresh_id();
  std::optional<uint32_t> declared_bool, declared_false;
  if (!bool_type) bool_type = declared_bool = fresh_id();
  if (!false_constant) false_constant = declared_false = fresh_id();
  bool capabilities_added = false, extensions_added = false, types_added = false;

  for_each_instruction(khr_module, [&](const Instruction& instruction) {
    const auto& operands = instruction.operands;
    if (instruction.opcode == spv::OpExtension && !extensions_added) {
      append_extension(out, "SPV_NV_cooperative_matrix2");
      append_extension(out, "SPV_NV_tensor_addressing");
      extensions_added = true;
    }
    if (instruction.opcode == spv::OpFunction && !types_added) {
      if (declared_bool) append_instruction(out, spv::OpTypeBool, {*declared_bool});
      if (declared_false)
        append_instruction(out, spv::OpConstantFalse, {*bool_type, *declared_false});
      for (const auto& [id, value] : new_constants)
        append_instruction(out, spv::OpConstant, {*uint_type, id, value});
      append_instruction(out, kOpTypeTensorLayoutNv, {layout_type, two, clamp_undefined});
      append_instruction(out, kOpTypeTensorViewNv, {view_type, two, *false_constant, one, zero});
      types_added = true;
    }
    if (instruction.opcode == spv::OpCapability && !capabilities_added) {
      append_instruction(out, spv::OpCapability, {kCapabilityTensorAddressingNv});
      append_instruction(out, spv::OpCapability, {kCapabilityCooperativeMatrixTensorAddressingNv});
      capabilities_added = true;
    }
    if (instruction.opcode != kOpCooperativeMatrixLoadKhr) {
      append_instruction(out, instruction.opcode, {}, operands);
      return;
    }
    // KHR: type, result, pointer, layout, stride [, memory operand]
    const uint32_t matrix_type = operands[0], result = operands[1];
    const MatrixShape shape = matrix_shapes.at(matrix_type);
    const auto layout = uint_constants.find(operands[3]);
    if (layout == uint_constants.end())
      throw Error("internal: a cooperative-matrix load has a non-constant layout");
    const bool column_major = layout->second == kColumnMajor;
    const uint32_t stride = operands[4];
    // The stored tensor: rows x cols, or cols x rows read through a transposing view.
    const uint32_t stored_rows = column_major ? shape.cols : shape.rows;
    const uint32_t stored_cols = column_major ? shape.rows : shape.cols;
    uint32_t pointer = operands[2], row_offset = zero, col_offset = zero;
    uint32_t rows_dimension = stored_rows;
    if (from_buffer_start) {
      // The layout covers every row up to the slice's last and whole rows (the stride).
      const auto found = access_chains.find(pointer);
      if (found == access_chains.end())
        throw Error("internal: a cooperative-matrix load's pointer is not an access chain");
      const AccessChain& chain = found->second;
      const uint32_t element = chain.indices.back();
      std::vector<uint32_t> start_indices = chain.indices;
      start_indices.back() = zero;
      pointer = fresh_id();
      append_instruction(out, spv::OpAccessChain, {chain.pointer_type, pointer, chain.base},
                         start_indices);
      row_offset = fresh_id();
      append_instruction(out, spv::OpUDiv, {*uint_type, row_offset, element, stride});
      col_offset = fresh_id();
      append_instruction(out, spv::OpUMod, {*uint_type, col_offset, element, stride});
      rows_dimension = fresh_id();
      append_instruction(out, spv::OpIAdd, {*uint_type, rows_dimension, row_offset, stored_rows});
    }
    const uint32_t created = fresh_id(), sized = fresh_id(), strided = fresh_id(),
                   sliced = fresh_id(), object = fresh_id();
    append_instruction(out, kOpCreateTensorLayoutNv, {layout_type, created});
    append_instruction(
        out, kOpTensorLayoutSetDimensionNv,
        {layout_type, sized, created, rows_dimension, from_buffer_start ? stride : stored_cols});
    append_instruction(out, kOpTensorLayoutSetStrideNv, {layout_type, strided, sized, stride, one});
    append_instruction(
        out, kOpTensorLayoutSliceNv,
        {layout_type, sliced, strided, row_offset, stored_rows, col_offset, stored_cols});
    append_instruction(out, spv::OpUndef, {matrix_type, object});
    std::vector<uint32_t> tail(operands.begin() + 5, operands.end());
    if (tail.empty()) tail.push_back(spv::MemoryAccessMaskNone);
    if (column_major) {
      const uint32_t view = fresh_id();
      append_instruction(out, kOpCreateTensorViewNv, {view_type, view});
      tail.push_back(kTensorAddressingTensorView);
      tail.push_back(view);
    } else {
      tail.push_back(0);
    }
    append_instruction(out, kOpCooperativeMatrixLoadTensorNv,
                       {matrix_type, result, pointer, object, sliced}, tail);
  });
  out[kBoundWord] = bound;
  return out;
}

}  // namespace mg::gpu::detail
