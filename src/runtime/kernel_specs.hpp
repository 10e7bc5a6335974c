#pragma once
// The kernels a planned program needs, each once: what a Session asks the device to make
// pipelines of, and which of them every launch runs.
#include <cstdint>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"
#include "plan/program.hpp"

namespace mg::runtime {

struct ProgramKernels {
  // Distinct kernels (source, defines and matrix loads), in the order of their first launch.
  std::vector<gpu::KernelSpec> specs;
  // The spec each launch runs: the setup's launches first, then every run's.
  std::vector<uint32_t> spec_of_launch;
};

ProgramKernels program_kernels(const plan::Program& program);

}  // namespace mg::runtime
