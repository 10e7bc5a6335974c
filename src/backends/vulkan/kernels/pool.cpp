// Pooling and resampling (NCHW), one thread per result element (the max-pool gradient given the
// window maxima: per cell of stride_h x stride_w elements). The backward ops are gathers:
// each input element sums the gradients of the output pixels that read it, recomputing which
// ones do, so every result is written once in a fixed order (deterministic, no atomics).
#include <algorithm>
#include <array>
#include <cmath>

#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "ops/pool_geometry.hpp"

namespace mg::kernels {
namespace {

constexpr uint32_t kLocalSize = 256;

std::string u(int64_t value) {
  return glsl_uint(value);
}
std::string s(int64_t value) {
  return std::to_string(value);
}

// Emits `functions` + main() running `body` once per invocation `i` of `count`.
void emit_invocations(LoweringContext& context, const std::string& functions,
                      const std::string& body, int64_t count, std::vector<Operand> operands) {
  Launch launch;
  launch.label = context.label();
  launch.kernel = "pool";
  launch.body = functions + "layout(local_size_x = " + std::to_string(kLocalSize) +
                ") in;\nvoid main() {\n  uint i = linear_workgroup() * " + u(kLocalSize) +
                " + gl_LocalInvocationID.x;\n  if (i >= " + u(count) + ") return;\n" + body + "}\n";
  launch.operands = std::move(operands);
  launch.groups = grid_for(static_cast<uint64_t>(count), kLocalSize, context.device());
  context.emit(std::move(launch));
}

// Emits `functions` + main() running `body` once per element of the node's result, with
// `plane`, `row` and `col` its coordinates in [planes, rows, cols] and `i` its flat index.
void emit_elementwise(LoweringContext& context, const std::string& functions,
                      const std::string& body, std::vector<Operand> operands) {
  const Shape& shape = context.node().type.shape;
  const std::string coordinates = "  uint col = i % " + u(shape[3]) + ";\n  uint row = (i / " +
                                  u(shape[3]) + ") % " + u(shape[2]) + ";\n  uint plane = i / " +
                                  u(shape[2] * shape[3]) + ";\n";
  emit_invocations(context, functions, coordinates + body, element_count(shape),
                   std::move(operands));
}

// The flat index of output window (oh, ow) of `plane`, where the caller has declared them.
std::string window_index(const PoolGeometry& p) {
  return "(plane * " + u(p.out_height) + " + oh) * " + u(p.out_width) + " + ow";
}

// GLSL loop over the in-bounds taps (int ih, iw) of output window (oh, ow), row-major.
std::string window_loop(const PoolGeometry& p, const std::string& oh, const std::string& ow,
                        const std::string& inner) {
  return "  for (uint kh = 0u; kh < " + u(p.kernel[0]) + "; ++kh) {\n    int ih = int(" + oh +
         " * " + u(p.stride[0]) + " + kh) - " + s(p.padding[0]) +
         ";\n    if (ih < 0 || ih >= " + s(p.in_height) +
         ") continue;\n    for (uint kw = 0u; kw < " + u(p.kernel[1]) +
         "; ++kw) {\n      int iw = int(" + ow + " * " + u(p.stride[1]) + " + kw) - " +
         s(p.padding[1]) + ";\n      if (iw < 0 || iw >= " + s(p.in_width) + ") continue;\n" +
         inner + "    }\n  }\n";
}

// GLSL loop over the output windows (oh, ow) that contain input pixel (row, col).
std::string windows_containing(const PoolGeometry& p, const std::string& inner) {
  std::string text;
  const std::array<std::string, 2> names{"oh", "ow"};
  const std::array<std::string, 2> coordinates{"row", "col"};
  const std::array<int64_t, 2> extents{p.out_height, p.out_width};
  for (int axis = 0; axis < 2; ++axis) {
    const std::string& name = names[axis];
    // Window o covers [o * S - P, o * S - P + K - 1]; the first one reaching this pixel is
    // ceil((pixel + P - K + 1) / S), computed only for a positive numerator.
    text += "  int " + name + "_reach = int(" + coordinates[axis] + ") + " +
            s(p.padding[axis] - p.kernel[axis] + 1) + ";\n";
    text += "  uint " + name + "_first = " + name + "_reach <= 0 ? 0u : uint(" + name +
            "_reach + " + s(p.stride[axis] - 1) + ") / " + u(p.stride[axis]) + ";\n";
    text += "  uint " + name + "_last = min(" + u(extents[axis] - 1) + ", (" + coordinates[axis] +
            " + " + u(p.padding[axis]) + ") / " + u(p.stride[axis]) + ");\n";
  }
  text += "  for (uint oh = oh_first; oh <= oh_last; ++oh) {\n";
  text += "    for (uint ow = ow_first; ow <= ow_last; ++ow) {\n" + inner + "    }\n  }\n";
  return text;
}

void lower_max_pool(LoweringContext& context) {
  const Node& node = context.node();
  const PoolGeometry p = pool_geometry(node.attrs, context.input_type(0).shape);
  // Strict > keeps the first maximum in row-major window order, like the reference.
  const std::string body =
      "  float best = 0.0;\n  bool found = false;\n" +
      window_loop(p, "row", "col",
                  "      float value = x[(plane * " + u(p.in_height) + " + uint(ih)) * " +
                      u(p.in_width) +
                      " + uint(iw)];\n      if (!found || value > best) { best = value; found "
                      "= true; }\n") +
      "  y[i] = best;\n";
  emit_elementwise(context, "", body, {{"x", node.inputs[0], false}, {"y", context.id(), true}});
}

// GLSL bool `name`(plane, oh, ow, i, xi) walking window (oh, ow) of `plane` in row-major order,
// with `index` the flat index of each tap, running `step` at each and returning true at the end.
std::string window_scan(const PoolGeometry& p, const std::string& name, const std::string& step) {
  return "bool " + name + "(uint plane, uint oh, uint ow, uint i, float xi) {\n" +
         window_loop(p, "oh", "ow",
                     "      uint index = (plane * " + u(p.in_height) + " + uint(ih)) * " +
                         u(p.in_width) + " + uint(iw);\n" + step) +
         "  return true;\n}\n";
}

// Whether input element i (value xi) is the first maximum of the window, as max_pool2d picks
// it: no larger value in the window and no equal one before it in row-major order, whose flat
// index is then smaller. Without the window's maximum, the scan stops at the first value that
// shows it.
std::string first_argmax_scan(const PoolGeometry& p) {
  return window_scan(p, "is_first_argmax",
                     "      float value = x[index];\n      if (value > xi || (value == xi && "
                     "index < i)) return false;\n");
}

// Given the window maxima (`pooled`), with the window's maximum equal to xi: whether no element
// equal to it comes before input element i in the window's row-major order.
std::string first_of_ties_scan(const PoolGeometry& p) {
  return window_scan(p, "first_of_ties",
                     "      if (index >= i) return true;\n      if (x[index] == xi) return "
                     "false;\n");
}

// The windows along one axis that an interval of `span` consecutive pixels can meet.
int64_t windows_meeting(int64_t span, int64_t kernel, int64_t stride) {
  return (span + kernel - 2) / stride + 1;
}

// max_pool2d_grad given the window maxima: one invocation per cell of stride_h x stride_w input
// pixels. The windows that meet a cell (at most windows_meeting along each axis) are loaded once,
// their maxima and gradients, and every pixel of the cell compares itself with those that
// contain it; only a pixel equal to a window's maximum scans that window for an equal one before
// it. Most pixels are no window's maximum, so this is mostly one read of x, the cell's few window
// values and one write of dx a pixel.
void lower_max_pool_grad_in_cells(LoweringContext& context, const PoolGeometry& p) {
  const Node& node = context.node();
  const int64_t sh = p.stride[0], sw = p.stride[1];
  const int64_t cells_h = (p.in_height + sh - 1) / sh, cells_w = (p.in_width + sw - 1) / sw;
  const int64_t count = p.batch * p.channels * cells_h * cells_w;
  const int64_t wh = windows_meeting(sh, p.kernel[0], sh),
                ww = windows_meeting(sw, p.kernel[1], sw);
  std::string text = "  uint row0 = i / " + u(cells_w) + " % " + u(cells_h) + " * " + u(sh) +
                     ", col0 = i % " + u(cells_w) + " * " + u(sw) + ";\n  uint plane = i / " +
                     u(cells_h * cells_w) + ";\n";
  // The first window meeting the cell along each axis: ceil((pixel + P - K + 1) / S), from 0.
  const auto first_window = [&](const std::string& name, const std::string& pixel, int axis) {
    return "  int " + name + "_reach = int(" + pixel + ") + " +
           s(p.padding[axis] - p.kernel[axis] + 1) + ";\n  uint " + name + "0 = " + name +
           "_reach <= 0 ? 0u : uint(" + name + "_reach + " + s(p.stride[axis] - 1) + ") / " +
           u(p.stride[axis]) + ";\n";
  };
  text += first_window("oh", "row0", 0) + first_window("ow", "col0", 1);
  const std::string window = window_index(p);
  text += "  float maxima[" + s(wh) + "][" + s(ww) + "], grads[" + s(wh) + "][" + s(ww) + "];\n";
  text += "  for (uint j = 0u; j < " + u(wh) + "; ++j) {\n    for (uint k = 0u; k < " + u(ww) +
          "; ++k) {\n      uint oh = oh0 + j, ow = ow0 + k;\n      bool inside = oh < " +
          u(p.out_height) + " && ow < " + u(p.out_width) +
          ";\n      maxima[j][k] = inside ? pooled[" + window +
          "] : 0.0;\n      grads[j][k] = inside ? dy[" + window + "] : 0.0;\n    }\n  }\n";
  text += "  for (uint dr = 0u; dr < " + u(sh) +
          "; ++dr) {\n    uint row = row0 + dr;\n    if (row >= " + u(p.in_height) +
          ") break;\n    for (uint dc = 0u; dc < " + u(sw) +
          "; ++dc) {\n      uint col = col0 + dc;\n      if (col >= " + u(p.in_width) +
          ") break;\n      uint index = (plane * " + u(p.in_height) + " + row) * " + u(p.in_width) +
          " + col;\n      float xi = x[index];\n      float total = 0.0;\n";
  // Window oh contains the row when oh * S - P <= row <= oh * S - P + K - 1.
  text += "      for (uint j = 0u; j < " + u(wh) + "; ++j) {\n        int top = int((oh0 + j) * " +
          u(sh) + ") - " + s(p.padding[0]) + ";\n        if (int(row) < top || int(row) > top + " +
          s(p.kernel[0] - 1) + " || oh0 + j >= " + u(p.out_height) +
          ") continue;\n        for (uint k = 0u; k < " + u(ww) +
          "; ++k) {\n          int left = int((ow0 + k) * " + u(sw) + ") - " + s(p.padding[1]) +
          ";\n          if (int(col) < left || int(col) > left + " + s(p.kernel[1] - 1) +
          " || ow0 + k >= " + u(p.out_width) +
          ") continue;\n          if (xi == maxima[j][k] && first_of_ties(plane, oh0 + j, ow0 + k, "
          "index, xi))\n"
          "            total += grads[j][k];\n        }\n      }\n      dx[index] = total;\n    "
          "}\n  }\n";
  emit_invocations(context, first_of_ties_scan(p), text, count,
                   {{"x", node.inputs[0], false},
                    {"dy", node.inputs[1], false},
                    {"pooled", node.inputs[2], false},
                    {"dx", context.id(), true}});
}

void lower_max_pool_grad(LoweringContext& context) {
  const Node& node = context.node();
  const PoolGeometry p = pool_geometry(node.attrs, context.input_type(0).shape);
  if (node.inputs.size() == 3) {
    lower_max_pool_grad_in_cells(context, p);
    return;
  }
  const std::string window = window_index(p);
  const std::string body =
      "  float total = 0.0;\n  float xi = x[i];\n" +
      windows_containing(
          p, "      if (is_first_argmax(plane, oh, ow, i, xi)) total += dy[" + window + "];\n") +
      "  dx[i] = total;\n";
  emit_elementwise(
      context, first_argmax_scan(p), body,
      {{"x", node.inputs[0], false}, {"dy", node.inputs[1], false}, {"dx", context.id(), true}});
}

// Padding taps count as zeros, so the divisor is always the full kernel area.
std::string inverse_area(const PoolGeometry& p) {
  return glsl_float(1.0 / static_cast<double>(p.kernel[0] * p.kernel[1]));
}

void lower_avg_pool(LoweringContext& context) {
  const Node& node = context.node();
  const PoolGeometry p = pool_geometry(node.attrs, context.input_type(0).shape);
  const std::string body = "  float total = 0.0;\n" +
                           window_loop(p, "row", "col",
                                       "      total += x[(plane * " + u(p.in_height) +
                                           " + uint(ih)) * " + u(p.in_width) + " + uint(iw)];\n") +
                           "  y[i] = total * " + inverse_area(p) + ";\n";
  emit_elementwise(context, "", body, {{"x", node.inputs[0], false}, {"y", context.id(), true}});
}

void lower_avg_pool_grad(LoweringContext& context) {
  const Node& node = context.node();
  const PoolGeometry p = pool_geometry(node.attrs, node.type.shape);
  const std::string body = "  float total = 0.0;\n" +
                           windows_containing(p, "      total += dy[" + window_index(p) + "];\n") +
                           "  dx[i] = total * " + inverse_area(p) + ";\n";
  emit_elementwise(context, "", body, {{"dy", node.inputs[0], false}, {"dx", context.id(), true}});
}

void lower_upsample_nearest(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& x = context.input_type(0).shape;
  const int64_t scale = node.attrs.get_int("scale");
  const std::string body = "  y[i] = x[(plane * " + u(x[2]) + " + row / " + u(scale) + ") * " +
                           u(x[3]) + " + col / " + u(scale) + "];\n";
  emit_elementwise(context, "", body, {{"x", node.inputs[0], false}, {"y", context.id(), true}});
}

void lower_upsample_nearest_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& dy = context.input_type(0).shape;
  const int64_t scale = node.attrs.get_int("scale");
  const std::string body = "  float total = 0.0;\n  for (uint a = 0u; a < " + u(scale) +
                           "; ++a) {\n    uint base = (plane * " + u(dy[2]) + " + row * " +
                           u(scale) + " + a) * " + u(dy[3]) + " + col * " + u(scale) +
                           ";\n    for (uint b = 0u; b < " + u(scale) +
                           "; ++b) total += dy[base + b];\n  }\n  dx[i] = total;\n";
  emit_elementwise(context, "", body, {{"dy", node.inputs[0], false}, {"dx", context.id(), true}});
}

// Bilinear taps along one axis from `in` to `out` pixels, computed in double exactly as the
// reference does (align_corners=False, source clamped at 0) and baked into the shader as
// constant tables, so the GPU picks the same taps even where f32 would round across an integer.
struct AxisTaps {
  std::vector<int64_t> low, high;
  std::vector<double> low_weight, high_weight;
  std::vector<int64_t> first, last;  // per input pixel: the outputs that read it (first > last
                                     // when none do)
};

AxisTaps axis_taps(int64_t in, int64_t out) {
  AxisTaps taps;
  taps.first.assign(in, out);
  taps.last.assign(in, -1);
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    const double source = std::max((static_cast<double>(o) + 0.5) * scale - 0.5, 0.0);
    const int64_t low = std::min(static_cast<int64_t>(source), in - 1);
    const int64_t high = std::min(low + 1, in - 1);
    taps.low.push_back(low);
    taps.high.push_back(high);
    taps.high_weight.push_back(source - static_cast<double>(low));
    taps.low_weight.push_back(1.0 - taps.high_weight.back());
    for (int64_t pixel : {low, high}) {
      taps.first[pixel] = std::min(taps.first[pixel], o);
      taps.last[pixel] = std::max(taps.last[pixel], o);
    }
  }
  return taps;
}

std::string uint_table(const std::string& name, const std::vector<int64_t>& values) {
  std::string text = "const uint " + name + "[" + s(values.size()) + "] = uint[](";
  for (size_t k = 0; k < values.size(); ++k) text += (k ? ", " : "") + u(values[k]);
  return text + ");\n";
}

std::string int_table(const std::string& name, const std::vector<int64_t>& values) {
  std::string text = "const int " + name + "[" + s(values.size()) + "] = int[](";
  for (size_t k = 0; k < values.size(); ++k) text += (k ? ", " : "") + s(values[k]);
  return text + ");\n";
}

std::string float_table(const std::string& name, const std::vector<double>& values) {
  std::string text = "const float " + name + "[" + s(values.size()) + "] = float[](";
  for (size_t k = 0; k < values.size(); ++k) text += (k ? ", " : "") + glsl_float(values[k]);
  return text + ");\n";
}

std::string tap_tables(const std::string& axis, const AxisTaps& taps, bool with_ranges) {
  std::string text = uint_table(axis + "_low", taps.low) + uint_table(axis + "_high", taps.high) +
                     float_table(axis + "_low_weight", taps.low_weight) +
                     float_table(axis + "_high_weight", taps.high_weight);
  if (with_ranges) {
    text += int_table(axis + "_first", taps.first) + int_table(axis + "_last", taps.last);
  }
  return text;
}

void lower_upsample_bilinear(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& x = context.input_type(0).shape;
  const Shape& y = node.type.shape;
  const std::string functions = tap_tables("rows", axis_taps(x[2], y[2]), false) +
                                tap_tables("cols", axis_taps(x[3], y[3]), false);
  const std::string at = "x[(plane * " + u(x[2]) + " + ";
  const auto tap = [&](const std::string& r, const std::string& c) {
    return "rows_" + r + "_weight[row] * cols_" + c + "_weight[col] * " + at + "rows_" + r +
           "[row]) * " + u(x[3]) + " + cols_" + c + "[col]]";
  };
  const std::string body = "  y[i] = " + tap("low", "low") + "\n       + " + tap("low", "high") +
                           "\n       + " + tap("high", "low") + "\n       + " +
                           tap("high", "high") + ";\n";
  emit_elementwise(context, functions, body,
                   {{"x", node.inputs[0], false}, {"y", context.id(), true}});
}

void lower_upsample_bilinear_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& dy = context.input_type(0).shape;
  const Shape& x = node.type.shape;
  const std::string functions = tap_tables("rows", axis_taps(x[2], dy[2]), true) +
                                tap_tables("cols", axis_taps(x[3], dy[3]), true);
  // An output reads this pixel through its low tap, its high tap, or both (clamped at the edge).
  std::string body = "  float total = 0.0;\n";
  body += "  for (int oh = rows_first[row]; oh <= rows_last[row]; ++oh) {\n";
  body +=
      "    float row_weight = (rows_low[oh] == row ? rows_low_weight[oh] : 0.0)"
      " + (rows_high[oh] == row ? rows_high_weight[oh] : 0.0);\n";
  body += "    for (int ow = cols_first[col]; ow <= cols_last[col]; ++ow) {\n";
  body +=
      "      float col_weight = (cols_low[ow] == col ? cols_low_weight[ow] : 0.0)"
      " + (cols_high[ow] == col ? cols_high_weight[ow] : 0.0);\n";
  body += "      total += row_weight * col_weight * dy[(plane * " + u(dy[2]) + " + uint(oh)) * " +
          u(dy[3]) + " + uint(ow)];\n    }\n  }\n  dx[i] = total;\n";
  emit_elementwise(context, functions, body,
                   {{"dy", node.inputs[0], false}, {"dx", context.id(), true}});
}

}  // namespace

std::vector<LoweringEntry> pool_lowerings() {
  return {{op::max_pool2d, lower_max_pool},
          {op::max_pool2d_grad, lower_max_pool_grad},
          {op::avg_pool2d, lower_avg_pool},
          {op::avg_pool2d_grad, lower_avg_pool_grad},
          {op::upsample_nearest2d, lower_upsample_nearest},
          {op::upsample_nearest2d_grad, lower_upsample_nearest_grad},
          {op::upsample_bilinear2d, lower_upsample_bilinear},
          {op::upsample_bilinear2d_grad, lower_upsample_bilinear_grad}};
}

}  // namespace mg::kernels
