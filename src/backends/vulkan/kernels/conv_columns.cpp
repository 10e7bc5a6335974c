// Convolution columns (passes/im2col.cpp): im2col gathers a convolution's taps into the columns
// of a GEMM operand, col2im sums column gradients back into an image. `width` (4 where OW allows
// and the images are apart, else 1) consecutive output columns of one row per invocation, so
// that the tap's index arithmetic is done once per vec4 store; consecutive invocations take
// consecutive columns, so reads along a row of x and all writes are coalesced.
#include <array>
#include <string>

#include "backends/vulkan/kernels/conv_columns.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"

namespace mg::kernels {

std::string columns_main(int64_t count) {
  return "layout(local_size_x = " + std::to_string(kColumnsLocalSize) +
         ") in;\nvoid main() {\n  uint i = linear_workgroup() * " + glsl_uint(kColumnsLocalSize) +
         " + gl_LocalInvocationID.x;\n  if (i >= " + glsl_uint(count) + ") return;\n";
}

void emit_columns_launch(LoweringContext& context, const std::string& kernel, std::string body,
                         const std::array<std::string, 2>& names, int64_t count) {
  Launch launch;
  launch.label = context.label();
  launch.kernel = kernel;
  launch.body = std::move(body);
  launch.operands = {{names[0], context.node().inputs[0], false}, {names[1], context.id(), true}};
  launch.groups = grid_for(static_cast<uint64_t>(count), kColumnsLocalSize, context.device());
  if (is_half_dtype(context.node().type.dtype)) {
    require_f16_tensors(context.label(), "writes", context.device());
    launch.f16_operands = true;
  }
  context.emit(std::move(launch));
}

namespace {

std::string u(int64_t value) {
  return glsl_uint(value);
}
std::string s(int64_t value) {
  return std::to_string(value);
}

void lower_im2col(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& x = context.input_type(0).shape;
  const auto [kernel, stride, padding, dilation, size] = column_geometry(node.attrs);
  // Side by side, an invocation's four columns could belong to two images: one column each.
  // 16-bit columns (of a 16-bit image) are stored two a word where OW is even, so that a pair
  // never leaves its image's row. bfloat16 values are bit patterns (GLSL here has no bfloat16
  // type): widened as they are read, their bits stored (the rounding keeps a bfloat16 value).
  const bool side_by_side = images_side_by_side(node.attrs);
  const bool bfloat16 = node.type.dtype == DType::bf16;
  const bool half = is_half_dtype(node.type.dtype);
  const int64_t width =
      half ? (size[1] % 2 == 0 ? 2 : 1) : (size[1] % 4 == 0 && !side_by_side ? 4 : 1);
  const int64_t count = node.type.elements() / width;
  // Packed columns (packed_columns): four elements as two words of f16 pairs, element e in half
  // e % 2 of word e / 2.
  const bool packed = packed_columns(context.graph(), context.id(), context.device());
  std::string body = bfloat16 ? std::string(pointwise_functions_glsl()) : std::string();
  if (packed) {
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_columns_halves { uvec2 "
        "columns_halves[]; };\n";
  } else if (width == 4) {
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_columns4 { vec4 "
        "columns4[]; };\n";
  } else if (width == 2) {
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_columns_pairs { uint "
        "columns_pairs[]; };\n";
  }
  body += columns_main(count);
  const int64_t row_units = size[1] / width;
  body += "  uint ox = i % " + u(row_units) + " * " + u(width) + ", oy = i / " + u(row_units) +
          " % " + u(size[0]) + ";\n";
  // tap: the column row (c * KH + kh) * KW + kw, plane: the image's channel n * C + c.
  const int64_t taps = kernel[0] * kernel[1];
  if (side_by_side) {
    // The invocation's first element is i * width.
    const int64_t columns_per_row = x[0] * size[0] * size[1];
    const std::string first = width == 1 ? "i" : "i * " + u(width);
    body += "  uint tap = " + first + " / " + u(columns_per_row) + ", image = " + first + " % " +
            u(columns_per_row) + " / " + u(size[0] * size[1]) + ";\n  uint plane = image * " +
            u(x[1]) + " + tap / " + u(taps) + ";\n";
  } else {
    body +=
        "  uint tap = i / " + u(row_units * size[0]) + ";\n  uint plane = tap / " + u(taps) + ";\n";
  }
  body += "  uint kw = tap % " + u(kernel[1]) + ", kh = tap / " + u(kernel[1]) + " % " +
          u(kernel[0]) + ";\n";
  body += "  int iy = int(oy) * " + s(stride[0]) + " + int(kh) * " + s(dilation[0]) + " - " +
          s(padding[0]) + ";\n  int ix0 = int(ox) * " + s(stride[1]) + " + int(kw) * " +
          s(dilation[1]) + " - " + s(padding[1]) + ";\n";
  body += "  bool row_inside = iy >= 0 && iy < " + s(x[2]) + ";\n  uint row = (plane * " + u(x[2]) +
          " + uint(iy)) * " + u(x[3]) + ";\n";
  body += "  float values[" + std::to_string(width) + "];\n  for (int j = 0; j < " +
          std::to_string(width) + "; ++j) {\n    int ix = ix0 + j * " + s(stride[1]) +
          ";\n    values[j] = row_inside && ix >= 0 && ix < " + s(x[3]) + " ? " +
          (bfloat16 ? "mg_widen_bf16(uint(x[row + uint(ix)]))" : "x[row + uint(ix)]") +
          " : 0.0;\n  }\n";
  if (packed) {
    body +=
        "  columns_halves[i] = uvec2(packHalf2x16(vec2(values[0], values[1])), "
        "packHalf2x16(vec2(values[2], values[3])));\n}\n";
  } else {
    body +=
        width == 4 ? "  columns4[i] = vec4(values[0], values[1], values[2], values[3]);\n}\n"
        : width == 2 && bfloat16
            ? "  columns_pairs[i] = mg_bf16_bits(values[0]) | (mg_bf16_bits(values[1]) << 16);\n}\n"
        : width == 2 ? "  columns_pairs[i] = packHalf2x16(vec2(values[0], values[1]));\n}\n"
        : bfloat16   ? "  columns[i] = uint16_t(mg_bf16_bits(values[0]));\n}\n"
        : half       ? "  columns[i] = float16_t(values[0]);\n}\n"
                     : "  columns[i] = values[0];\n}\n";
  }
  emit_columns_launch(context, "im2col", std::move(body), {"x", "columns"}, count);
}

// col2im(columns): one invocation per `width` consecutive image elements of a row (4 as a vec4
// where W allows and the image is f32, else 1), summing the column elements of the taps that
// reach each: for kernel row kh, the output row oy with oy * S - P + kh * D = y exists when
// y + P - kh * D is a non-negative multiple of S below OH * S (likewise for columns). The loops
// run over constant extents, so the compiler unrolls them and folds the stride tests; the
// element's indices are worked out once for the invocation's elements. Row
// (c * KH + kh) * KW + kw of image n's columns starts at (n * C * KH * KW + row) * plane, or
// side by side at row * N * plane + n * plane.
void lower_col2im(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& image = node.type.shape;
  const auto [kernel, stride, padding, dilation, size] = column_geometry(node.attrs);
  const bool half = node.type.dtype == DType::f16;
  const int64_t width = image[3] % 4 == 0 && !half ? 4 : 1;
  const int64_t row_units = image[3] / width;
  const int64_t count = node.type.elements() / width;
  const int64_t column_plane = size[0] * size[1];
  std::string body;
  if (width == 4)
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_image4 { vec4 image4[]; "
        "};\n";
  body += columns_main(count);
  body += "  uint x0 = i % " + u(row_units) + " * " + u(width) + ", y = i / " + u(row_units) +
          " % " + u(image[2]) + ";\n  uint plane = i / " + u(image[2] * row_units) +
          ";\n  float sums[" + s(width) + "];\n  for (int j = 0; j < " + s(width) +
          "; ++j) sums[j] = 0.0;\n";
  // The first tap row of this channel and the distance between rows.
  std::string row_stride = u(column_plane);
  if (images_side_by_side(node.attrs)) {
    row_stride = u(image[0] * column_plane);
    body += "  uint first_row = plane % " + u(image[1]) + " * " + u(kernel[0] * kernel[1]) +
            ", image_start = plane / " + u(image[1]) + " * " + u(column_plane) + ";\n";
  } else {
    body += "  uint first_row = plane * " + u(kernel[0] * kernel[1]) + ", image_start = 0u;\n";
  }
  // Output coordinate o<name> of position `at` along `dim` for tap k<name>, or `skip` where the
  // tap does not reach it.
  const auto axis = [&](const std::string& name, const std::string& at, int64_t dim,
                        const std::string& skip) {
    const std::string shifted = "t" + name;
    std::string text = "int " + shifted + " = int(" + at + ") + " + s(padding[dim]) + " - k" +
                       name + " * " + s(dilation[dim]) + ";\n";
    text += "if (" + shifted + " < 0" +
            (stride[dim] > 1 ? " || " + shifted + " % " + s(stride[dim]) + " != 0" : "") + ") " +
            skip + ";\n";
    text += "uint o" + name + " = uint(" + shifted + ") / " + u(stride[dim]) + ";\nif (o" + name +
            " >= " + u(size[dim]) + ") " + skip + ";\n";
    return text;
  };
  body += "  for (int ky = 0; ky < " + s(kernel[0]) + "; ++ky) {\n" +
          axis("y", "y", 0, "continue") + "  for (int kx = 0; kx < " + s(kernel[1]) +
          "; ++kx) {\n  uint tap_start = (first_row + uint(ky) * " + u(kernel[1]) +
          " + uint(kx)) * " + row_stride + " + image_start + oy * " + u(size[1]) +
          ";\n  for (int j = 0; j < " + s(width) + "; ++j) {\n" +
          axis("x", "x0 + uint(j)", 1, "continue") +
          "  sums[j] += float(columns[tap_start + ox]);\n  }\n  }\n  }\n";
  if (width == 4) {
    body += "  image4[i] = vec4(sums[0], sums[1], sums[2], sums[3]);\n}\n";
  } else {
    body += std::string("  image[i] = ") + (half ? "float16_t(sums[0])" : "sums[0]") + ";\n}\n";
  }
  emit_columns_launch(context, "col2im", std::move(body), {"columns", "image"}, count);
}

}  // namespace

std::vector<LoweringEntry> columns_lowerings() {
  return {{op::im2col, lower_im2col}, {op::col2im, lower_col2im}};
}

}  // namespace mg::kernels
