#pragma once
// What the compiler knows of the device a program is built for: its limits and the matrix units
// it has, and the session's switches. A backend fills it from the device it opened (the Vulkan
// backend: backends/vulkan/runtime/device_target.cpp); tests describe devices they do not have.
#include <cstdint>
#include <string>

#include "meganeura/switches.hpp"

namespace mg::target {

// The compute units that the tile, block and split rules plan their workgroups for when the
// driver does not report the count: the count of the GPU the rules were tuned on.
constexpr int64_t kAssumedComputeUnits = 132;

struct DeviceTraits {
  uint32_t subgroup_size = 32;
  int64_t compute_units = kAssumedComputeUnits;
  uint32_t max_shared_memory_bytes = 16384;
  uint32_t max_workgroup_invocations = 256;
  uint32_t max_workgroup_count_x = 65535;
  uint32_t max_storage_buffers = 16;  // bound by one kernel
  bool cpu = false;  // a CPU implementation (Lavapipe): prefer kernels without barriers
  // Subgroup-scope matrices with f16 A (16 x 16) and B (16 x 8) and f32 accumulators (the shape
  // the fast GEMM uses), in either of the two forms a driver may offer (Vulkan's NV and KHR
  // cooperative matrices); fast_precision asks for them (Precision::fast).
  bool coop_matrix_f16_nv = false;
  bool coop_matrix_f16_khr = false;
  // Workgroup-scope matrices for f16 A and B and f32 accumulators on 256 invocations, in
  // multiples of 128 x 256 x 64 (the workgroup GEMM's whole block), with f16 storage.
  bool workgroup_coop_matrix_f16 = false;
  // Those matrices, also in multiples of 128 x 128 x 64, loaded through tensor layouts, which
  // the workgroup GEMM's faster block needs.
  bool workgroup_tensor_loads = false;
  // Those matrices also in blocks 224 wide on 256 invocations and 112 wide on 128, 128 or 64
  // rows high (multiples of 64 x 224 x 64 and 64 x 112 x 64), whose columns divide planes that
  // no 128 or 256 divides: 3136 and 784, ResNet's 56 x 56 and 28 x 28.
  bool workgroup_narrow_blocks = false;
  // The device runs the block that MEGANEURA_WORKGROUP_BLOCK forces (switches.workgroup_block):
  // its workgroup-scope matrices on the block's invocations, in the block's accumulator and
  // 64-deep steps, on every operand type the workgroup GEMM multiplies here, through tensor
  // layouts where the block splits its rows.
  bool workgroup_forced_block = false;
  // The subgroup matrices keep their elements in the layout the fast attention kernels are
  // written for (NVIDIA's, probed on the device): those then keep their scores in registers.
  bool quad_row_fragments = false;
  // f16 storage and f16 arithmetic, which f16 tensors need (passes/half_storage.cpp).
  bool f16_tensors = false;
  bool fast_precision = false;
  // bfloat16 A (16 x 16) and B (16 x 16, the shape devices offer for them) with f32
  // accumulators through the KHR extension (VK_KHR_shader_bfloat16's cooperative matrices);
  // bf16_operands asks for them (with fast_precision: Precision::bf16), and the GEMMs then run on
  // cooperative matrices only where the device has them (attention keeps f16 operands).
  bool coop_matrix_bf16_khr = false;
  // Workgroup-scope matrices for bfloat16 A and B and f32 accumulators in every form the
  // workgroup GEMM takes for f16 ones on this device (the flags above), and bfloat16
  // cooperative matrices: the workgroup GEMM then multiplies bf16 operands too.
  bool workgroup_coop_matrix_bf16 = false;
  bool bf16_operands = false;
  std::string name = "device";
  // The session's switches (docs/SWITCHES.md): kill switches, forced routes and tuning
  // overrides of the choices made for this device.
  Switches switches;
};

}  // namespace mg::target
