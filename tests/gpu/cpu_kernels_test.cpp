// The CPU-device kernels (gemm_cpu.comp for matmul and the convolutions), which Lavapipe runs
// instead of the GPU kernels, against the f64 reference. On a GPU these tests run the GPU
// kernels. Shapes are odd so that register blocks, k chunks and grids all end partially.
// Every block shape the lowering can pick is forced once (MEGANEURA_CPU_GEMM_BLOCK), and a few
// cases also run with MEGANEURA_NO_CPU_KERNELS=1, the kill switch that forces the GPU kernels.

#include "conv_support.hpp"

namespace mg {
namespace {

using testing::check_conv;
using testing::check_on_gpu;
using testing::output_with_gradients;
using testing::ScopedSwitch;

void check_matmuls() {
  check_on_gpu({{"a", {3, 13, 21}},
                {"at", {3, 21, 13}},
                {"b", {21, 35}},
                {"bt", {1, 35, 21}},
                {"single", {1, 7}},
                {"long", {7, 37}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("nn", matmul(x[0], x[2]).id());
                 graph.set_output("nt", matmul(x[0], x[3], false, true).id());
                 graph.set_output("tn", matmul(x[1], x[2], true, false).id());
                 graph.set_output("tt", matmul(x[1], x[3], true, true).id());
                 graph.set_output("row", matmul(x[4], x[5]).id());
               });
}

TEST(GpuCpuKernels, MatmulTransposesAndBroadcast) {
  check_matmuls();
}

// Batch axes broadcast on either side, with a long K that spans many chunks plus a tail.
TEST(GpuCpuKernels, MatmulBatchBroadcast) {
  check_on_gpu({{"a", {2, 1, 5, 67}}, {"b", {1, 3, 67, 11}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("y", matmul(x[0], x[1]).id());
                 graph.set_output("yt", matmul(x[1], x[0], true, true).id());
               });
}

TEST(GpuCpuKernels, MatmulEveryBlockShape) {
  for (const char* block : {"32x8", "16x4", "8x2", "4x8", "1x2", "3x7", "5x5"}) {
    SCOPED_TRACE(block);
    const ScopedSwitch forced("MEGANEURA_CPU_GEMM_BLOCK", block);
    check_on_gpu({{"a", {2, 19, 29}}, {"b", {29, 41}}}, [](Graph& graph, std::vector<Tensor>& x) {
      graph.set_output("y", matmul(x[0], x[1]).id());
      graph.set_output("t", matmul(x[1], x[0], true, true).id());
    });
  }
}

TEST(GpuCpuKernels, ConvPadded3x3) {
  check_conv({3, 5, 9, 7}, {6, 5, 3, 3}, {.padding = {1, 1}});
}

TEST(GpuCpuKernels, ConvStrideDilationRectangular) {
  check_conv({2, 3, 11, 9}, {5, 3, 3, 2},
             {.stride = {2, 3}, .padding = {2, 1}, .dilation = {2, 1}});
  check_conv({2, 4, 8, 9}, {3, 4, 1, 1}, {});
}

TEST(GpuCpuKernels, ConvGroupsAndDepthwise) {
  check_conv({2, 6, 7, 8}, {9, 2, 3, 3}, {.stride = {2, 1}, .padding = {1, 1}, .groups = 3});
  check_conv({2, 5, 9, 8}, {10, 1, 3, 3}, {.padding = {1, 1}, .groups = 5});
}

// The classifier's second convolution, shrunk in batch and plane.
TEST(GpuCpuKernels, ConvClassifierLike) {
  check_conv({3, 16, 7, 7}, {32, 16, 3, 3}, {.padding = {1, 1}});
}

TEST(GpuCpuKernels, ConvTranspose2d) {
  const ConvTranspose2dOptions options{
      .stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 0}, .groups = 2};
  check_on_gpu({{"x", {2, 4, 5, 4}}, {"w", {4, 3, 3, 3}}, {"seed", {2, 6, 10, 7}}},
               [&](Graph& graph, std::vector<Tensor>& in) {
                 output_with_gradients(graph, conv_transpose2d(in[0], in[1], std::nullopt, options),
                                       in[2], {in[0], in[1]});
               });
}

// The kill switch: the same problems on the GPU kernels.
TEST(GpuCpuKernels, KillSwitchRunsGpuKernels) {
  const ScopedSwitch forced("MEGANEURA_NO_CPU_KERNELS", "1");
  check_matmuls();
  check_conv({2, 5, 7, 6}, {6, 5, 3, 3}, {.stride = {2, 1}, .padding = {1, 1}});
}

}  // namespace
}  // namespace mg
