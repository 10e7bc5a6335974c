#pragma once
// Geometry of a 2-D pooling window (NCHW), shared by the reference (src/ops/pool.cpp) and the
// kernels (src/backends/vulkan/kernels/pool.cpp) so that both derive output sizes with the same
// arithmetic.
#include <array>

#include "meganeura/graph.hpp"

namespace mg {

struct PoolGeometry {
  int64_t batch = 0, channels = 0, in_height = 0, in_width = 0, out_height = 0, out_width = 0;
  std::array<int64_t, 2> kernel{}, stride{}, padding{};

  Shape output_shape() const { return {batch, channels, out_height, out_width}; }
};

// Geometry of pooling x [N, C, H, W] under the node's kernel, stride (default: the kernel) and
// padding, without checks (infer runs checked_pool_geometry first; references and kernels trust
// it).
PoolGeometry pool_geometry(const Attrs& attrs, const Shape& x);

}  // namespace mg
