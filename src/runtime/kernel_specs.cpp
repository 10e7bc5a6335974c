#include "runtime/kernel_specs.hpp"

#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/vulkan/kernels/vulkan_target.hpp"

namespace mg::runtime {

ProgramKernels program_kernels(const plan::Program& program) {
  ProgramKernels result;
  // Launches of one kernel: the same source, defines, matrix loads and operand type. Kernel
  // files are the embedded sources' views, the same file at the same address: compared by address
  // rather than by their tens of kilobytes of text.
  std::map<std::tuple<std::string, std::vector<const char*>,
                      std::vector<std::pair<std::string, std::string>>, bool, bool, bool>,
           uint32_t>
      unique;
  std::vector<const plan::PlannedLaunch*> launches;
  for (const plan::PlannedLaunch& planned : program.setup) launches.push_back(&planned);
  for (const plan::PlannedLaunch& planned : program.launches) launches.push_back(&planned);
  result.spec_of_launch.reserve(launches.size());
  for (const plan::PlannedLaunch* planned : launches) {
    const kernels::Launch& launch = vulkan::glsl_launch(planned->launch);
    std::vector<const char*> files;
    files.reserve(launch.files.size());
    for (std::string_view file : launch.files) files.push_back(file.data());
    auto key = std::make_tuple(kernels::buffer_declarations(program.graph, launch) + launch.body,
                               std::move(files), launch.defines, launch.tensor_loads,
                               launch.bf16_operands, launch.bf16_buffers);
    const auto [it, inserted] =
        unique.try_emplace(std::move(key), static_cast<uint32_t>(result.specs.size()));
    if (inserted) {
      gpu::KernelSpec spec;
      spec.label = launch.label;
      spec.source = kernels::launch_source(program.graph, launch);
      spec.defines = launch.defines;
      spec.binding_count = static_cast<uint32_t>(launch.operands.size());
      spec.khr_cooperative_matrix = launch.khr_cooperative_matrix;
      spec.matrix_loads =
          launch.tensor_loads ? gpu::MatrixLoads::tensor_at_element : gpu::MatrixLoads::plain;
      spec.bf16_operands = launch.bf16_operands;
      spec.bf16_buffers = launch.bf16_buffers;
      result.specs.push_back(std::move(spec));
    }
    result.spec_of_launch.push_back(it->second);
  }
  return result;
}

}  // namespace mg::runtime
