// Winograd's transforms (ops/winograd.hpp): winograd_tiles and winograd_grad_tiles (input
// patches and grad_out blocks to their 16 or 36 transformed points), winograd_weight_grad (the
// products' 4 x 4 or 6 x 6 points back to 3 x 3 taps), and for the forward and the data gradient
// winograd_filter (3 x 3 taps to 4 x 4 points) and winograd_output (4 x 4 points to 2 x 2
// outputs). The im2col pass writes them for 3 x 3 stride-1 convolutions (passes/im2col.cpp),
// after differentiation, so they take no gradient.
#include "ops/winograd.hpp"

#include <utility>

#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/op_checks.hpp"

namespace mg {
namespace {

using winograd::kF2;

// The variant of a tile or weight-gradient node: its `outputs` attribute (2 or 4, default 2).
const winograd::Variant& node_variant(const Graph& graph, const Node& node) {
  const int64_t outputs = winograd::outputs_of(node.attrs);
  if (outputs != 2 && outputs != 4)
    op_error(graph, node, "outputs must be 2 or 4 (the tile's side, F(2 x 2) or F(4 x 4))");
  return winograd::variant(outputs);
}

// The dtype of a transform's points: f16 with f16_result, bf16 with bf16_result (of f32
// values), else its input's.
DType result_dtype(const Graph& graph, const Node& node, DType input) {
  const int64_t f16 = node.attrs.get_int(winograd::kF16ResultAttribute, 0);
  const int64_t bf16 = node.attrs.get_int(winograd::kBf16ResultAttribute, 0);
  if (f16 != 0 && f16 != 1) op_error(graph, node, "f16_result must be 0 or 1");
  if (bf16 != 0 && bf16 != 1) op_error(graph, node, "bf16_result must be 0 or 1");
  if (f16 == 1 && bf16 == 1) op_error(graph, node, "takes f16_result or bf16_result, not both");
  if ((f16 == 1 || bf16 == 1) && input != DType::f32)
    op_error(graph, node,
             std::string(f16 == 1 ? "f16_result" : "bf16_result") + " rounds f32 values");
  return f16 == 1 ? DType::f16 : bf16 == 1 ? DType::bf16 : input;
}

// The reference's points as the node stores them: rounded to f16 with f16_result, to bfloat16
// with bf16_result.
HostTensor stored(const Node& node, HostTensor points) {
  const DType format = winograd::f16_result(node.attrs)    ? DType::f16
                       : winograd::bf16_result(node.attrs) ? DType::bf16
                                                           : DType::f32;
  for (double& value : points.data) value = round_to_dtype(format, value);
  return points;
}

// [P, C, N * TH * TW] for the tiles of v [N, C, H, W] (attribute tiles), P the variant's
// points.
TensorType tiles_type(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  expect_floating(graph, node, 0, 4);
  const int64_t points = node_variant(graph, node).points();
  const auto tiles = pair_attr(graph, node, "tiles", 1);
  const TensorType& v = graph.type(node.inputs[0]);
  return TensorType{result_dtype(graph, node, v.dtype),
                    {points, v.shape[1], v.shape[0] * tiles[0] * tiles[1]}};
}

// The reference of both tile ops: point (i, j) of tile t is the sum over the extent x extent
// patch at (m ty - padding, m tx - padding) of T[i][a] T[j][b] v[.., a, b], with T (tile x
// extent) `transform` and 0 outside v.
HostTensor transformed_tiles(const Node& node, const HostTensor& v, int64_t outputs,
                             const winograd::Matrix& transform) {
  HostTensor result(node.type.shape);
  const auto tiles = attr_pair(node.attrs, "tiles", 1);
  const auto padding = attr_pair(node.attrs, "padding", 0);
  const int64_t side = transform.rows, extent = transform.columns;
  const int64_t planes = v.shape[1], height = v.shape[2], width = v.shape[3];
  const int64_t count = v.shape[0] * tiles[0] * tiles[1];
  for (int64_t t = 0; t < count; ++t) {
    const int64_t tx = t % tiles[1], ty = t / tiles[1] % tiles[0];
    const int64_t n = t / (tiles[0] * tiles[1]);
    for (int64_t p = 0; p < planes; ++p) {
      const double* plane = v.data.data() + (n * planes + p) * height * width;
      for (int64_t a = 0; a < extent; ++a) {
        const int64_t y = outputs * ty - padding[0] + a;
        if (y < 0 || y >= height) continue;
        for (int64_t b = 0; b < extent; ++b) {
          const int64_t x = outputs * tx - padding[1] + b;
          if (x < 0 || x >= width) continue;
          for (int64_t i = 0; i < side; ++i)
            for (int64_t j = 0; j < side; ++j)
              result.data[((i * side + j) * planes + p) * count + t] +=
                  transform.at(i, a) * transform.at(j, b) * plane[y * width + x];
        }
      }
    }
  }
  return result;
}

std::vector<ValueId> no_gradient(Graph& graph, ValueId self, ValueId) {
  reject_pass_written_gradient(graph, self, "the im2col pass", "the conv2d it came from");
}

// [16, O, C] (or [16, C, O] when transposed) for w [O, C, 3, 3].
TensorType filter_type(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  expect_floating(graph, node, 0, 4);
  const TensorType& w = graph.type(node.inputs[0]);
  if (w.shape[2] != winograd::kKernel || w.shape[3] != winograd::kKernel)
    op_error(graph, node, "the filter must be 3 x 3");
  const int64_t transposed = node.attrs.get_int("transposed", 0);
  if (transposed != 0 && transposed != 1) op_error(graph, node, "transposed must be 0 or 1");
  return TensorType{result_dtype(graph, node, w.dtype),
                    transposed ? Shape{kF2.points(), w.shape[1], w.shape[0]}
                               : Shape{kF2.points(), w.shape[0], w.shape[1]}};
}

// [N, P, OH, OW] for the 2 x 2 outputs of m [16, P, N * TH * TW]; the tiles must be the
// output's (TH = ceil(OH / 2), TW = ceil(OW / 2)).
TensorType output_type(const Graph& graph, const Node& node) {
  expect_input_count(graph, node, 1);
  expect_floating(graph, node, 0, 3);
  const TensorType& m = graph.type(node.inputs[0]);
  const auto tiles = pair_attr(graph, node, "tiles", 1);
  const auto size = pair_attr(graph, node, "output_size", 1);
  if (m.shape[0] != kF2.points()) op_error(graph, node, "input must be [16, P, T]");
  if (tiles[0] != kF2.tiles_along(size[0]) || tiles[1] != kF2.tiles_along(size[1]))
    op_error(graph, node, "tiles must cover output_size in 2 x 2 blocks");
  if (m.shape[2] % (tiles[0] * tiles[1]) != 0)
    op_error(graph, node, "T must be a whole number of images' tiles");
  return TensorType{m.dtype, {m.shape[2] / (tiles[0] * tiles[1]), m.shape[1], size[0], size[1]}};
}

}  // namespace

void register_winograd_ops(std::vector<OpDef>& registry) {
  // winograd_tiles(x [N, C, H, W]) -> [P, C, N * TH * TW], P = (m + 2)^2: element
  // [(m + 2) i + j, c, t] of tile t = (n * TH + ty) * TW + tx is point (i, j) of B^T d B for the
  // (m + 2) x (m + 2) patch d of x at (m ty - padding, m tx - padding), 0 outside x. attrs:
  // outputs (m: 2 or 4, default 2), tiles [2] (TH, TW), padding [2] (>= 0, default 0),
  // f16_result (1: the points rounded to f16 and stored as f16; default 0), bf16_result (the
  // same in bfloat16).
  registry.push_back(OpDef{
      .name = op::winograd_tiles,
      .infer =
          [](const Graph& graph, const Node& node) {
            pair_attr(graph, node, "padding", 0, {0, 0});
            return tiles_type(graph, node);
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const winograd::Variant& f = winograd::variant_of(node.attrs);
            return stored(node, transformed_tiles(node, *in[0], f.outputs, f.input));
          },
      .vjp = no_gradient,
  });

  // winograd_grad_tiles(dy [N, O, OH, OW]) -> [P, O, N * TH * TW]: element [(m + 2) i + j, o,
  // t] is point (i, j) of A dY A^T for the m x m block dY of dy at (m ty, m tx), 0 past its
  // edge. attrs: outputs (m: 2 or 4, default 2), tiles [2] (TH, TW), f16_result (as
  // winograd_tiles'); no padding (the blocks start at the grad_out's origin).
  registry.push_back(OpDef{
      .name = op::winograd_grad_tiles,
      .infer =
          [](const Graph& graph, const Node& node) {
            if (node.attrs.has("padding"))
              op_error(graph, node, "takes no padding: its blocks start at (m ty, m tx)");
            return tiles_type(graph, node);
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const winograd::Variant& f = winograd::variant_of(node.attrs);
            return stored(node, transformed_tiles(node, *in[0], f.outputs, f.grad));
          },
      .vjp = no_gradient,
  });

  // winograd_weight_grad(m [P, O, C]) -> [O, C, 3, 3], P = (m + 2)^2: G^T M G of each (o, c),
  // where M[i][j] = m[(m + 2) i + j, o, c]. m may carry a leading axis of partial products,
  // [S, P, O, C], which it sums first (the split-K slices of the products over the tiles).
  // attrs: outputs (m: 2 or 4, default 2).
  registry.push_back(OpDef{
      .name = op::winograd_weight_grad,
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0);
            const int64_t points = node_variant(graph, node).points();
            const TensorType& m = graph.type(node.inputs[0]);
            const size_t rank = m.shape.size();
            if ((rank != 3 && rank != 4) || m.shape[rank - 3] != points)
              op_error(graph, node,
                       "input must be [" + std::to_string(points) + ", O, C] or [S, " +
                           std::to_string(points) + ", O, C]");
            return TensorType{
                m.dtype,
                {m.shape[rank - 2], m.shape[rank - 1], winograd::kKernel, winograd::kKernel}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            const winograd::Variant& f = winograd::variant_of(node.attrs);
            HostTensor result(node.type.shape);
            const int64_t pairs = node.type.shape[0] * node.type.shape[1];
            const int64_t points = f.points();
            const int64_t slices = static_cast<int64_t>(in[0]->data.size()) / (points * pairs);
            constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel;
            for (int64_t s = 0; s < slices; ++s)
              for (int64_t point = 0; point < points; ++point)
                for (int64_t pair = 0; pair < pairs; ++pair) {
                  const double value = in[0]->data[(s * points + point) * pairs + pair];
                  const int64_t i = point / f.tile(), j = point % f.tile();
                  for (int64_t r = 0; r < winograd::kKernel; ++r)
                    for (int64_t q = 0; q < winograd::kKernel; ++q)
                      result.data[pair * kTaps + r * winograd::kKernel + q] +=
                          f.filter.at(i, r) * f.filter.at(j, q) * value;
                }
            return result;
          },
      .vjp = no_gradient,
  });

  // winograd_filter(w [O, C, 3, 3]) -> [16, O, C]: element [4 i + j, o, c] is point (i, j) of
  // G g G^T for g = w[o, c]. With transposed = 1, [16, C, O] of the filter turned by 180
  // degrees: element [4 i + j, c, o] is point (i, j) of G g' G^T, g'[r][q] = w[o, c, 2 - r,
  // 2 - q] (the data gradient's filter). With f16_result = 1 the points are rounded to f16, with
  // bf16_result = 1 to bfloat16.
  registry.push_back(OpDef{
      .name = op::winograd_filter,
      .infer = filter_type,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor result(node.type.shape);
            const HostTensor& w = *in[0];
            const int64_t outs = w.shape[0], ins = w.shape[1];
            const bool transposed = node.attrs.get_int("transposed", 0) == 1;
            constexpr int64_t kSide = winograd::kKernel, kLast = kSide - 1;
            for (int64_t o = 0; o < outs; ++o)
              for (int64_t c = 0; c < ins; ++c) {
                const double* taps = w.data.data() + (o * ins + c) * kSide * kSide;
                const int64_t pair = transposed ? c * outs + o : o * ins + c;
                for (int64_t i = 0; i < kF2.tile(); ++i)
                  for (int64_t j = 0; j < kF2.tile(); ++j) {
                    double sum = 0;
                    for (int64_t r = 0; r < kSide; ++r)
                      for (int64_t q = 0; q < kSide; ++q) {
                        const double tap = transposed ? taps[(kLast - r) * kSide + kLast - q]
                                                      : taps[r * kSide + q];
                        sum += kF2.filter.at(i, r) * kF2.filter.at(j, q) * tap;
                      }
                    result.data[(i * kF2.tile() + j) * outs * ins + pair] = sum;
                  }
              }
            return stored(node, std::move(result));
          },
      .vjp = no_gradient,
  });

  // winograd_output(m [16, P, N * TH * TW]) -> [N, P, OH, OW]: the 2 x 2 outputs at
  // (2 ty, 2 tx) of tile t = (n * TH + ty) * TW + tx are A^T M A, M[i][j] = m[4 i + j, p, t];
  // those past the edge are dropped. attrs: tiles [2] (TH, TW), output_size [2] (OH, OW).
  registry.push_back(OpDef{
      .name = op::winograd_output,
      .infer = output_type,
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor result(node.type.shape);
            const auto tiles = attr_pair(node.attrs, "tiles", 1);
            const int64_t planes = node.type.shape[1], height = node.type.shape[2],
                          width = node.type.shape[3];
            const int64_t count = in[0]->shape[2];
            for (int64_t t = 0; t < count; ++t) {
              const int64_t tx = t % tiles[1], ty = t / tiles[1] % tiles[0];
              const int64_t n = t / (tiles[0] * tiles[1]);
              for (int64_t p = 0; p < planes; ++p)
                for (int64_t r = 0; r < kF2.outputs; ++r)
                  for (int64_t q = 0; q < kF2.outputs; ++q) {
                    const int64_t y = kF2.outputs * ty + r, x = kF2.outputs * tx + q;
                    if (y >= height || x >= width) continue;
                    double sum = 0;
                    for (int64_t i = 0; i < kF2.tile(); ++i)
                      for (int64_t j = 0; j < kF2.tile(); ++j)
                        sum += kF2.grad.at(i, r) * kF2.grad.at(j, q) *
                               in[0]->data[((i * kF2.tile() + j) * planes + p) * count + t];
                    result.data[((n * planes + p) * height + y) * width + x] = sum;
                  }
            }
            return result;
          },
      .vjp = no_gradient,
  });
}

}  // namespace mg
