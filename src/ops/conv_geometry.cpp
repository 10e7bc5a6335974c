#include "ops/conv_geometry.hpp"

#include <vector>

namespace mg {

std::array<int64_t, 2> attr_pair(const Attrs& attrs, std::string_view name, int64_t fallback) {
  const std::vector<int64_t> values = attrs.get_ints(name, {fallback, fallback});
  return {values[0], values[1]};
}

ConvGeometry conv_geometry(const Attrs& attrs, const Shape& x, const Shape& w) {
  ConvGeometry g;
  g.stride = attr_pair(attrs, "stride", 1);
  g.padding = attr_pair(attrs, "padding", 0);
  g.dilation = attr_pair(attrs, "dilation", 1);
  g.groups = attrs.get_int("groups", 1);
  g.batch = x[0];
  g.in_channels = x[1];
  g.in_height = x[2];
  g.in_width = x[3];
  g.out_channels = w[0];
  g.kernel_height = w[2];
  g.kernel_width = w[3];
  // A kernel wider than the padded input has no output (division would round -1 up to 0).
  const auto extent = [](int64_t in, int64_t pad, int64_t dilation, int64_t kernel,
                         int64_t stride) {
    const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
  };
  g.out_height = extent(g.in_height, g.padding[0], g.dilation[0], g.kernel_height, g.stride[0]);
  g.out_width = extent(g.in_width, g.padding[1], g.dilation[1], g.kernel_width, g.stride[1]);
  return g;
}

ColumnGeometry column_geometry(const Attrs& attrs) {
  return {.kernel = attr_pair(attrs, "kernel", 1),
          .stride = attr_pair(attrs, "stride", 1),
          .padding = attr_pair(attrs, "padding", 0),
          .dilation = attr_pair(attrs, "dilation", 1),
          .output_size = attr_pair(attrs, "output_size", 1)};
}

bool images_side_by_side(const Attrs& attrs) {
  return attrs.get_int("images_side_by_side", 0) != 0;
}

}  // namespace mg
