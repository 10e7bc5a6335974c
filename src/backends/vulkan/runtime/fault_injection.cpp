#include "backends/vulkan/runtime/fault_injection.hpp"

#include <atomic>
#include <cstdint>

namespace mg::gpu::detail {

namespace {

std::atomic<int64_t> allocations_left{0};  // the armed allocation fails when this reaches 0
std::atomic<int64_t> submissions_left{0};  // the device is lost when this reaches 0
std::atomic<bool> device_lost{false};

}  // namespace

void arm_injected_faults(const Switches& switches) {
  allocations_left = 0;
  submissions_left = 0;
  device_lost = false;
  if (!switches.inject_fault) return;
  const bool allocation = switches.inject_fault->kind == Switches::InjectedFault::Kind::allocation;
  (allocation ? allocations_left : submissions_left) = switches.inject_fault->at;
}

VkResult injected_allocation_result() {
  if (allocations_left.load() > 0 && --allocations_left == 0) return VK_ERROR_OUT_OF_DEVICE_MEMORY;
  return VK_SUCCESS;
}

VkResult injected_submission_result() {
  if (submissions_left.load() > 0 && --submissions_left == 0) device_lost = true;
  return device_lost ? VK_ERROR_DEVICE_LOST : VK_SUCCESS;
}

}  // namespace mg::gpu::detail
