#include "vk/spirv_cooperative_matrix.hpp"

#define SPV_ENABLE_UTILITY_CODE
#include <glslang/SPIRV/spirv.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

// SPV_KHR_cooperative_matrix enumerants (newer than the SPIR-V headers Debian 12 ships).
constexpr uint32_t kCapabilityCooperativeMatrixKhr = 6022;
constexpr uint32_t kOpTypeCooperativeMatrixKhr = 4456;
constexpr uint32_t kOpCooperativeMatrixLoadKhr = 4457;
constexpr uint32_t kOpCooperativeMatrixStoreKhr = 4458;
constexpr uint32_t kOpCooperativeMatrixMulAddKhr = 4459;
constexpr uint32_t kOpCooperativeMatrixLengthKhr = 4460;
enum Use : uint32_t { kMatrixA = 0, kMatrixB = 1, kAccumulator = 2 };
constexpr uint32_t kRowMajor = 0, kColumnMajor = 1;
constexpr size_t kHeaderWords = 5;
constexpr size_t kBoundWord = 3;

struct Instruction {
  uint32_t opcode;
  std::span<const uint32_t> operands;  // the words after the opcode word
};

template <typename Visit>
void for_each_instruction(std::span<const uint32_t> module, Visit visit) {
  for (size_t at = kHeaderWords; at < module.size();) {
    const uint32_t words = module[at] >> 16;
    if (words == 0 || at + words > module.size())
      throw Error("internal: malformed SPIR-V at word " + std::to_string(at));
    visit(Instruction{module[at] & 0xffffu, module.subspan(at + 1, words - 1)});
    at += words;
  }
}

std::string_view literal_string(std::span<const uint32_t> words) {
  const char* text = reinterpret_cast<const char*>(words.data());
  return std::string_view(text, strnlen(text, words.size() * 4));
}

void append_instruction(std::vector<uint32_t>& out, uint32_t opcode,
                        std::initializer_list<uint32_t> operands,
                        std::span<const uint32_t> tail = {}) {
  out.push_back(static_cast<uint32_t>((1 + operands.size() + tail.size()) << 16) | opcode);
  out.insert(out.end(), operands);
  out.insert(out.end(), tail.begin(), tail.end());
}

void append_extension(std::vector<uint32_t>& out, std::string_view name) {
  std::vector<uint32_t> words((name.size() + 4) / 4, 0);
  std::memcpy(words.data(), name.data(), name.size());
  append_instruction(out, spv::OpExtension, {}, words);
}

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

}  // namespace mg::gpu::detail
