#include "backends/vulkan/runtime/device_target.hpp"

#include <algorithm>
#include <optional>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_workgroup.hpp"
#include "backends/vulkan/runtime/coop_fragment_layout.hpp"

namespace mg::vulkan {
namespace {

// A shape the fast GEMM is written for: `operands` A 16 x 16, B 16 x `columns`, f32
// accumulator.
bool has_coop_shape(const gpu::DeviceCaps& caps, bool khr, gpu::ScalarType operands,
                    uint32_t columns) {
  return std::any_of(
      caps.coop_matrix.begin(), caps.coop_matrix.end(), [&](const gpu::CoopMatrixConfig& config) {
        return config.khr == khr && config.m == 16 && config.n == columns && config.k == 16 &&
               config.a == operands && config.b == operands && config.c == gpu::ScalarType::f32 &&
               config.result == gpu::ScalarType::f32;
      });
}

// Whether the device runs the workgroup GEMM's `block` form (kernels/gemm_workgroup.hpp) on
// `operands` (f16 or bf16): operands x operands + f32 on the form's invocations, with
// granularities that divide the form's accumulator and its 64-deep steps.
bool has_workgroup_coop(const gpu::DeviceCaps& caps, const kernels::WorkgroupGemmBlock& block,
                        gpu::ScalarType operands = gpu::ScalarType::f16) {
  const gpu::WorkgroupCoopMatrixCaps& workgroup = caps.workgroup_coop_matrix;
  return workgroup.available && caps.storage_f16 &&
         workgroup.max_workgroup_invocations >= block.invocations &&
         std::any_of(workgroup.configs.begin(), workgroup.configs.end(),
                     [&](const gpu::WorkgroupCoopMatrixConfig& config) {
                       return config.a == operands && config.b == operands &&
                              config.c == gpu::ScalarType::f32 &&
                              config.result == gpu::ScalarType::f32 &&
                              config.workgroup_invocations == block.invocations &&
                              block.accumulator_rows() % config.m_granularity == 0 &&
                              block.n % config.n_granularity == 0 &&
                              kernels::kWorkgroupGemmBlockK % config.k_granularity == 0;
                     });
}

// Whether the device runs the block MEGANEURA_WORKGROUP_BLOCK forces: on f16 operands, on
// bfloat16 ones where the workgroup GEMM takes them too, and through tensor layouts where it
// splits its rows (DeviceTraits::workgroup_forced_block).
bool runs_forced_workgroup_block(const gpu::DeviceCaps& caps, const target::DeviceTraits& traits,
                                 const Switches::WorkgroupBlock& forced) {
  const kernels::WorkgroupGemmBlock block = kernels::forced_workgroup_block(forced);
  return traits.workgroup_coop_matrix_f16 && has_workgroup_coop(caps, block) &&
         (!block.split_rows || traits.workgroup_tensor_loads) &&
         (!traits.workgroup_coop_matrix_bf16 ||
          has_workgroup_coop(caps, block, gpu::ScalarType::bf16));
}

}  // namespace

target::DeviceTraits device_traits(const gpu::DeviceInfo& info, bool fast_precision,
                                   bool bf16_operands) {
  target::DeviceTraits traits;
  traits.subgroup_size = info.caps.subgroup_size;
  traits.max_shared_memory_bytes = info.caps.max_shared_memory_bytes;
  traits.max_workgroup_invocations = info.caps.max_workgroup_invocations;
  if (info.caps.compute_units > 0) traits.compute_units = info.caps.compute_units;
  traits.max_workgroup_count_x = info.caps.max_workgroup_count[0];
  traits.cpu = info.kind == gpu::DeviceKind::cpu;
  traits.max_storage_buffers = info.caps.max_storage_buffers_per_stage;
  traits.name = info.name;
  traits.coop_matrix_f16_nv =
      info.caps.shader_f16 && has_coop_shape(info.caps, false, gpu::ScalarType::f16, 8);
  traits.coop_matrix_f16_khr =
      info.caps.shader_f16 && has_coop_shape(info.caps, true, gpu::ScalarType::f16, 8);
  // The kernels' f16 conversions become bfloat16 ones; the f16 type itself must still compile.
  traits.coop_matrix_bf16_khr = info.caps.shader_f16 && info.caps.coop_matrix_bf16 &&
                                has_coop_shape(info.caps, true, gpu::ScalarType::bf16, 16);
  traits.workgroup_coop_matrix_f16 = has_workgroup_coop(info.caps, kernels::kWholeBlock);
  traits.workgroup_tensor_loads = traits.workgroup_coop_matrix_f16 &&
                                  info.caps.workgroup_coop_matrix.tensor_addressing &&
                                  has_workgroup_coop(info.caps, kernels::kSplitRowsBlock);
  traits.workgroup_narrow_blocks = traits.workgroup_coop_matrix_f16 &&
                                   has_workgroup_coop(info.caps, kernels::kNarrowBlock) &&
                                   has_workgroup_coop(info.caps, kernels::kNarrowerBlock) &&
                                   has_workgroup_coop(info.caps, kernels::kLowNarrowBlock) &&
                                   has_workgroup_coop(info.caps, kernels::kLowNarrowerBlock);
  // Every form the f16 flags above grant, in bfloat16 as well.
  const auto has_bf16_form = [&](bool granted, const kernels::WorkgroupGemmBlock& block) {
    return !granted || has_workgroup_coop(info.caps, block, gpu::ScalarType::bf16);
  };
  traits.workgroup_coop_matrix_bf16 =
      traits.coop_matrix_bf16_khr && traits.workgroup_coop_matrix_f16 &&
      has_bf16_form(true, kernels::kWholeBlock) &&
      has_bf16_form(traits.workgroup_tensor_loads, kernels::kSplitRowsBlock) &&
      has_bf16_form(traits.workgroup_narrow_blocks, kernels::kNarrowBlock) &&
      has_bf16_form(traits.workgroup_narrow_blocks, kernels::kNarrowerBlock) &&
      has_bf16_form(traits.workgroup_narrow_blocks, kernels::kLowNarrowBlock) &&
      has_bf16_form(traits.workgroup_narrow_blocks, kernels::kLowNarrowerBlock);
  traits.f16_tensors = info.caps.shader_f16 && info.caps.storage_f16;
  traits.fast_precision = fast_precision;
  traits.bf16_operands = bf16_operands;
  return traits;
}

VulkanTarget device_target(gpu::Device& device, bool fast_precision, bool bf16_operands,
                           const Switches& switches) {
  target::DeviceTraits traits = device_traits(device.info(), fast_precision, bf16_operands);
  traits.switches = switches;
  if (const std::optional<Switches::WorkgroupBlock>& forced = switches.workgroup_block) {
    traits.workgroup_forced_block =
        runs_forced_workgroup_block(device.info().caps, traits, *forced);
    if (!traits.workgroup_forced_block && traits.workgroup_coop_matrix_f16)
      kernels::warn_once("ignoring MEGANEURA_WORKGROUP_BLOCK=" + std::to_string(forced->m) + "," +
                         std::to_string(forced->n) + "," + std::to_string(forced->invocations) +
                         "," + (forced->split_rows ? "1" : "0") + ": '" + traits.name +
                         "' has no workgroup-scope matrices of that form (meganeura devices "
                         "--verbose lists its forms)");
  }
  if (kernels::use_coop_gemm(traits)) {
    const std::optional<gpu::FragmentLayout> layout =
        gpu::probe_fragment_layout(device, kernels::coop_wants_khr(traits));
    traits.quad_row_fragments = layout && gpu::is_quad_row_layout(*layout);
  }
  return VulkanTarget(std::move(traits));
}

}  // namespace mg::vulkan
