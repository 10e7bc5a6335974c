#pragma once
// Debian 12's glslang (12.0) compiles GL_NV_cooperative_matrix but not
// GL_KHR_cooperative_matrix, which AMD and Intel drivers implement. The two SPIR-V extensions
// differ only in encoding, so kernels are written once against the NV extension and their
// SPIR-V is rewritten for KHR-only devices.
#include <cstdint>
#include <span>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::gpu::detail {

// Rewrites a module using SPV_NV_cooperative_matrix into the same module using
// SPV_KHR_cooperative_matrix: the capability and extension, the matrix types (which gain a Use,
// inferred from their role in the multiply-adds: A, B or accumulator, and carried through
// conversions, which keep the use), loads and stores (the
// column-major flag becomes a memory layout), multiply-adds and lengths. Throws mg::Error when
// a matrix type has no role or two roles (give A and B different shapes) or when the
// column-major flag is not a constant.
std::vector<uint32_t> nv_to_khr_cooperative_matrix(std::span<const uint32_t> nv_module);

// Rewrites every cooperative-matrix load of a KHR module (nv_to_khr_cooperative_matrix's output)
// into an SPV_NV_tensor_addressing load of the same matrix (`loads` says where its layout
// starts; not MatrixLoads::plain): a two-dimensional tensor layout with the load's stride, read
// through a transposing view where the load was column-major. Throws mg::Error when a load's
// layout is not a constant or, from the buffer start, its pointer not an access chain.
std::vector<uint32_t> khr_loads_to_tensor_loads(std::span<const uint32_t> khr_module,
                                                MatrixLoads loads);

}  // namespace mg::gpu::detail
