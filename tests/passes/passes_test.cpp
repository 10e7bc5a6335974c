// Every pass keeps outputs unchanged: random graphs (with repeated subexpressions, dead nodes
// and foldable constants) evaluate to the same values before and after, on the f64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "ops/half_gemm.hpp"
#include "ops/interpreter.hpp"
#include "ops/k_split.hpp"
#include "ops/op.hpp"
#include "passes/passes.hpp"

namespace mg {
namespace {

// The split rules were tuned on an H200; the slice counts below are its.
constexpr int64_t kH200ComputeUnits = 132;

// A GPU like the H200 (the limits the GEMM tiles are chosen by) with `compute_units` units and
// `switches` set (docs/SWITCHES.md).
target::DeviceTraits h200_like(
    int64_t compute_units = kH200ComputeUnits,
    const std::map<std::string, std::string, std::less<>>& switches = {}) {
  target::DeviceTraits device;
  device.switches = Switches::from_environment(switches);
  device.compute_units = compute_units;
  device.max_shared_memory_bytes = 49152;
  device.max_workgroup_invocations = 1024;
  return device;
}

Graph random_graph(uint64_t seed, Environment& environment) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Graph graph;
  std::vector<Tensor> pool;
  for (int i = 0; i < 3; ++i) {
    const std::string name = "x" + std::to_string(i);
    pool.push_back(input(graph, name, {4, 5}));
    HostTensor value({4, 5});
    for (double& element : value.data) element = uniform(generator);
    environment.leaves[name] = value;
  }
  for (int i = 0; i < 24; ++i) {
    const Tensor a = pool[generator() % pool.size()];
    const Tensor b = pool[generator() % pool.size()];
    switch (generator() % 8) {
      case 0:
        pool.push_back(a + b);
        break;
      case 1:
        pool.push_back(a * b);
        break;
      case 2:
        pool.push_back(tanh(a) - b);
        break;
      // The same expression twice: CSE merges it.
      case 3:
        pool.push_back((a * 2.0) + (a * 2.0));
        break;
      // Constant arithmetic: folding replaces it by one constant.
      case 4:
        pool.push_back(a + (scalar(graph, 3.0) * scalar(graph, 0.5)));
        break;
      case 5:
        pool.push_back(matmul(a, b, false, true) * 0.1 + scalar(graph, 1.0));
        break;
      case 6:
        pool.push_back(broadcast_to(sum(a, {1}, true), {4, 5}));
        break;
      default:
        pool.push_back(sigmoid(a) * b);
        break;  // may stay unused: DCE drops it
    }
    if (pool.back().shape() != Shape{4, 5}) pool.pop_back();
  }
  graph.set_output("y", pool.back().id());
  graph.set_output("z", pool[pool.size() / 2].id());
  return graph;
}

void expect_same_outputs(const Graph& before, const Graph& after, const Environment& environment) {
  verify(after);
  const std::vector<HostTensor> expected = evaluate(before, environment);
  const std::vector<HostTensor> got = evaluate(after, environment);
  for (const auto& [name, id] : before.outputs()) {
    const HostTensor& a = expected[id];
    const HostTensor& b = got[after.output(name)];
    ASSERT_EQ(a.shape, b.shape);
    for (int64_t i = 0; i < a.elements(); ++i) {
      // Relative: a pass may reorder a sum, which moves the last bits of large values.
      EXPECT_NEAR(a.data[i], b.data[i], 1e-12 * std::max(1.0, std::abs(a.data[i]))) << name;
    }
  }
}

TEST(Passes, OptimizeKeepsOutputsOnRandomGraphs) {
  for (uint64_t seed = 1; seed <= 25; ++seed) {
    Environment environment;
    const Graph graph = random_graph(seed, environment);
    const Graph optimized = passes::optimize(graph);
    EXPECT_LE(optimized.size(), graph.size());
    expect_same_outputs(graph, optimized, environment);
  }
}

TEST(Passes, EachPassAloneKeepsOutputs) {
  Environment environment;
  const Graph graph = random_graph(99, environment);
  expect_same_outputs(graph, passes::fold_constants(graph), environment);
  expect_same_outputs(graph, passes::eliminate_common_subexpressions(graph), environment);
  expect_same_outputs(graph, passes::eliminate_dead_code(graph), environment);
}

// A pass with nothing to rewrite returns the graph as it is, node for node, with the identity
// remap (its caller moves the graph in and pays for no copy): dead-code elimination of a graph
// without dead nodes, f16 storage without f16 values, the workgroup GEMM on a strict device,
// batch-norm decomposition without batch norms, merged sums without sums of sums, head padding
// without attention, im2col without convolutions and the dQ GEMM without attention gradients.
// Given something to rewrite, each still rewrites.
TEST(Passes, PassesWithNothingToRewriteReturnTheGraphAsItIs) {
  Environment environment;
  const Graph graph = passes::optimize(random_graph(7, environment));
  const vulkan::VulkanTarget strict(h200_like());
  const std::vector<std::pair<std::string, std::function<Graph(std::vector<ValueId>*)>>> passes = {
      {"dead code", [&](auto* remap) { return passes::eliminate_dead_code(graph, remap); }},
      {"f16 storage", [&](auto* remap) { return passes::half_storage(graph, strict, remap); }},
      {"workgroup GEMM", [&](auto* remap) { return passes::workgroup_gemm(graph, strict, remap); }},
      {"batch norm",
       [&](auto* remap) { return passes::decompose_batch_norm(graph, 1, false, remap); }},
      {"leading sums", [&](auto* remap) { return passes::merge_leading_sums(graph, remap); }},
      {"head padding", [&](auto* remap) { return passes::pad_attention_heads(graph, 16, remap); }},
      {"im2col",
       [&](auto* remap) { return passes::im2col_convolutions(graph, strict, 1 << 30, remap); }},
      {"dQ GEMM",
       [&](auto* remap) { return passes::attention_grad_q_gemm(graph, 1 << 30, remap); }}};
  for (const auto& [name, pass] : passes) {
    SCOPED_TRACE(name);
    std::vector<ValueId> remap;
    const Graph result = pass(&remap);
    EXPECT_EQ(result.to_string(), graph.to_string());
    ASSERT_EQ(remap.size(), graph.size());
    for (size_t i = 0; i < remap.size(); ++i) EXPECT_EQ(remap[i], static_cast<ValueId>(i));
  }
  Graph with_dead = graph;
  sigmoid(Tensor(&with_dead, with_dead.outputs().begin()->second));  // read by nothing
  EXPECT_EQ(passes::eliminate_dead_code(with_dead).size(), graph.size());
  Graph summed;
  const Tensor x = input(summed, "x", {2, 3, 4});
  summed.set_output("y", sum(sum(x, {0}), {0}).id());
  EXPECT_EQ(passes::merge_leading_sums(summed).size(), summed.size() - 1);
  Graph half;
  half.set_output("y", cast(input(half, "x", {4}), DType::f16).id());
  EXPECT_NE(passes::half_storage(half, strict).to_string(), half.to_string());
}

TEST(Passes, CseAndFoldingShrinkTheGraph) {
  Graph graph;
  const Tensor x = input(graph, "x", {3});
  const Tensor y = (x * 2.0) + (x * 2.0) + scalar(graph, 1.0) * scalar(graph, 4.0);
  graph.set_output("y", y.id());
  sigmoid(x);  // dead
  const Graph optimized = passes::optimize(graph);
  EXPECT_LT(optimized.size(), graph.size());
  Environment environment;
  environment.leaves["x"] = HostTensor({3}, {0.5, -1.0, 2.0});
  expect_same_outputs(graph, optimized, environment);
}

// Constants that differ only past the sixth significant digit are different values: CSE keeps
// both, and the result is that of the graph without the pass.
TEST(Passes, CseKeepsConstantsThatDifferInTheSeventhDigit) {
  Graph graph;
  const Tensor x = input(graph, "x", {2});
  const Tensor y = x * 1.0000001 - x * 1.0000002;
  graph.set_output("y", y.id());
  const Graph optimized = passes::eliminate_common_subexpressions(graph);
  Environment environment;
  environment.leaves["x"] = HostTensor({2}, {1e6, -3e6});
  EXPECT_EQ(optimized.size(), graph.size());
  expect_same_outputs(graph, optimized, environment);
  const HostTensor result = evaluate(optimized, environment)[optimized.output("y")];
  EXPECT_LT(result.data[0], -0.05);
  EXPECT_NEAR(result.data[1], -3 * result.data[0], 1e-9);
}

// The split-K node of a split graph: its k_splits, checked to be followed by the sum over them.
int64_t only_split(const Graph& split, const std::string& op) {
  int64_t splits = 0;
  for (ValueId id = 0; id < static_cast<ValueId>(split.size()); ++id) {
    const Node& node = split.node(id);
    if (node.op != op || !node.attrs.has("k_splits")) continue;
    EXPECT_EQ(splits, 0) << "one split node";
    splits = node.attrs.get_int("k_splits");
    const auto sum = std::find_if(split.nodes().begin(), split.nodes().end(), [&](const Node& n) {
      return n.op == "sum" && n.inputs == std::vector<ValueId>{id};
    });
    EXPECT_NE(sum, split.nodes().end()) << "partials are summed";
  }
  return splits;
}

// Convolution weight gradients (K = N * OH * OW = 1024) are split over K, in 8 slices of 128.
TEST(Passes, SplitKKeepsWeightGradients) {
  Graph graph;
  Environment environment;
  std::mt19937_64 generator(4);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const Tensor x = input(graph, "x", {4, 2, 16, 16});
  const Tensor w = input(graph, "w", {3, 2, 3, 3});
  for (const auto& [name, shape] : {std::pair<std::string, Shape>{"x", {4, 2, 16, 16}},
                                    std::pair<std::string, Shape>{"w", {3, 2, 3, 3}}}) {
    HostTensor value(shape);
    for (double& element : value.data) element = uniform(generator);
    environment.leaves[name] = value;
  }
  Conv2dOptions options;
  options.padding = {1, 1};
  const Tensor y = conv2d(x, w, std::nullopt, options);
  graph.set_output("dw", gradients(graph, sum_all(y * y).id(), {w.id()}).at(w.id()));
  const Graph split = passes::split_k(graph, vulkan::VulkanTarget(h200_like()));
  EXPECT_EQ(only_split(split, "conv2d_grad_weight"), 8);
  expect_same_outputs(graph, split, environment);
}

// Random long-K products with few output tiles (transposes, broadcast batches, K not a multiple
// of the slice alignment) become one node of partial products over K slices, at least 32 long,
// whose sum matches; those of at most 8 rows against B stored [N, K] stay whole (their own
// kernel reads B once, kernels::few_rows_gemm_suits).
TEST(Passes, SplitKKeepsProductsOnRandomGraphs) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 generator(seed);
    const auto extent = [&](int64_t low, int64_t high) {
      return low + static_cast<int64_t>(generator() % static_cast<uint64_t>(high - low + 1));
    };
    const int64_t m = extent(1, 9), n = extent(1, 9), k = extent(512, 1500), batch = extent(1, 3);
    const bool transpose_a = generator() % 2, transpose_b = generator() % 2;
    const Shape a_shape = transpose_a ? Shape{batch, 1, k, m} : Shape{batch, 1, m, k};
    const Shape b_shape = transpose_b ? Shape{2, n, k} : Shape{2, k, n};
    Graph graph;
    Environment environment;
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    for (const auto& [name, shape] :
         {std::pair<std::string, Shape>{"a", a_shape}, {"b", b_shape}}) {
      HostTensor value(shape);
      for (double& element : value.data) element = uniform(generator);
      environment.leaves[name] = value;
    }
    const Tensor a = input(graph, "a", a_shape);
    const Tensor b = input(graph, "b", b_shape);
    const Tensor product = matmul(a, b, transpose_a, transpose_b);
    graph.set_output("y", tanh(product).id());
    graph.set_output("product", product.id());
    const Graph split = passes::split_k(graph, vulkan::VulkanTarget(h200_like()));
    if (m <= 8 && transpose_b) {
      EXPECT_EQ(only_split(split, "matmul"), 0) << "M = " << m << ", K = " << k;
      continue;
    }
    const int64_t splits = only_split(split, "matmul");
    ASSERT_GE(splits, 2) << "K = " << k;
    EXPECT_GE(k_slice_length(k, splits), 32);
    expect_same_outputs(graph, split, environment);
  }
}

// The sums of one random input over reduced axes that straddle a kept axis.
struct SumCase {
  Shape shape;
  std::vector<int64_t> axes;
  bool keepdims;
};

// The values of a leaf "x" of `shape`, drawn uniformly from [low, high) with `seed`.
Environment random_x(const Shape& shape, uint64_t seed, double low, double high) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(low, high);
  Environment environment;
  HostTensor value(shape);
  for (double& element : value.data) element = uniform(generator);
  environment.leaves["x"] = value;
  return environment;
}

size_t sum_count(const Graph& graph) {
  return static_cast<size_t>(std::count_if(graph.nodes().begin(), graph.nodes().end(),
                                           [](const Node& node) { return node.op == "sum"; }));
}

// Sums around a kept axis with few outputs become two sums whose result matches: a convolution
// bias gradient ([N, C, H, W] over N, H, W, with and without keepdims), reduced axes on both
// sides of two kept axes, and negative axes. Sums with many outputs, short inner rows or no kept
// axis between reduced ones stay one node.
TEST(Passes, SplitReductionsSumsInnerAxesFirst) {
  const std::vector<SumCase> split_cases{{{6, 3, 12, 13}, {0, 2, 3}, true},
                                         {{6, 3, 12, 13}, {0, 2, 3}, false},
                                         {{2, 3, 4, 5, 160}, {0, 2, 4}, false},
                                         {{5, 2, 9, 16}, {-4, -1, -2}, true}};
  const std::vector<SumCase> whole_cases{{{4, 1024, 2, 64}, {0, 2, 3}, true},
                                         {{64, 3, 2, 5}, {0, 2, 3}, true},
                                         {{3, 4, 200}, {1, 2}, false},
                                         {{300, 7}, {0}, false}};
  uint64_t seed = 10;
  for (const auto& [cases, splits] :
       {std::pair{&split_cases, true}, std::pair{&whole_cases, false}}) {
    for (const SumCase& sum_case : *cases) {
      SCOPED_TRACE(splits ? "split" : "whole");
      Graph graph;
      const Environment environment = random_x(sum_case.shape, ++seed, -1.0, 1.0);
      const Tensor x = input(graph, "x", sum_case.shape);
      graph.set_output("y", sum(x, sum_case.axes, sum_case.keepdims).id());
      const Graph split = passes::split_reductions(graph);
      EXPECT_EQ(sum_count(split), splits ? 2u : 1u);
      expect_same_outputs(graph, split, environment);
    }
  }
}

// The max of a few long contiguous rows becomes the maxima of chunks, then of each row's
// (passes/split_reductions.cpp), with the same result: attention's per-head max |dO| over
// [B, H, S, D] (S * D = 96,000, chunks of 1,000) with keepdims, one row of 73,728 (chunks of
// 1,024) over every axis, and negative axes. A max over a kept inner axis, of 65 rows, of rows
// shorter than 16,384 or of a length without a divisor in [128, 1024] (a prime), and a sum of
// that shape, stay one node. Sums are chunked likewise from rows of 262,144 (two such rows, and
// a 512 x 576 parameter's gradient over every axis, as clipping sums its squares).
TEST(Passes, SplitReductionsChunksFewLongRowsOfAMax) {
  struct MaxCase {
    Shape shape;
    std::vector<int64_t> axes;
    bool keepdims, chunked;
    std::string op = "max";
  };
  const std::vector<MaxCase> cases{
      {{1, 6, 1500, 64}, {2, 3}, true, true}, {{1, 9, 128, 64}, {}, false, true},
      {{2, 3, 16384}, {-1}, false, true},     {{2, 16384, 3}, {1}, false, false},
      {{65, 16384}, {1}, false, false},       {{4, 16000}, {1}, false, false},
      {{2, 16411}, {1}, false, false},        {{1, 6, 1500, 64}, {2, 3}, true, false, "sum"},
      {{2, 262144}, {1}, false, true, "sum"}, {{512, 576}, {}, false, true, "sum"}};
  uint64_t seed = 40;
  for (const MaxCase& max_case : cases) {
    SCOPED_TRACE(max_case.op + " of " + shape_string(max_case.shape));
    Graph graph;
    const Environment environment = random_x(max_case.shape, ++seed, -3.0, 1.0);
    const Tensor x = input(graph, "x", max_case.shape);
    const Tensor y = max_case.op == "max" ? max(x, max_case.axes, max_case.keepdims)
                                          : sum(x, max_case.axes, max_case.keepdims);
    graph.set_output("y", y.id());
    const Graph split = passes::split_reductions(graph);
    const auto reductions = std::count_if(split.nodes().begin(), split.nodes().end(),
                                          [&](const Node& node) { return node.op == max_case.op; });
    EXPECT_EQ(reductions, max_case.chunked ? 2 : 1);
    EXPECT_EQ(split.type(split.output("y")).shape, graph.type(graph.output("y")).shape);
    expect_same_outputs(graph, split, environment);
  }
}

// A cross-entropy over many logits becomes its per_row form and a sum with the same loss
// (ignored rows and label smoothing included); a small one stays one node.
TEST(Passes, SplitReductionsComputesLargeCrossEntropyPerRow) {
  std::mt19937_64 generator(31);
  std::uniform_real_distribution<double> uniform(-4.0, 4.0);
  for (const Shape& shape : {Shape{64, 1500}, Shape{16, 10}}) {
    Graph graph;
    Environment environment;
    HostTensor logits(shape), labels({shape[0]});
    for (double& value : logits.data) value = uniform(generator);
    for (size_t n = 0; n < labels.data.size(); ++n)
      labels.data[n] = n % 5 == 2 ? -100.0 : static_cast<double>(generator() % shape[1]);
    environment.leaves["logits"] = logits;
    environment.leaves["labels"] = labels;
    graph.set_output("loss", cross_entropy(input(graph, "logits", shape),
                                           input(graph, "labels", {shape[0]}, DType::i32), 0.05)
                                 .id());
    const Graph split = passes::split_reductions(graph);
    bool per_row = false;
    for (const Node& node : split.nodes())
      per_row = per_row || (node.op == "cross_entropy" && node.attrs.get_int("per_row", 0) == 1);
    EXPECT_EQ(per_row, shape[1] > 10) << shape_string(shape);
    expect_same_outputs(graph, split, environment);
  }
}

// The slice count of a product's matmul node after split_k on `device` (1: whole).
int64_t matmul_slices(const Graph& graph, const target::DeviceTraits& device) {
  const Graph split = passes::split_k(graph, vulkan::VulkanTarget(device));
  for (const Node& node : split.nodes())
    if (node.op == "matmul") return node.attrs.get_int("k_splits", 1);
  return 0;
}

// The products of the H200 benchmarks that split-K may cut (SmolLM's projections and data
// gradients, ResNet-50's weight gradients and strided forward as im2col matmuls, its 1x1 weight
// gradients) take the slice count that ran fastest when swept on the H200 (runs 28 and 30 in
// git's history of docs/BENCHMARKS.md).
TEST(Passes, SplitKTakesTheFastestSliceCountsMeasured) {
  struct Measured {
    std::string name;
    Shape a, b;
    bool transpose_b;
    int64_t fastest;
  };
  const std::vector<Measured> products{
      {"q_proj 128x576x576", {128, 576}, {576, 576}, false, 12},
      {"up 128x1536x576", {128, 576}, {576, 1536}, false, 5},
      {"up dX 128x576x1536", {128, 1536}, {1536, 576}, false, 12},
      {"lm_head dX 128x576x49152", {128, 49152}, {49152, 576}, false, 58},
      {"3x3 dW", {4, 64, 3136}, {4, 576, 3136}, true, 6},
      {"7x7/2 dW", {4, 64, 12544}, {4, 147, 12544}, true, 16},
      {"3x3/2 dW", {4, 128, 784}, {4, 1152, 784}, true, 3},
      {"3x3/2 forward", {128, 1152}, {4, 1152, 784}, false, 2},
      {"3x3 forward", {64, 576}, {4, 576, 3136}, false, 1}};
  for (const Measured& product : products) {
    Graph graph;
    graph.set_output("y", matmul(input(graph, "a", product.a), input(graph, "b", product.b), false,
                                 product.transpose_b)
                              .id());
    EXPECT_EQ(matmul_slices(graph, h200_like()), product.fastest) << product.name;
  }
  // ResNet-50's 1x1 weight gradients at batch 4 on the implicit GEMM through generated loads,
  // where the im2col pass does not make them matmuls (MEGANEURA_IM2COL=0).
  struct MeasuredConvolution {
    int64_t in_channels, out_channels, side, fastest;
  };
  for (const MeasuredConvolution& convolution :
       std::vector<MeasuredConvolution>{{256, 64, 56, 31}, {512, 128, 28, 8}}) {
    Graph graph;
    const Tensor images =
        input(graph, "images", {4, convolution.in_channels, convolution.side, convolution.side});
    const Tensor weight =
        input(graph, "weight", {convolution.out_channels, convolution.in_channels, 1, 1});
    const Tensor y = conv2d(images, weight, std::nullopt, {});
    graph.set_output("dw", gradients(graph, sum_all(y * y).id(), {weight.id()}).at(weight.id()));
    const Graph split = passes::split_k(graph, vulkan::VulkanTarget(h200_like()));
    EXPECT_EQ(only_split(split, "conv2d_grad_weight"), convolution.fastest)
        << "1x1 " << convolution.in_channels << "->" << convolution.out_channels;
  }
}

// gemm.comp pads neither extent of a product whose last 128 x 128 tiles are at most half full
// along both M and N: U-Net's F(4 x 4) Winograd weight gradient, 36 products of 320 x 320, runs
// on 64 x 64 tiles (900 workgroups) with 16-deep slices (chains of 32 and 8 over K = 512 and
// 128). A product with one half-full edge keeps the half-tall 64 x 128 tile (5 x 4 tiles of
// 320 x 512), and so does one through generated loads (the implicit-GEMM convolutions, 5 x 3
// tiles of 320 x 320).
TEST(Passes, GemmTilesPadNeitherHalfFullEdge) {
  const kernels::SimtGemmLaunch long_k =
      kernels::simt_gemm_launch(320, 320, 512, 512, 36, false, h200_like());
  EXPECT_EQ(long_k.workgroups, 36 * 5 * 5);
  EXPECT_EQ(long_k.chain, 512 / 16);
  EXPECT_FALSE(long_k.four_by_four);
  EXPECT_EQ(kernels::simt_gemm_launch(320, 320, 128, 128, 36, false, h200_like()).chain, 128 / 16);
  EXPECT_EQ(kernels::simt_gemm_launch(320, 512, 512, 512, 36, false, h200_like()).workgroups,
            36 * 5 * 4);
  EXPECT_EQ(kernels::simt_gemm_launch(320, 320, 512, 512, 36, true, h200_like()).workgroups,
            36 * 5 * 3);
}

// The slice count follows the device's compute units: SmolLM's 128 x 576 x 49152 data gradient
// takes fewer slices on fewer units. On cooperative matrices (fast precision) a matmul takes the
// modelled count, which weighs each workgroup's chain of K steps against the partial results
// every slice writes, within the coarse rule's bound: SmolLM2's 128 x 576 x 576 projections on
// 6 slices and its 128 x 1536 x 576 MLP data gradient on 12 (9 and 24 by the coarse rule of
// MEGANEURA_COOP_SPLIT_MODEL=0: one 128 x 128 tile a compute unit, two where one leaves fewer
// than three slices, slices of at least 64), while the products whose partials outweigh a
// shorter chain keep the coarse rule's count: the lm_head's 26, ResNet's strided 3x3 weight
// gradient as 4 products of 128 x 1152 x 784 (36 tiles) on 3, U-Net's 320-channel convolution
// as 2 products of 320 x 1024 x 2880 (48 tiles) on 5 (measured fastest there by the coarse
// rule: runs 32 and 34 in git's history of docs/BENCHMARKS.md). A product small enough to stay
// on gemm.comp (16 x 1024 x 512, under 64K multiply-adds a unit) is split as in strict
// precision.
TEST(Passes, SplitKFollowsComputeUnits) {
  Graph graph;
  const Tensor dx = matmul(input(graph, "a", {128, 49152}), input(graph, "b", {49152, 576}));
  graph.set_output("dx", dx.id());
  const auto slices = [&](int64_t units) { return matmul_slices(graph, h200_like(units)); };
  EXPECT_GT(slices(kH200ComputeUnits), slices(16));
  EXPECT_GT(slices(16), slices(4));
  EXPECT_GT(slices(4), 1);

  target::DeviceTraits coop = h200_like();
  coop.fast_precision = true;
  coop.coop_matrix_f16_nv = true;
  EXPECT_EQ(matmul_slices(graph, coop), 26);
  Graph q_proj;
  q_proj.set_output("y",
                    matmul(input(q_proj, "a", {128, 576}), input(q_proj, "b", {576, 576})).id());
  EXPECT_EQ(matmul_slices(q_proj, coop), 6);
  Graph up_data_gradient;
  up_data_gradient.set_output("dx", matmul(input(up_data_gradient, "dy", {128, 1536}),
                                           input(up_data_gradient, "w", {1536, 576}))
                                        .id());
  EXPECT_EQ(matmul_slices(up_data_gradient, coop), 12);
  Graph strided_weight_gradient;
  strided_weight_gradient.set_output(
      "dw", matmul(input(strided_weight_gradient, "dy", {4, 128, 784}),
                   input(strided_weight_gradient, "columns", {4, 784, 1152}))
                .id());
  EXPECT_EQ(matmul_slices(strided_weight_gradient, coop), 3);
  Graph unet_convolution;
  unet_convolution.set_output("y", matmul(input(unet_convolution, "w", {320, 2880}),
                                          input(unet_convolution, "columns", {2, 2880, 1024}))
                                       .id());
  EXPECT_EQ(matmul_slices(unet_convolution, coop), 5);
  target::DeviceTraits coarse = coop;
  coarse.switches.coop_split_model = false;
  EXPECT_EQ(matmul_slices(q_proj, coarse), 9);
  EXPECT_EQ(matmul_slices(up_data_gradient, coarse), 24);
  EXPECT_EQ(matmul_slices(graph, coarse), 26);
  EXPECT_EQ(matmul_slices(strided_weight_gradient, coarse), 3);
  EXPECT_EQ(matmul_slices(unet_convolution, coarse), 5);
  Graph small;
  small.set_output("y", matmul(input(small, "a", {16, 512}), input(small, "b", {512, 1024})).id());
  EXPECT_EQ(matmul_slices(small, coop), matmul_slices(small, h200_like()));
  EXPECT_GT(matmul_slices(small, coop), 1);

  // MEGANEURA_SPLIT_K_SLICES forces the count on any device (1: whole); misuse names it.
  const auto forced_slices = [&](int64_t units, const char* count) {
    return matmul_slices(graph, h200_like(units, {{"MEGANEURA_SPLIT_K_SLICES", count}}));
  };
  EXPECT_EQ(forced_slices(kH200ComputeUnits, "13"), 13);
  EXPECT_EQ(forced_slices(4, "13"), 13);
  EXPECT_EQ(forced_slices(kH200ComputeUnits, "1"), 1);
  for (const char* bad : {"0", "1025", "13x", ""}) {
    SCOPED_TRACE(bad);
    try {
      forced_slices(kH200ComputeUnits, bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("MEGANEURA_SPLIT_K_SLICES='"), std::string::npos);
    }
  }
}

// Products that fill the GPU or have a K below 512 stay whole.
TEST(Passes, SplitKLeavesLargeOrShortProducts) {
  Graph graph;
  const Tensor wide = matmul(input(graph, "a", {2048, 600}), input(graph, "b", {600, 2048}));
  const Tensor short_k = matmul(input(graph, "c", {8, 500}), input(graph, "d", {500, 8}));
  // 100 output tiles: two slices would not pay for their sum (a 3x3 convolution as a matmul).
  const Tensor most_units = matmul(input(graph, "e", {64, 576}), input(graph, "f", {4, 576, 3136}));
  graph.set_output("wide", wide.id());
  graph.set_output("short", short_k.id());
  graph.set_output("most units", most_units.id());
  const Graph split = passes::split_k(graph, vulkan::VulkanTarget(h200_like()));
  EXPECT_EQ(split.size(), graph.size());
  for (ValueId id = 0; id < static_cast<ValueId>(split.size()); ++id)
    EXPECT_FALSE(split.node(id).attrs.has("k_splits"));
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

size_t count_op(const Graph& graph, const std::string& op) {
  return static_cast<size_t>(std::count_if(graph.nodes().begin(), graph.nodes().end(),
                                           [&](const Node& node) { return node.op == op; }));
}

// y = conv2d(x, w) with leaves x, w and a cotangent g of y's shape, whose values (uniform in
// [-1, 1], from `seed`) go into `environment`.
struct RandomConv {
  Tensor x, w, y, g;
};
RandomConv random_conv(Graph& graph, Environment& environment, uint64_t seed, const Shape& x_shape,
                       const Shape& w_shape, const Conv2dOptions& options) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const Tensor x = input(graph, "x", x_shape);
  const Tensor w = input(graph, "w", w_shape);
  const Tensor y = conv2d(x, w, std::nullopt, options);
  const Tensor g = input(graph, "g", y.shape());
  for (const auto& [name, shape] :
       {std::pair{std::string("x"), x_shape}, std::pair{std::string("w"), w_shape},
        std::pair{std::string("g"), y.shape()}}) {
    HostTensor value(shape);
    for (double& element : value.data) element = uniform(generator);
    environment.leaves[name] = value;
  }
  return {x, w, y, g};
}

// The im2col rewrite against the convolution references (an independent loop over taps): the
// forward and the weight gradient with padding, stride and dilation, the stride-1 data gradient
// (columns of grad_out with negative padding and dilation) and the strided one (col2im of the
// column gradients), on random inputs; the forward's and the stride-1 data gradient's columns
// side by side where a plane is not a whole number of vec4s and the batch's planes are; grouped
// convolutions, columns past the byte limit and forwards and weight gradients with fewer than 16
// rows of columns (C * KH * KW) stay convolutions, and 1x1 products take no columns (their
// forwards and data gradients run over the buffers, their weight gradients as matmuls).
TEST(Passes, Im2colKeepsConvolutionsAndGradients) {
  struct Case {
    Shape x, w;
    Conv2dOptions options;
    size_t im2col_nodes;      // one for each of the forward, data and weight gradients rewritten
    size_t col2im_nodes;      // strided data gradients
    size_t side_by_side = 0;  // im2col nodes with the batch's columns side by side
  };
  const std::vector<Case> cases = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, {.padding = {1, 1}}, 3, 0},
      {{1, 3, 11, 10}, {3, 3, 3, 2}, {.padding = {2, 1}, .dilation = {2, 3}}, 3, 0},
      // Planes of 42, two of them 84 floats: the forward's columns side by side.
      {{2, 3, 13, 12}, {4, 3, 5, 5}, {.stride = {2, 2}, .padding = {2, 2}}, 2, 1, 1},
      {{2, 3, 15, 14}, {5, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}, 2, 1},
      {{1, 2, 12, 13},
       {3, 2, 3, 3},
       {.stride = {3, 2}, .padding = {1, 2}, .dilation = {2, 1}},
       2,
       1},
      {{2, 16, 8, 8}, {6, 16, 1, 1}, {.stride = {2, 2}}, 2, 1},
      {{1, 4, 7, 7}, {6, 2, 3, 3}, {.padding = {1, 1}, .groups = 2}, 0, 0},
      {{2, 5, 6, 6}, {3, 5, 1, 1}, {}, 0, 0},
      {{2, 16, 6, 6}, {3, 16, 1, 1}, {.padding = {1, 0}}, 3, 0},
      // 9 rows of columns: the forward and the weight gradient stay implicit.
      {{2, 1, 9, 9}, {4, 1, 3, 3}, {.padding = {1, 1}}, 1, 0},
      // Planes of 49, four of them 196 floats: the forward's and the data gradient's columns
      // side by side; two planes (98) or one stay apart.
      {{4, 3, 7, 7}, {5, 3, 3, 3}, {.padding = {1, 1}}, 3, 0, 2},
      {{2, 3, 7, 7}, {5, 3, 3, 3}, {.padding = {1, 1}}, 3, 0, 0},
      {{1, 3, 7, 7}, {5, 3, 3, 3}, {.padding = {1, 1}}, 3, 0, 0},
      // Strided: the forward's 3 x 3 planes side by side, the data gradient through col2im.
      {{4, 4, 9, 9}, {6, 4, 3, 3}, {.stride = {3, 3}}, 2, 1, 1},
  };
  uint64_t seed = 20;
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_string(c.x) + " * " + shape_string(c.w));
    Graph graph;
    Environment environment;
    const auto [x, w, y, seed_grad] = random_conv(graph, environment, seed++, c.x, c.w, c.options);
    graph.set_output("y", y.id());
    const std::map<ValueId, ValueId> grads =
        gradients(graph, sum_all(y * seed_grad).id(), {x.id(), w.id()});
    graph.set_output("dx", grads.at(x.id()));
    graph.set_output("dw", grads.at(w.id()));
    const Graph rewritten =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(h200_like()), uint64_t{1} << 30);
    EXPECT_EQ(count_op(rewritten, "im2col"), c.im2col_nodes);
    EXPECT_EQ(count_op(rewritten, "col2im"), c.col2im_nodes);
    EXPECT_EQ(std::count_if(rewritten.nodes().begin(), rewritten.nodes().end(),
                            [](const Node& node) {
                              return node.op == "im2col" &&
                                     node.attrs.get_int("images_side_by_side", 0) == 1;
                            }),
              static_cast<std::ptrdiff_t>(c.side_by_side));
    expect_same_outputs(graph, rewritten, environment);
    // A byte limit below the smallest columns keeps every convolution.
    const Graph limited = passes::im2col_convolutions(graph, vulkan::VulkanTarget(h200_like()), 64);
    EXPECT_EQ(count_op(limited, "im2col") + count_op(limited, "col2im"), 0u);
  }
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// Nested sums over leading axes become one sum over all of them; a sum that is also used
// elsewhere, kept axes and sums over later axes stay as they are. Then the im2col weight
// gradient after split-K: its partials [S, N, O, K] are summed once.
TEST(Passes, MergeLeadingSums) {
  std::mt19937_64 generator(31);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Graph graph;
  Environment environment;
  const Tensor x = input(graph, "x", {3, 4, 5, 6});
  HostTensor value({3, 4, 5, 6});
  for (double& element : value.data) element = uniform(generator);
  environment.leaves["x"] = value;
  graph.set_output("merged", sum(sum(x, {0}), {0, 1}).id());
  graph.set_output("all", sum_all(sum(x, {0, 1})).id());
  const Tensor shared = sum(x, {0});
  graph.set_output("shared", shared.id());
  graph.set_output("of shared", sum(shared, {0}).id());
  graph.set_output("kept", sum(sum(x, {0}, true), {0}).id());
  graph.set_output("later", sum(sum(x, {0}), {1}).id());
  const Graph merged = passes::merge_leading_sums(graph);
  // Two sums each for merged, all, kept and later, one each for shared and of shared; merged and
  // all become one.
  EXPECT_EQ(count_op(graph, "sum"), 10u);
  EXPECT_EQ(count_op(merged, "sum"), 8u);
  expect_same_outputs(graph, merged, environment);

  Graph conv;
  Environment conv_environment;
  const Tensor images = input(conv, "images", {4, 3, 24, 24});
  // 9 output channels: the weight gradient's product has too many rows for the few-rows kernel,
  // which takes products whole.
  const Tensor weight = input(conv, "weight", {9, 3, 3, 3});
  for (const auto& [name, shape] : {std::pair{std::string("images"), Shape{4, 3, 24, 24}},
                                    std::pair{std::string("weight"), Shape{9, 3, 3, 3}}}) {
    HostTensor leaf(shape);
    for (double& element : leaf.data) element = uniform(generator);
    conv_environment.leaves[name] = leaf;
  }
  const Tensor y = conv2d(images, weight, std::nullopt, {.padding = {1, 1}});
  conv.set_output("dw", gradients(conv, sum_all(y * y).id(), {weight.id()}).at(weight.id()));
  const Graph split = passes::eliminate_dead_code(passes::split_k(
      passes::im2col_convolutions(conv, vulkan::VulkanTarget(h200_like()), uint64_t{1} << 30),
      vulkan::VulkanTarget(h200_like())));
  ASSERT_EQ(count_op(split, "sum"), 2u);  // over the K slices, then over the batch
  const Graph one_sum = passes::merge_leading_sums(split);
  EXPECT_EQ(count_op(one_sum, "sum"), count_op(split, "sum") - 1);
  expect_same_outputs(conv, one_sum, conv_environment);
}

// The 3x3 weight gradients of ResNet-50's four stages at batch 4 and of U-Net's 320 channels at
// 32 x 32, batch 2, on an H200-like GPU. Winograd (at least 128 tiles of 2 x 2 outputs and 128
// channels a side) takes ResNet's 128 and 256 channels and U-Net's; the direct kernel keeps 64
// channels and 512 over 7 x 7 (64 tiles), and split-K gives it as many splits as fill the
// compute units with workgroups (channel tiles x 3 kernel rows), or none where the tiles alone
// do: 44 at 64 channels (132 workgroups), 1 at 512 (192). With Winograd off the direct kernel
// takes 128 (11 splits, 132 workgroups) and 256 (2, 96) too, while U-Net's would leave 57 of 132
// units idle (75 workgroups) and becomes columns and a batched matmul, as every one does with
// both off. (Values: Passes.WinogradWeightGradientMatchesTheConvolution here,
// GpuConv.DirectWeightGradient and GpuConv.WinogradWeightGradient on the GPU.)
TEST(Passes, WeightGradientRoutesAndDirectSplits) {
  struct Case {
    Shape x;
    int64_t channels;
    bool winograd;
    int64_t direct_splits;  // with Winograd off; 0: columns
  };
  for (const Case& c : {Case{{4, 64, 56, 56}, 64, false, 44}, Case{{4, 128, 28, 28}, 128, true, 11},
                        Case{{4, 256, 14, 14}, 256, true, 2}, Case{{4, 512, 7, 7}, 512, false, 1},
                        Case{{2, 320, 32, 32}, 320, true, 0}}) {
    SCOPED_TRACE(shape_string(c.x));
    Graph graph;
    const Tensor x = input(graph, "x", c.x);
    const Tensor w = input(graph, "w", {c.channels, c.channels, 3, 3});
    const Tensor seed = input(graph, "seed", c.x);
    const Tensor y = conv2d(x, w, std::nullopt, {.padding = {1, 1}});
    graph.set_output("dw", gradients(graph, y.id(), {w.id()}, seed.id()).at(w.id()));
    graph = passes::eliminate_dead_code(graph);  // the forward, which dw does not read
    const auto expect_direct = [&](const Graph& rewritten) {
      EXPECT_EQ(count_op(rewritten, "conv2d_grad_weight"), 1u);
      EXPECT_EQ(count_op(rewritten, "im2col") + count_op(rewritten, "winograd_tiles"), 0u);
      const Graph split = passes::split_k(rewritten, vulkan::VulkanTarget(h200_like()));
      if (c.direct_splits > 1) {
        EXPECT_EQ(only_split(split, "conv2d_grad_weight"), c.direct_splits);
      } else {
        EXPECT_EQ(count_op(split, "sum"), 0u);
      }
    };
    const Graph chosen =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(h200_like()), uint64_t{1} << 30);
    if (c.winograd) {
      EXPECT_EQ(count_op(chosen, "winograd_tiles"), 1u);
      EXPECT_EQ(count_op(chosen, "winograd_grad_tiles"), 1u);
      EXPECT_EQ(count_op(chosen, "winograd_weight_grad"), 1u);
      EXPECT_EQ(count_op(chosen, "conv2d_grad_weight"), 0u);
    } else {
      expect_direct(chosen);
    }
    const Graph without_winograd = passes::im2col_convolutions(
        graph,
        vulkan::VulkanTarget(
            h200_like(kH200ComputeUnits, {{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0"}})),
        uint64_t{1} << 30);
    if (c.direct_splits > 0) {
      expect_direct(without_winograd);
    } else {
      EXPECT_EQ(count_op(without_winograd, "im2col"), 1u);
    }
    const Graph columns = passes::im2col_convolutions(
        graph,
        vulkan::VulkanTarget(h200_like(kH200ComputeUnits, {{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0"},
                                                           {"MEGANEURA_DIRECT_WEIGHT_GRAD", "0"}})),
        uint64_t{1} << 30);
    EXPECT_EQ(count_op(columns, "conv2d_grad_weight"), 0u);
    EXPECT_EQ(count_op(columns, "im2col"), 1u);
  }
}

// The weight gradient alone of a square 3 x 3 convolution (padding 1) over input shape `x`.
Graph square_weight_gradient(const Shape& x) {
  Graph graph;
  const Tensor input_x = input(graph, "x", x);
  const Tensor w = input(graph, "w", {x[1], x[1], 3, 3});
  const Tensor seed = input(graph, "seed", x);
  const Tensor y = conv2d(input_x, w, std::nullopt, {.padding = {1, 1}});
  graph.set_output("dw", gradients(graph, y.id(), {w.id()}, seed.id()).at(w.id()));
  return passes::eliminate_dead_code(graph);  // the forward, which dw does not read
}

// An H200-like GPU in fast precision, with KHR cooperative matrices.
target::DeviceTraits fast_h200_like() {
  target::DeviceTraits fast = h200_like();
  fast.subgroup_size = 32;
  fast.coop_matrix_f16_khr = true;
  fast.fast_precision = true;
  return fast;
}

// Fast precision, where the direct kernel does not run and the tile products go to cooperative
// matrices: Winograd from 64 channels (ResNet's first three 3x3 stages, U-Net), the columns for
// the 64 tiles of 512 channels at 7 x 7. With MEGANEURA_NO_COOPMAT=1 the strict routes return.
TEST(Passes, FastPrecisionWeightGradientsTakeWinogradFrom64Channels) {
  const target::DeviceTraits fast = fast_h200_like();
  for (const auto& [x, winograd] : {std::pair<Shape, bool>{{4, 64, 56, 56}, true},
                                    {{4, 128, 28, 28}, true},
                                    {{4, 256, 14, 14}, true},
                                    {{4, 512, 7, 7}, false},
                                    {{2, 320, 32, 32}, true}}) {
    SCOPED_TRACE(shape_string(x));
    const Graph graph = square_weight_gradient(x);
    const Graph chosen =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(fast), uint64_t{1} << 30);
    EXPECT_EQ(count_op(chosen, "winograd_tiles"), winograd ? 1u : 0u);
    EXPECT_EQ(count_op(chosen, "im2col"), winograd ? 0u : 1u);
    EXPECT_EQ(count_op(chosen, "conv2d_grad_weight"), 0u);
    if (x[1] == 64) {
      target::DeviceTraits killed = fast;
      killed.switches.no_coopmat = true;
      const Graph strict =
          passes::im2col_convolutions(graph, vulkan::VulkanTarget(killed), uint64_t{1} << 30);
      EXPECT_EQ(count_op(strict, "winograd_tiles"), 0u);
      EXPECT_EQ(count_op(strict, "conv2d_grad_weight"), 1u);  // the direct kernel
    }
  }
}

// Where products run on cooperative matrices, a 1x1 convolution with stride 1 and no padding
// (ResNet's bottleneck ends, its largest products) is a batched matmul over the images
// themselves: its forward, data gradient and weight gradient (whose per-image products are summed)
// match the convolution's in the f64 reference, with no convolution and no columns left. Strict
// precision, and the kill switch, keep the forward and data gradient for their buffer GEMMs and
// make only the weight gradient a matmul; with a stride of 2 or padding the images are not the
// operand, and the columns are taken instead.
TEST(Passes, PointwiseConvolutionsBecomeMatmulsOnCooperativeMatrices) {
  const target::DeviceTraits fast = fast_h200_like();
  target::DeviceTraits killed = fast;
  killed.switches.no_coopmat = true;
  uint64_t seed = 90;
  for (const auto& [x_shape, w_shape, options, rewritten] :
       {std::tuple<Shape, Shape, Conv2dOptions, bool>{{3, 24, 7, 5}, {40, 24, 1, 1}, {}, true},
        {{2, 64, 8, 8}, {16, 64, 1, 1}, {}, true},
        {{2, 16, 8, 8}, {6, 16, 1, 1}, {.stride = {2, 2}}, false},
        {{2, 16, 6, 6}, {3, 16, 1, 1}, {.padding = {1, 0}}, false}}) {
    SCOPED_TRACE(shape_string(x_shape) + " * " + shape_string(w_shape));
    Graph graph;
    Environment environment;
    const auto [x, w, y, seed_grad] =
        random_conv(graph, environment, seed++, x_shape, w_shape, options);
    graph.set_output("y", y.id());
    const std::map<ValueId, ValueId> grads =
        gradients(graph, sum_all(y * seed_grad).id(), {x.id(), w.id()});
    graph.set_output("dx", grads.at(x.id()));
    graph.set_output("dw", grads.at(w.id()));
    const Graph on_fast =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(fast), uint64_t{1} << 30);
    const size_t convolutions = count_op(on_fast, "conv2d") +
                                count_op(on_fast, "conv2d_grad_input") +
                                count_op(on_fast, "conv2d_grad_weight");
    if (rewritten) {
      EXPECT_EQ(convolutions, 0u);
      EXPECT_EQ(count_op(on_fast, "matmul"), 3u);
      EXPECT_EQ(count_op(on_fast, "im2col"), 0u);
    } else {
      EXPECT_GT(count_op(on_fast, "im2col") + count_op(on_fast, "col2im"), 0u);
    }
    expect_same_outputs(graph, on_fast, environment);
    for (const target::DeviceTraits& strict : {h200_like(), killed}) {
      const Graph kept =
          passes::im2col_convolutions(graph, vulkan::VulkanTarget(strict), uint64_t{1} << 30);
      if (rewritten) {
        EXPECT_EQ(count_op(kept, "matmul"), 1u);
        EXPECT_EQ(count_op(kept, "conv2d_grad_weight"), 0u);
        EXPECT_EQ(count_op(kept, "conv2d") + count_op(kept, "conv2d_grad_input"), 2u);
        expect_same_outputs(graph, kept, environment);
      }
    }
    // Per-image weight-gradient products [N, O, C] past the column limit keep the convolution's
    // weight gradient; the forward and data gradient need no such value.
    if (rewritten) {
      const uint64_t products = static_cast<uint64_t>(x_shape[0] * w_shape[0] * w_shape[1]) * 4;
      const Graph limited =
          passes::im2col_convolutions(graph, vulkan::VulkanTarget(fast), products - 4);
      EXPECT_EQ(count_op(limited, "conv2d_grad_weight"), 1u);
      EXPECT_EQ(count_op(limited, "matmul"), 2u);
      const Graph enough = passes::im2col_convolutions(graph, vulkan::VulkanTarget(fast), products);
      EXPECT_EQ(count_op(enough, "conv2d_grad_weight"), 0u);
    }
  }
}

// On a device with the workgroup GEMM, a 1x1 convolution over planes narrower than the subgroup
// GEMM's widest block multiplies the batch's images side by side: its forward, data gradient and
// weight gradient each become one 2-D half_matmul, over x and grad_out moved side by side once
// each (two transposes there) and with the forward's and data gradient's results moved back (two
// more). On values f16 holds exactly (multiples of 2^-8) the outputs equal the convolution's in
// the f64 reference. Wider planes keep the per-image products (on f16 images where the workgroup
// GEMM takes them: PointwiseConvolutionsMultiplyF16ImagesOneAnImage) unless
// MEGANEURA_COLUMNS_SIDE_BY_SIDE=1, and =0 keeps every plane apart.
target::DeviceTraits workgroup_capable(int64_t compute_units);

// A convolution of random values that f16 holds exactly (multiples of 2^-8) in `graph`, its
// output and both gradients (of the sum of the output times a random cotangent) the graph's
// outputs y, dx and dw.
void exact_convolution_with_gradients(Graph& graph, Environment& environment, uint64_t seed,
                                      const Shape& x_shape, const Shape& w_shape,
                                      const Conv2dOptions& options) {
  const auto [x, w, y, cotangent] =
      random_conv(graph, environment, seed, x_shape, w_shape, options);
  for (auto& [name, value] : environment.leaves)
    for (double& element : value.data) element = std::round(element * 256) / 256;
  graph.set_output("y", y.id());
  const std::map<ValueId, ValueId> grads =
      gradients(graph, sum_all(y * cotangent).id(), {x.id(), w.id()});
  graph.set_output("dx", grads.at(x.id()));
  graph.set_output("dw", grads.at(w.id()));
}

// The im2col rewrite of `graph` on `traits` with a column limit of 1 GiB.
Graph im2col_within_a_gib(const Graph& graph, const target::DeviceTraits& traits) {
  return passes::im2col_convolutions(graph, vulkan::VulkanTarget(traits), uint64_t{1} << 30);
}

// The convolution nodes (forwards and both gradients) left in `graph`.
size_t convolutions_left(const Graph& graph) {
  return count_op(graph, "conv2d") + count_op(graph, "conv2d_grad_input") +
         count_op(graph, "conv2d_grad_weight");
}

// A 1x1 convolution of x to `out_channels` on values f16 holds exactly, with both gradients
// (exact_convolution_with_gradients), and its im2col rewrite on `device`, which must leave no
// convolution.
struct RewrittenConvolution {
  Graph graph;
  Environment environment;
  Graph rewritten;
};
RewrittenConvolution exact_pointwise_convolution_rewritten(uint64_t seed, const Shape& x_shape,
                                                           int64_t out_channels,
                                                           const target::DeviceTraits& device) {
  RewrittenConvolution made;
  exact_convolution_with_gradients(made.graph, made.environment, seed, x_shape,
                                   {out_channels, x_shape[1], 1, 1}, {});
  made.rewritten = im2col_within_a_gib(made.graph, device);
  EXPECT_EQ(convolutions_left(made.rewritten), 0u);
  return made;
}

TEST(Passes, PointwiseConvolutionsOverSmallPlanesMultiplyTheImagesSideBySide) {
  const target::DeviceTraits device = workgroup_capable(1);
  uint64_t seed = 120;
  for (const auto& [x_shape, side_by_side] :
       {std::pair<Shape, bool>{{4, 128, 8, 8}, true}, {{2, 128, 16, 16}, false}}) {
    SCOPED_TRACE(shape_string(x_shape));
    const auto [graph, environment, rewritten] =
        exact_pointwise_convolution_rewritten(seed++, x_shape, 128, device);
    // Apart, the forward and data gradient multiply f16 images one an image, and the weight
    // gradient the same f16 images per image.
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 3u);
    EXPECT_EQ(count_op(rewritten, "matmul"), 0u);
    EXPECT_EQ(count_op(rewritten, "transpose"), side_by_side ? 4u : 0u);
    expect_same_outputs(graph, rewritten, environment);

    target::DeviceTraits apart = device;
    apart.switches.columns_side_by_side = false;
    apart.switches.half_images = false;
    EXPECT_EQ(count_op(im2col_within_a_gib(graph, apart), "half_matmul"), 0u);
    target::DeviceTraits together = device;
    together.switches.columns_side_by_side = true;
    const Graph forced = im2col_within_a_gib(graph, together);
    EXPECT_EQ(count_op(forced, "half_matmul"), 3u);
    EXPECT_EQ(count_op(forced, "transpose"), 4u);
    expect_same_outputs(graph, forced, environment);
  }
}

// On a device with the workgroup GEMM, a 1x1 convolution over planes that the subgroup GEMM's
// widest block fills multiplies f16 images one an image where the workgroup GEMM takes the
// batched product: its forward and data gradient become half_matmuls over x and grad_out rounded
// to f16 (the values themselves, so that the roundings fuse into their producers), with no
// transposes; the weight gradient's per-image products read those same f16 copies, each value
// rounded once for all three products. Planes of 784 (28 x 28) take
// the narrow blocks, and without them (DeviceTraits::workgroup_narrow_blocks) stay in f32, as
// they do with MEGANEURA_HALF_IMAGES=0. On values f16 holds exactly (multiples of 2^-8) the
// outputs equal the convolution's in the f64 reference.
TEST(Passes, PointwiseConvolutionsMultiplyF16ImagesOneAnImage) {
  target::DeviceTraits device = workgroup_capable(1);
  device.workgroup_narrow_blocks = true;
  uint64_t seed = 125;
  for (const Shape& x_shape : {Shape{2, 128, 28, 28}, Shape{2, 128, 16, 32}}) {
    SCOPED_TRACE(shape_string(x_shape));
    const auto [graph, environment, rewritten] =
        exact_pointwise_convolution_rewritten(seed++, x_shape, 256, device);
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 3u);
    EXPECT_EQ(count_op(rewritten, "matmul"), 0u);
    EXPECT_EQ(count_op(rewritten, "transpose"), 0u);
    size_t rounded_images = 0;
    for (const Node& node : rewritten.nodes()) {
      if (node.op != "round_to_f16") continue;
      const Shape& shape = rewritten.type(node.inputs[0]).shape;
      // x and grad_out are rounded as the 4-D values they are; the rows are the weight's matrix.
      EXPECT_TRUE(shape.size() == 4 || shape.size() == 2) << shape_string(shape);
      rounded_images += shape.size() == 4;
    }
    EXPECT_EQ(rounded_images, 2u);
    expect_same_outputs(graph, rewritten, environment);

    target::DeviceTraits off = device;
    off.switches = Switches::from_environment({{"MEGANEURA_HALF_IMAGES", "0"}});
    EXPECT_EQ(count_op(im2col_within_a_gib(graph, off), "half_matmul"), 0u);
    target::DeviceTraits without_narrow = device;
    without_narrow.workgroup_narrow_blocks = false;
    EXPECT_EQ(count_op(im2col_within_a_gib(graph, without_narrow), "half_matmul"),
              x_shape[2] == 28 ? 0u : 3u);
  }
}

// On a device with the workgroup GEMM, a strided convolution's columns go side by side in f16
// whatever its plane: im2col of x rounded to f16 writes [C * KH * KW, N * plane] once for the
// forward and the weight gradient, the forward is one 2-D half_matmul moved back to NCHW, the
// data gradient one half_matmul of Wᵀ and grad_out's images side by side into column gradients
// side by side that col2im sums, and the weight gradient one half_matmul of grad_out side by side
// and the columns. On values f16 holds exactly (multiples of 2^-8) the outputs equal the
// convolution's in the f64 reference. MEGANEURA_HALF_COLUMNS=0 (or
// MEGANEURA_COLUMNS_SIDE_BY_SIDE=0) keeps the f32 columns per image.
TEST(Passes, StridedConvolutionsMultiplyF16ColumnsSideBySide) {
  const target::DeviceTraits device = workgroup_capable(1);
  uint64_t seed = 130;
  for (const auto& [x_shape, w_shape, options] :
       {std::tuple<Shape, Shape, Conv2dOptions>{
            {4, 128, 16, 16}, {128, 128, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
        std::tuple<Shape, Shape, Conv2dOptions>{
            {2, 128, 64, 64}, {256, 128, 1, 1}, {.stride = {2, 2}}}}) {
    SCOPED_TRACE(shape_string(x_shape) + " * " + shape_string(w_shape));
    Graph graph;
    Environment environment;
    exact_convolution_with_gradients(graph, environment, seed++, x_shape, w_shape, options);
    const Graph rewritten = im2col_within_a_gib(graph, device);
    EXPECT_EQ(convolutions_left(rewritten) + count_op(rewritten, "matmul"), 0u);
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 3u);
    EXPECT_EQ(count_op(rewritten, "transpose"), 2u);
    ASSERT_EQ(count_op(rewritten, "im2col"), 1u);
    ASSERT_EQ(count_op(rewritten, "col2im"), 1u);
    for (const Node& node : rewritten.nodes()) {
      if (node.op == "im2col") {
        EXPECT_EQ(node.type.dtype, DType::f16);
        EXPECT_EQ(node.attrs.get_int("images_side_by_side", 0), 1);
      }
      if (node.op == "col2im") {
        EXPECT_EQ(node.attrs.get_int("images_side_by_side", 0), 1);
      }
    }
    expect_same_outputs(graph, rewritten, environment);

    for (const auto& [name, value] : {std::pair{"MEGANEURA_HALF_COLUMNS", "0"},
                                      std::pair{"MEGANEURA_COLUMNS_SIDE_BY_SIDE", "0"}}) {
      SCOPED_TRACE(name);
      target::DeviceTraits off = device;
      off.switches = Switches::from_environment({{name, value}});
      const Graph apart = im2col_within_a_gib(graph, off);
      EXPECT_EQ(count_op(apart, "half_matmul"), 0u);
      for (const Node& node : apart.nodes()) {
        if (node.op == "im2col") {
          EXPECT_EQ(node.type.dtype, DType::f32);
        }
      }
    }
  }
}

// In bf16 precision, on a device with workgroup-scope bfloat16 matrices, the convolutions' routes
// to the workgroup GEMM round to bfloat16 instead of f16: a strided convolution's columns side by
// side (im2col of x rounded to bfloat16, one for the forward and the weight gradient), a 1x1
// convolution's images side by side over small planes and one an image over wide ones, every
// product of them a half_matmul of bfloat16 operands (those the workgroup GEMM does not take,
// such as a weight gradient over planes of 784, not whole 64-deep steps, on the subgroup GEMM).
// Without those matrices nothing is rounded.
// On values bfloat16 holds exactly (multiples of 2^-8 in [-1, 1]) the outputs equal the
// convolution's in the f64 reference.
TEST(Passes, ConvolutionRoutesRoundToBfloat16InBf16Precision) {
  target::DeviceTraits device = workgroup_capable(1);
  device.workgroup_narrow_blocks = true;
  device.workgroup_tensor_loads = true;
  device.coop_matrix_bf16_khr = true;
  device.bf16_operands = true;
  device.workgroup_coop_matrix_bf16 = true;
  struct Case {
    Shape x, w;
    Conv2dOptions options;
  };
  uint64_t seed = 140;
  for (const Case& c :
       {Case{{4, 128, 16, 16}, {256, 128, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
        Case{{4, 128, 8, 8}, {256, 128, 1, 1}, {}}, Case{{2, 128, 16, 32}, {256, 128, 1, 1}, {}},
        Case{{2, 128, 28, 28}, {256, 128, 1, 1}, {}}}) {
    SCOPED_TRACE(shape_string(c.x) + " * " + shape_string(c.w));
    Graph graph;
    Environment environment;
    exact_convolution_with_gradients(graph, environment, seed++, c.x, c.w, c.options);
    const Graph rewritten = im2col_within_a_gib(graph, device);
    EXPECT_EQ(convolutions_left(rewritten), 0u);
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 3u);
    EXPECT_EQ(count_op(rewritten, "matmul"), 0u);
    EXPECT_EQ(count_op(rewritten, "round_to_f16"), 0u);
    EXPECT_GE(count_op(rewritten, "round_to_bf16"), 2u);
    for (const Node& node : rewritten.nodes()) {
      if (node.op == "half_matmul") {
        EXPECT_EQ(rewritten.type(node.inputs[0]).dtype, DType::bf16);
        EXPECT_EQ(rewritten.type(node.inputs[1]).dtype, DType::bf16);
      }
      if (node.op == "im2col") {
        EXPECT_EQ(node.type.dtype, DType::bf16);
      }
    }
    expect_same_outputs(graph, rewritten, environment);

    target::DeviceTraits without_matrices = device;
    without_matrices.workgroup_coop_matrix_bf16 = false;
    const Graph unrounded = im2col_within_a_gib(graph, without_matrices);
    EXPECT_EQ(count_op(unrounded, "half_matmul"), 0u);
    EXPECT_EQ(count_op(unrounded, "round_to_bf16") + count_op(unrounded, "round_to_f16"), 0u);
  }
}

// The Winograd weight gradient (forced on, for shapes below the rule's minimums), F(2 x 2, 3 x 3)
// and F(4 x 4, 3 x 3), against the convolution's own weight gradient in the f64 reference:
// padding 1 with odd output extents (a last row and column of tiles partly past grad_out),
// padding 0 and 2, rectangular images and channel counts that differ. Then 529 tiles (46 x 46
// or 92 x 92 outputs) split over K into 3 partial products: the filter transform reads the
// partials [3, 16 or 36, O, C] and sums them itself, with no sum left.
TEST(Passes, WinogradWeightGradientMatchesTheConvolution) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> padding;
  };
  uint64_t seed = 40;
  for (const int64_t outputs : {2, 4}) {
    const target::DeviceTraits forced = h200_like(
        kH200ComputeUnits, {{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1"},
                            {"MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE", std::to_string(outputs)}});
    const int64_t points = (outputs + 2) * (outputs + 2);
    for (const Case& c :
         {Case{{2, 3, 9, 7}, {4, 3, 3, 3}, {1, 1}}, Case{{1, 2, 6, 9}, {3, 2, 3, 3}, {0, 0}},
          Case{{2, 4, 5, 4}, {2, 4, 3, 3}, {2, 1}},
          Case{{1, 2, 23 * outputs, 23 * outputs}, {3, 2, 3, 3}, {1, 1}}}) {
      SCOPED_TRACE("F(" + std::to_string(outputs) + ") " + shape_string(c.x) + " * " +
                   shape_string(c.w));
      Graph graph;
      Environment environment;
      const auto [x, w, y, cotangent] =
          random_conv(graph, environment, seed++, c.x, c.w, {.padding = c.padding});
      graph.set_output("dw", gradients(graph, y.id(), {w.id()}, cotangent.id()).at(w.id()));
      graph = passes::eliminate_dead_code(graph);
      const Graph rewritten =
          passes::im2col_convolutions(graph, vulkan::VulkanTarget(forced), uint64_t{1} << 30);
      EXPECT_EQ(count_op(rewritten, "winograd_tiles"), 1u);
      EXPECT_EQ(count_op(rewritten, "winograd_grad_tiles"), 1u);
      EXPECT_EQ(count_op(rewritten, "conv2d_grad_weight"), 0u);
      for (const Node& node : rewritten.nodes()) {
        if (node.op.starts_with("winograd_")) {
          EXPECT_EQ(node.attrs.get_int("outputs", 2), outputs) << node.op;
        }
      }
      expect_same_outputs(graph, rewritten, environment);
      if (c.x[2] < 46) continue;
      target::DeviceTraits three_slices = forced;
      three_slices.switches.split_k_slices = 3;
      const Graph split = passes::merge_leading_sums(
          passes::split_k(rewritten, vulkan::VulkanTarget(three_slices)));
      EXPECT_EQ(count_op(split, "sum"), 0u);
      for (const Node& node : split.nodes()) {
        if (node.op == "winograd_weight_grad") {
          EXPECT_EQ(split.type(node.inputs[0]).shape, (Shape{3, points, 3, 2}));
        }
      }
      expect_same_outputs(graph, split, environment);
    }
  }
}

// The Winograd weight gradient's tile on an H200: F(4 x 4, 3 x 3) for U-Net's 320 channels at
// 32 x 32 and 64 x 64 (128 and 512 tiles of 4 x 4 outputs at batch 2) and ResNet's 128 at
// 28 x 28 (196 tiles at batch 4), F(2 x 2, 3 x 3) for ResNet's 256 at 14 x 14 (64 tiles of
// 4 x 4) and for every product in fast precision (f16 operands);
// MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE forces either, and anything else is refused by name.
TEST(Passes, WinogradWeightGradientTileRule) {
  const auto outputs_of = [](const Shape& x, const target::DeviceTraits& device = h200_like()) {
    const Graph chosen = passes::im2col_convolutions(
        square_weight_gradient(x), vulkan::VulkanTarget(device), uint64_t{1} << 30);
    for (const Node& node : chosen.nodes())
      if (node.op == "winograd_weight_grad") return node.attrs.get_int("outputs", 2);
    ADD_FAILURE() << "no Winograd weight gradient for " << shape_string(x);
    return int64_t{0};
  };
  EXPECT_EQ(outputs_of({2, 320, 32, 32}), 4);
  EXPECT_EQ(outputs_of({2, 320, 64, 64}), 4);
  EXPECT_EQ(outputs_of({4, 128, 28, 28}), 4);
  EXPECT_EQ(outputs_of({4, 256, 14, 14}), 2);
  EXPECT_EQ(outputs_of({2, 320, 64, 64}, fast_h200_like()), 2);
  const auto forced_tile = [](const char* tile) {
    return h200_like(kH200ComputeUnits, {{"MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE", tile}});
  };
  EXPECT_EQ(outputs_of({2, 320, 32, 32}, forced_tile("2")), 2);
  EXPECT_EQ(outputs_of({4, 256, 14, 14}, forced_tile("4")), 4);
  try {
    outputs_of({2, 320, 32, 32}, forced_tile("6"));
    ADD_FAILURE() << "MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE=6 was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE='6'"),
              std::string::npos)
        << error.what();
  }
}

// U-Net's F(4 x 4) weight gradient at 64 x 64 (K = 512 tiles) splits its product into two
// slices of 256 on an H200, whose partials the filter transform sums (no sum node); at 32 x 32
// (K = 128) the product stays whole.
TEST(Passes, WinogradWeightGradientProductSplitsInTwo) {
  const auto transform_input = [](const Shape& x) {
    const Graph split = passes::merge_leading_sums(passes::split_k(
        passes::im2col_convolutions(square_weight_gradient(x), vulkan::VulkanTarget(h200_like()),
                                    uint64_t{1} << 30),
        vulkan::VulkanTarget(h200_like())));
    EXPECT_EQ(count_op(split, "sum"), 0u);
    for (const Node& node : split.nodes())
      if (node.op == "winograd_weight_grad") return split.type(node.inputs[0]).shape;
    ADD_FAILURE() << "no Winograd weight gradient for " << shape_string(x);
    return Shape{};
  };
  EXPECT_EQ(transform_input({2, 320, 64, 64}), (Shape{2, 36, 320, 320}));
  EXPECT_EQ(transform_input({2, 320, 32, 32}), (Shape{36, 320, 320}));
}

// The forward's and data gradient's route on an H200 (strict and fast alike): Winograd for every
// ResNet-50 3x3 stage (64 tiles at 512 channels over 7 x 7 included) and U-Net's 320 channels;
// the columns for 32 channels, a stride of 2, a data gradient padded by 3, on CPU devices, and
// with MEGANEURA_WINOGRAD_CONV=0.
TEST(Passes, WinogradConvolutionRoutes) {
  struct Case {
    Shape x;
    int64_t channels, stride, padding;
    bool winograd;
  };
  target::DeviceTraits cpu = h200_like();
  cpu.cpu = true;
  cpu.subgroup_size = 8;
  for (const Case& c :
       {Case{{4, 64, 56, 56}, 64, 1, 1, true}, Case{{4, 128, 28, 28}, 128, 1, 1, true},
        Case{{4, 256, 14, 14}, 256, 1, 1, true}, Case{{4, 512, 7, 7}, 512, 1, 1, true},
        Case{{2, 320, 32, 32}, 320, 1, 1, true}, Case{{4, 32, 56, 56}, 32, 1, 1, false},
        Case{{4, 128, 56, 56}, 128, 2, 1, false}}) {
    SCOPED_TRACE(shape_string(c.x) + " stride " + std::to_string(c.stride));
    Graph graph;
    const Tensor x = input(graph, "x", c.x);
    const Tensor w = input(graph, "w", {c.channels, c.x[1], 3, 3});
    const Tensor y = conv2d(x, w, std::nullopt,
                            {.stride = {c.stride, c.stride}, .padding = {c.padding, c.padding}});
    const Tensor seed = input(graph, "seed", y.shape());
    graph.set_output("y", y.id());
    graph.set_output("dx", gradients(graph, y.id(), {x.id()}, seed.id()).at(x.id()));
    const Graph chosen =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(h200_like()), uint64_t{1} << 30);
    EXPECT_EQ(count_op(chosen, "winograd_output"), c.winograd ? 2u : 0u);
    EXPECT_EQ(
        count_op(passes::im2col_convolutions(graph, vulkan::VulkanTarget(cpu), uint64_t{1} << 30),
                 "winograd_output"),
        0u);
    EXPECT_EQ(count_op(passes::im2col_convolutions(
                           graph,
                           vulkan::VulkanTarget(
                               h200_like(kH200ComputeUnits, {{"MEGANEURA_WINOGRAD_CONV", "0"}})),
                           uint64_t{1} << 30),
                       "winograd_output"),
              0u);
  }
  Graph graph;
  const Tensor x = input(graph, "x", {4, 64, 28, 28});
  const Tensor w = input(graph, "w", {64, 64, 3, 3});
  const Tensor y = conv2d(x, w, std::nullopt, {.padding = {3, 3}});
  const Tensor seed = input(graph, "seed", y.shape());
  graph.set_output("y", y.id());
  graph.set_output("dx", gradients(graph, y.id(), {x.id()}, seed.id()).at(x.id()));
  EXPECT_EQ(count_op(passes::im2col_convolutions(graph, vulkan::VulkanTarget(h200_like()),
                                                 uint64_t{1} << 30),
                     "winograd_output"),
            1u);  // the forward only
}

// The Winograd forward and data gradient (forced on, for shapes below the rule's minimums)
// against the convolution's own in the f64 reference: padding 1 with odd output extents (a last
// row and column of tiles half past the image), padding 0 and 2 (the data gradient's grad_out
// padded by 2 and 0), rectangular images and channel counts that differ. The weight gradient
// stays on its own route (Winograd off for it here).
TEST(Passes, WinogradForwardAndDataGradientMatchTheConvolution) {
  const target::DeviceTraits forced =
      h200_like(kH200ComputeUnits,
                {{"MEGANEURA_WINOGRAD_CONV", "1"}, {"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "0"}});
  struct Case {
    Shape x, w;
    std::vector<int64_t> padding;
  };
  uint64_t seed = 60;
  for (const Case& c :
       {Case{{2, 3, 9, 7}, {4, 3, 3, 3}, {1, 1}}, Case{{1, 2, 6, 9}, {3, 2, 3, 3}, {0, 0}},
        Case{{2, 4, 5, 4}, {2, 4, 3, 3}, {2, 1}}}) {
    SCOPED_TRACE(shape_string(c.x) + " * " + shape_string(c.w));
    Graph graph;
    Environment environment;
    const auto [x, w, y, cotangent] =
        random_conv(graph, environment, seed++, c.x, c.w, {.padding = c.padding});
    graph.set_output("y", y.id());
    graph.set_output("dx", gradients(graph, y.id(), {x.id()}, cotangent.id()).at(x.id()));
    graph = passes::eliminate_dead_code(graph);
    const Graph rewritten =
        passes::im2col_convolutions(graph, vulkan::VulkanTarget(forced), uint64_t{1} << 30);
    EXPECT_EQ(count_op(rewritten, "winograd_filter"), 2u);
    EXPECT_EQ(count_op(rewritten, "winograd_output"), 2u);
    EXPECT_EQ(count_op(rewritten, "conv2d") + count_op(rewritten, "conv2d_grad_input"), 0u);
    expect_same_outputs(graph, rewritten, environment);
  }
  // Padding 3 leaves the data gradient's grad_out a negative padding: that one keeps the columns.
  Graph graph;
  Environment environment;
  const auto [x, w, y, cotangent] =
      random_conv(graph, environment, seed, {1, 2, 5, 5}, {2, 2, 3, 3}, {.padding = {3, 3}});
  graph.set_output("dx", gradients(graph, y.id(), {x.id()}, cotangent.id()).at(x.id()));
  graph = passes::eliminate_dead_code(graph);
  const Graph rewritten =
      passes::im2col_convolutions(graph, vulkan::VulkanTarget(forced), uint64_t{1} << 30);
  EXPECT_EQ(count_op(rewritten, "winograd_output"), 0u);
  expect_same_outputs(graph, rewritten, environment);
}

// Where products round their operands (fast precision, f16 operands; bf16 precision, bfloat16
// ones), Winograd's transforms store their points in that format (f16_result, bf16_result) and
// its three batched products multiply them as they are (half_matmul; no rounding launch): on the
// f64 reference the output and both gradients then differ from the convolution's by the points'
// rounding alone (not at all would mean nothing was rounded; more than the format's step times
// the few products summed would mean something else changed). MEGANEURA_WINOGRAD_F16=0 and strict
// precision keep the points f32 and the values exact.
TEST(Passes, WinogradPointsAreHalfWhereProductsRoundTheirOperands) {
  Graph graph;
  Environment environment;
  const auto [x, w, y, cotangent] =
      random_conv(graph, environment, 64, {2, 8, 6, 6}, {4, 8, 3, 3}, {.padding = {1, 1}});
  graph.set_output("y", y.id());
  const std::map<ValueId, ValueId> grads =
      gradients(graph, sum_all(y * cotangent).id(), {x.id(), w.id()});
  graph.set_output("dx", grads.at(x.id()));
  graph.set_output("dw", grads.at(w.id()));
  graph = passes::eliminate_dead_code(graph);
  const auto rewritten = [&graph](const std::map<std::string, std::string, std::less<>>& extra,
                                  bool fast, bool bf16) {
    std::map<std::string, std::string, std::less<>> switches = {
        {"MEGANEURA_WINOGRAD_CONV", "1"}, {"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1"}};
    switches.insert(extra.begin(), extra.end());
    target::DeviceTraits device = fast_h200_like();
    device.switches = Switches::from_environment(switches);
    device.f16_tensors = true;
    device.fast_precision = fast;
    device.bf16_operands = bf16;
    device.coop_matrix_bf16_khr = bf16;
    const vulkan::VulkanTarget target(device);
    return passes::workgroup_gemm(passes::im2col_convolutions(graph, target, uint64_t{1} << 30),
                                  target);
  };
  for (const DType format : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(format)));
    const bool bf16 = format == DType::bf16;
    const Graph half_points = rewritten({}, true, bf16);
    EXPECT_EQ(count_op(half_points, "half_matmul"), 3u);
    EXPECT_EQ(count_op(half_points, "matmul"), 0u);
    EXPECT_EQ(count_op(half_points, "round_to_f16") + count_op(half_points, "round_to_bf16"), 0u);
    size_t transforms = 0;
    for (const Node& node : half_points.nodes()) {
      if (node.op != "winograd_tiles" && node.op != "winograd_grad_tiles" &&
          node.op != "winograd_filter")
        continue;
      ++transforms;
      EXPECT_EQ(node.type.dtype, format) << node.op;
    }
    // Each product's two: the forward's filter and x's tiles, the data gradient's turned filter
    // and grad_out's padded tiles, the weight gradient's grad_out blocks and x's tiles again
    // (merged with the forward's by CSE, which these passes alone do not run).
    EXPECT_EQ(transforms, 6u);
    const std::vector<HostTensor> exact = evaluate(graph, environment);
    const std::vector<HostTensor> rounded = evaluate(half_points, environment);
    for (const std::string name : {"y", "dx", "dw"}) {
      const HostTensor& wanted = exact[graph.output(name)];
      const HostTensor& got = rounded[half_points.output(name)];
      double largest = 0, difference = 0;
      for (int64_t i = 0; i < wanted.elements(); ++i) {
        largest = std::max(largest, std::abs(wanted.data[i]));
        difference = std::max(difference, std::abs(wanted.data[i] - got.data[i]));
      }
      EXPECT_GT(difference, 0.0) << name;
      // bfloat16 keeps 8 significant bits to f16's 11.
      EXPECT_LT(difference, (bf16 ? 2.4e-2 : 3e-3) * largest) << name;
    }
  }
  for (const auto& [label, kept] :
       {std::pair{"MEGANEURA_WINOGRAD_F16=0",
                  rewritten({{"MEGANEURA_WINOGRAD_F16", "0"}}, true, false)},
        std::pair{"MEGANEURA_WINOGRAD_F16=0 in bf16",
                  rewritten({{"MEGANEURA_WINOGRAD_F16", "0"}}, true, true)},
        std::pair{"strict", rewritten({}, false, false)}}) {
    SCOPED_TRACE(label);
    EXPECT_EQ(count_op(kept, "half_matmul"), 0u);
    EXPECT_EQ(count_op(kept, "winograd_filter"), 2u);
    expect_same_outputs(graph, kept, environment);
  }
}

// Whether `node` is a gradient op of attention (of q, k or v).
bool is_attention_gradient(const Node& node) {
  return node.op == "attention_grad_q" || node.op == "attention_grad_k" ||
         node.op == "attention_grad_v";
}

// Attention on seeded random leaves q, k, v, an additive mask [Sq, Sk] and a seed [B, Hq, Sq, Dv]:
// each variant ("masked": scale 0.7 and the mask; "plain"; "causal") as an output under its
// name, with the gradients of sum(y * seed) with respect to q, k and v.
struct AttentionCase {
  Graph graph;
  Environment environment;
};

AttentionCase attention_with_gradients(uint64_t seed, const Shape& q, const Shape& k,
                                       const Shape& v, const std::vector<std::string>& variants) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"q", q}, {"k", k}, {"v", v}, {"mask", {q[2], k[2]}}, {"seed", {q[0], q[1], q[2], v[3]}}};
  AttentionCase result;
  Graph& graph = result.graph;
  std::map<std::string, Tensor> x;
  for (const auto& [name, shape] : shapes) {
    x.emplace(name, input(graph, name, shape));
    HostTensor value(shape);
    for (double& element : value.data) element = 2.0 * uniform(generator);
    result.environment.leaves[name] = value;
  }
  const std::vector<ValueId> wrt{x.at("q").id(), x.at("k").id(), x.at("v").id()};
  for (const std::string& variant : variants) {
    AttentionOptions options;
    if (variant == "masked") options = {.scale = 0.7, .mask = x.at("mask")};
    if (variant == "causal") options.causal = true;
    const Tensor y = scaled_dot_product_attention(x.at("q"), x.at("k"), x.at("v"), options);
    graph.set_output(variant, y.id());
    for (const auto& [leaf, grad] : gradients(graph, sum_all(y * x.at("seed")).id(), wrt))
      graph.set_output("d" + variant + "_" + std::to_string(leaf), grad);
  }
  return result;
}

// Attention over slices (the forward and dQ over key slices, dK and dV over query slices, their
// partial results joined by attention_combine or summed) against the whole ops on the
// reference: grouped heads, an additive mask, causal masking (whose later slices see no key of
// a row) and lengths that are no multiple of the slices; forced slice counts, since the
// built-in rule leaves sequences this short whole.
TEST(Passes, SplitAttentionKeepsOutputs) {
  const AttentionCase attention = attention_with_gradients(11, {2, 2, 140, 8}, {2, 1, 300, 8},
                                                           {2, 1, 300, 6}, {"masked", "causal"});
  const Graph& graph = attention.graph;
  const Environment& environment = attention.environment;
  // Forced counts: every kind, or forward, dQ and dK / dV apart (140 queries make at most 3
  // query slices of 64).
  for (const auto& [forced, key_slices, query_slices] :
       {std::tuple<const char*, int64_t, int64_t>{"5", 5, 3},
        {"3", 3, 3},
        {"2", 2, 2},
        {"40", 5, 3},
        {"1,5,2", 5, 2}}) {
    SCOPED_TRACE(std::string("MEGANEURA_ATTENTION_SPLITS=") + forced);
    const Graph split = passes::split_attention(
        graph, vulkan::VulkanTarget(
                   h200_like(kH200ComputeUnits, {{"MEGANEURA_ATTENTION_SPLITS", forced}})));
    const bool forward_split = std::string(forced) != "1,5,2";
    EXPECT_EQ(count_op(split, "attention_combine"), forward_split ? 2u : 0u);
    for (const Node& node : split.nodes()) {
      if (node.op == "scaled_dot_product_attention") {
        EXPECT_EQ(node.attrs.get_int("kv_splits", 1), forward_split ? key_slices : 1);
      }
      if (node.op == "attention_grad_q") {
        EXPECT_EQ(node.attrs.get_int("kv_splits"), key_slices);
      }
      if (node.op == "attention_grad_k" || node.op == "attention_grad_v") {
        EXPECT_EQ(node.attrs.get_int("q_splits"), query_slices);
      }
    }
    expect_same_outputs(graph, split, environment);
  }
}

// A split forward whose heads a transpose moves after the queries (a multi-head layer's output
// projection reads them so): its combine writes that layout (heads_last) in place of the
// transpose, which is gone where nothing else reads the forward (inference) and kept for the
// backward, which reads the forward as it was (training); the outputs on the reference are the
// graph's either way.
TEST(Passes, SplitAttentionCombinesWithTheHeadsAfterTheQueries) {
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    std::mt19937_64 generator(23);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    Graph graph;
    Environment environment;
    std::map<std::string, Tensor> x;
    for (const auto& [name, shape] : std::vector<std::pair<std::string, Shape>>{
             {"q", {2, 4, 20, 8}}, {"k", {2, 2, 150, 8}}, {"v", {2, 2, 150, 6}}, {"w", {24, 5}}}) {
      x.emplace(name, input(graph, name, shape));
      HostTensor value(shape);
      for (double& element : value.data) element = uniform(generator);
      environment.leaves[name] = value;
    }
    const Tensor heads = scaled_dot_product_attention(x.at("q"), x.at("k"), x.at("v"), {});
    const Tensor y = matmul(reshape(transpose(heads, {0, 2, 1, 3}), {2, 20, 24}), x.at("w"));
    graph.set_output("y", y.id());
    if (training) {
      for (const auto& [leaf, grad] :
           gradients(graph, sum_all(y * y).id(), {x.at("q").id(), x.at("k").id(), x.at("v").id()}))
        graph.set_output("d" + std::to_string(leaf), grad);
    }
    const Graph split = passes::split_attention(
        graph,
        vulkan::VulkanTarget(h200_like(kH200ComputeUnits, {{"MEGANEURA_ATTENTION_SPLITS", "3"}})));
    size_t combines = 0, transposes_of_combines = 0;
    for (const Node& node : split.nodes()) {
      if (node.op == "attention_combine") {
        ++combines;
        EXPECT_EQ(node.attrs.get_int("heads_last", 0), 1);
        EXPECT_EQ(node.type.shape, (Shape{2, 20, 4, 6}));
      }
      if (node.op == "transpose" && split.node(node.inputs[0]).op == "attention_combine")
        ++transposes_of_combines;
    }
    EXPECT_EQ(combines, 1u);
    EXPECT_EQ(transposes_of_combines, training ? 1u : 0u);
    expect_same_outputs(graph, split, environment);
  }
}

// dK and dV of grouped-query attention over parts of each group's query heads, alone and with
// query slices, against the whole ops on the reference: an additive mask and causal masking,
// a group of 6 heads. The rule: 6 owned blocks of 64 keys (2 key/value heads, 140 keys) take as
// many parts as fit one workgroup a compute unit: on the H200 with its 2 query slices 6 (72
// workgroups), on 12 units 2 and on 18 units 3 (no slices: too few units).
TEST(Passes, HeadSplitsKeepOutputs) {
  const AttentionCase attention = attention_with_gradients(17, {1, 12, 140, 8}, {1, 2, 140, 8},
                                                           {1, 2, 140, 6}, {"masked", "causal"});
  for (const auto& [units, forced, head_splits, query_slices] :
       {std::tuple<int64_t, const char*, int64_t, int64_t>{kH200ComputeUnits, nullptr, 6, 2},
        {12, nullptr, 2, 1},
        {18, nullptr, 3, 1},
        {kH200ComputeUnits, "2", 1, 2}}) {
    SCOPED_TRACE(std::to_string(units) + " units, slices " + (forced ? forced : "by rule"));
    std::map<std::string, std::string, std::less<>> switches;
    if (forced) switches["MEGANEURA_ATTENTION_SPLITS"] = forced;
    const Graph split =
        passes::split_attention(attention.graph, vulkan::VulkanTarget(h200_like(units, switches)));
    size_t checked = 0;
    for (const Node& node : split.nodes()) {
      if (node.op != "attention_grad_k" && node.op != "attention_grad_v") continue;
      EXPECT_EQ(node.attrs.get_int("head_splits", 1), head_splits) << node.op;
      EXPECT_EQ(node.attrs.get_int("q_splits", 1), query_slices) << node.op;
      EXPECT_EQ(node.type.shape[0], head_splits * query_slices) << node.op;
      ++checked;
    }
    EXPECT_EQ(checked, 4u);
    expect_same_outputs(attention.graph, split, attention.environment);
  }
  // Forced: every head apart beside forced slices, or none.
  for (const auto& [value, head_splits] : {std::pair<const char*, int64_t>{"1", 6}, {"0", 1}}) {
    SCOPED_TRACE(std::string("MEGANEURA_ATTENTION_HEAD_SPLITS=") + value);
    const Graph split = passes::split_attention(
        attention.graph, vulkan::VulkanTarget(h200_like(
                             kH200ComputeUnits, {{"MEGANEURA_ATTENTION_SPLITS", "3"},
                                                 {"MEGANEURA_ATTENTION_HEAD_SPLITS", value}})));
    for (const Node& node : split.nodes()) {
      if (node.op != "attention_grad_k") continue;
      EXPECT_EQ(node.attrs.get_int("head_splits", 1), head_splits);
      EXPECT_EQ(node.attrs.get_int("q_splits", 1), 3);
    }
    expect_same_outputs(attention.graph, split, attention.environment);
  }
}

// dQ as a matmul of W = scale * dS: non-causal gradients of grouped heads (a masked and an
// unmasked attention) give the reference's dQ through attention_grad_scores and a matmul, with
// their attention_grad_k ahead of W; the causal one keeps attention_grad_q, and so does any
// whose W exceeds the bound.
TEST(Passes, AttentionGradQAsMatmulKeepsOutputs) {
  const AttentionCase attention = attention_with_gradients(
      5, {2, 4, 20, 8}, {2, 2, 30, 8}, {2, 2, 30, 6}, {"masked", "plain", "causal"});
  const Graph& graph = attention.graph;
  const Graph routed = passes::attention_grad_q_gemm(graph, 1 << 20);
  EXPECT_EQ(count_op(routed, "attention_grad_q"), 1u);  // the causal one
  EXPECT_EQ(count_op(routed, "attention_grad_scores"), 2u);
  for (size_t i = 0; i < routed.size(); ++i) {
    const Node& node = routed.nodes()[i];
    if (node.op != "attention_grad_scores") continue;
    bool grad_k_before = false;
    for (size_t j = 0; j < i; ++j) {
      const Node& other = routed.nodes()[j];
      grad_k_before =
          grad_k_before || (other.op == "attention_grad_k" && other.inputs == node.inputs);
    }
    EXPECT_TRUE(grad_k_before) << "W %" << i;
  }
  expect_same_outputs(graph, routed, attention.environment);
  // W is 2 x 4 x 20 x 30 floats, 19200 bytes.
  EXPECT_EQ(count_op(passes::attention_grad_q_gemm(graph, 19199), "attention_grad_q"), 3u);
  EXPECT_EQ(count_op(passes::attention_grad_q_gemm(graph, 19200), "attention_grad_q"), 1u);
}

// Attention gradients given max |dO| (passes/scale_attention_gradients.cpp), masked and causal:
// for grouped heads one per batch entry, for as many kv heads as query heads one per head; the
// dK and dV of one attention read the same one (so that their launches can still be one); each
// is the largest |dO| of its batch entry (and head), dO being the seed; the outputs are those of
// the graph as it was; a second run of the pass adds nothing.
TEST(Passes, ScaledAttentionGradientsReadTheLargestCotangent) {
  for (const Shape& k : {Shape{2, 2, 30, 8}, Shape{2, 4, 30, 8}}) {
    SCOPED_TRACE("kv heads " + std::to_string(k[1]));
    const AttentionCase attention =
        attention_with_gradients(7, {2, 4, 20, 8}, k, {2, k[1], 30, 6}, {"masked", "causal"});
    const Graph scaled = passes::scale_attention_gradients(attention.graph);
    const std::vector<HostTensor> values = evaluate(scaled, attention.environment);
    const HostTensor& seed = attention.environment.leaves.at("seed");  // [2, 4, 20, 6]
    const int64_t heads = k[1] == 4 ? 4 : 1;
    std::set<ValueId> largest;
    size_t gradient_ops = 0;
    for (const Node& node : scaled.nodes()) {
      if (!is_attention_gradient(node)) continue;
      ++gradient_ops;
      EXPECT_EQ(node.attrs.get_int("has_grad_out_max", 0), 1) << node.op;
      largest.insert(node.inputs.back());
      const HostTensor& got = values[node.inputs.back()];
      ASSERT_EQ(got.shape, (Shape{2, heads, 1, 1})) << node.op;
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t h = 0; h < heads; ++h) {
          double expected = 0;
          for (int64_t row = 0; row < 4 * 20 * 6; ++row) {
            if (heads > 1 && row / (20 * 6) != h) continue;
            expected = std::max(expected, std::abs(seed.data[b * 4 * 20 * 6 + row]));
          }
          EXPECT_EQ(got.data[b * heads + h], expected) << node.op << " b " << b << " h " << h;
        }
      }
    }
    EXPECT_EQ(gradient_ops, 6u);
    EXPECT_EQ(largest.size(), 2u);
    expect_same_outputs(attention.graph, scaled, attention.environment);
    EXPECT_EQ(count_op(passes::scale_attention_gradients(scaled), "max"), count_op(scaled, "max"));
  }
}

// Where the target says the kernels find the largest |dO| themselves, the gradients say so
// (own_grad_out_scale) and read no max: no reduction is added, the outputs are the graph's, and
// a second run adds nothing. The target is asked about each gradient op.
TEST(Passes, AttentionGradientsThatScaleThemselvesReadNoMax) {
  const AttentionCase attention = attention_with_gradients(11, {2, 4, 20, 8}, {2, 2, 30, 8},
                                                           {2, 2, 30, 6}, {"masked", "causal"});
  size_t asked = 0;
  const passes::ScalesItself scales_itself = [&asked](const Graph& graph, const Node& node) {
    ++asked;
    EXPECT_EQ(graph.type(node.inputs[0]).shape, (Shape{2, 4, 20, 8})) << node.op;
    return true;
  };
  const Graph scaled = passes::scale_attention_gradients(attention.graph, scales_itself);
  EXPECT_EQ(asked, 6u);
  size_t gradient_ops = 0;
  for (const Node& node : scaled.nodes()) {
    if (!is_attention_gradient(node)) continue;
    ++gradient_ops;
    EXPECT_EQ(node.attrs.get_int("own_grad_out_scale", 0), 1) << node.op;
    EXPECT_EQ(node.attrs.get_int("has_grad_out_max", 0), 0) << node.op;
  }
  EXPECT_EQ(gradient_ops, 6u);
  EXPECT_EQ(count_op(scaled, "max"), count_op(attention.graph, "max"));
  expect_same_outputs(attention.graph, scaled, attention.environment);
  const Graph again = passes::scale_attention_gradients(scaled, scales_itself);
  EXPECT_EQ(asked, 6u);
  EXPECT_EQ(again.size(), scaled.size());
}

// Heads padded to whole fragments: q and k of 40 columns and v of 24 read as 48 and 32 zero-
// padded columns, the scale of 40 kept (the causal variant's default and the masked one's
// explicit 0.7), every result sliced back: the same outputs and gradients on the reference,
// alone and with attention split after it; the backward reads the forward's padded result,
// not a pad of its slice; whole fragments and a multiple of 1 leave the graph as it was.
TEST(Passes, PadAttentionHeadsKeepsOutputs) {
  const AttentionCase attention = attention_with_gradients(13, {2, 4, 20, 40}, {2, 2, 30, 40},
                                                           {2, 2, 30, 24}, {"masked", "causal"});
  const Graph padded = passes::pad_attention_heads(attention.graph, 16);
  size_t attention_nodes = 0;
  for (const Node& node : padded.nodes()) {
    if (node.op == "pad") {
      EXPECT_NE(padded.node(node.inputs[0]).op, "slice");
    }
    if (node.op != "scaled_dot_product_attention" && !node.op.starts_with("attention_")) continue;
    ++attention_nodes;
    EXPECT_EQ(padded.type(node.inputs[0]).shape.back(), 48) << node.op;
    if (node.op != "attention_lse") {
      EXPECT_EQ(padded.type(node.inputs[2]).shape.back(), 32) << node.op;
    }
    EXPECT_TRUE(node.attrs.has("scale")) << node.op;
  }
  EXPECT_GE(attention_nodes, 8u);
  expect_same_outputs(attention.graph, padded, attention.environment);
  const std::map<std::string, std::string, std::less<>> forced = {
      {"MEGANEURA_ATTENTION_SPLITS", "2"}};
  expect_same_outputs(
      attention.graph,
      passes::split_attention(padded, vulkan::VulkanTarget(h200_like(kH200ComputeUnits, forced))),
      attention.environment);
  EXPECT_EQ(passes::pad_attention_heads(attention.graph, 1).size(), attention.graph.size());
  const AttentionCase whole =
      attention_with_gradients(17, {1, 2, 9, 32}, {1, 2, 9, 32}, {1, 2, 9, 16}, {"causal"});
  EXPECT_EQ(passes::pad_attention_heads(whole.graph, 16).size(), whole.graph.size());
}

// The built-in rule: Whisper's encoder attention at batch 1 (144 blocks of 64 queries, and as
// many of 64 keys) takes 4 slices in the forward, dQ, dK and dV; at batch 8, or over 128 keys
// and queries, it stays whole.
TEST(Passes, SplitAttentionOnlyWhereQueryBlocksAreFew) {
  // Each attention op's slices (0: absent).
  const auto slices = [](int64_t batch, int64_t length, int64_t units = kH200ComputeUnits) {
    Graph graph;
    const Tensor q = input(graph, "q", {batch, 6, length, 64});
    const Tensor k = input(graph, "k", {batch, 6, length, 64});
    const Tensor v = input(graph, "v", {batch, 6, length, 64});
    const Tensor y = scaled_dot_product_attention(q, k, v, {});
    graph.set_output("y", y.id());
    for (const auto& [leaf, grad] : gradients(graph, sum_all(y * y).id(), {q.id(), k.id(), v.id()}))
      graph.set_output("d" + std::to_string(leaf), grad);
    std::map<std::string, int64_t> found;
    const Graph split = passes::split_attention(graph, vulkan::VulkanTarget(h200_like(units)));
    for (const Node& node : split.nodes()) {
      if (node.op.starts_with("attention_grad_") || node.op == "scaled_dot_product_attention")
        found[node.op] = node.attrs.get_int(
            node.op == "attention_grad_k" || node.op == "attention_grad_v" ? "q_splits"
                                                                           : "kv_splits",
            1);
    }
    return found;
  };
  const std::map<std::string, int64_t> whisper = slices(1, 1500);
  EXPECT_EQ(whisper.size(), 4u);
  for (const auto& [op, count] : whisper) EXPECT_EQ(count, 4) << op;
  for (const auto& [op, count] : slices(8, 1500)) EXPECT_EQ(count, 1) << op;
  // A 128-row sequence at batch 1 has 12 blocks, leaving most of the 132 units idle: its
  // gradients take two slices of 64 rows, while its forward, whose 128 queries a head would pay
  // the join of two slices, stays whole; at batch 8 (96 blocks) all stay whole.
  for (const auto& [op, count] : slices(1, 128))
    EXPECT_EQ(count, op == "scaled_dot_product_attention" ? 1 : 2) << op;
  for (const auto& [op, count] : slices(8, 128)) EXPECT_EQ(count, 1) << op;
  // A device with 16 compute units already has 9 blocks for each; one with 264, twice the
  // H200's, takes 5 slices (at least 256 rows each of the 1500).
  for (const auto& [op, count] : slices(1, 1500, 16)) EXPECT_EQ(count, 1) << op;
  for (const auto& [op, count] : slices(1, 1500, 264)) EXPECT_EQ(count, 5) << op;
  // Forwards alone, idle units all: a decode step's (one query a head over a cache of 128 keys)
  // takes 2 slices of 64; SmolVLA's flow-step self-attention (50 queries, 15 heads over 5,
  // 163 keys) none; the U-Net's at 16 x 16 latents, batch 1 (256 queries and keys, 8 heads), 4.
  const auto forward_slices = [](int64_t queries, int64_t q_heads, int64_t keys, int64_t kv_heads) {
    Graph graph;
    const Tensor q = input(graph, "q", {1, q_heads, queries, 64});
    const Tensor k = input(graph, "k", {1, kv_heads, keys, 64});
    const Tensor v = input(graph, "v", {1, kv_heads, keys, 64});
    graph.set_output("y", scaled_dot_product_attention(q, k, v, {}).id());
    const Graph split =
        passes::split_attention(graph, vulkan::VulkanTarget(h200_like(kH200ComputeUnits)));
    for (const Node& node : split.nodes())
      if (node.op == "scaled_dot_product_attention") return node.attrs.get_int("kv_splits", 1);
    return int64_t{0};
  };
  EXPECT_EQ(forward_slices(1, 9, 128, 3), 2);
  EXPECT_EQ(forward_slices(50, 15, 163, 5), 1);
  EXPECT_EQ(forward_slices(256, 8, 256, 8), 4);
  for (const char* bad : {"two", "0", "2,2", "2,2,x", "3,", "2,2,2,2"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(h200_like(kH200ComputeUnits, {{"MEGANEURA_ATTENTION_SPLITS", bad}}), Error);
  }
}

// A GPU like the H200 with workgroup-scope f16 matrices, in fast precision.
target::DeviceTraits workgroup_capable(int64_t compute_units) {
  target::DeviceTraits device = h200_like(compute_units);
  device.coop_matrix_f16_khr = true;
  device.workgroup_coop_matrix_f16 = true;
  device.fast_precision = true;
  return device;
}

// c = a b (each operand stored transposed where its flag says) on seeded leaves: multiples of
// 2^-8 in [-1, 1] (which f16 holds exactly) or any values in [-1, 1].
struct RandomProduct {
  Graph graph;
  Environment environment;
};
RandomProduct random_product(uint64_t seed, int64_t m, int64_t n, int64_t k, bool transpose_a,
                             bool transpose_b, bool exact_in_f16) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  RandomProduct result;
  const Shape a_shape = transpose_a ? Shape{k, m} : Shape{m, k};
  const Shape b_shape = transpose_b ? Shape{n, k} : Shape{k, n};
  const Tensor a = input(result.graph, "a", a_shape);
  const Tensor b = input(result.graph, "b", b_shape);
  result.graph.set_output("c", matmul(a, b, transpose_a, transpose_b).id());
  for (const auto& [name, shape] :
       {std::pair{std::string("a"), a_shape}, std::pair{std::string("b"), b_shape}}) {
    HostTensor value(shape);
    for (double& element : value.data)
      element = exact_in_f16 ? std::round(uniform(generator) * 256) / 256 : uniform(generator);
    result.environment.leaves[name] = value;
  }
  return result;
}

// The workgroup GEMM pass (forced past its size rule): a product whose extents are multiples of
// 128 x 256 x 64 becomes round_to_f16 of both operands and a half_matmul, in every
// transposition. On operands f16 holds exactly it computes the product itself; on any
// others the product of the rounded operands, within K * 2^-10 of the f64 one (each operand
// off by at most 2^-11 relative) and not equal to it.
TEST(Passes, WorkgroupGemmTakesFittingProductsAndRoundsTheirOperands) {
  // Past the size rule, for a product this small.
  target::DeviceTraits forced = workgroup_capable(1);
  forced.switches.workgroup_gemm = true;
  uint64_t seed = 90;
  for (int flags = 0; flags < 4; ++flags) {
    const bool transpose_a = flags & 1, transpose_b = flags & 2;
    SCOPED_TRACE("transpose_a " + std::to_string(transpose_a) + ", transpose_b " +
                 std::to_string(transpose_b));
    const int64_t m = 128, n = 256, k = 192;
    RandomProduct exact = random_product(seed++, m, n, k, transpose_a, transpose_b, true);
    const Graph rewritten = passes::workgroup_gemm(exact.graph, vulkan::VulkanTarget(forced));
    EXPECT_EQ(count_op(rewritten, "round_to_f16"), 2u);
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 1u);
    EXPECT_EQ(count_op(rewritten, "matmul"), 0u);
    expect_same_outputs(exact.graph, rewritten, exact.environment);

    RandomProduct any = random_product(seed++, m, n, k, transpose_a, transpose_b, false);
    const HostTensor wanted = evaluate(any.graph, any.environment)[any.graph.output("c")];
    const Graph rounded = passes::workgroup_gemm(any.graph, vulkan::VulkanTarget(forced));
    const HostTensor got = evaluate(rounded, any.environment)[rounded.output("c")];
    double largest = 0;
    for (int64_t i = 0; i < wanted.elements(); ++i)
      largest = std::max(largest, std::abs(wanted.data[i] - got.data[i]));
    EXPECT_GT(largest, 0.0);
    EXPECT_LE(largest, k * std::ldexp(1.0, -10));
  }
}

TEST(Passes, WorkgroupGemmRoutes) {
  const auto taken = [](int64_t m, int64_t n, int64_t k, const target::DeviceTraits& device) {
    Graph graph;
    const Tensor a = input(graph, "a", {m, k});
    const Tensor b = input(graph, "b", {k, n});
    graph.set_output("c", matmul(a, b).id());
    return count_op(passes::workgroup_gemm(graph, vulkan::VulkanTarget(device)), "half_matmul") ==
           1;
  };
  EXPECT_TRUE(taken(4096, 4096, 4096, workgroup_capable(kH200ComputeUnits)));
  // M N / (M + N) = 512, the least the roundings of the operands allow.
  EXPECT_TRUE(taken(1024, 1024, 64, workgroup_capable(1)));
  EXPECT_TRUE(taken(1152, 1024, 64, workgroup_capable(1)));
  // Extents off the block.
  EXPECT_FALSE(taken(1088, 1024, 64, workgroup_capable(1)));
  EXPECT_FALSE(taken(1024, 1152, 64, workgroup_capable(1)));
  EXPECT_FALSE(taken(1024, 1024, 96, workgroup_capable(1)));
  // SmolLM's lm_head fills the H200 with 192 blocks, but its 128 rows do not pay for rounding
  // the 49152 x 576 weight; a 1024 x 1024 product has 32 blocks for 132 units.
  EXPECT_FALSE(taken(128, 49152, 576, workgroup_capable(kH200ComputeUnits)));
  EXPECT_FALSE(taken(1024, 1024, 1024, workgroup_capable(kH200ComputeUnits)));
  target::DeviceTraits strict = workgroup_capable(1);
  strict.fast_precision = false;
  EXPECT_FALSE(taken(1024, 1024, 64, strict));
  target::DeviceTraits subgroups_only = workgroup_capable(1);
  subgroups_only.workgroup_coop_matrix_f16 = false;
  EXPECT_FALSE(taken(1024, 1024, 64, subgroups_only));
  // With tensor-layout loads the 256 x 128 block also takes N of an odd number of 128s (1152)
  // where M is a multiple of 256, and its blocks count toward filling the device; M of an odd
  // number of 128s (1152) still takes the 128 x 256 block.
  target::DeviceTraits tensor_loads = workgroup_capable(1);
  tensor_loads.workgroup_tensor_loads = true;
  EXPECT_TRUE(taken(1024, 1152, 64, tensor_loads));
  EXPECT_TRUE(taken(1152, 1024, 64, tensor_loads));
  EXPECT_FALSE(taken(1152, 1152, 64, tensor_loads));
  tensor_loads.compute_units = 36;  // 4 x 9 blocks of 256 x 128
  EXPECT_TRUE(taken(1024, 1152, 64, tensor_loads));
  tensor_loads.compute_units = 37;
  EXPECT_FALSE(taken(1024, 1152, 64, tensor_loads));
  // Batched products stay on the subgroup-scope kernel.
  Graph batched;
  const Tensor a = input(batched, "a", {2, 1024, 64});
  const Tensor b = input(batched, "b", {2, 64, 1024});
  batched.set_output("c", matmul(a, b).id());
  EXPECT_EQ(count_op(passes::workgroup_gemm(batched, vulkan::VulkanTarget(workgroup_capable(1))),
                     "half_matmul"),
            0u);

  // A workgroup-capable device with `switches` set.
  const auto switched = [](int64_t compute_units,
                           const std::map<std::string, std::string, std::less<>>& switches) {
    target::DeviceTraits device = workgroup_capable(compute_units);
    device.switches = Switches::from_environment(switches);
    return device;
  };
  const std::map<std::string, std::string, std::less<>> on{{"MEGANEURA_WORKGROUP_GEMM", "1"}};
  EXPECT_TRUE(taken(1024, 1024, 1024, switched(kH200ComputeUnits, on)));
  EXPECT_TRUE(taken(128, 256, 64, switched(kH200ComputeUnits, on)));
  EXPECT_FALSE(taken(96, 256, 64, switched(1, on)));
  EXPECT_FALSE(
      taken(4096, 4096, 4096, switched(kH200ComputeUnits, {{"MEGANEURA_WORKGROUP_GEMM", "0"}})));
  EXPECT_FALSE(
      taken(4096, 4096, 4096, switched(kH200ComputeUnits, {{"MEGANEURA_NO_COOPMAT", "1"}})));
  try {
    taken(1024, 1024, 64, switched(1, {{"MEGANEURA_WORKGROUP_GEMM", "yes"}}));
    ADD_FAILURE() << "MEGANEURA_WORKGROUP_GEMM=yes was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGANEURA_WORKGROUP_GEMM='yes'"), std::string::npos)
        << error.what();
  }
}

// The half storage pass on a graph of f16 or bf16 tensors (inputs, a state, a constant, casts
// every way, to the other 16-bit format too, ops of several families, a batched product, a view,
// 16-bit outputs and an assignment): every kernel but the conversions and transposes reads and
// writes f32 or integers only, each 16-bit value is widened once for the other kernels that read
// it (a cast to f32 is that widening) and once for each pointwise op (a widening read by that op
// alone, which fuses into it), and every output and assignment keeps its reference value exactly
// (the pass rounds where the interpreter does).
TEST(Passes, HalfStorageComputesInF32WithTheSameValues) {
  for (const DType half : {DType::f16, DType::bf16}) {
    const std::string format(dtype_name(half));
    SCOPED_TRACE(format);
    const DType other = half == DType::f16 ? DType::bf16 : DType::f16;
    Graph graph;
    Environment environment;
    std::mt19937_64 generator(71);
    std::uniform_real_distribution<double> uniform(-2.0, 2.0);
    const auto leaf = [&](Tensor tensor, const std::string& name) {
      HostTensor value(tensor.shape());
      for (double& element : value.data) element = uniform(generator);
      environment.leaves[name] = value;
      return tensor;
    };
    const Tensor x = leaf(input(graph, "x", {2, 3, 5}, half), "x");
    const Tensor w = leaf(input(graph, "w", {5, 4}, half), "w");
    const Tensor wide = leaf(input(graph, "wide", {4}), "wide");
    const Tensor running = leaf(Tensor(&graph, graph.state("running", {half, {3, 4}})), "running");
    const Tensor hidden = relu(matmul(x, w) + full(graph, {4}, 0.1, half)) * cast(wide, half);
    const Tensor mixed = matmul(hidden, hidden, false, true);  // batched
    graph.set_output("hidden", reshape(hidden, {24}).id());
    graph.set_output("mixed", mixed.id());
    graph.set_output("moved", transpose(x, {1, 0, 2}).id());
    graph.set_output("wide", (cast(x, DType::f32) * 3.0).id());
    graph.set_output("integers", cast(x * 4.0, DType::i32).id());
    graph.set_output("back", cast(cast(cast(x, DType::i32), half), DType::f32).id());
    graph.set_output("other", cast(cast(x, other), half).id());
    graph.assign(running.id(), (running * 0.5 + sum(hidden, {0}, false)).id());

    const Graph rewritten = passes::half_storage(graph, vulkan::VulkanTarget(h200_like()));
    verify(rewritten);
    const std::string widening = "widen_" + format;
    const std::set<std::string> conversions = {"round_to_f16", "widen_f16", "round_to_bf16",
                                               "widen_bf16", "transpose"};
    const auto is_16_bits = [](DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; };
    for (const Node& node : rewritten.nodes()) {
      if (node.is_leaf() || is_view_op(node.op) || conversions.count(node.op)) continue;
      EXPECT_FALSE(is_16_bits(node.type.dtype)) << node.op;
      for (ValueId input_id : node.inputs)
        EXPECT_FALSE(is_16_bits(rewritten.type(input_id).dtype))
            << node.op << " reads a 16-bit value";
    }
    std::map<ValueId, std::vector<std::string>> readers;  // of each widening, by op
    for (const Node& node : rewritten.nodes())
      for (ValueId input_id : node.inputs)
        if (rewritten.node(input_id).op == widening) readers[input_id].push_back(node.op);
    std::map<ValueId, int> shared_widenings;  // of each 16-bit value, read by other kernels
    size_t own_widenings = 0;
    for (const auto& [widened, ops] : readers) {
      if (ops.size() == 1 && kernels::is_pointwise_op(ops.front())) {
        ++own_widenings;
      } else {
        ++shared_widenings[rewritten.node(widened).inputs[0]];
      }
    }
    for (const auto& [value, count] : shared_widenings) EXPECT_EQ(count, 1) << "%" << value;
    EXPECT_GT(own_widenings, 0u);
    EXPECT_FALSE(shared_widenings.empty());
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 0u);
    EXPECT_EQ(rewritten.type(rewritten.output("hidden")).dtype, half);
    EXPECT_EQ(rewritten.type(rewritten.output("moved")).dtype, half);

    Environment stepped_before = environment, stepped_after = environment;
    expect_same_outputs(graph, rewritten, environment);
    step(graph, stepped_before);
    step(rewritten, stepped_after);
    EXPECT_EQ(stepped_before.leaves["running"].data, stepped_after.leaves["running"].data);
  }
}

// `value` rounded to 16-bit `format` and widened back, by hand: what a pass that stores it in
// that format computes.
Tensor rounded_by_hand(Graph& graph, Tensor value, DType format = DType::f16) {
  return Tensor(&graph, graph.add(widening_op(format),
                                  {graph.add(rounding_op(format), {value.id()})}));
}

// The leaves `names` of `graph` drawn from [-1.5, 1.5] with `seed`.
Environment uniform_leaves(const Graph& graph, const std::vector<std::string>& names,
                           uint64_t seed) {
  Environment environment;
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-1.5, 1.5);
  for (const std::string& name : names) {
    HostTensor value(graph.type(graph.find_leaf(name)).shape);
    for (double& element : value.data) element = uniform(generator);
    environment.leaves[name] = value;
  }
  return environment;
}

// The values both half activations tests store in 16 bits: a = x c and b = tanh(a), which
// elementwise kernels, a reduction and a transpose read (output "shared"), each passed through
// `kept`; returns x and a.
std::pair<Tensor, Tensor> shared_values(Graph& graph, const std::function<Tensor(Tensor)>& kept) {
  const Tensor x = input(graph, "x", {4, 8, 48, 48});
  const Tensor c = input(graph, "c", {8, 1, 1});
  const Tensor a = kept(x * c);
  const Tensor b = kept(tanh(a));
  const Tensor s = sum(a * b, {2, 3}, true);
  graph.set_output("shared", (b * s + transpose(b, {0, 1, 3, 2}) * 2.0).id());
  return {x, a};
}

// What the half activations tests check of `rewritten`, `graph` with values stored in 16 bits
// (widened by `widening`): each widening has one reader, the outputs keep their dtypes, and they
// are those of `by_hand` (the graph with those values rounded by hand), not the graph's own (the
// roundings move output "shared").
void expect_stored_in_16_bits(const Graph& graph, const Graph& by_hand, const Graph& rewritten,
                              const Environment& environment, std::string_view widening) {
  std::map<ValueId, size_t> widening_readers;
  for (const Node& node : rewritten.nodes())
    for (ValueId input_id : node.inputs)
      if (rewritten.node(input_id).op == widening) ++widening_readers[input_id];
  EXPECT_FALSE(widening_readers.empty());
  for (const auto& [value, readers] : widening_readers) EXPECT_EQ(readers, 1u) << "%" << value;
  for (const auto& [name, id] : rewritten.outputs())
    EXPECT_EQ(rewritten.type(id).dtype, graph.type(graph.output(name)).dtype) << name;

  expect_same_outputs(by_hand, rewritten, environment);
  const std::vector<HostTensor> got = evaluate(rewritten, environment);
  const std::vector<HostTensor> unrounded = evaluate(graph, environment);
  EXPECT_NE(unrounded[graph.output("shared")].data, got[rewritten.output("shared")].data);
}

// What both half activations tests add for Winograd's output transform: a product of points
// rounded to 16-bit `format`, read only by the transform, whose image two elementwise kernels
// read (output "image"); the product and the image each passed through `kept`.
void winograd_image_of_rounded_points(Graph& graph, DType format,
                                      const std::function<Tensor(Tensor)>& kept) {
  const std::string_view rounding = rounding_op(format);
  const Tensor filter_points = input(graph, "filter_points", {16, 128, 64});
  const Tensor tile_points = input(graph, "tile_points", {16, 64, 256});
  const Tensor transformed =
      kept(Tensor(&graph, graph.add("half_matmul", {graph.add(rounding, {filter_points.id()}),
                                                    graph.add(rounding, {tile_points.id()})})));
  const Tensor image =
      kept(Tensor(&graph, graph.add("winograd_output", {transformed.id()},
                                    {{"tiles", std::vector<int64_t>{16, 16}},
                                     {"output_size", std::vector<int64_t>{32, 32}}})));
  graph.set_output("image", (relu(image) - image * 0.25).id());
}

// Half activations (on an H200-like GPU with the workgroup GEMM): a value that
// several kernels read is stored in f16 where its producer and every reader convert in
// registers (an elementwise value that Winograd's f16 tiles read too, products of f16 operands,
// a transpose, Winograd's output transform of f16 products); a value one kernel reads, one a
// layer norm reads, a bias added to a product (the GEMM's epilogue) and the outputs keep their
// dtypes. The rewritten graph
// computes what the same graph computes with those values rounded to f16 (built by hand below),
// and each widening of an f16 value has one reader.
TEST(Passes, HalfActivationsStoreValuesThatSeveralKernelsReadInF16) {
  const auto block = [&](Graph& graph, bool round_by_hand) {
    const auto kept = [&](Tensor value) {
      return round_by_hand ? rounded_by_hand(graph, value) : value;
    };
    const auto [x, a] = shared_values(graph, kept);
    // Winograd's input tiles of a, in f16 points either way.
    graph.set_output("tiles", graph.add("winograd_tiles", {a.id()},
                                        {{"tiles", std::vector<int64_t>{24, 24}},
                                         {"padding", std::vector<int64_t>{1, 1}},
                                         {"f16_result", int64_t{1}}}));
    // Winograd's output transform of a product of f16 points, read twice.
    winograd_image_of_rounded_points(graph, DType::f16, kept);
    const Tensor e = x * 2.0 + 1.0;
    graph.set_output("normed", (layer_norm(e, std::nullopt, std::nullopt) + exp(e)).id());
    // A bias added to a product, which the GEMM adds as it stores the product.
    const Tensor biased =
        matmul(input(graph, "rows", {256, 64}), input(graph, "columns", {64, 256})) +
        input(graph, "bias", {256});
    graph.set_output("biased", relu(biased).id());
    graph.set_output("biased_sums", sum(biased, {0}).id());
    const Tensor weights = input(graph, "weights", {128, 64});
    const Tensor images = input(graph, "images", {2, 64, 256});
    const Tensor product =
        kept(Tensor(&graph, graph.add("half_matmul", {graph.add("round_to_f16", {weights.id()}),
                                                      graph.add("round_to_f16", {images.id()})})));
    graph.set_output("product", (relu(product) + product * 0.5).id());
  };
  Graph graph, by_hand;
  block(graph, false);
  block(by_hand, true);
  const Environment environment = uniform_leaves(
      graph,
      {"x", "c", "weights", "images", "filter_points", "tile_points", "rows", "columns", "bias"},
      37);
  // One compute unit: the product, two blocks, fills it.
  const Graph rewritten =
      passes::half_activations(graph, vulkan::VulkanTarget(workgroup_capable(1)));
  verify(rewritten);
  size_t roundings = 0, f16_products = 0, f16_moves = 0, tiles_of_f16 = 0;
  for (const Node& node : rewritten.nodes()) {
    roundings += node.op == "round_to_f16";
    f16_products += node.op == "half_matmul" && node.type.dtype == DType::f16;
    f16_moves +=
        (node.op == "transpose" || node.op == "winograd_output") && node.type.dtype == DType::f16;
    tiles_of_f16 += node.op == "winograd_tiles" &&
                    rewritten.type(node.inputs[0]).dtype == DType::f16 &&
                    !node.attrs.has("f16_result");
  }
  // a and b, and the two products' operands.
  EXPECT_EQ(roundings, 6u);
  EXPECT_EQ(f16_products, 2u);
  EXPECT_EQ(f16_moves, 2u);
  EXPECT_EQ(tiles_of_f16, 1u);
  expect_stored_in_16_bits(graph, by_hand, rewritten, environment, "widen_f16");
}

// Half activations in bfloat16 (bf16 precision's, on a device with bfloat16 workgroup-scope
// matrices): a value that several elementwise kernels, a reduction, a transpose and Winograd's
// bfloat16 tiles read is stored as bfloat16 (the transpose moving it as it is, the tiles reading
// it), as is one that a rounding to bfloat16 (a product's operand) and an elementwise kernel read,
// the rounding then being the stored value itself; a product of bfloat16 operands read twice
// stores a bfloat16 result (bf16_result), and Winograd's output transform of bfloat16 products a
// bfloat16 image. The rewritten graph computes what the same graph computes with those values
// rounded to bfloat16 (built by hand below), and each widening has one reader.
TEST(Passes, HalfActivationsInBf16StoreWhatElementwiseKernelsRead) {
  const auto block = [&](Graph& graph, bool round_by_hand) {
    const auto kept = [&](Tensor value) {
      return round_by_hand ? rounded_by_hand(graph, value, DType::bf16) : value;
    };
    const auto [x, a] = shared_values(graph, kept);
    // Winograd's input tiles of a, in bfloat16 points either way.
    graph.set_output("tiles", graph.add("winograd_tiles", {a.id()},
                                        {{"tiles", std::vector<int64_t>{24, 24}},
                                         {"padding", std::vector<int64_t>{1, 1}},
                                         {"bf16_result", int64_t{1}}}));
    const Tensor e = kept(relu(input(graph, "rows", {256, 512})) * 1.5);
    const Tensor columns = input(graph, "columns", {512, 256});
    const Tensor product = kept(
        Tensor(&graph, graph.add("half_matmul", {graph.add("round_to_bf16", {e.id()}),
                                                 graph.add("round_to_bf16", {columns.id()})})));
    graph.set_output("product", (relu(product) + product * 0.5).id());
    graph.set_output("scaled", (e * 3.0 - 1.0).id());
    // Winograd's output transform of a product of bfloat16 points, read twice.
    winograd_image_of_rounded_points(graph, DType::bf16, kept);
  };
  Graph graph, by_hand;
  block(graph, false);
  block(by_hand, true);
  const Environment environment =
      uniform_leaves(graph, {"x", "c", "rows", "columns", "filter_points", "tile_points"}, 41);
  target::DeviceTraits device = workgroup_capable(1);
  device.coop_matrix_bf16_khr = true;
  device.bf16_operands = true;
  device.workgroup_coop_matrix_bf16 = true;
  const Graph rewritten =
      passes::half_activations(graph, vulkan::VulkanTarget(device), DType::bf16);
  verify(rewritten);
  size_t roundings = 0, bf16_moves = 0, bf16_products = 0, tiles_of_bf16 = 0, f16_conversions = 0;
  for (const Node& node : rewritten.nodes()) {
    roundings += node.op == "round_to_bf16";
    bf16_moves +=
        (node.op == "transpose" || node.op == "winograd_output") && node.type.dtype == DType::bf16;
    bf16_products += node.op == "half_matmul" && node.type.dtype == DType::bf16 &&
                     node.attrs.get_int("bf16_result", 0) == 1;
    tiles_of_bf16 += node.op == "winograd_tiles" &&
                     rewritten.type(node.inputs[0]).dtype == DType::bf16 &&
                     node.type.dtype == DType::bf16 && !node.attrs.has("bf16_result");
    f16_conversions += node.op == "round_to_f16" || node.op == "widen_f16";
  }
  // a, b and e stored, and the products' three other operands.
  EXPECT_EQ(roundings, 6u);
  EXPECT_EQ(bf16_moves, 2u);
  EXPECT_EQ(bf16_products, 2u);
  EXPECT_EQ(tiles_of_bf16, 1u);
  EXPECT_EQ(f16_conversions, 0u);
  expect_stored_in_16_bits(graph, by_hand, rewritten, environment, "widen_bf16");
}

// Split-K takes a product of f16 matrices on the subgroup-scope GEMM apart as it takes an f32
// one, into f32 partial products that one sum_to_f16 sums and rounds to f16 once, with the
// reference values of the whole product; the workgroup GEMM's products stay whole.
TEST(Passes, SplitKSplitsF16ProductsIntoF32Partials) {
  for (const auto& [m, n, k] : {std::tuple{128, 576, 1536}, std::tuple{4096, 4096, 4096}}) {
    Graph graph;
    Environment environment;
    std::mt19937_64 generator(m + k);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    const Tensor a = input(graph, "a", {m, k}, DType::f16);
    const Tensor b = input(graph, "b", {k, n}, DType::f16);
    graph.set_output("c", matmul(a, b).id());
    const Graph split = passes::split_k(
        passes::half_storage(graph, vulkan::VulkanTarget(workgroup_capable(kH200ComputeUnits))),
        vulkan::VulkanTarget(workgroup_capable(kH200ComputeUnits)));
    const ValueId product = [&] {
      for (size_t i = 0; i < split.size(); ++i)
        if (split.nodes()[i].op == "half_matmul") return static_cast<ValueId>(i);
      return kNoValue;
    }();
    ASSERT_NE(product, kNoValue);
    const bool on_workgroups = m == 4096;
    EXPECT_EQ(split.node(product).attrs.has("k_splits"), !on_workgroups);
    EXPECT_EQ(split.type(product).dtype, on_workgroups ? DType::f16 : DType::f32);
    EXPECT_EQ(count_op(split, "sum_to_f16"), on_workgroups ? 0u : 1u);
    EXPECT_EQ(count_op(split, "round_to_f16"), 0u);
    EXPECT_EQ(count_op(split, "sum"), 0u);
    EXPECT_EQ(split.type(split.output("c")).dtype, DType::f16);
    if (on_workgroups) continue;
    for (const auto& [name, shape] : {std::pair{"a", Shape{m, k}}, std::pair{"b", Shape{k, n}}}) {
      HostTensor value(shape);
      for (double& element : value.data) element = uniform(generator);
      environment.leaves[name] = value;
    }
    expect_same_outputs(graph, split, environment);
  }
}

// Products of f16 matrices into f16 results run on cooperative matrices as they are wherever the
// session runs the fast GEMMs: the workgroup GEMM where the blocks fill the compute units (no
// roundings to pay for, so no other bound), else the subgroup-scope GEMM whatever their size.
// Elsewhere (strict precision, the kill switch) they are computed in f32 between conversions.
TEST(Passes, HalfStorageRoutesF16Products) {
  const auto rewritten = [](int64_t m, int64_t n, int64_t k, const target::DeviceTraits& device) {
    Graph graph;
    const Tensor a = input(graph, "a", {m, k}, DType::f16);
    const Tensor b = input(graph, "b", {k, n}, DType::f16);
    graph.set_output("c", matmul(a, b).id());
    return passes::half_storage(graph, vulkan::VulkanTarget(device));
  };
  const auto on_coop = [&](int64_t m, int64_t n, int64_t k, const target::DeviceTraits& device) {
    const Graph graph = rewritten(m, n, k, device);
    const bool direct = count_op(graph, "half_matmul") == 1;
    // Either the product reads the f16 operands and writes the f16 result itself, or two
    // widenings and a rounding surround an f32 matmul.
    EXPECT_EQ(count_op(graph, "widen_f16"), direct ? 0u : 2u);
    EXPECT_EQ(count_op(graph, "round_to_f16"), direct ? 0u : 1u);
    EXPECT_EQ(count_op(graph, "matmul"), direct ? 0u : 1u);
    EXPECT_EQ(graph.type(graph.output("c")).dtype, DType::f16);
    return direct;
  };
  const target::DeviceTraits h200 = workgroup_capable(kH200ComputeUnits);
  // 128 x 49152: 192 blocks of the workgroup GEMM, which f32 operands would not take
  // (M N / (M + N) < 512); 1024^3, SmolLM's 128 x 1536 x 576 and a product that gemm.comp would
  // run in f32 are the subgroup GEMM's.
  EXPECT_TRUE(on_coop(128, 49152, 576, h200));
  EXPECT_TRUE(on_coop(1024, 1024, 1024, h200));
  EXPECT_TRUE(on_coop(128, 1536, 576, h200));
  EXPECT_TRUE(on_coop(64, 64, 64, h200));
  target::DeviceTraits strict = workgroup_capable(1);
  strict.fast_precision = false;
  EXPECT_FALSE(on_coop(1024, 1024, 64, strict));
  target::DeviceTraits killed = h200;
  killed.switches.no_coopmat = true;
  EXPECT_FALSE(on_coop(4096, 4096, 4096, killed));
}

// Products of bf16 matrices into bf16 results read the bfloat16 operands as they are in bf16
// precision: on the workgroup GEMM, which stores the bf16 result itself (a half_matmul with
// bf16_result), on a device with workgroup-scope bfloat16 matrices where a block fits; else on the
// subgroup GEMM into an f32 result that a rounding stores. Elsewhere (fast precision, strict) they
// are computed in f32 between two widenings and a rounding.
TEST(Passes, HalfStorageRoutesBf16Products) {
  enum class Route { workgroup, subgroup, f32 };
  const auto route = [](int64_t m, int64_t n, int64_t k, const target::DeviceTraits& device) {
    Graph graph;
    const Tensor a = input(graph, "a", {m, k}, DType::bf16);
    const Tensor b = input(graph, "b", {k, n}, DType::bf16);
    graph.set_output("c", matmul(a, b).id());
    const Graph rewritten = passes::half_storage(graph, vulkan::VulkanTarget(device));
    EXPECT_EQ(rewritten.type(rewritten.output("c")).dtype, DType::bf16);
    if (count_op(rewritten, "widen_bf16") == 2) {
      EXPECT_EQ(count_op(rewritten, "matmul"), 1u);
      EXPECT_EQ(count_op(rewritten, "round_to_bf16"), 1u);
      return Route::f32;
    }
    EXPECT_EQ(count_op(rewritten, "widen_bf16"), 0u);
    EXPECT_EQ(count_op(rewritten, "half_matmul"), 1u);
    EXPECT_EQ(count_op(rewritten, "matmul"), 0u);
    return count_op(rewritten, "round_to_bf16") == 1 ? Route::subgroup : Route::workgroup;
  };
  target::DeviceTraits bf16 = workgroup_capable(kH200ComputeUnits);
  bf16.coop_matrix_bf16_khr = true;
  bf16.bf16_operands = true;
  bf16.workgroup_coop_matrix_bf16 = true;
  EXPECT_EQ(route(4096, 4096, 4096, bf16), Route::workgroup);
  EXPECT_EQ(route(128, 1536, 576, bf16), Route::subgroup);
  target::DeviceTraits without_matrices = bf16;
  without_matrices.workgroup_coop_matrix_bf16 = false;
  EXPECT_EQ(route(4096, 4096, 4096, without_matrices), Route::subgroup);
  EXPECT_EQ(route(4096, 4096, 4096, workgroup_capable(kH200ComputeUnits)), Route::f32);
  target::DeviceTraits strict = bf16;
  strict.fast_precision = false;
  strict.bf16_operands = false;
  EXPECT_EQ(route(4096, 4096, 4096, strict), Route::f32);
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

size_t count_of(const Graph& graph, std::string_view op) {
  return static_cast<size_t>(std::count_if(graph.nodes().begin(), graph.nodes().end(),
                                           [&](const Node& node) { return node.op == op; }));
}

// A training batch norm (weight and bias, or neither) over an input far from zero mean, its
// running statistics and the gradients of a loss through it: the decomposed graph gives the same
// output, gradients and running statistics, shares the statistics and the gradient sums (no
// batch norm left, one mean a statistic, one sum each for the weight and bias gradients), and
// leaves channels below the element bound as they are; the variance in one pass (the mean of
// squares less the squared mean) as in two.
TEST(Passes, DecomposedBatchNormKeepsOutputsGradientsAndRunningStatistics) {
  for (const bool affine : {true, false}) {
    SCOPED_TRACE(affine ? "affine" : "plain");
    std::mt19937_64 generator(affine ? 31 : 32);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    const Shape shape{2, 4, 12, 12};
    Graph graph;
    Environment environment;
    const Tensor x = input(graph, "x", shape);
    HostTensor x_value(shape);
    for (int64_t i = 0; i < x_value.elements(); ++i)
      x_value.data[static_cast<size_t>(i)] =
          3.0 + 0.5 * static_cast<double>((i / 144) % 4) + uniform(generator);
    environment.leaves["x"] = x_value;
    std::optional<Tensor> weight, bias;
    if (affine) {
      weight = input(graph, "w", {4});
      bias = input(graph, "b", {4});
      environment.leaves["w"] = HostTensor({4}, {0.5, -1.5, 2.0, 1.25});
      environment.leaves["b"] = HostTensor({4}, {0.1, 0.2, -0.3, 0.4});
    }
    const Tensor running_mean{&graph, graph.state("rm", {DType::f32, {4}})};
    const Tensor running_var{&graph, graph.state("rv", {DType::f32, {4}}, Init::ones())};
    const Tensor y = relu(batch_norm(x, weight, bias, running_mean, running_var, true, 0.1, 1e-5));
    const Tensor seed = input(graph, "seed", shape);
    HostTensor seed_value(shape);
    for (double& element : seed_value.data) element = uniform(generator);
    environment.leaves["seed"] = seed_value;
    std::vector<ValueId> wrt{x.id()};
    if (affine) wrt = {x.id(), weight->id(), bias->id()};
    const std::map<ValueId, ValueId> grads = gradients(graph, sum_all(y * seed).id(), wrt);
    graph.set_output("y", y.id());
    graph.set_output("dx", grads.at(x.id()));
    if (affine) {
      graph.set_output("dw", grads.at(weight->id()));
      graph.set_output("db", grads.at(bias->id()));
    }
    for (const auto& [leaf, value] : graph.updates())
      graph.set_output("new " + graph.node(leaf).name, value);
    initialise_leaves(graph, environment, 1);
    const Graph optimized = passes::optimize(graph);

    for (const bool one_pass : {false, true}) {
      SCOPED_TRACE(one_pass ? "one-pass variance" : "two-pass variance");
      const Graph decomposed = passes::decompose_batch_norm(optimized, 288, one_pass);
      EXPECT_EQ(count_of(decomposed, "batch_norm") + count_of(decomposed, "batch_norm_grad"), 0u);
      EXPECT_EQ(count_of(decomposed, "mean"), 2u);
      EXPECT_EQ(count_of(decomposed, "sum"), 2u);
      // In one pass both means read x (one through its square), neither waits for the other.
      for (const Node& node : decomposed.nodes()) {
        if (node.op != "mean" || !one_pass) continue;
        const Node& source = decomposed.node(node.inputs[0]);
        const Node& read = source.op == "square" ? decomposed.node(source.inputs[0]) : source;
        EXPECT_EQ(read.name, "x") << source.op;
      }
      expect_same_outputs(graph, decomposed, environment);
      const Graph split = passes::split_reductions(decomposed);
      EXPECT_EQ(count_of(split, "mean"), 4u);
      expect_same_outputs(graph, split, environment);
    }

    const Graph kept = passes::decompose_batch_norm(optimized, 289, false);
    EXPECT_EQ(count_of(kept, "batch_norm_grad"), 1u);
    EXPECT_EQ(kept.size(), optimized.size());
  }
}

// Half products (on an H200-like GPU of one compute unit, in fast precision, and in bf16
// precision on one with bfloat16 cooperative matrices, whose GEMMs round to bfloat16): a product
// reads in the 16-bit format each operand that costs nothing to store so, a weight no assignment
// updates (a parameter or a state) and a layer norm's or an elementwise result that only such
// products read, through a reshape, whatever its number of rows (60 too), one rounding an
// operand however many products read it; its other operand stays f32 where it cannot (a host
// input, an updated weight, a value something else reads too). A product over a K off the
// multiples of 8 (the extent along which both operands lie in memory) keeps both f32; a strict
// device rewrites nothing. The rewritten graph computes, on the f64 reference, what the same
// graph computes with those operands rounded to the format (built by hand below).
TEST(Passes, HalfProductsRoundOperandsThatCostNothingToStoreInF16) {
  for (const DType format : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(format));
    const bool bfloat16 = format == DType::bf16;
    const char* rounding = bfloat16 ? "round_to_bf16" : "round_to_f16";
    const auto block = [&](Graph& graph, bool round_by_hand) {
      const auto half = [&](Tensor value) {
        return round_by_hand ? rounded_by_hand(graph, value, format) : value;
      };
      const Tensor x = input(graph, "x", {2, 32, 64});
      const Tensor w_q = parameter(graph, "w_q", {64, 64}, Init::uniform(-1, 1));
      const Tensor w_k{&graph, graph.state("w_k", {DType::f32, {64, 64}}, Init::uniform(-1, 1))};
      const Tensor w_up = parameter(graph, "w_up", {128, 64}, Init::uniform(-1, 1));
      const Tensor w_down = parameter(graph, "w_down", {64, 128}, Init::uniform(-1, 1));
      const Tensor w_trained = parameter(graph, "w_trained", {64, 64}, Init::uniform(-1, 1));
      const Tensor normed = half(reshape(layer_norm(x, std::nullopt, std::nullopt), {64, 64}));
      const Tensor q = matmul(normed, half(w_q), false, true);
      const Tensor k = matmul(normed, half(w_k), false, true);
      const Tensor up = half(gelu(matmul(normed, half(w_up), false, true)));
      const Tensor down = matmul(up, half(w_down), false, true);
      graph.set_output("qk", (q * k + down).id());
      const Tensor sixty = reshape(input(graph, "sixty", {60, 64}), {60, 64});
      graph.set_output("of_sixty", matmul(half(sigmoid(sixty)), half(w_q), false, true).id());
      // One operand 16-bit: beside a host input, an updated weight, a value that a sum reads too.
      const Tensor rows = reshape(x, {64, 64});
      graph.set_output("of_input", matmul(rows, half(w_q), false, true).id());
      const Tensor trained = matmul(half(tanh(rows)), w_trained, false, true);
      graph.set_output("of_trained", trained.id());
      graph.assign(w_trained.id(), (w_trained * 0.5).id());
      const Tensor shared = exp(rows * 0.25);
      graph.set_output("of_shared", matmul(shared, half(w_q), false, true).id());
      graph.set_output("shared_sum", sum(shared, {0}).id());
      // Kept: a K of 60.
      const Tensor w_narrow = parameter(graph, "w_narrow", {64, 60}, Init::uniform(-1, 1));
      const Tensor narrow = reshape(input(graph, "narrow", {64, 60}), {64, 60});
      graph.set_output("of_narrow", matmul(sigmoid(narrow), w_narrow, false, true).id());
    };
    Graph graph, by_hand;
    block(graph, false);
    block(by_hand, true);
    const Environment environment = uniform_leaves(
        graph, {"x", "w_q", "w_k", "w_up", "w_down", "w_trained", "sixty", "w_narrow", "narrow"},
        41);
    target::DeviceTraits device = h200_like(1);
    device.coop_matrix_f16_khr = true;
    device.coop_matrix_bf16_khr = bfloat16;
    device.bf16_operands = bfloat16;
    device.fast_precision = true;
    const Graph rewritten = passes::half_products(graph, vulkan::VulkanTarget(device), format);
    verify(rewritten);
    EXPECT_EQ(count_of(rewritten, "half_matmul"), 8u);
    EXPECT_EQ(count_of(rewritten, "matmul"), 1u);
    // The layer norm's, the GELU's, the sigmoid's, the tanh's and the four fixed weights'.
    EXPECT_EQ(count_of(rewritten, rounding), 8u);
    EXPECT_EQ(count_of(rewritten, bfloat16 ? "round_to_f16" : "round_to_bf16"), 0u);
    size_t mixed = 0;
    for (const Node& node : rewritten.nodes())
      mixed += node.op == "half_matmul" &&
               rewritten.type(node.inputs[0]).dtype != rewritten.type(node.inputs[1]).dtype;
    EXPECT_EQ(mixed, 3u);
    expect_same_outputs(by_hand, rewritten, environment);

    const Graph strict = passes::half_products(graph, vulkan::VulkanTarget(h200_like(1)), format);
    EXPECT_EQ(strict.to_string(), graph.to_string());
  }
}

}  // namespace
}  // namespace mg
