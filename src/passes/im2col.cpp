// Convolutions as explicit im2col + GEMM: conv2d, and the data gradient of a stride-1 conv2d,
// become an im2col node (the taps as the columns of a GEMM operand) and a batched matmul whose
// result is already NCHW: y[n] = W [O, C * KH * KW] x columns[n] [C * KH * KW, OH * OW]. The
// implicit GEMM (kernels/conv.cpp) computes the tap indices of every operand element inside its
// K loop; here one gather kernel does that once per element and the GEMM reads plain vec4 rows.
// On the H200 the ResNet 3x3 forward ... (docs/BENCHMARKS.md). The columns cost C * KH * KW
// times the input's bytes, a transient value freed after the product; products whose columns
// exceed the byte limit keep the implicit GEMM, as do grouped convolutions (one GEMM per group)
// and 1x1 convolutions with stride 1 and no padding (already plain GEMMs over the buffers).
#include "ops/conv_geometry.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

std::vector<int64_t> pair_of(const std::array<int64_t, 2>& pair) {
  return {pair[0], pair[1]};
}

bool reads_buffers_directly(const ConvGeometry& g) {
  return g.kernel_height == 1 && g.kernel_width == 1 && g.stride == std::array<int64_t, 2>{1, 1} &&
         g.padding == std::array<int64_t, 2>{0, 0};
}

uint64_t column_bytes(int64_t batch, int64_t channels, int64_t taps, int64_t plane) {
  return static_cast<uint64_t>(batch * channels * taps * plane) * sizeof(float);
}

// The columns of `source` [N, C, H, W] for a GEMM producing an OH x OW plane, and the product
// W2 [rows, C * KH * KW] x columns reshaped to `result_shape`.
ValueId columns_product(Graph& target, ValueId source, ValueId weights, const ConvGeometry& g,
                        std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                        std::array<int64_t, 2> stride, std::array<int64_t, 2> output_size,
                        const Shape& result_shape) {
  const ValueId columns =
      target.add("im2col", {source},
                 {{"kernel", std::vector<int64_t>{g.kernel_height, g.kernel_width}},
                  {"stride", pair_of(stride)},
                  {"padding", pair_of(padding)},
                  {"dilation", pair_of(dilation)},
                  {"output_size", pair_of(output_size)}});
  const ValueId product = target.add("matmul", {weights, columns}, {});
  return target.add("reshape", {product}, {{"shape", result_shape}});
}

}  // namespace

Graph im2col_convolutions(const Graph& graph, uint64_t max_column_bytes,
                          std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      graph, keep,
      [&](Graph& target, ValueId, Node node) {
        const bool forward = node.op == "conv2d";
        const bool data_gradient = node.op == "conv2d_grad_input";
        if ((!forward && !data_gradient) || node.type.dtype != DType::f32)
          return target.add_typed(std::move(node));
        const Shape& weight = target.type(node.inputs[1]).shape;
        const Shape input =
            forward ? target.type(node.inputs[0]).shape : node.attrs.get_ints("input_shape");
        const ConvGeometry g = conv_geometry(node.attrs, input, weight);
        const int64_t taps = g.kernel_height * g.kernel_width;
        if (g.groups != 1 || reads_buffers_directly(g)) return target.add_typed(std::move(node));
        if (forward) {
          if (column_bytes(g.batch, g.in_channels, taps, g.out_height * g.out_width) >
              max_column_bytes)
            return target.add_typed(std::move(node));
          const ValueId rows = target.add("reshape", {node.inputs[1]},
                                          {{"shape", Shape{g.out_channels, g.in_channels * taps}}});
          return columns_product(target, node.inputs[0], rows, g, g.padding, g.dilation, g.stride,
                                 {g.out_height, g.out_width}, g.output_shape());
        }
        // dx[n, c, y, x] = sum over (o, kh, kw) of w[o, c, kh, kw] grad_out[n, o, y + P - D kh,
        // x + P - D kw] for stride 1: the columns of grad_out with padding -P and dilation -D,
        // against w with its first two axes swapped.
        if (g.stride != std::array<int64_t, 2>{1, 1} ||
            column_bytes(g.batch, g.out_channels, taps, g.in_height * g.in_width) >
                max_column_bytes)
          return target.add_typed(std::move(node));
        const ValueId swapped = target.add("transpose", {node.inputs[1]},
                                           {{"permutation", std::vector<int64_t>{1, 0, 2, 3}}});
        const ValueId rows = target.add("reshape", {swapped},
                                        {{"shape", Shape{g.in_channels, g.out_channels * taps}}});
        return columns_product(target, node.inputs[0], rows, g, {-g.padding[0], -g.padding[1]},
                               {-g.dilation[0], -g.dilation[1]}, {1, 1}, {g.in_height, g.in_width},
                               g.input_shape());
      },
      remap);
}

}  // namespace mg::passes
