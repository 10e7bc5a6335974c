#pragma once
// The target of an opened Vulkan device: the traits its capabilities give the compiler (the
// cooperative-matrix shapes the fast kernels use, and their fragment layout, probed on the
// device), for the session that plans a program for it.
#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::vulkan {

// The traits of a device from its capabilities (without the probe), in fast precision where
// `fast_precision`, with bfloat16 operands where also `bf16_operands`.
target::DeviceTraits device_traits(const gpu::DeviceInfo& info, bool fast_precision,
                                   bool bf16_operands);

// The target of `device` with `switches`: its traits, and where the fast kernels run, whether
// their fragments keep the layout the attention kernels are written for (probed on the device).
VulkanTarget device_target(gpu::Device& device, bool fast_precision, bool bf16_operands,
                           const Switches& switches);

}  // namespace mg::vulkan
