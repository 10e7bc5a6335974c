#pragma once
#include <string_view>

#include "backends/vulkan/runtime/vulkan_api.hpp"

namespace mg::gpu::detail {

// Plain words for a VkResult, for messages users read.
std::string_view result_words(VkResult result);

// Throws mg::Error "<what>: <words>" unless `result` is VK_SUCCESS.
void check(VkResult result, std::string_view what);

}  // namespace mg::gpu::detail
