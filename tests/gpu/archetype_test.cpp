#include <cstdlib>

#include "harness.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;

TEST(GpuArchetypes, PointwiseChainWithBroadcast) {
  check_on_gpu({{"a", {3, 5, 7}}, {"b", {5, 1}}}, [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("y", (relu(x[0] * x[1] + 0.5) - exp(x[1])).id());
  });
}

TEST(GpuArchetypes, MatmulOddSizesAndTransposes) {
  check_on_gpu({{"a", {2, 67, 33}}, {"b", {33, 70}}, {"c", {70, 33}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("plain", matmul(x[0], x[1]).id());
                 graph.set_output("transposed", matmul(x[0], x[2], false, true).id());
               });
}

TEST(GpuArchetypes, ReductionsShortAndLongRows) {
  check_on_gpu({{"x", {4, 300, 5}}}, [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("sum_long", sum(x[0], {1}).id());
    graph.set_output("mean_short", mean(x[0], {2}, true).id());
    graph.set_output("max_all", max(x[0], {0, 1, 2}).id());
    graph.set_output("argmax", argmax(x[0], 1).id());
    graph.set_output("softmax", softmax(x[0], 1).id());
    graph.set_output("log_softmax", log_softmax(x[0], -1).id());
  });
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The GPU GEMM picks 128, 64 or 32-wide tiles by problem size; run each through the GPU kernel
// (on Lavapipe the CPU kernel would run otherwise).
TEST(GpuArchetypes, GemmTileSizes) {
  setenv("MEGANEURA_NO_CPU_KERNELS", "1", 1);
  testing::check_on_gpu({{"a", {1536, 24}},
                         {"b", {1600, 24}},
                         {"c", {40, 600}},
                         {"d", {40, 700}},
                         {"e", {100, 33}},
                         {"f", {33, 90}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("tile128", matmul(x[0], x[1], false, true).id());
                          graph.set_output("tile64", matmul(x[2], x[3], true, false).id());
                          graph.set_output("tile32", matmul(x[4], x[5]).id());
                        });
  unsetenv("MEGANEURA_NO_CPU_KERNELS");
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The kill switch for pointwise fusion: one dispatch per elementwise op gives the same values.
TEST(GpuArchetypes, PointwiseChainUnfused) {
  setenv("MEGANEURA_NO_FUSION", "1", 1);
  testing::check_on_gpu({{"a", {3, 5, 7}}, {"b", {5, 1}}},
                        [](Graph& graph, std::vector<Tensor>& x) {
                          graph.set_output("y", (relu(x[0] * x[1] + 0.5) - exp(x[1])).id());
                        });
  unsetenv("MEGANEURA_NO_FUSION");
}

}  // namespace
}  // namespace mg
