#pragma once
// Where a subgroup's cooperative-matrix fragments keep their elements: which row and column of
// the matrix component e of lane l holds. Vulkan leaves this to the implementation; kernels that
// work on a fragment's elements in registers (the fast attention forward's softmax) are written
// for one layout and run only where a probe of the device finds it.
#include <array>
#include <cstdint>
#include <optional>

#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::gpu {

struct FragmentElement {
  uint8_t row = 0, col = 0;
};

// The elements of one lane: a 16 x 16 f16 A fragment's 8, a 16 x 8 f32 accumulator's 4.
struct FragmentLayout {
  std::array<std::array<FragmentElement, 8>, 32> a;
  std::array<std::array<FragmentElement, 4>, 32> accumulator;
};

// Loads a 16 x 16 f16 A fragment and a 16 x 8 f32 accumulator whose elements encode their own
// positions and reads back each lane's components, through the NV extension or (`khr`) the
// rewrite to KHR. Nothing when the device has no 32-wide subgroups or the kernel cannot run, or
// when the components do not cover each element once.
std::optional<FragmentLayout> probe_fragment_layout(Device& device, bool khr);

// The layout NVIDIA's driver gives both extensions (found by the probe, docs/KERNELS.md): lane l
// holds rows l / 4 and l / 4 + 8 and the two adjacent columns 2 (l % 4), 2 (l % 4) + 1 of each
// 8-column half. Accumulator components 0, 1 lie in the upper row, 2, 3 in the lower; A components
// 0-3 in the upper row (columns 0-7, then 8-15), 4-7 in the lower. The fast attention forward's
// softmax in registers is written for it.
bool is_quad_row_layout(const FragmentLayout& layout);

}  // namespace mg::gpu
