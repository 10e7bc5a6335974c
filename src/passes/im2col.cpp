// Convolutions as explicit im2col + GEMM: conv2d and its weight and stride-1 data gradients
// become an im2col node (the taps as the columns of a GEMM operand) and a batched matmul, e.g.
// y[n] = W [O, C * KH * KW] x columns[n] [C * KH * KW, OH * OW], which is already NCHW (or, with
// the batch's columns side by side, one matmul and a transpose: columns_side_by_side below); a
// strided data gradient becomes a matmul into column gradients and a col2im node. The implicit
// GEMM works out the tap of every operand element inside its K loop; here one gather kernel does
// that once per element and the GEMM reads plain vec4 rows, which is faster on GPUs. The columns
// take C * KH * KW times the input's bytes,
// a transient value freed after its product; products whose columns pass the byte limit keep
// the implicit GEMM, as do grouped convolutions (one GEMM per group) and forwards and weight
// gradients with fewer than kMinColumnRows rows of columns (below). 1x1 convolutions with stride
// 1 and no padding take no columns: their operand is the images themselves (pointwise_as_matmul,
// rewrite_weight_gradient), where their forwards and data gradients do not already run as plain
// GEMMs over the buffers (strict precision). 3x3 stride-1 convolutions
// and their gradients where Winograd suits on the target take its transforms
// and 16 batched products instead of columns. Where the workgroup GEMM takes the product over
// the batch's columns side by side (fast precision), the columns are f16 and side by side,
// shared by the forward and the weight gradient (half_columns_forward); bfloat16 in bf16
// precision, as are the images of the routes below (each product's operands in the format the
// workgroup GEMM reads them in: SideBySideImages::rounding).
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/half_gemm.hpp"
#include "ops/winograd.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

std::vector<int64_t> pair_of(const std::array<int64_t, 2>& pair) {
  return {pair[0], pair[1]};
}

// Columns with C * KH * KW rows fewer than this leave the forward's GEMM a K, and the weight
// gradient's an N, too small to pay for the gather: the Fashion-MNIST CNN's first convolution
// (1 channel, 3 x 3: 9 rows) ran slower as im2col + matmul, while its second (16 channels: 144
// rows) gained from the columns.
constexpr int64_t kMinColumnRows = 16;

uint64_t column_bytes(int64_t batch, int64_t channels, int64_t taps, int64_t plane) {
  return static_cast<uint64_t>(batch * channels * taps * plane) * sizeof(float);
}

// Whether the columns of a batch's `plane`-sized planes go side by side ([C * KH * KW,
// N * plane], one GEMM for the batch and a transpose of its result) rather than one matrix per
// image: where a plane is not a whole number of vec4s but the batch's planes are, so that the
// GEMM reads and writes vec4s (ResNet's 7 x 7 stage, 3x3 512->512 at batch 4: planes of 49); side
// by side everywhere made the other ResNet and U-Net convolutions slower.
// MEGANEURA_COLUMNS_SIDE_BY_SIDE=0 keeps every batch apart,
// =1 puts every batch of more than one image side by side (tuning sweeps).
bool columns_side_by_side(int64_t batch, int64_t plane, const Switches& switches) {
  if (const std::optional<bool> forced = switches.columns_side_by_side) return *forced && batch > 1;
  return batch > 1 && plane % 4 != 0 && batch * plane % 4 == 0;
}

ValueId columns_of(Graph& target, ValueId source, const ConvGeometry& g,
                   std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                   std::array<int64_t, 2> stride, std::array<int64_t, 2> output_size,
                   bool side_by_side) {
  Attrs attrs{{"kernel", std::vector<int64_t>{g.kernel_height, g.kernel_width}},
              {"stride", pair_of(stride)},
              {"padding", pair_of(padding)},
              {"dilation", pair_of(dilation)},
              {"output_size", pair_of(output_size)}};
  if (side_by_side) attrs.set("images_side_by_side", int64_t{1});
  return target.add(op::im2col, {source}, std::move(attrs));
}

ValueId reshaped(Graph& target, ValueId value, Shape shape) {
  return target.add(op::reshape, {value}, {{"shape", std::move(shape)}});
}

// rows [R, K] x columns, per image: [N, R, plane] from columns [N, K, plane] (a batched GEMM
// with broadcast rows), or from side-by-side columns [K, N * plane] through [R, N * plane].
ValueId product_per_image(Graph& target, ValueId rows, ValueId columns, int64_t batch,
                          int64_t plane) {
  const ValueId product = target.add(op::matmul, {rows, columns}, {});
  const Node& column_node = target.node(columns);
  if (!images_side_by_side(column_node.attrs)) return product;
  const ValueId split = reshaped(target, product, {target.type(rows).shape[0], batch, plane});
  return target.add(op::transpose, {split}, {{"permutation", std::vector<int64_t>{1, 0, 2}}});
}

// A 1x1 convolution with stride 1 and no padding (groups 1) has the images themselves,
// [N, C, H * W] per image, as its GEMM operand, so it becomes a batched matmul over them without
// columns: where its products run on cooperative matrices, which the convolution kernels would
// feed through generated per-element index arithmetic. The strict forward and data gradient
// already run as batched GEMMs over the buffers (kernels/conv.cpp); the weight gradient becomes
// a matmul on every GPU (rewrite_weight_gradient).
bool pointwise_as_matmul(const ConvGeometry& g, const target::Target& device) {
  return g.is_pointwise() && g.groups == 1 && device.cooperative_matrices();
}

const std::vector<int64_t> kSwapLeadingAxes{1, 0, 2};

// The 16-bit operands of the products over the batch's images side by side (and over 16-bit
// images one an image), each made once for every product that reads it: a value rounded to f16,
// or to bfloat16 in bf16 precision (as the workgroup GEMM reads its operands), the batch's images
// of a value ([N, K, plane] once reshaped) side by side as [K, N * plane] (moved in 16 bits, half
// the bytes of moving them in f32: x for a 1x1 convolution's forward and weight gradient,
// grad_out for its data and weight gradients), and a convolution's 16-bit columns side by side
// (its forward's and weight gradient's operand).
class SideBySideImages {
 public:
  explicit SideBySideImages(const target::Target& device)
      : rounding_(rounding_op(device.traits().bf16_operands ? DType::bf16 : DType::f16)) {}

  // The rounding of a product's operand for the workgroup GEMM.
  std::string_view rounding() const { return rounding_; }

  ValueId rounded(Graph& target, ValueId source) {
    auto [made, inserted] = rounded_.try_emplace(source, kNoValue);
    if (inserted) made->second = target.add(rounding_, {source});
    return made->second;
  }

  ValueId of(Graph& target, ValueId source, int64_t batch, int64_t channels, int64_t plane) {
    auto [made, inserted] = made_.try_emplace(source, kNoValue);
    if (inserted) {
      const ValueId images = reshaped(target, rounded(target, source), {batch, channels, plane});
      const ValueId across =
          target.add(op::transpose, {images}, {{"permutation", kSwapLeadingAxes}});
      made->second = reshaped(target, across, {channels, batch * plane});
    }
    return made->second;
  }

  // The columns of the convolution `g` of `source`, [C * KH * KW, N * OH * OW] in 16 bits.
  ValueId columns(Graph& target, ValueId source, const ConvGeometry& g) {
    const std::vector<int64_t> key{source,        g.kernel_height, g.kernel_width, g.stride[0],
                                   g.stride[1],   g.padding[0],    g.padding[1],   g.dilation[0],
                                   g.dilation[1], g.out_height,    g.out_width};
    auto [made, inserted] = columns_.try_emplace(key, kNoValue);
    if (inserted)
      made->second = columns_of(target, rounded(target, source), g, g.padding, g.dilation, g.stride,
                                {g.out_height, g.out_width}, /*side_by_side=*/true);
    return made->second;
  }

 private:
  std::string_view rounding_;
  std::unordered_map<ValueId, ValueId> rounded_;
  std::unordered_map<ValueId, ValueId> made_;
  std::map<std::vector<int64_t>, ValueId> columns_;
};

// Whether the convolution `g`'s forward (or weight gradient) multiplies 16-bit columns side by side
// (target::Target::half_columns_suit) that fit `max_bytes`: W [O, C * KH * KW] times them.
bool half_columns_forward(const ConvGeometry& g, const target::Target& device, uint64_t max_bytes) {
  const int64_t rows = g.in_channels * g.kernel_height * g.kernel_width;
  const int64_t plane = g.out_height * g.out_width;
  return g.groups == 1 && !g.is_pointwise() && rows >= kMinColumnRows &&
         column_bytes(g.batch, g.in_channels, g.kernel_height * g.kernel_width, plane) / 2 <=
             max_bytes &&
         device.half_columns_suit(g.out_channels, rows, g.batch, plane);
}

// Whether its strided data gradient multiplies Wᵀ [C * KH * KW, O] by grad_out side by side into
// column gradients side by side.
bool half_columns_data_gradient(const ConvGeometry& g, const target::Target& device) {
  return g.groups == 1 && !g.is_pointwise() && g.stride != std::array<int64_t, 2>{1, 1} &&
         device.half_columns_suit(g.in_channels * g.kernel_height * g.kernel_width, g.out_channels,
                                  g.batch, g.out_height * g.out_width);
}

// [M, N * plane] -> [N, M, plane], reshaped to `shape`.
ValueId images_apart(Graph& target, ValueId product, int64_t batch, int64_t plane, Shape shape) {
  const int64_t m = target.type(product).shape[0];
  const ValueId moved = target.add(op::transpose, {reshaped(target, product, {m, batch, plane})},
                                   {{"permutation", kSwapLeadingAxes}});
  return reshaped(target, moved, std::move(shape));
}

// A 1x1 convolution's forward or data gradient: rows [M, K] (stored [K, M] where
// `transpose_rows`) times the images of `source` [N, K, plane], per image (a batched matmul with
// broadcast rows; a half_matmul over `source` rounded to 16 bits where the target says 16-bit
// images suit it, the rounding of the value itself so that it fuses into the value's producer) or,
// where the target says the images side by side suit it (small planes, whose per-image products
// leave the subgroup GEMM's blocks partly empty), as one 2-D half_matmul over them
// (SideBySideImages) and its [M, N * plane] result moved back to [N, M, plane]. Fast precision
// rounds both operands to f16 either way (bf16 precision to bfloat16).
ValueId pointwise_product(Graph& target, ValueId rows, bool transpose_rows, ValueId source,
                          int64_t batch, int64_t k, int64_t plane, const target::Target& device,
                          SideBySideImages& side_by_side) {
  const int64_t m = target.type(rows).shape[transpose_rows ? 1 : 0];
  Attrs attrs;
  if (transpose_rows) attrs.set("transpose_a", int64_t{1});
  if (device.half_images_suit(m, k, batch, plane)) {
    const ValueId images =
        reshaped(target, side_by_side.rounded(target, source), {batch, k, plane});
    return target.add(op::half_matmul, {side_by_side.rounded(target, rows), images},
                      std::move(attrs));
  }
  if (!device.images_side_by_side_suit(m, k, batch, plane)) {
    const ValueId images = reshaped(target, source, {batch, k, plane});
    return target.add(op::matmul, {rows, images}, std::move(attrs));
  }
  const ValueId product = target.add(op::half_matmul,
                                     {target.add(side_by_side.rounding(), {rows}),
                                      side_by_side.of(target, source, batch, k, plane)},
                                     std::move(attrs));
  return images_apart(target, product, batch, plane, {batch, m, plane});
}

// The grid of `f`'s m x m output tiles (rows, columns) of `batch` images of `output_size`, or
// nothing where its transformed tiles ([(m + 2)^2, channels, T]) would pass the columns' byte
// limit.
std::optional<std::vector<int64_t>> winograd_grid(const winograd::Variant& f, int64_t batch,
                                                  std::array<int64_t, 2> output_size,
                                                  int64_t channels, uint64_t max_bytes) {
  const int64_t tiles = f.tile_count(batch, output_size[0], output_size[1]);
  if (column_bytes(f.points(), channels, 1, tiles) > max_bytes) return std::nullopt;
  return std::vector<int64_t>{f.tiles_along(output_size[0]), f.tiles_along(output_size[1])};
}

// Winograd F(2 x 2, 3 x 3) over `source` [N, P, H, W] padded by `padding` into [N, Q, OH, OW]
// (ops/winograd.hpp): the transformed filter U [16, Q, P] (of `weights` [Q, P, 3, 3], or of
// [P, Q, 3, 3] turned by 180 degrees when `transposed`) times the transformed patches V
// [16, P, T] for the T tiles of 2 x 2 outputs, one batched product, and the output transform.
std::optional<ValueId> winograd_convolution(Graph& target, ValueId source, ValueId weights,
                                            bool transposed, std::array<int64_t, 2> padding,
                                            std::array<int64_t, 2> output_size,
                                            uint64_t max_bytes) {
  const Shape& w = target.type(weights).shape;
  const std::optional<std::vector<int64_t>> grid = winograd_grid(
      winograd::kF2, target.type(source).shape[0], output_size, std::max(w[0], w[1]), max_bytes);
  if (!grid) return std::nullopt;
  const ValueId patches =
      target.add(op::winograd_tiles, {source}, {{"tiles", *grid}, {"padding", pair_of(padding)}});
  const ValueId filter =
      target.add(op::winograd_filter, {weights}, {{"transposed", int64_t{transposed ? 1 : 0}}});
  const ValueId products = target.add(op::matmul, {filter, patches}, {});
  return target.add(op::winograd_output, {products},
                    {{"tiles", *grid}, {"output_size", pair_of(output_size)}});
}

// y[n] = W [O, C * KH * KW] x columns(x)[n]; Winograd where it suits.
std::optional<ValueId> rewrite_forward(Graph& target, const Node& node,
                                       const target::Target& device, uint64_t max_bytes,
                                       SideBySideImages& side_by_side) {
  const ConvGeometry g = conv_geometry(node.attrs, target.type(node.inputs[0]).shape,
                                       target.type(node.inputs[1]).shape);
  if (device.winograd_convolution_suits(g, false)) {
    if (auto rewritten = winograd_convolution(target, node.inputs[0], node.inputs[1], false,
                                              g.padding, {g.out_height, g.out_width}, max_bytes))
      return rewritten;
  }
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t plane = g.out_height * g.out_width;
  if (pointwise_as_matmul(g, device)) {
    const ValueId rows = reshaped(target, node.inputs[1], {g.out_channels, g.in_channels});
    return reshaped(target,
                    pointwise_product(target, rows, false, node.inputs[0], g.batch, g.in_channels,
                                      plane, device, side_by_side),
                    g.output_shape());
  }
  if (half_columns_forward(g, device, max_bytes)) {
    const ValueId rows =
        target.add(side_by_side.rounding(),
                   {reshaped(target, node.inputs[1], {g.out_channels, g.in_channels * taps})});
    const ValueId product = target.add(
        op::half_matmul, {rows, side_by_side.columns(target, node.inputs[0], g)}, Attrs{});
    return images_apart(target, product, g.batch, plane, g.output_shape());
  }
  if (g.groups != 1 || g.is_pointwise() || g.in_channels * taps < kMinColumnRows ||
      column_bytes(g.batch, g.in_channels, taps, plane) > max_bytes)
    return std::nullopt;
  const ValueId columns = columns_of(target, node.inputs[0], g, g.padding, g.dilation, g.stride,
                                     {g.out_height, g.out_width},
                                     columns_side_by_side(g.batch, plane, device.switches()));
  const ValueId rows = reshaped(target, node.inputs[1], {g.out_channels, g.in_channels * taps});
  return reshaped(target, product_per_image(target, rows, columns, g.batch, plane),
                  g.output_shape());
}

// The data gradient of a strided convolution: the column gradients W^T [C * KH * KW, O] x
// grad_out[n] [O, OH * OW], summed back onto the image by col2im (each pixel gathers the taps
// that reach it), instead of the implicit GEMM per stride phase, whose ResNet stem has only 3
// columns (C) to spread over a GPU.
// With half_columns_data_gradient, Wᵀ times grad_out's images side by side in 16 bits, one 2-D
// product into column gradients side by side.
ValueId strided_data_gradient(Graph& target, const Node& node, const ConvGeometry& g,
                              const target::Target& device, SideBySideImages& side_by_side) {
  const int64_t plane = g.out_height * g.out_width;
  const ValueId rows = reshaped(target, node.inputs[1],
                                {g.out_channels, g.in_channels * g.kernel_height * g.kernel_width});
  Attrs attrs{{"kernel", std::vector<int64_t>{g.kernel_height, g.kernel_width}},
              {"stride", pair_of(g.stride)},
              {"padding", pair_of(g.padding)},
              {"dilation", pair_of(g.dilation)},
              {"output_size", std::vector<int64_t>{g.out_height, g.out_width}},
              {"image_size", std::vector<int64_t>{g.in_height, g.in_width}}};
  ValueId column_grads = kNoValue;
  if (half_columns_data_gradient(g, device)) {
    column_grads =
        target.add(op::half_matmul,
                   {target.add(side_by_side.rounding(), {rows}),
                    side_by_side.of(target, node.inputs[0], g.batch, g.out_channels, plane)},
                   {{"transpose_a", int64_t{1}}});
    attrs.set("images_side_by_side", int64_t{1});
  } else {
    const ValueId grad_out = reshaped(target, node.inputs[0], {g.batch, g.out_channels, plane});
    column_grads = target.add(op::matmul, {rows, grad_out}, {{"transpose_a", int64_t{1}}});
  }
  return target.add(op::col2im, {column_grads}, std::move(attrs));
}

// dx[n, c, y, x] = sum over (o, kh, kw) of w[o, c, kh, kw] grad_out[n, o, y + P - D kh,
// x + P - D kw] for stride 1: the columns of grad_out with padding -P and dilation -D, against
// w with its first two axes swapped; or, where Winograd suits, the forward of grad_out padded by
// 2 - P with the filter turned. Strided ones go through col2im.
std::optional<ValueId> rewrite_data_gradient(Graph& target, const Node& node,
                                             const target::Target& device, uint64_t max_bytes,
                                             SideBySideImages& side_by_side) {
  const ConvGeometry g = conv_geometry(node.attrs, node.attrs.get_ints("input_shape"),
                                       target.type(node.inputs[1]).shape);
  if (device.winograd_convolution_suits(g, true)) {
    if (auto rewritten = winograd_convolution(
            target, node.inputs[0], node.inputs[1], true,
            {winograd::kKernel - 1 - g.padding[0], winograd::kKernel - 1 - g.padding[1]},
            {g.in_height, g.in_width}, max_bytes))
      return rewritten;
  }
  const int64_t taps = g.kernel_height * g.kernel_width;
  if (pointwise_as_matmul(g, device)) {
    const ValueId rows = reshaped(target, node.inputs[1], {g.out_channels, g.in_channels});
    return reshaped(target,
                    pointwise_product(target, rows, true, node.inputs[0], g.batch, g.out_channels,
                                      g.out_height * g.out_width, device, side_by_side),
                    g.input_shape());
  }
  if (g.groups != 1 || g.is_pointwise()) return std::nullopt;
  if (g.stride != std::array<int64_t, 2>{1, 1}) {
    if (column_bytes(g.batch, g.in_channels, taps, g.out_height * g.out_width) > max_bytes)
      return std::nullopt;
    return strided_data_gradient(target, node, g, device, side_by_side);
  }
  const int64_t plane = g.in_height * g.in_width;
  if (column_bytes(g.batch, g.out_channels, taps, plane) > max_bytes) return std::nullopt;
  const ValueId columns = columns_of(
      target, node.inputs[0], g, {-g.padding[0], -g.padding[1]}, {-g.dilation[0], -g.dilation[1]},
      {1, 1}, {g.in_height, g.in_width}, columns_side_by_side(g.batch, plane, device.switches()));
  const ValueId swapped = target.add(op::transpose, {node.inputs[1]},
                                     {{"permutation", std::vector<int64_t>{1, 0, 2, 3}}});
  const ValueId rows = reshaped(target, swapped, {g.in_channels, g.out_channels * taps});
  return reshaped(target, product_per_image(target, rows, columns, g.batch, plane),
                  g.input_shape());
}

// dw = G^T [sum over tiles of U V^T] G (ops/winograd.hpp): the transformed tiles of grad_out
// U [P, O, T] and of the input V [P, C, T], one batched product of their P = (m + 2)^2 points
// over the T tiles of m x m outputs (m from target::Target::winograd_weight_gradient_outputs), and
// the filter transform back to 3 x 3 taps. The tiles lie along the product's K, so that the
// transforms read rows of the images and write rows of tiles; tiles across, [16, T, C], made the
// product no faster and the transforms slower.
std::optional<ValueId> winograd_weight_gradient(Graph& target, const Node& node,
                                                const ConvGeometry& g, const target::Target& device,
                                                uint64_t max_bytes) {
  const int64_t outputs = device.winograd_weight_gradient_outputs(g);
  const std::optional<std::vector<int64_t>> grid =
      winograd_grid(winograd::variant(outputs), g.batch, {g.out_height, g.out_width},
                    std::max(g.in_channels, g.out_channels), max_bytes);
  if (!grid) return std::nullopt;
  // F(2 x 2) leaves `outputs` at its default, so that the input's tiles stay one value with a
  // Winograd forward's over the same input (CSE).
  Attrs variant;
  if (outputs != 2) variant.set(winograd::kOutputsAttribute, outputs);
  Attrs tile_attrs = variant;
  tile_attrs.set("tiles", *grid);
  Attrs patch_attrs = tile_attrs;
  patch_attrs.set("padding", pair_of(g.padding));
  const ValueId patches = target.add(op::winograd_tiles, {node.inputs[0]}, std::move(patch_attrs));
  const ValueId grads =
      target.add(op::winograd_grad_tiles, {node.inputs[1]}, std::move(tile_attrs));
  const ValueId products = target.add(op::matmul, {grads, patches}, {{"transpose_b", int64_t{1}}});
  return target.add(op::winograd_weight_grad, {products}, std::move(variant));
}

// dw = sum over n of grad_out[n] [O, OH * OW] x columns(x)[n]^T, then reshaped to w's shape.
// The batched product is long in K and short in outputs, so split-K slices it.
// Those that run as Winograd or on the direct kernel need no
// columns. A 1x1 convolution whose forward and data gradient multiply the images side by side
// (pointwise_product) takes grad_out's and x's side-by-side images as its operands, one 2-D
// product over K = N * plane that split-K slices.
std::optional<ValueId> rewrite_weight_gradient(Graph& target, const Node& node,
                                               const target::Target& device, uint64_t max_bytes,
                                               SideBySideImages& side_by_side) {
  const ConvGeometry g = conv_geometry(node.attrs, target.type(node.inputs[0]).shape,
                                       node.attrs.get_ints("weight_shape"));
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t plane = g.out_height * g.out_width;
  if (device.winograd_weight_gradient_suits(g)) {
    if (auto rewritten = winograd_weight_gradient(target, node, g, device, max_bytes))
      return rewritten;
  }
  // Every GPU: the convolution kernels would read both operands through generated loads. The
  // per-image products [N, O, C] are one transient value, bounded as the columns are.
  if (pointwise_as_matmul(g, device) &&
      device.images_side_by_side_suit(g.out_channels, g.in_channels, g.batch, plane) &&
      device.images_side_by_side_suit(g.in_channels, g.out_channels, g.batch, plane)) {
    const ValueId grad_out =
        side_by_side.of(target, node.inputs[1], g.batch, g.out_channels, plane);
    const ValueId images = side_by_side.of(target, node.inputs[0], g.batch, g.in_channels, plane);
    const ValueId product =
        target.add(op::half_matmul, {grad_out, images}, {{"transpose_b", int64_t{1}}});
    return reshaped(target, product, g.weight_shape());
  }
  if (g.is_pointwise() && g.groups == 1 &&
      column_bytes(g.batch, g.out_channels, g.in_channels, 1) <= max_bytes) {
    // Where the forward and the data gradient multiply 16-bit images one an image, the weight
    // gradient reads those same 16-bit copies of x and grad_out, half the bytes of the f32 values,
    // which their products would round as they read them anyway.
    const bool half_images =
        pointwise_as_matmul(g, device) &&
        device.half_images_suit(g.out_channels, g.in_channels, g.batch, plane) &&
        device.half_images_suit(g.in_channels, g.out_channels, g.batch, plane);
    const auto operand = [&](ValueId value, int64_t channels) {
      return reshaped(target, half_images ? side_by_side.rounded(target, value) : value,
                      {g.batch, channels, plane});
    };
    const ValueId per_image = target.add(
        half_images ? op::half_matmul : op::matmul,
        {operand(node.inputs[1], g.out_channels), operand(node.inputs[0], g.in_channels)},
        {{"transpose_b", int64_t{1}}});
    return reshaped(target, sum_leading_axis(target, per_image), g.weight_shape());
  }
  // Where the forward multiplies 16-bit columns side by side and the data gradient grad_out's
  // images side by side, the weight gradient is one 2-D product of the two, over K = N * plane.
  if (half_columns_forward(g, device, max_bytes) && half_columns_data_gradient(g, device)) {
    const ValueId grad_out =
        side_by_side.of(target, node.inputs[1], g.batch, g.out_channels, plane);
    const ValueId product =
        target.add(op::half_matmul, {grad_out, side_by_side.columns(target, node.inputs[0], g)},
                   {{"transpose_b", int64_t{1}}});
    return reshaped(target, product, g.weight_shape());
  }
  if (device.direct_weight_gradient_suits(g)) return std::nullopt;
  if (g.groups != 1 || g.is_pointwise() || g.in_channels * taps < kMinColumnRows ||
      column_bytes(g.batch, g.in_channels, taps, plane) > max_bytes)
    return std::nullopt;
  const ValueId columns = columns_of(target, node.inputs[0], g, g.padding, g.dilation, g.stride,
                                     {g.out_height, g.out_width}, /*side_by_side=*/false);
  const ValueId rows = reshaped(target, node.inputs[1], {g.batch, g.out_channels, plane});
  const ValueId per_image = target.add(op::matmul, {rows, columns}, {{"transpose_b", int64_t{1}}});
  return reshaped(target, sum_leading_axis(target, per_image), g.weight_shape());
}

// The nodes the pass may rewrite: f32 convolutions and their gradients.
bool is_f32_convolution(const Node& node) {
  return node.type.dtype == DType::f32 &&
         (node.op == op::conv2d || node.op == op::conv2d_grad_input ||
          node.op == op::conv2d_grad_weight);
}

}  // namespace

Graph im2col_convolutions(Graph graph, const target::Target& device, uint64_t max_column_bytes,
                          std::vector<ValueId>* remap) {
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(), is_f32_convolution))
    return unchanged(std::move(graph), remap);
  std::vector<bool> keep(graph.size(), true);
  SideBySideImages side_by_side(device);
  return rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId, Node node) {
        std::optional<ValueId> rewritten;
        if (is_f32_convolution(node)) {
          if (node.op == op::conv2d)
            rewritten = rewrite_forward(target, node, device, max_column_bytes, side_by_side);
          if (node.op == op::conv2d_grad_input)
            rewritten = rewrite_data_gradient(target, node, device, max_column_bytes, side_by_side);
          if (node.op == op::conv2d_grad_weight)
            rewritten =
                rewrite_weight_gradient(target, node, device, max_column_bytes, side_by_side);
        }
        return rewritten ? *rewritten : target.add_typed(std::move(node));
      },
      remap);
}

}  // namespace mg::passes
