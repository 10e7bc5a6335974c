#include "ops/pool_geometry.hpp"

#include <vector>

namespace mg {

PoolGeometry pool_geometry(const Attrs& attrs, const Shape& x) {
  PoolGeometry g;
  const std::vector<int64_t>& kernel = attrs.get_ints("kernel");
  const std::vector<int64_t> stride = attrs.get_ints("stride", kernel);
  const std::vector<int64_t> padding = attrs.get_ints("padding", {0, 0});
  g.kernel = {kernel[0], kernel[1]};
  g.stride = {stride[0], stride[1]};
  g.padding = {padding[0], padding[1]};
  g.batch = x[0];
  g.channels = x[1];
  g.in_height = x[2];
  g.in_width = x[3];
  const auto extent = [](int64_t in, int64_t pad, int64_t kernel_size, int64_t step) {
    const int64_t span = in + 2 * pad - kernel_size;
    return span < 0 ? 0 : span / step + 1;
  };
  g.out_height = extent(g.in_height, g.padding[0], g.kernel[0], g.stride[0]);
  g.out_width = extent(g.in_width, g.padding[1], g.kernel[1], g.stride[1]);
  return g;
}

}  // namespace mg
