#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::gpu::detail {

// Compiles a kernel to SPIR-V for a Vulkan version (VK_API_VERSION_1_1 to 1_3), optionally
// checking the result with the SPIR-V validator. Thread-safe. Throws mg::Error with the label,
// the defines and the offending source lines.
std::vector<uint32_t> compile_to_spirv(const KernelSpec& spec, uint32_t vulkan_api_version,
                                       bool validate);

// Names the compiler and the target, for cache keys: the same source compiles to the same
// SPIR-V only under the same glslang and target.
std::string compiler_identity(uint32_t vulkan_api_version);

// The text glslang sees: "#version 450", one #define per define, then the source.
std::string full_source(const KernelSpec& spec);

}  // namespace mg::gpu::detail
