// Winograd's F(m x m, 3 x 3) transforms (ops/winograd.hpp; passes/im2col.cpp writes them): the
// input and grad_out tiles, the filter transform and the output transform, one invocation per
// point; the tile products between them are batched matmuls.
#include <array>
#include <functional>
#include <string>

#include "backends/vulkan/kernels/conv_columns.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/winograd.hpp"

namespace mg::kernels {
namespace {

std::string u(int64_t value) {
  return glsl_uint(value);
}
std::string s(int64_t value) {
  return std::to_string(value);
}

// The GLSL name `prefix`<i>_<j> of point (i, j) of a tile (as a function of (i, j): `named`).
std::string point_name(const std::string& prefix, size_t i, size_t j) {
  return prefix + std::to_string(i) + "_" + std::to_string(j);
}

std::function<std::string(size_t, size_t)> named(std::string prefix) {
  return [prefix = std::move(prefix)](size_t i, size_t j) { return point_name(prefix, i, j); };
}

// `names` combined with the coefficients of row `row` of `matrix` (zeros left out), as a GLSL
// expression.
std::string combination(const winograd::Matrix& matrix, int64_t row,
                        const std::vector<std::string>& names) {
  std::string text;
  for (int64_t k = 0; k < matrix.columns; ++k) {
    const double coefficient = matrix.at(row, k);
    if (coefficient == 0.0) continue;
    const double magnitude = coefficient < 0.0 ? -coefficient : coefficient;
    text += coefficient < 0.0 ? " - " : (text.empty() ? "" : " + ");
    text += (magnitude == 1.0 ? "" : glsl_float(magnitude) + " * ") + names[k];
  }
  return text.empty() ? "0.0" : text;
}

// The two-sided transform of one tile, T M T^T with T `transform` (rows x extent) and M the
// extent x extent GLSL values named `value(a, b)`: declares e<i>_<j> for each of its rows x rows
// points.
std::string tile_transform_glsl(const winograd::Matrix& transform,
                                const std::function<std::string(size_t, size_t)>& value) {
  const size_t rows = static_cast<size_t>(transform.rows);
  const size_t extent = static_cast<size_t>(transform.columns);
  std::string text;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t b = 0; b < extent; ++b) {
      std::vector<std::string> column(extent);
      for (size_t a = 0; a < extent; ++a) column[a] = value(a, b);
      text += "  float " + point_name("h", i, b) + " = " +
              combination(transform, static_cast<int64_t>(i), column) + ";\n";
    }
  }
  for (size_t i = 0; i < rows; ++i) {
    std::vector<std::string> row(extent);
    for (size_t b = 0; b < extent; ++b) row[b] = point_name("h", i, b);
    for (size_t j = 0; j < rows; ++j)
      text += "  float " + point_name("e", i, j) + " = " +
              combination(transform, static_cast<int64_t>(j), row) + ";\n";
  }
  return text;
}

// A transformed point `value` (an f32 expression) as a value of `dtype` to store: rounded to f16
// or to a bfloat16 bit pattern (to nearest even) where the points are f16 or bf16
// (ops/winograd.hpp, f16_result, bf16_result; the bfloat16 helpers: bf16_helpers).
std::string stored_point(DType dtype, const std::string& value) {
  if (dtype == DType::bf16) return "uint16_t(mg_bf16_bits(" + value + "))";
  return dtype == DType::f16 ? "float16_t(" + value + ")" : value;
}

// The pointwise helpers that stored_point's bfloat16 stores and loaded's widenings call, where
// a launch `touches_bf16` values.
std::string bf16_helpers(bool touches_bf16) {
  return touches_bf16 ? std::string(pointwise_functions_glsl()) : std::string();
}

// A value of `dtype` read by `load` (a GLSL expression) as an f32 expression: f16 values (half
// activations) convert, bfloat16 bit patterns widen.
std::string loaded(DType dtype, const std::string& load) {
  if (dtype == DType::bf16) return "mg_widen_bf16(uint(" + load + "))";
  return dtype == DType::f16 ? "float(" + load + ")" : load;
}

// The name of flat point `point` (i * side + j) of a transformed side x side tile.
std::string tile_point(const std::string& prefix, int64_t point, int64_t side) {
  return point_name(prefix, static_cast<size_t>(point / side), static_cast<size_t>(point % side));
}

// Invocation i's plane p and tile t, with the tile's (ty, tx) and image n, for `tile_count`
// tiles of a grid `tiles` (TH, TW) an image, consecutive invocations on consecutive tiles.
std::string tile_coordinates_glsl(int64_t tile_count, const std::array<int64_t, 2>& tiles) {
  return "  uint t = i % " + u(tile_count) + ", p = i / " + u(tile_count) + ";\n  uint tx = t % " +
         u(tiles[1]) + ", ty = t / " + u(tiles[1]) + " % " + u(tiles[0]) + ", n = t / " +
         u(tiles[0] * tiles[1]) + ";\n";
}

// The body of a winograd_tiles or winograd_grad_tiles node for invocation i (below its
// elements / its points) of a launch that reads its input as `source` and writes its result as
// `target`: one invocation per (plane p, tile t), consecutive invocations on consecutive tiles,
// so that the patches' reads along a row of the input and every point's store are coalesced; it
// reads the patch ((m + 2) x (m + 2) of the input, m x m of grad_out) once and writes its
// (m + 2)^2 transformed points, each [P, T] apart.
std::string winograd_tiles_glsl(const Graph& graph, ValueId id, const std::string& source,
                                const std::string& target) {
  const Node& node = graph.node(id);
  const Shape& v = graph.type(node.inputs[0]).shape;
  const auto tiles = attr_pair(node.attrs, "tiles", 1);
  const auto padding = attr_pair(node.attrs, "padding", 0);
  const bool grad_out = node.op == op::winograd_grad_tiles;
  const winograd::Variant& f = winograd::variant_of(node.attrs);
  const winograd::Matrix& transform = grad_out ? f.grad : f.input;
  const int64_t tile_count = node.type.shape[2];
  const int64_t count = node.type.shape[1] * tile_count;
  std::string body = tile_coordinates_glsl(tile_count, tiles) + "  int y0 = int(ty) * " +
                     s(f.outputs) + " - " + s(padding[0]) + ", x0 = int(tx) * " + s(f.outputs) +
                     " - " + s(padding[1]) + ";\n  uint plane = (n * " + u(v[1]) + " + p) * " +
                     u(v[2] * v[3]) + ";\n";
  const int64_t extent = transform.columns;
  const DType input = graph.type(node.inputs[0]).dtype;
  for (int64_t a = 0; a < extent; ++a) {
    for (int64_t b = 0; b < extent; ++b) {
      const std::string y = "y0 + " + s(a), x = "x0 + " + s(b);
      const std::string load = source + "[plane + uint((" + y + ") * " + s(v[3]) + " + " + x + ")]";
      body += "  float " + point_name("d", a, b) + " = " + y + " >= 0 && " + y + " < " + s(v[2]) +
              " && " + x + " >= 0 && " + x + " < " + s(v[3]) + " ? " + loaded(input, load) +
              " : 0.0;\n";
    }
  }
  body += tile_transform_glsl(transform, named("d"));
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  " + target + "[i + " + u(point * count) +
            "] = " + stored_point(graph.type(id).dtype, tile_point("e", point, f.tile())) + ";\n";
  return body;
}

int64_t winograd_tiles_invocations(const Graph& graph, ValueId id) {
  const Shape& tiles = graph.type(id).shape;
  return tiles[1] * tiles[2];
}

void lower_winograd_tiles(LoweringContext& context) {
  const int64_t count = winograd_tiles_invocations(context.graph(), context.id());
  std::string body = bf16_helpers(context.node().type.dtype == DType::bf16 ||
                                  context.input_type(0).dtype == DType::bf16) +
                     columns_main(count) +
                     winograd_tiles_glsl(context.graph(), context.id(), "source", "tiles") + "}\n";
  emit_columns_launch(context, context.node().op, std::move(body), {"source", "tiles"}, count);
}

// winograd_weight_grad(m): one invocation per (o, c), consecutive invocations on consecutive c:
// the (m + 2)^2 points (summed over the partial products first, if any) through G^T M G. A
// workgroup's 9 taps a pair go through shared memory (an odd stride: no bank conflicts), so
// that its stores are one contiguous run instead of 9 runs strided by 9 floats, which were
// slow.
void lower_winograd_weight_grad(LoweringContext& context) {
  const Shape& m = context.input_type(0).shape;
  const int64_t pairs = m[m.size() - 2] * m[m.size() - 1];
  const int64_t slices = m.size() == 4 ? m[0] : 1;
  const winograd::Variant& f = winograd::variant_of(context.node().attrs);
  constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel;
  std::string body = "layout(local_size_x = " + std::to_string(kColumnsLocalSize) +
                     ") in;\nshared float staged[" + s(kColumnsLocalSize * kTaps) +
                     "];\nvoid main() {\n  uint local = gl_LocalInvocationID.x;\n  uint first = "
                     "linear_workgroup() * " +
                     u(kColumnsLocalSize) + ";\n  uint i = first + local;\n  if (i < " + u(pairs) +
                     ") {\n";
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  float " + tile_point("m", point, f.tile()) + " = 0.0;\n";
  body += "  for (uint s = 0u; s < " + u(slices) + "; ++s) {\n    uint at = s * " +
          u(f.points() * pairs) + " + i;\n";
  for (int64_t point = 0; point < f.points(); ++point)
    body += "    " + tile_point("m", point, f.tile()) + " += products[at + " + u(point * pairs) +
            "];\n";
  body += "  }\n";
  body += tile_transform_glsl(f.filter.transpose(), named("m"));
  for (int64_t tap = 0; tap < kTaps; ++tap) {
    body += "  staged[local * " + u(kTaps) + " + " + u(tap) +
            "] = " + point_name("e", tap / winograd::kKernel, tap % winograd::kKernel) + ";\n";
  }
  body += "  }\n  barrier();\n  for (uint k = 0u; k < " + u(kTaps) +
          "; ++k) {\n    uint at = k * " + u(kColumnsLocalSize) + " + local;\n    if (first * " +
          u(kTaps) + " + at < " + u(pairs * kTaps) + ") grad_weight[first * " + u(kTaps) +
          " + at] = staged[at];\n  }\n}\n";
  emit_columns_launch(context, "winograd_weight_grad", std::move(body), {"products", "grad_weight"},
                      pairs);
}

// winograd_filter(w): one invocation per pair of the result's [A, B] (o and c, or c and o when
// transposed), consecutive invocations on consecutive b: its 9 taps (turned by 180 degrees when
// transposed) through G g G^T, the 16 points each [A, B] apart.
void lower_winograd_filter(LoweringContext& context) {
  const Shape& w = context.input_type(0).shape;
  const bool transposed = context.node().attrs.get_int("transposed", 0) == 1;
  const int64_t second = context.node().type.shape[2];
  const int64_t pairs = w[0] * w[1];
  constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel, kLast = winograd::kKernel - 1;
  std::string body = bf16_helpers(context.node().type.dtype == DType::bf16) + columns_main(pairs) +
                     "  uint a = i / " + u(second) + ", b = i % " + u(second) +
                     ";\n  uint base = (" + (transposed ? "b" : "a") + " * " + u(w[1]) + " + " +
                     (transposed ? "a" : "b") + ") * " + u(kTaps) + ";\n";
  for (int64_t r = 0; r < winograd::kKernel; ++r) {
    for (int64_t q = 0; q < winograd::kKernel; ++q) {
      const int64_t tap =
          transposed ? (kLast - r) * winograd::kKernel + kLast - q : r * winograd::kKernel + q;
      body += "  float " + point_name("g", r, q) + " = weights[base + " + u(tap) + "];\n";
    }
  }
  constexpr const winograd::Variant& f = winograd::kF2;
  body += tile_transform_glsl(f.filter, named("g"));
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  points[i + " + u(point * pairs) +
            "] = " + stored_point(context.node().type.dtype, tile_point("e", point, f.tile())) +
            ";\n";
  emit_columns_launch(context, "winograd_filter", body + "}\n", {"weights", "points"}, pairs);
}

// winograd_output(m): one invocation per (plane p, tile t), consecutive invocations on
// consecutive tiles (coalesced reads of every point): A^T M A, and the 2 x 2 outputs that lie
// inside the image.
void lower_winograd_output(LoweringContext& context) {
  const Shape& y = context.node().type.shape;
  const auto tiles = attr_pair(context.node().attrs, "tiles", 1);
  const int64_t tile_count = context.input_type(0).shape[2];
  const int64_t count = y[1] * tile_count;
  // 16-bit products (half activations) are widened as they are read; the image is then
  // stored in their format too.
  const DType products = context.input_type(0).dtype;
  std::string body = bf16_helpers(products == DType::bf16) + columns_main(count) +
                     tile_coordinates_glsl(tile_count, tiles);
  constexpr const winograd::Variant& f = winograd::kF2;
  for (int64_t point = 0; point < f.points(); ++point) {
    body += "  float " + tile_point("m", point, f.tile()) + " = " +
            loaded(products, "products[i + " + u(point * count) + "]") + ";\n";
  }
  body += tile_transform_glsl(f.grad.transpose(), named("m"));
  body += "  uint y0 = ty * " + u(f.outputs) + ", x0 = tx * " + u(f.outputs) +
          ";\n  uint plane = (n * " + u(y[1]) + " + p) * " + u(y[2] * y[3]) + ";\n";
  for (int64_t r = 0; r < f.outputs; ++r) {
    for (int64_t q = 0; q < f.outputs; ++q) {
      body += "  if (y0 + " + u(r) + " < " + u(y[2]) + " && x0 + " + u(q) + " < " + u(y[3]) +
              ") image[plane + (y0 + " + u(r) + ") * " + u(y[3]) + " + x0 + " + u(q) +
              "] = " + stored_point(context.node().type.dtype, point_name("e", r, q)) + ";\n";
    }
  }
  emit_columns_launch(context, "winograd_output", body + "}\n", {"products", "image"}, count);
}

}  // namespace

bool can_pair_winograd_tiles(const Graph& graph, ValueId producer, ValueId companion) {
  const Node& p = graph.node(producer);
  const Node& c = graph.node(companion);
  // Every reader of the companion follows it and so the producer's launch, and so must the
  // value it reads.
  if (p.op != op::winograd_tiles || c.op != op::winograd_grad_tiles || companion <= producer ||
      c.inputs[0] >= producer)
    return false;
  // The two operands of one weight gradient's product, so that neither lives longer than it
  // would in a launch of its own.
  for (size_t i = companion + 1; i < graph.size(); ++i) {
    const Node& reader = graph.nodes()[i];
    if ((reader.op == op::matmul || reader.op == op::half_matmul) &&
        reader.inputs == std::vector<ValueId>{companion, producer})
      return true;
  }
  return false;
}

std::vector<Launch> lower_winograd_tiles_pair(const Graph& graph, ValueId producer,
                                              ValueId companion, const DeviceTraits& device) {
  LoweringContext context(graph, producer, device);
  const int64_t first = winograd_tiles_invocations(graph, producer);
  const int64_t count = first + winograd_tiles_invocations(graph, companion);
  Launch launch;
  launch.label = context.label() + " + winograd_grad_tiles %" + std::to_string(companion);
  launch.kernel = "winograd_tiles";
  const DType points = graph.type(producer).dtype;
  const auto reads_or_writes_bf16 = [&](ValueId transform) {
    return graph.type(transform).dtype == DType::bf16 ||
           graph.type(graph.node(transform).inputs[0]).dtype == DType::bf16;
  };
  launch.body = bf16_helpers(reads_or_writes_bf16(producer) || reads_or_writes_bf16(companion)) +
                columns_main(count) + "  if (i < " + u(first) + ") {\n" +
                winograd_tiles_glsl(graph, producer, "source", "tiles") +
                "  } else {\n  i -= " + u(first) + ";\n" +
                winograd_tiles_glsl(graph, companion, "grad", "grad_tiles") + "  }\n}\n";
  launch.operands = {{"source", graph.node(producer).inputs[0], false},
                     {"grad", graph.node(companion).inputs[0], false},
                     {"tiles", producer, true},
                     {"grad_tiles", companion, true}};
  launch.groups = grid_for(static_cast<uint64_t>(count), kColumnsLocalSize, device);
  if (is_half_dtype(points) || is_half_dtype(graph.type(companion).dtype)) {
    require_f16_tensors(launch.label, "writes", device);
    launch.f16_operands = true;
  }
  context.emit(std::move(launch));
  return std::move(context.launches());
}

std::vector<LoweringEntry> winograd_lowerings() {
  return {{op::winograd_tiles, lower_winograd_tiles},
          {op::winograd_grad_tiles, lower_winograd_tiles},
          {op::winograd_weight_grad, lower_winograd_weight_grad},
          {op::winograd_filter, lower_winograd_filter},
          {op::winograd_output, lower_winograd_output}};
}

}  // namespace mg::kernels
