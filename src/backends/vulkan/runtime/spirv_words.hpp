#pragma once
// Reading and writing SPIR-V modules word by word, for the rewrites of compiled kernels
// (spirv_cooperative_matrix.cpp, spirv_bfloat16.cpp).
#define SPV_ENABLE_UTILITY_CODE
#include <glslang/SPIRV/spirv.hpp>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/error.hpp"

namespace mg::gpu::detail::spirv {

constexpr size_t kHeaderWords = 5;
constexpr size_t kBoundWord = 3;

// SPV_KHR_cooperative_matrix enumerants (newer than the SPIR-V headers Debian 12 ships).
constexpr uint32_t kCapabilityCooperativeMatrixKhr = 6022;
constexpr uint32_t kOpTypeCooperativeMatrixKhr = 4456;
constexpr uint32_t kOpCooperativeMatrixLoadKhr = 4457;
constexpr uint32_t kOpCooperativeMatrixStoreKhr = 4458;
constexpr uint32_t kOpCooperativeMatrixMulAddKhr = 4459;
constexpr uint32_t kOpCooperativeMatrixLengthKhr = 4460;

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

inline std::string_view literal_string(std::span<const uint32_t> words) {
  const char* text = reinterpret_cast<const char*>(words.data());
  return std::string_view(text, strnlen(text, words.size() * 4));
}

inline void append_instruction(std::vector<uint32_t>& out, uint32_t opcode,
                               std::initializer_list<uint32_t> operands,
                               std::span<const uint32_t> tail = {}) {
  out.push_back(static_cast<uint32_t>((1 + operands.size() + tail.size()) << 16) | opcode);
  out.insert(out.end(), operands);
  out.insert(out.end(), tail.begin(), tail.end());
}

inline void append_extension(std::vector<uint32_t>& out, std::string_view name) {
  std::vector<uint32_t> words((name.size() + 4) / 4, 0);
  std::memcpy(words.data(), name.data(), name.size());
  append_instruction(out, spv::OpExtension, {}, words);
}

}  // namespace mg::gpu::detail::spirv
