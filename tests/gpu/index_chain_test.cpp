// Index chains (backends/vulkan/kernels/index_chain.cpp): a transpose, rope or concat computed in
// one launch with the transposes, ropes, reshapes and split-K sums before it that only it reads.
// Each case runs against the f64 reference and again with MEGANEURA_NO_FUSION=1, which must give
// the same values in the stated number of launches.
#include "harness.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;
using testing::HarnessInput;
using testing::ScopedSwitch;
using Build = std::function<void(Graph&, std::vector<Tensor>&)>;

// rope's transpose (its gradient), as autodiff adds it.
Tensor inverse_rope(const Tensor& x, double theta) {
  Graph& graph = x.graph();
  return Tensor(
      &graph,
      graph.add("rope", {x.id()},
                {{"theta", theta}, {"position_offset", int64_t{3}}, {"inverse", int64_t{1}}}));
}

void check_chain(const std::vector<HarnessInput>& inputs, const Build& build, size_t fused_launches,
                 size_t unfused_launches) {
  size_t fused = 0, unfused = 0;
  check_on_gpu(inputs, build, 1e-5, 7, {}, &fused);
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 7, {}, &unfused);
  }
  EXPECT_EQ(fused, fused_launches);
  EXPECT_EQ(unfused, unfused_launches);
}

// Attention's query after its projection: split-K partials [3, S, H * D] summed, split into
// heads, moved to head-major order and rotated (offset positions), in one launch instead of
// three.
TEST(GpuIndexChain, PartialSumTransposeRope) {
  check_chain(
      {{"partials", {3, 12, 4 * 8}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor heads = reshape(sum(x[0], {0}), {1, 12, 4, 8});
        const Tensor y = rope(transpose(heads, {0, 2, 1, 3}), 10000.0, 5);
        graph.set_output("y", y.id());
      },
      1, 3);
}

// Each sample at its own positions (SmolVLA's padded prefix): the rope reads them in the chain,
// forward and inverse (its gradient).
TEST(GpuIndexChain, PartialSumTransposeRopeAtPositions) {
  check_chain(
      {{"partials", {3, 2, 12, 4 * 8}}, {"positions", {2, 12}, DType::i32, 0.0, 300.0}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor heads = reshape(sum(x[0], {0}), {2, 12, 4, 8});
        const Tensor y = rope(transpose(heads, {0, 2, 1, 3}), x[1], 10000.0, 2);
        graph.set_output("y", y.id());
        Attrs inverse = graph.node(y.id()).attrs;
        inverse.set("inverse", int64_t{1});
        graph.set_output(
            "back",
            transpose(Tensor(&graph, graph.add("rope", {y.id(), x[1].id()}, inverse)), {0, 2, 1, 3})
                .id());
      },
      2, 5);
}

// An attention forward whose queries are a chain's value (their projection split into heads,
// moved to head-major order, rotated at each sample's positions) computes the chain as it loads
// them (Q_CHAIN): the chain has no launch, one fewer than with MEGANEURA_QUERY_CHAINS=0, against
// the reference, with the output as it is, written heads last, and both (the forward writes the
// transpose's value beside its own output). Where the queries are kept too (an output), the
// chain keeps its launch and the forward computes it all the same: as many launches either way.
// A chain that sums split-K partials keeps its launch (the forward's few workgroups would load
// every partial).
TEST(GpuIndexChain, AttentionComputesItsQueriesChain) {
  for (const bool summed : {false, true}) {
    for (const bool kept : {false, true}) {
      for (const int layout : {0, 1, 2}) {  // as it is, heads last, both
        const bool heads_last = layout != 0;
        SCOPED_TRACE(std::string(summed ? "partials summed, " : "") +
                     (kept ? "queries kept" : "queries read once") +
                     (layout == 1   ? ", heads last"
                      : layout == 2 ? ", both layouts"
                                    : ""));
        const std::vector<HarnessInput> inputs{
            {"projected", summed ? Shape{3, 2, 12, 4 * 8} : Shape{2, 12, 4 * 8}},
            {"positions", {2, 12}, DType::i32, 0.0, 300.0},
            {"k", {2, 2, 9, 8}},
            {"v", {2, 2, 9, 6}}};
        const Build build = [&](Graph& graph, std::vector<Tensor>& x) {
          const Tensor heads = reshape(summed ? sum(x[0], {0}) : x[0], {2, 12, 4, 8});
          const Tensor q = rope(transpose(heads, {0, 2, 1, 3}), x[1], 10000.0, 2);
          const Tensor y = scaled_dot_product_attention(q, x[2], x[3]);
          graph.set_output("y", (heads_last ? transpose(y, {0, 2, 1, 3}) : y).id());
          if (layout == 2) graph.set_output("y as it is", y.id());
          if (kept) graph.set_output("q", q.id());
        };
        size_t chained = 0, apart = 0;
        std::string list;
        check_on_gpu(inputs, build, 1e-5, 11, {}, &chained, true, &list);
        {
          const ScopedSwitch off("MEGANEURA_QUERY_CHAINS", "0");
          check_on_gpu(inputs, build, 1e-5, 11, {}, &apart);
        }
        const bool computes_chain = !summed;
        EXPECT_EQ(chained + (computes_chain && !kept ? 1 : 0), apart) << list;
        EXPECT_NE(list.find("scaled_dot_product_attention %"), std::string::npos) << list;
        EXPECT_EQ(list.find(" + rope %") != std::string::npos, computes_chain) << list;
        EXPECT_EQ(list.find(" + transpose %") != std::string::npos, heads_last) << list;
      }
    }
  }
}

// The gradient's way back: partials summed, rotated back (inverse), moved to sequence-major
// order; and a value that is also read elsewhere ends the chain (the transpose of `kept` reads
// it from memory).
TEST(GpuIndexChain, PartialSumInverseRopeTranspose) {
  check_chain(
      {{"partials", {2, 1, 3, 10, 6}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor rotated = inverse_rope(sum(x[0], {0}), 500.0);
        graph.set_output("y", reshape(transpose(rotated, {0, 2, 1, 3}), {10, 18}).id());
      },
      1, 3);
  check_chain(
      {{"partials", {2, 1, 3, 10, 6}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor kept = sum(x[0], {0});
        graph.set_output("kept", kept.id());
        graph.set_output("y", transpose(rope(kept, 500.0, 0), {0, 2, 1, 3}).id());
      },
      2, 3);
}

// SmolVLA's flow step: the cached prefix keys [B, H, P, D] and the step's own keys (their
// projection's split-K partials summed, split into heads, moved head-major, rotated) concatenated
// along the sequence in one launch that reads the prefix from memory and computes the rest; the
// values likewise without the rotation, and a concat whose parts both come from memory (a copy,
// as before). Three parts, the chain in the middle one, and a concat over the last axis.
TEST(GpuIndexChain, ConcatOfCachedPrefixAndRotatedKeys) {
  check_chain(
      {{"prefix", {2, 3, 7, 8}}, {"partials", {4, 2, 5, 3 * 8}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor heads = reshape(sum(x[1], {0}), {2, 5, 3, 8});
        const Tensor keys = rope(transpose(heads, {0, 2, 1, 3}), 10000.0, 7);
        graph.set_output("keys", concat({x[0], keys}, 2).id());
        const Tensor values = transpose(reshape(sum(x[1] * 0.5, {0}), {2, 5, 3, 8}), {0, 2, 1, 3});
        graph.set_output("values", concat({x[0], values}, 2).id());
      },
      3, 8);
  check_chain(
      {{"a", {2, 3, 4}}, {"b", {2, 4, 3}}, {"c", {2, 3, 2}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", concat({x[0], transpose(x[1], {0, 2, 1}), x[2]}, 2).id());
        graph.set_output("copy", concat({x[2], x[0]}, 2).id());
      },
      2, 3);
}

// Transposes in a row (one permutation of another), and two ropes, which a chain never holds
// together (one table of angles a launch): the first rope is a launch of its own.
TEST(GpuIndexChain, TransposesAndTwoRopes) {
  check_chain(
      {{"x", {2, 3, 4, 6}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor once = transpose(x[0], {0, 2, 1, 3});
        graph.set_output("y", transpose(once, {3, 1, 0, 2}).id());
      },
      1, 2);
  check_chain(
      {{"x", {1, 2, 5, 8}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor twice = rope(transpose(rope(x[0], 100.0, 1), {0, 2, 1, 3}), 9.0, 2);
        graph.set_output("y", twice.id());
      },
      2, 3);
}

}  // namespace
}  // namespace mg
