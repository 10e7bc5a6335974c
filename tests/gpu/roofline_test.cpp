// Roofline costs (plan/roofline.hpp) as a Session reports them: a product's, a convolution's and
// attention's FLOPs against their textbook counts, bytes as the bound values' sizes.
#include <gtest/gtest.h>

#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/session.hpp"

namespace mg {
namespace {

// The cost of the one dispatch whose label starts with `op` (the planner may add others).
DispatchCost cost_of(const Session& session, const std::string& op) {
  for (const DispatchCost& cost : session.report().dispatch_costs)
    if (cost.label.rfind(op + " %", 0) == 0) return cost;
  ADD_FAILURE() << "no " << op << " dispatch in\n" << session.report().dispatch_list;
  return {};
}

SessionOptions plain() {
  SessionOptions options;
  // Convolutions stay convolutions (GPUs would run them as im2col and a product).
  options.switches =
      Switches::from_environment({{"MEGANEURA_SPLIT_K", "0"}, {"MEGANEURA_IM2COL", "0"}});
  return options;
}

TEST(Roofline, ProductCountsTwoFlopsPerMultiplyAdd) {
  Graph graph;
  const Tensor a = input(graph, "a", {48, 80});
  const Tensor b = input(graph, "b", {80, 24});
  graph.set_output("c", matmul(a, b).id());
  const Session session(graph, plain());
  ASSERT_EQ(session.report().dispatch_costs.size(), session.report().dispatches);
  const DispatchCost cost = cost_of(session, "matmul");
  EXPECT_EQ(cost.flops, 2.0 * 48 * 80 * 24);
  EXPECT_EQ(cost.bytes, 4.0 * (48 * 80 + 80 * 24 + 48 * 24));
}

TEST(Roofline, ConvolutionAndAttention) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 3, 10, 10});
  const Tensor w = input(graph, "w", {5, 3, 3, 3});
  graph.set_output("y", conv2d(x, w).id());  // 2 x 5 x 8 x 8 outputs of 27 taps
  const Tensor q = input(graph, "q", {1, 2, 16, 8});
  const Tensor k = input(graph, "k", {1, 2, 24, 8});
  const Tensor v = input(graph, "v", {1, 2, 24, 8});
  graph.set_output("o", scaled_dot_product_attention(q, k, v).id());
  const Session session(graph, plain());
  EXPECT_EQ(cost_of(session, "conv2d").flops, 2.0 * (2 * 5 * 8 * 8) * 27);
  // Scores q k^T and their product with v: 2 x 2 x B H Sq Sk D.
  EXPECT_EQ(cost_of(session, "scaled_dot_product_attention").flops, 4.0 * 2 * 16 * 24 * 8);
}

// A weight gradient split over K computes the unsplit product in slices: its partials' launch
// counts the same FLOPs as the whole one, not once a slice.
TEST(Roofline, WeightGradientSplitOverKCountsItsProductOnce) {
  Graph graph;
  const Tensor x = input(graph, "x", {4, 3, 18, 18});
  const Tensor w = input(graph, "w", {5, 3, 3, 3});
  const Tensor y = conv2d(x, w);  // 4 x 5 x 16 x 16 outputs of 27 taps: K = 1,024 positions
  graph.set_output("dw", gradients(graph, sum_all(y).id(), {w.id()}).at(w.id()));
  const auto flops_with = [&graph](const char* slices) {
    SessionOptions options;
    options.switches = Switches::from_environment({{"MEGANEURA_IM2COL", "0"},
                                                   {"MEGANEURA_SPLIT_K", "1"},
                                                   {"MEGANEURA_SPLIT_K_SLICES", slices}});
    const Session session(graph, options);
    return cost_of(session, "conv2d_grad_weight").flops;
  };
  const double whole = 2.0 * (4 * 5 * 16 * 16) * 27;
  EXPECT_EQ(flops_with("1"), whole);
  EXPECT_EQ(flops_with("4"), whole);
}

}  // namespace
}  // namespace mg
