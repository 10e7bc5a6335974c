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
