#pragma once
// The check that a planned program fits the device before any of it is allocated: a model too
// large for the device fails on one line that says how much it needs against what the device
// has, instead of on whichever allocation happens to fail first.
#include <cstdint>

#include "backends/vulkan/runtime/gpu.hpp"
#include "plan/program.hpp"

namespace mg::gpu {

// The bytes of the device's largest device-local memory heap, 0 where it reports none.
uint64_t largest_device_local_heap(const DeviceInfo& info);

// Throws mg::Error (out_of_memory) when the arenas `program` allocates itself (not the shared
// ones, which exist already) exceed the device's largest device-local memory heap.
void require_heap_for(const DeviceInfo& info, const plan::Program& program);

}  // namespace mg::gpu
