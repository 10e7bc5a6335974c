#pragma once
// MEGANEURA_INJECT_FAULT (Switches::inject_fault): the tests' way to make an allocation fail or
// the device be lost on Lavapipe, where neither happens by itself. A device arms it as it opens;
// the memory and queue code ask before each allocation and submission.
#include <vulkan/vulkan.h>

#include "meganeura/switches.hpp"

namespace mg::gpu::detail {

// Restarts the counts for a device that opens with `switches` (nothing armed without the switch).
void arm_injected_faults(const Switches& switches);
// VK_ERROR_OUT_OF_DEVICE_MEMORY for the armed allocation, else VK_SUCCESS.
VkResult injected_allocation_result();
// VK_ERROR_DEVICE_LOST from the armed submission on, else VK_SUCCESS.
VkResult injected_submission_result();

}  // namespace mg::gpu::detail
