#pragma once
// Geometry of a 2-D convolution (NCHW), shared by the reference (src/ops/conv.cpp) and the
// kernels (src/backends/vulkan/kernels/conv.cpp) so that both derive output sizes with the same
// arithmetic.
#include <array>
#include <string_view>

#include "meganeura/graph.hpp"

namespace mg {

struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, in_height = 0, in_width = 0;
  int64_t out_channels = 0, kernel_height = 0, kernel_width = 0, out_height = 0, out_width = 0;
  int64_t groups = 1;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};

  int64_t channels_per_group() const { return in_channels / groups; }
  int64_t outs_per_group() const { return out_channels / groups; }
  Shape input_shape() const { return {batch, in_channels, in_height, in_width}; }
  Shape weight_shape() const {
    return {out_channels, channels_per_group(), kernel_height, kernel_width};
  }
  Shape output_shape() const { return {batch, out_channels, out_height, out_width}; }
  // 1x1 with stride 1 and no padding: each image's channels are already a plain GEMM operand.
  bool is_pointwise() const {
    return kernel_height == 1 && kernel_width == 1 && stride == std::array<int64_t, 2>{1, 1} &&
           padding == std::array<int64_t, 2>{0, 0};
  }
};

// The two-entry (height, width) list attribute `name`, {fallback, fallback} when absent;
// unchecked (infer validates attributes with pair_attr first).
std::array<int64_t, 2> attr_pair(const Attrs& attrs, std::string_view name, int64_t fallback);

// Geometry of conv2d(x [N, C, H, W], w [O, C/groups, KH, KW]) under the node's attributes,
// without checks (infer runs checked_geometry first; references and kernels trust it).
ConvGeometry conv_geometry(const Attrs& attrs, const Shape& x, const Shape& w);

// The columns of im2col and col2im: for every output position (oy, ox) of an OH x OW plane
// (output_size) and tap (c, kh, kw), row oy * stride - padding + kh * dilation of the image
// (likewise for columns); padding and dilation may be negative.
struct ColumnGeometry {
  std::array<int64_t, 2> kernel, stride, padding, dilation, output_size;
};

// The column geometry of an im2col or col2im node's attributes, without checks (infer checks
// them first).
ColumnGeometry column_geometry(const Attrs& attrs);

// Whether an im2col node lays the images' columns side by side, [C * KH * KW, N * OH * OW],
// instead of one matrix per image, [N, C * KH * KW, OH * OW] (attribute images_side_by_side).
bool images_side_by_side(const Attrs& attrs);

}  // namespace mg
