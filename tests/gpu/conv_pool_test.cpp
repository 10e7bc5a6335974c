// Convolution, pooling and resampling kernels against the f64 reference, forward and backward.
// Gradients come from mg::gradients seeded with a random cotangent (not ones), so a backward
// kernel that reads the wrong output gradient element cannot pass by symmetry.

#include "backends/vulkan/runtime/gpu.hpp"
#include "conv_support.hpp"

namespace mg {
namespace {

using testing::check_conv;
using testing::check_on_gpu;
using testing::output_with_gradients;
using testing::ScopedSwitch;

TEST(GpuConv, Pointwise1x1) {
  check_conv({2, 4, 7, 7}, {5, 4, 1, 1}, {});
}

// 1x1 convolutions (stride 1, no padding) on the GPU kernels run as batched GEMMs over buffers:
// vec4 loads where the plane and channels allow (4 x 8 plane, 8 and 12 channels), scalar ones
// where they do not (3 x 5 plane, 6 and 10 channels), two groups, and conv_transpose2d, which is
// the data gradient's GEMM.
TEST(GpuConv, PointwiseAsBufferGemm) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_conv({2, 8, 4, 8}, {12, 8, 1, 1}, {});
  check_conv({3, 6, 3, 5}, {10, 3, 1, 1}, {.groups = 2});
  check_on_gpu({{"x", {2, 6, 3, 5}}, {"w", {6, 4, 1, 1}}, {"seed", {2, 8, 3, 5}}},
               [](Graph& graph, std::vector<Tensor>& in) {
                 output_with_gradients(graph,
                                       conv_transpose2d(in[0], in[1], std::nullopt, {.groups = 2}),
                                       in[2], {in[0], in[1]});
               });
}

TEST(GpuConv, Same3x3) {
  check_conv({2, 3, 9, 8}, {4, 3, 3, 3}, {.padding = {1, 1}});
}

TEST(GpuConv, Stem7x7Stride2) {
  check_conv({2, 3, 9, 9}, {4, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}});
}

TEST(GpuConv, Rectangular5x5MixedStride) {
  check_conv({2, 3, 8, 9}, {5, 3, 5, 3}, {.stride = {2, 1}, .padding = {2, 0}});
}

// Convolutions as im2col + matmul (passes/im2col.cpp, on by default for GPUs, forced here for
// Lavapipe; every case has at least 16 rows of columns, C * KH * KW, below which forwards and
// weight gradients stay implicit): forwards and weight gradients with padding, stride and
// dilation, the stride-1 data gradients (also from columns side by side) and the strided ones
// (col2im), on the CPU-device kernels and on the GPU ones (the im2col and col2im kernels, the
// batched buffer GEMM with a broadcast weight, the weight gradient's batched product and its
// sum).
TEST(GpuConv, Im2colThenMatmul) {
  const ScopedSwitch im2col("MEGANEURA_IM2COL", "1");
  for (const char* gpu_kernels : {"0", "1"}) {
    const ScopedSwitch kernels("MEGANEURA_NO_CPU_KERNELS", gpu_kernels);
    check_conv({2, 3, 9, 8}, {4, 3, 3, 3}, {.padding = {1, 1}});
    check_conv({1, 3, 11, 10}, {3, 3, 3, 2}, {.padding = {2, 1}, .dilation = {2, 3}});
    check_conv({2, 3, 13, 12}, {8, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}});
    check_conv({1, 2, 12, 13}, {3, 2, 3, 3},
               {.stride = {3, 2}, .padding = {1, 2}, .dilation = {2, 1}});
    check_conv({2, 16, 8, 8}, {6, 16, 1, 1}, {.stride = {2, 2}});
    // Planes of 25: the forward's and the data gradient's columns lie side by side, [36, 100].
    check_conv({4, 4, 5, 5}, {6, 4, 3, 3}, {.padding = {1, 1}});
    // A plane of 576: the weight gradient's product is split over K, and its sums over the
    // slices and the batch merge into one.
    const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    check_conv({2, 3, 24, 24}, {4, 3, 3, 3}, {.padding = {1, 1}});
  }
}

// Columns stored as packed f16 pairs (MEGANEURA_PACKED_COLUMNS=1) for the CPU-device GEMM,
// which reads them through the same functions as the cooperative-matrix GEMM (whose own tests,
// GpuCoopMatrix.*Convolutions*, run with them on devices that have it; other GPUs cannot pack
// for their strict GEMM, so this test is skipped there): the forward, data gradient and weight
// gradient of a same-padded 3x3 and a strided
// 3x3 convolution (whose data gradient goes through col2im, no columns) against the reference
// at f16's precision. The worst error must also exceed f32's, or the columns were not rounded
// to f16 and the packed path did not run. A third case's output width, 7, is not a multiple of
// 4: its columns stay f32, and so does its error.
TEST(GpuConv, PackedColumns) {
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  if (devices[gpu::choose_device(devices, "")].kind != gpu::DeviceKind::cpu)
    GTEST_SKIP() << "packed columns feed only the CPU-device GEMM in strict precision";
  const ScopedSwitch im2col("MEGANEURA_IM2COL", "1");
  const ScopedSwitch packed("MEGANEURA_PACKED_COLUMNS", "1");
  const auto build = [](Conv2dOptions options) {
    return [options](Graph& graph, std::vector<Tensor>& in) {
      testing::output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, options), in[2],
                                     {in[0], in[1]});
    };
  };
  const double same =
      check_on_gpu({{"x", {2, 4, 8, 12}}, {"w", {5, 4, 3, 3}}, {"seed", {2, 5, 8, 12}}},
                   build({.padding = {1, 1}}), 3e-3, 21);
  EXPECT_GT(same, 1e-6);
  const double strided =
      check_on_gpu({{"x", {2, 4, 16, 16}}, {"w", {6, 4, 3, 3}}, {"seed", {2, 6, 8, 8}}},
                   build({.stride = {2, 2}, .padding = {1, 1}}), 3e-3, 22);
  EXPECT_GT(strided, 1e-6);
  check_on_gpu({{"x", {2, 4, 13, 13}}, {"w", {6, 4, 3, 3}}, {"seed", {2, 6, 7, 7}}},
               build({.stride = {2, 2}, .padding = {1, 1}}), 1e-5, 23);
}

// Strided data gradients run as one GEMM per stride phase (backends/vulkan/kernels/conv.cpp):
// stride 3 with padding past the stride, a kernel narrower than the stride (phases without any tap,
// whose gradient is zero), extents that do not divide by the stride (phases with fewer pixels) and
// two groups; then on the square-tile GEMM with 32 x 32 products per phase.
TEST(GpuConv, StridedDataGradientPhases) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  check_conv({2, 4, 11, 13}, {6, 2, 2, 5}, {.stride = {3, 2}, .padding = {4, 1}, .groups = 2});
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch square_tiles("MEGANEURA_GEMM_TILE", "32");
  check_conv({2, 33, 17, 16}, {40, 33, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}});
}

// Products of at most 4 columns on gemm_rows.comp (one thread per row), forced on Lavapipe's GPU
// kernels: the stem-like data gradient (3 input channels, stride phases), a depthwise forward
// (one column per group) with a channel multiplier, and a dilated 2-channel data gradient.
TEST(GpuConv, FewColumnProductsOneRowPerThread) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch rows("MEGANEURA_CONV_ROWS", "1");
  check_conv({2, 3, 11, 10}, {5, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}});
  check_conv({2, 3, 7, 8}, {6, 1, 3, 3}, {.stride = {2, 1}, .padding = {1, 1}, .groups = 3});
  check_conv({1, 2, 9, 9}, {4, 2, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}});
}

TEST(GpuConv, Dilation2) {
  check_conv({2, 4, 9, 9}, {4, 4, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}});
}

TEST(GpuConv, Groups2Strided) {
  check_conv({2, 6, 8, 7}, {4, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2});
}

TEST(GpuConv, Depthwise) {
  check_conv({2, 5, 8, 9}, {5, 1, 3, 3}, {.padding = {1, 1}, .groups = 5});
  // Channel multiplier 2.
  check_conv({2, 3, 7, 7}, {6, 1, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 3});
}

// A GEMM larger than one tile in every dimension, with K not a multiple of the tile depth.
TEST(GpuConv, SeveralTiles) {
  check_conv({2, 9, 12, 11}, {70, 9, 3, 3}, {.padding = {1, 1}});
}

// Every tile shape the lowering can pick (MEGANEURA_CONV_TILES indexes its table), on a
// problem where each GEMM spans several tiles or leaves partial ones.
TEST(GpuConv, EveryTileShape) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  for (int config = 0; config < 8; ++config) {
    SCOPED_TRACE("tile config " + std::to_string(config));
    const ScopedSwitch tiles("MEGANEURA_CONV_TILES", std::to_string(config));
    check_conv({1, 5, 9, 10}, {66, 5, 3, 3}, {.padding = {1, 1}});
  }
}

// Products of at least 32 x 32 that suit its square tiles run on gemm.comp's generated-load form;
// here the GPU kernels are forced on Lavapipe (whose default is the CPU kernels) and
// MEGANEURA_GEMM_TILE forces the route: forward, data and weight gradient in every tile size,
// odd extents leaving partial tiles and K not a multiple of the slice depth.
TEST(GpuConv, SquareTileGemmEveryTile) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  for (const char* tile : {"128", "64", "32"}) {
    SCOPED_TRACE(tile);
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", tile);
    check_conv({2, 36, 9, 7}, {40, 36, 3, 3}, {.padding = {1, 1}});
  }
}

// Two groups with mixed stride, dilation and padding, every GEMM at least 32 x 32 per group:
// forward 48 x 34, data gradient 110 x 33, weight gradient 34 x 198.
TEST(GpuConv, SquareTileGemmGroupsStrideDilation) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch square_tiles("MEGANEURA_GEMM_TILE", "32");
  check_conv({1, 66, 11, 10}, {68, 33, 3, 2},
             {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2});
}

// The weight gradient's K = 2 x 17 x 17 = 578 is long enough for the split-K pass: two slices
// of 304, whose partial gradients the square-tile GEMM reads through the split load functions;
// one GEMM and one reduction dispatch instead of one GEMM.
TEST(GpuConv, SquareTileGemmSplitKWeightGradient) {
  const ScopedSwitch implicit("MEGANEURA_IM2COL", "0");  // the implicit-GEMM route on GPUs too
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch square_tiles("MEGANEURA_GEMM_TILE", "32");
  const auto build = [](Graph& graph, std::vector<Tensor>& in) {
    output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, {.padding = {1, 1}}), in[2],
                          {in[1]});
  };
  const std::vector<testing::HarnessInput> inputs{
      {"x", {2, 32, 17, 17}}, {"w", {32, 32, 3, 3}}, {"seed", {2, 32, 17, 17}}};
  size_t split_dispatches = 0, whole_dispatches = 0;
  {
    const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    check_on_gpu(inputs, build, 1e-5, 7, {}, &split_dispatches);
  }
  const ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  check_on_gpu(inputs, build, 1e-5, 7, {}, &whole_dispatches);
  EXPECT_EQ(split_dispatches, whole_dispatches + 1);
}

// The inputs and graph of a stride-1 convolution's weight gradient under a random cotangent.
std::pair<std::vector<testing::HarnessInput>, std::function<void(Graph&, std::vector<Tensor>&)>>
weight_gradient_check(const Shape& x, const Shape& w, const Conv2dOptions& options) {
  const Shape y{x[0], w[0], testing::conv_extent(x[2], w[2], 1, options.padding[0], 1),
                testing::conv_extent(x[3], w[3], 1, options.padding[1], 1)};
  return {{{"x", x}, {"w", w}, {"seed", y}}, [options](Graph& graph, std::vector<Tensor>& in) {
            output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, options), in[2],
                                  {in[1]});
          }};
}

// The direct weight gradient (backends/vulkan/kernels/conv_weight_grad.hpp) on the GPU kernels,
// forced on (these shapes are too small for the rule's occupancy minimum;
// Passes.DirectWeightGradient* checks the rule): whole 64-channel tiles, partial channel tiles on
// both sides (70 output, 18 input channels) and 3 x 2 taps, padding 2 (output larger than the
// input) with output rows of 19 in chunks of 10 and 9, and a partial output tile over rows of 14.
// Tiles of 14 columns and wider (the image of the first case, both of the last) are fetched 4
// channels a load unit, the others a channel at a time. All but the second split over K (each
// variant costs Lavapipe seconds to compile). With the kernel off the same weight gradient takes
// more dispatches (im2col columns and a GEMM, or the implicit GEMM and its reduction), so the
// counts show which one ran.
TEST(GpuConv, DirectWeightGradient) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch im2col("MEGANEURA_IM2COL", "1");
  const ScopedSwitch winograd("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0");
  struct Case {
    Shape x, w;
    Conv2dOptions options;
    const char* split;
  };
  const std::vector<Case> cases{{{2, 64, 9, 12}, {64, 64, 3, 3}, {.padding = {1, 1}}, "1"},
                                {{3, 18, 7, 11}, {70, 18, 3, 2}, {.padding = {1, 0}}, "0"},
                                {{1, 8, 5, 17}, {4, 8, 3, 3}, {.padding = {2, 2}}, "1"},
                                {{2, 64, 3, 14}, {70, 64, 3, 3}, {.padding = {1, 1}}, "1"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_string(c.x) + " * " + shape_string(c.w));
    const auto [inputs, build] = weight_gradient_check(c.x, c.w, c.options);
    const ScopedSwitch split_k("MEGANEURA_SPLIT_K", c.split);
    size_t direct_dispatches = 0, other_dispatches = 0;
    {
      const ScopedSwitch direct("MEGANEURA_DIRECT_WEIGHT_GRAD", "1");
      check_on_gpu(inputs, build, 1e-5, 7, {}, &direct_dispatches);
    }
    const ScopedSwitch off("MEGANEURA_DIRECT_WEIGHT_GRAD", "0");
    check_on_gpu(inputs, build, 1e-5, 7, {}, &other_dispatches);
    EXPECT_LT(direct_dispatches, other_dispatches);
  }
}

// The Winograd weight gradient (ops/winograd.hpp) on the GPU kernels, forced on (the rule,
// which Passes.WeightGradientRoutesAndDirectSplits checks, wants 128 tiles and channels), with
// F(2 x 2, 3 x 3) and F(4 x 4, 3 x 3) tiles: padding 1 over an odd output height (a last row of
// tiles partly past grad_out), padding 0 and 2 (output larger than the input), and 529 tiles
// whose product is split over K into 3 partial products, which the filter transform sums itself.
// Each with fusion off as well, where its two tile transforms take a launch each instead of one:
// one dispatch more, so the pair ran; and that is one more than the columns take (the gather,
// the product and the sum), so Winograd ran.
TEST(GpuConv, WinogradWeightGradient) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch im2col("MEGANEURA_IM2COL", "1");
  const ScopedSwitch direct("MEGANEURA_DIRECT_WEIGHT_GRAD", "0");
  struct Case {
    Shape x, w;
    Conv2dOptions options;
    const char* slices;
  };
  for (const int64_t outputs : {2, 4}) {
    const ScopedSwitch tile("MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE", std::to_string(outputs).c_str());
    const int64_t split_extent = 23 * outputs;  // 529 tiles
    const std::vector<Case> cases{
        {{2, 5, 9, 8}, {6, 5, 3, 3}, {.padding = {1, 1}}, "1"},
        {{1, 3, 7, 10}, {4, 3, 3, 3}, {}, "1"},
        {{1, 4, 5, 6}, {3, 4, 3, 3}, {.padding = {2, 2}}, "1"},
        {{1, 4, split_extent, split_extent}, {4, 4, 3, 3}, {.padding = {1, 1}}, "3"}};
    for (const Case& c : cases) {
      SCOPED_TRACE("F(" + std::to_string(outputs) + ") " + shape_string(c.x) + " * " +
                   shape_string(c.w));
      const auto [inputs, build] = weight_gradient_check(c.x, c.w, c.options);
      const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", c.slices);
      size_t paired = 0, apart = 0, columns = 0;
      {
        const ScopedSwitch winograd("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1");
        check_on_gpu(inputs, build, 1e-5, 7, {}, &paired);
        const ScopedSwitch no_fusion("MEGANEURA_NO_FUSION", "1");
        check_on_gpu(inputs, build, 1e-5, 7, {}, &apart);
      }
      const ScopedSwitch off("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0");
      const ScopedSwitch no_fusion("MEGANEURA_NO_FUSION", "1");
      check_on_gpu(inputs, build, 1e-5, 7, {}, &columns);
      EXPECT_EQ(paired + 1, apart);
      EXPECT_EQ(apart, columns + 1);
    }
  }
}

// The Winograd forward and data gradient on the GPU (forced on: these shapes are below the
// rule's minimums) against the f64 reference: padding 1 over odd extents (a last row and column
// of tiles half past the image), padding 0 and 2 (the data gradient's grad_out padded by 2 and
// 0). Winograd takes four launches a convolution (input tiles, filter, product, output
// transform) where the columns take two for the forward (gather, product) and three for the data
// gradient (gather, the filter's transpose, product): three more in all, so it ran.
TEST(GpuConv, WinogradForwardAndDataGradient) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch im2col("MEGANEURA_IM2COL", "1");
  const ScopedSwitch weight_route("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0");
  for (const auto& [x, padding] :
       {std::pair<Shape, int64_t>{{2, 5, 9, 8}, 1}, {{1, 3, 7, 10}, 0}, {{1, 4, 5, 6}, 2}}) {
    SCOPED_TRACE(shape_string(x));
    const Shape w{6, x[1], 3, 3};
    const int64_t side = 2 * padding - 2;
    const Shape y{x[0], 6, x[2] + side, x[3] + side};
    const auto build = [&](Graph& graph, std::vector<Tensor>& in) {
      const Tensor out = conv2d(in[0], in[1], std::nullopt, {.padding = {padding, padding}});
      graph.set_output("y", out.id());
      graph.set_output("dx", gradients(graph, out.id(), {in[0].id()}, in[2].id()).at(in[0].id()));
    };
    size_t winograd = 0, columns = 0;
    {
      const ScopedSwitch on("MEGANEURA_WINOGRAD_CONV", "1");
      check_on_gpu({{"x", x}, {"w", w}, {"seed", y}}, build, 1e-5, 9, {}, &winograd);
    }
    const ScopedSwitch off("MEGANEURA_WINOGRAD_CONV", "0");
    check_on_gpu({{"x", x}, {"w", w}, {"seed", y}}, build, 1e-5, 9, {}, &columns);
    EXPECT_EQ(winograd, columns + 3);
  }
}

TEST(GpuConv, Transpose2dStride2OutputPadding) {
  // [2, 4, 5, 5] -> (5 - 1) * 2 - 2 + 2 + 1 + 1 = 10.
  for (int64_t groups : {1, 2}) {
    const ConvTranspose2dOptions options{
        .stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 1}, .groups = groups};
    check_on_gpu({{"x", {2, 4, 5, 5}}, {"w", {4, 6 / groups, 3, 3}}, {"seed", {2, 6, 10, 10}}},
                 [&](Graph& graph, std::vector<Tensor>& in) {
                   output_with_gradients(graph,
                                         conv_transpose2d(in[0], in[1], std::nullopt, options),
                                         in[2], {in[0], in[1]});
                 });
  }
}

// The gradient runs in cells of stride_h x stride_w input pixels, each loading the windows that
// meet it: overlapping windows over extents the stride does not divide (partial cells), then
// windows narrower than the stride (pixels that no window reads, whose gradient is zero).
TEST(GpuConv, MaxPoolOverlappingPadded) {
  check_on_gpu(
      {{"x", {2, 3, 9, 8}}, {"seed", {2, 3, 5, 4}}}, [](Graph& graph, std::vector<Tensor>& in) {
        output_with_gradients(graph, max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}), in[1], {in[0]});
      });
  check_on_gpu(
      {{"x", {1, 2, 8, 10}}, {"seed", {1, 2, 3, 4}}}, [](Graph& graph, std::vector<Tensor>& in) {
        output_with_gradients(graph, max_pool2d(in[0], {2, 2}, {3, 3}, {0, 1}), in[1], {in[0]});
      });
}

// relu makes many exact ties (zeros): the gradient must go to the first one of each window,
// with the windows' maxima given (`pooled`, as max_pool2d's gradient passes them) or not.
// The backward op is added directly, since differentiating through relu would zero exactly
// the gradients that a wrong tie-break misroutes.
TEST(GpuConv, MaxPoolTiesGoToFirst) {
  check_on_gpu({{"x", {2, 2, 7, 7}}, {"dy", {2, 2, 6, 4}}},
               [](Graph& graph, std::vector<Tensor>& in) {
                 const Tensor x = relu(in[0] - 0.5);
                 const Attrs attrs{{"kernel", std::vector<int64_t>{2, 3}},
                                   {"stride", std::vector<int64_t>{1, 2}},
                                   {"padding", std::vector<int64_t>{0, 1}}};
                 const Tensor y = max_pool2d(x, {2, 3}, {1, 2}, {0, 1});
                 graph.set_output("y", y.id());
                 graph.set_output("dx", graph.add("max_pool2d_grad", {x.id(), in[1].id()}, attrs));
                 graph.set_output(
                     "dx given pooled",
                     graph.add("max_pool2d_grad", {x.id(), in[1].id(), y.id()}, attrs));
               });
}

TEST(GpuConv, AvgPoolPadded) {
  check_on_gpu(
      {{"x", {2, 3, 9, 8}}, {"seed", {2, 3, 5, 3}}}, [](Graph& graph, std::vector<Tensor>& in) {
        output_with_gradients(graph, avg_pool2d(in[0], {3, 4}, {2, 3}, {1, 2}), in[1], {in[0]});
      });
}

TEST(GpuConv, UpsampleNearest) {
  check_on_gpu({{"x", {2, 3, 5, 7}}, {"seed", {2, 3, 15, 21}}},
               [](Graph& graph, std::vector<Tensor>& in) {
                 output_with_gradients(graph, upsample_nearest2d(in[0], 3), in[1], {in[0]});
               });
}

TEST(GpuConv, UpsampleBilinearUpAndDown) {
  check_on_gpu({{"x", {2, 3, 5, 7}}, {"seed", {2, 3, 9, 16}}},
               [](Graph& graph, std::vector<Tensor>& in) {
                 output_with_gradients(graph, upsample_bilinear2d(in[0], 9, 16), in[1], {in[0]});
               });
  check_on_gpu({{"x", {2, 3, 9, 8}}, {"seed", {2, 3, 4, 3}}},
               [](Graph& graph, std::vector<Tensor>& in) {
                 output_with_gradients(graph, upsample_bilinear2d(in[0], 4, 3), in[1], {in[0]});
               });
}

TEST(GpuConv, SmallCnnGradients) {
  check_on_gpu(
      {{"x", {2, 3, 9, 9}}, {"w1", {4, 3, 3, 3}}, {"w2", {5, 4, 3, 3}}, {"seed", {2, 5, 4, 4}}},
      [](Graph& graph, std::vector<Tensor>& in) {
        const Tensor h = relu(conv2d(in[0], in[1], std::nullopt, {.padding = {1, 1}}));
        const Tensor pooled = max_pool2d(h, {2, 2});
        const Tensor y = conv2d(pooled, in[2], std::nullopt, {.padding = {1, 1}});
        output_with_gradients(graph, y, in[3], {in[0], in[1], in[2]});
      });
}

}  // namespace
}  // namespace mg
