// The Winograd weight gradient's two transforms (ops/winograd.hpp): winograd_tiles (input
// patches or grad_out tiles to their 16 transformed points) and winograd_weight_grad (the
// products' 4 x 4 points back to 3 x 3 taps). The im2col pass writes them for the weight
// gradients of 3 x 3 stride-1 convolutions (passes/im2col.cpp), after differentiation, so they
// take no gradient.
#include "ops/winograd.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/op_checks.hpp"

namespace mg {
namespace {

using winograd::kPoints;
using winograd::kTile;

[[noreturn]] void reject_gradient(const Graph& graph, ValueId self) {
  throw Error(graph.node(self).op + " %" + std::to_string(self) +
              " is written by the im2col pass after differentiation and has no gradient; "
              "differentiate the conv2d it came from instead");
}

bool is_grad_out(const Attrs& attrs) {
  return attrs.get_int("grad_out", 0) == 1;
}

}  // namespace

void register_winograd_ops(std::vector<OpDef>& registry) {
  // winograd_tiles(v [N, P, H, W]) -> [16, P, N * TH * TW]: element [4 i + j, p, t] of tile
  // t = (n * TH + ty) * TW + tx is point (i, j) of its transform. attrs: tiles [2] (TH, TW),
  // padding [2] (>= 0, default 0), grad_out (0 or 1, default 0). With grad_out 0, v is the
  // convolution's input and the point is (B^T d B)[i][j] over the 4 x 4 patch d at
  // (2 ty - padding, 2 tx - padding); with 1, v is grad_out, padding must be 0, and the point is
  // (A dY A^T)[i][j] over the 2 x 2 block dY at (2 ty, 2 tx). Elements outside v read 0.
  registry.push_back(OpDef{
      .name = "winograd_tiles",
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0, 4);
            const auto tiles = pair_attr(graph, node, "tiles", 1);
            const auto padding = pair_attr(graph, node, "padding", 0, {0, 0});
            const int64_t grad_out = node.attrs.get_int("grad_out", 0);
            if (grad_out != 0 && grad_out != 1) op_error(graph, node, "grad_out must be 0 or 1");
            if (grad_out == 1 && (padding[0] != 0 || padding[1] != 0))
              op_error(graph, node, "grad_out tiles take no padding");
            const TensorType& v = graph.type(node.inputs[0]);
            return TensorType{v.dtype, {kPoints, v.shape[1], v.shape[0] * tiles[0] * tiles[1]}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor result(node.type.shape);
            const Shape& v = in[0]->shape;
            const auto tiles = attr_pair(node.attrs, "tiles", 1);
            const auto padding = attr_pair(node.attrs, "padding", 0);
            const bool grad_out = is_grad_out(node.attrs);
            const int64_t extent = grad_out ? winograd::kOutputs : kTile;
            const int64_t planes = v[1], count = v[0] * tiles[0] * tiles[1];
            // coefficient(i, a): row i of the transform applied to patch row (or column) a.
            const auto coefficient = [&](int64_t i, int64_t a) {
              return grad_out ? winograd::kGradTransform[i][a] : winograd::kInputTransform[i][a];
            };
            for (int64_t t = 0; t < count; ++t) {
              const int64_t tx = t % tiles[1], ty = t / tiles[1] % tiles[0];
              const int64_t n = t / (tiles[0] * tiles[1]);
              for (int64_t p = 0; p < planes; ++p) {
                const double* plane = in[0]->data.data() + (n * planes + p) * v[2] * v[3];
                for (int64_t a = 0; a < extent; ++a) {
                  const int64_t y = 2 * ty - padding[0] + a;
                  if (y < 0 || y >= v[2]) continue;
                  for (int64_t b = 0; b < extent; ++b) {
                    const int64_t x = 2 * tx - padding[1] + b;
                    if (x < 0 || x >= v[3]) continue;
                    for (int64_t i = 0; i < kTile; ++i)
                      for (int64_t j = 0; j < kTile; ++j)
                        result.data[((i * kTile + j) * planes + p) * count + t] +=
                            coefficient(i, a) * coefficient(j, b) * plane[y * v[3] + x];
                  }
                }
              }
            }
            return result;
          },
      .vjp = [](Graph& graph, ValueId self, ValueId) -> std::vector<ValueId> {
        reject_gradient(graph, self);
      },
  });

  // winograd_weight_grad(m [16, O, C]) -> [O, C, 3, 3]: G^T M G of each (o, c), where
  // M[i][j] = m[4 i + j, o, c]. m may carry a leading axis of partial products, [S, 16, O, C],
  // which it sums first (the split-K slices of the products over the tiles).
  registry.push_back(OpDef{
      .name = "winograd_weight_grad",
      .infer =
          [](const Graph& graph, const Node& node) {
            expect_input_count(graph, node, 1);
            expect_floating(graph, node, 0);
            const TensorType& m = graph.type(node.inputs[0]);
            const size_t rank = m.shape.size();
            if ((rank != 3 && rank != 4) || m.shape[rank - 3] != kPoints)
              op_error(graph, node, "input must be [16, O, C] or [S, 16, O, C]");
            return TensorType{
                m.dtype,
                {m.shape[rank - 2], m.shape[rank - 1], winograd::kKernel, winograd::kKernel}};
          },
      .reference =
          [](const Node& node, const std::vector<const HostTensor*>& in) {
            HostTensor result(node.type.shape);
            const int64_t pairs = node.type.shape[0] * node.type.shape[1];
            const int64_t slices = static_cast<int64_t>(in[0]->data.size()) / (kPoints * pairs);
            constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel;
            for (int64_t s = 0; s < slices; ++s)
              for (int64_t point = 0; point < kPoints; ++point)
                for (int64_t pair = 0; pair < pairs; ++pair) {
                  const double value = in[0]->data[(s * kPoints + point) * pairs + pair];
                  const int64_t i = point / kTile, j = point % kTile;
                  for (int64_t r = 0; r < winograd::kKernel; ++r)
                    for (int64_t q = 0; q < winograd::kKernel; ++q)
                      result.data[pair * kTaps + r * winograd::kKernel + q] +=
                          winograd::kFilterTransform[i][r] * winograd::kFilterTransform[j][q] *
                          value;
                }
            return result;
          },
      .vjp = [](Graph& graph, ValueId self, ValueId) -> std::vector<ValueId> {
        reject_gradient(graph, self);
      },
  });
}

}  // namespace mg
