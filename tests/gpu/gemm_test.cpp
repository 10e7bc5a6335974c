// The SIMT GEMM (gemm.comp) in every tile configuration, split-K partial products (k_splits) on
// the GPU and CPU-device kernels, and the split-K pass end to end, against the f64 reference. On
// Lavapipe gemm.comp runs only with MEGANEURA_NO_CPU_KERNELS=1.
#include <cstdlib>

#include "conv_support.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;
using testing::ScopedEnv;

// The partial products of a matmul over `splits` K slices (what the split-K pass emits).
Tensor split_matmul(Tensor a, Tensor b, bool transpose_a, bool transpose_b, int64_t splits) {
  Graph& graph = a.graph();
  return Tensor(&graph, graph.add("matmul", {a.id(), b.id()},
                                  {{"transpose_a", int64_t{transpose_a}},
                                   {"transpose_b", int64_t{transpose_b}},
                                   {"k_splits", splits}}));
}

// Every operand layout with vec4 and scalar global loads (a contiguous extent of 40, 132 or 44
// allows vec4s, 33, 21 or 19 does not), ragged tiles, broadcast batches on both sides, two row
// tiles even at 128, and K slices (multiples of 16) whose last one is short: K = 33 in [0, 32)
// and [32, 33), K = 44 and K = 40 in three. Cold pipeline compiles dominate on Lavapipe, so the
// outputs are few.
void check_gemm_layouts() {
  check_on_gpu({{"a", {2, 1, 37, 40}},
                {"b", {1, 3, 40, 36}},
                {"at_odd", {33, 21}},
                {"bt_odd", {19, 33}},
                {"at", {40, 132}},
                {"b_odd", {40, 21}},
                {"a_k44", {21, 44}},
                {"bt_k44", {36, 44}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("nn_vec4_broadcast", matmul(x[0], x[1]).id());
                 graph.set_output("tt_scalar_split", split_matmul(x[2], x[3], true, true, 2).id());
                 graph.set_output("tn_two_row_tiles", matmul(x[4], x[5], true, false).id());
                 graph.set_output("nt_vec4_split", split_matmul(x[6], x[7], false, true, 3).id());
                 graph.set_output("nn_broadcast_split",
                                  split_matmul(x[0], x[1], false, false, 3).id());
               });
}

TEST(GpuGemm, EveryTileConfiguration) {
  const ScopedEnv gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  for (const char* tile : {"128", "64", "32"}) {
    SCOPED_TRACE(tile);
    const ScopedEnv forced("MEGANEURA_GEMM_TILE", tile);
    check_gemm_layouts();
  }
}

// Split-K partial products on the device's default GEMM (gemm_cpu.comp on Lavapipe).
TEST(GpuGemm, DefaultKernelKSplits) {
  check_on_gpu({{"a", {2, 1, 7, 40}}, {"b", {1, 3, 40, 9}}, {"at", {33, 6}}, {"bt", {5, 33}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("nn", split_matmul(x[0], x[1], false, false, 3).id());
                 graph.set_output("tt", split_matmul(x[2], x[3], true, true, 2).id());
               });
}

// A long-K product with a small output, its weight gradient (K = the 600 rows) included, split
// over K: the sum of the partial products matches the whole one on both GEMM kernels, and each
// of the two split products costs one GEMM and one reduction dispatch.
void check_split_k() {
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor y = matmul(x[0], x[1], false, true);
    testing::output_with_gradients(graph, y, x[2], {x[1]});
    graph.set_output("long_k", matmul(x[3], x[4], true, false).id());
  };
  const std::vector<testing::HarnessInput> inputs{
      {"x", {600, 6}}, {"w", {5, 6}}, {"seed", {600, 5}}, {"at", {700, 7}}, {"b", {700, 9}}};
  const ScopedEnv split("MEGANEURA_SPLIT_K", "1");
  check_on_gpu(inputs, build);

  Graph graph;
  std::vector<Tensor> x;
  for (const testing::HarnessInput& spec : inputs) x.push_back(input(graph, spec.name, spec.shape));
  build(graph, x);
  const size_t split_dispatches = Session(graph).report().dispatches;
  const ScopedEnv whole("MEGANEURA_SPLIT_K", "0");
  EXPECT_EQ(split_dispatches, Session(graph).report().dispatches + 2);
}

TEST(GpuGemm, SplitKEndToEnd) {
  check_split_k();
}

TEST(GpuGemm, SplitKEndToEndOnGpuKernels) {
  const ScopedEnv gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_split_k();
}

}  // namespace
}  // namespace mg
