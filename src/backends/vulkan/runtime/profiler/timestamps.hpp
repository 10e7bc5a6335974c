#pragma once
#include <vector>

#include "backends/vulkan/runtime/command_recorder.hpp"

namespace mg::gpu::detail {

// Per-dispatch times of the last submission of a profiled recording (empty otherwise).
std::vector<DispatchTiming> read_timings(VkDevice device, const Recording& recording,
                                         double timestamp_period_ns, uint32_t valid_bits);

}  // namespace mg::gpu::detail
