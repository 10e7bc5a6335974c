#include "backends/vulkan/runtime/spirv_bfloat16.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "backends/vulkan/runtime/spirv_words.hpp"
#include "ir/half.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

using namespace spirv;

// SPV_KHR_bfloat16 enumerants (newer than Debian's headers).
constexpr uint32_t kCapabilityBFloat16TypeKhr = 5116;
constexpr uint32_t kCapabilityBFloat16CooperativeMatrixKhr = 5118;
constexpr uint32_t kFpEncodingBFloat16Khr = 0;

// The instructions SPV_KHR_bfloat16 lets touch bfloat16 values (its validation rules): constant
// creation, memory, function, conversion and composite instructions, the matrix operations,
// OpSelect, OpPhi and OpReturnValue; no arithmetic, comparison or extended instruction.
bool takes_bfloat16(uint32_t opcode) {
  static const std::set<uint32_t> allowed = {
      spv::OpUndef,
      spv::OpConstant,
      spv::OpConstantComposite,
      spv::OpConstantNull,
      spv::OpSpecConstant,
      spv::OpSpecConstantComposite,
      spv::OpFunction,
      spv::OpFunctionParameter,
      spv::OpFunctionCall,
      spv::OpVariable,
      spv::OpLoad,
      spv::OpStore,
      spv::OpCopyMemory,
      spv::OpCopyMemorySized,
      spv::OpAccessChain,
      spv::OpInBoundsAccessChain,
      spv::OpPtrAccessChain,
      spv::OpInBoundsPtrAccessChain,
      spv::OpVectorExtractDynamic,
      spv::OpVectorInsertDynamic,
      spv::OpVectorShuffle,
      spv::OpCompositeConstruct,
      spv::OpCompositeExtract,
      spv::OpCompositeInsert,
      spv::OpCopyObject,
      spv::OpTranspose,
      spv::OpCopyLogical,
      spv::OpConvertFToU,
      spv::OpConvertFToS,
      spv::OpConvertSToF,
      spv::OpConvertUToF,
      spv::OpFConvert,
      spv::OpBitcast,
      spv::OpSelect,
      spv::OpPhi,
      spv::OpReturnValue,
      kOpCooperativeMatrixLoadKhr,
      kOpCooperativeMatrixStoreKhr,
      kOpCooperativeMatrixMulAddKhr,
      kOpCooperativeMatrixLengthKhr,
  };
  return allowed.count(opcode) != 0;
}

// Storage classes through which a kernel exchanges values with the host or other kernels: their
// f16 would be real f16 data, which a bfloat16 reading would misread.
bool is_external_storage(uint32_t storage_class) {
  return storage_class == spv::StorageClassStorageBuffer ||
         storage_class == spv::StorageClassUniform ||
         storage_class == spv::StorageClassPushConstant ||
         storage_class == spv::StorageClassPhysicalStorageBuffer ||
         storage_class == spv::StorageClassInput || storage_class == spv::StorageClassOutput;
}

// The f16 scalar type, and every type that holds it.
struct HalfTypes {
  std::optional<uint32_t> scalar;
  std::set<uint32_t> holding;
};

HalfTypes find_half_types(std::span<const uint32_t> module, HalfBuffers buffers) {
  HalfTypes types;
  const auto holds = [&](uint32_t type) { return types.holding.count(type) != 0; };
  for_each_instruction(module, [&](const Instruction& instruction) {
    const auto& operands = instruction.operands;
    switch (instruction.opcode) {
      case spv::OpTypeFloat:
        if (operands[1] == 16) {
          if (operands.size() > 2)
            throw Error("internal: the kernel already has a 16-bit float with an encoding");
          types.scalar = operands[0];
          types.holding.insert(operands[0]);
        }
        break;
      case spv::OpTypeVector:
      case spv::OpTypeMatrix:
      case spv::OpTypeArray:
      case spv::OpTypeRuntimeArray:
      case kOpTypeCooperativeMatrixKhr:
        if (holds(operands[1])) types.holding.insert(operands[0]);
        break;
      case spv::OpTypeCooperativeMatrixNV:
        if (holds(operands[1]))
          throw Error("internal: bfloat16 operands need the KHR cooperative matrices");
        break;
      case spv::OpTypeStruct:
      case spv::OpTypeFunction:
        if (std::any_of(operands.begin() + 1, operands.end(), holds))
          types.holding.insert(operands[0]);
        break;
      case spv::OpTypePointer:
        if (holds(operands[2])) {
          if (is_external_storage(operands[1]) && buffers == HalfBuffers::refused)
            throw Error(
                "internal: the kernel reads or writes f16 memory, which bfloat16 operands would "
                "misread");
          types.holding.insert(operands[0]);
        }
        break;
      default:
        break;
    }
  });
  return types;
}

// Throws where an instruction outside takes_bfloat16 has a result of, or reads a value of, a
// type holding the f16 scalar.
void check_uses(std::span<const uint32_t> module, const HalfTypes& types) {
  std::map<uint32_t, uint32_t> type_of_value;
  for_each_instruction(module, [&](const Instruction& instruction) {
    const auto opcode = static_cast<spv::Op>(instruction.opcode);
    bool has_result = false, has_result_type = false;
    spv::HasResultAndType(opcode, &has_result, &has_result_type);
    if (!has_result || !has_result_type || instruction.operands.size() < 2) return;
    const auto& operands = instruction.operands;
    type_of_value[operands[1]] = operands[0];
    if (takes_bfloat16(opcode)) return;
    const auto refuse = [&] {
      throw Error("internal: SPIR-V opcode " + std::to_string(instruction.opcode) +
                  " computes with f16 values, which bfloat16 operands do not allow");
    };
    if (types.holding.count(operands[0])) refuse();
    for (size_t k = 2; k < operands.size(); ++k) {
      // OpExtInst's third operand is the instruction's number, a literal.
      if (opcode == spv::OpExtInst && k == 3) continue;
      const auto found = type_of_value.find(operands[k]);
      if (found != type_of_value.end() && types.holding.count(found->second)) refuse();
    }
  });
}

}  // namespace

std::vector<uint32_t> f16_operands_to_bf16(std::span<const uint32_t> khr_module,
                                           HalfBuffers buffers) {
  if (khr_module.size() < kHeaderWords || khr_module[0] != spv::MagicNumber)
    throw Error("internal: not a SPIR-V module");
  const HalfTypes types = find_half_types(khr_module, buffers);
  if (!types.scalar) throw Error("internal: no f16 type to make bfloat16");
  check_uses(khr_module, types);

  std::vector<uint32_t> out(khr_module.begin(), khr_module.begin() + kHeaderWords);
  out.reserve(khr_module.size() + 16);
  bool capabilities_added = false, extension_added = false;
  for_each_instruction(khr_module, [&](const Instruction& instruction) {
    const auto& operands = instruction.operands;
    // Capabilities come first in a module, then extensions.
    if (!capabilities_added && instruction.opcode != spv::OpCapability) {
      append_instruction(out, spv::OpCapability, {kCapabilityBFloat16TypeKhr});
      append_instruction(out, spv::OpCapability, {kCapabilityBFloat16CooperativeMatrixKhr});
      capabilities_added = true;
    }
    if (!extension_added && instruction.opcode != spv::OpCapability &&
        instruction.opcode != spv::OpExtension) {
      append_extension(out, "SPV_KHR_bfloat16");
      extension_added = true;
    }
    if (instruction.opcode == spv::OpTypeFloat && operands[0] == *types.scalar) {
      append_instruction(out, spv::OpTypeFloat, {operands[0], 16, kFpEncodingBFloat16Khr});
      return;
    }
    if ((instruction.opcode == spv::OpConstant || instruction.opcode == spv::OpSpecConstant) &&
        operands[0] == *types.scalar) {
      const uint16_t half = static_cast<uint16_t>(operands[2] & 0xffffu);
      append_instruction(out, instruction.opcode,
                         {operands[0], operands[1], uint32_t{bf16_bits(f16_value(half))}});
      return;
    }
    append_instruction(out, instruction.opcode, {}, operands);
  });
  return out;
}

}  // namespace mg::gpu::detail
