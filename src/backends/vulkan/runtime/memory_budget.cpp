#include "backends/vulkan/runtime/memory_budget.hpp"

#include <algorithm>

#include "backends/vulkan/runtime/memory.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu {

uint64_t largest_device_local_heap(const DeviceInfo& info) {
  uint64_t heap = 0;
  for (const MemoryHeap& candidate : info.caps.heaps)
    if (candidate.device_local) heap = std::max(heap, candidate.bytes);
  return heap;
}

void require_heap_for(const DeviceInfo& info, const plan::Program& program) {
  uint64_t persistent = 0, transient = 0;
  for (const plan::Arena& arena : program.arenas) {
    if (arena.kind == plan::ArenaKind::persistent) persistent += arena.bytes;
    if (arena.kind == plan::ArenaKind::transient) transient += arena.bytes;
  }
  const uint64_t heap = largest_device_local_heap(info);
  if (heap == 0 || persistent + transient <= heap) return;
  throw Error("the program needs " + detail::human_bytes(persistent + transient) +
                  " of device memory (" + detail::human_bytes(persistent) + " persistent, " +
                  detail::human_bytes(transient) + " transient) but " + info.name + " has " +
                  detail::human_bytes(heap) +
                  " in its largest device-local heap: use a smaller batch, sequence or model",
              Error::Kind::out_of_memory);
}

}  // namespace mg::gpu
