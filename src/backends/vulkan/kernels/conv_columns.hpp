#pragma once
// The one-invocation-per-element kernels of the convolutions' rewrites: im2col and col2im
// (conv_columns.cpp) and Winograd's transforms (conv_winograd.cpp).
#include <array>
#include <cstdint>
#include <string>

#include "backends/vulkan/kernels/lowering.hpp"

namespace mg::kernels {

constexpr uint32_t kColumnsLocalSize = 256;

// The start of such a kernel's main(): invocation i of `count`, returning past the last.
std::string columns_main(int64_t count);

// Emits `kernel` (`body`, `count` invocations) reading the node's input as names[0] and writing
// its result as names[1]; f16 operands where its result is f16.
void emit_columns_launch(LoweringContext& context, const std::string& kernel, std::string body,
                         const std::array<std::string, 2>& names, int64_t count);

}  // namespace mg::kernels
