// Matmul epilogue fusion (backends/vulkan/kernels/fusion.cpp,
// backends/vulkan/kernels/gemm_epilogue.cpp): a matmul and the elementwise chain that consumes it
// run as one GEMM launch. Every case runs against the f64 reference on both GEMM kernels (on
// Lavapipe: gemm_cpu.comp, and gemm.comp through MEGANEURA_NO_CPU_KERNELS=1), and again with
// MEGANEURA_NO_EPILOGUE_FUSION=1, which must give the same values in exactly `saved` more
// dispatches.
#include <optional>

#include "backends/vulkan/kernels/fusion.hpp"
#include "harness.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;
using testing::HarnessInput;
using testing::ScopedSwitch;
using Build = std::function<void(Graph&, std::vector<Tensor>&)>;

void check_fused(const std::vector<HarnessInput>& inputs, const Build& build, size_t saved) {
  for (const bool gpu_kernels : {false, true}) {
    SCOPED_TRACE(gpu_kernels ? "gemm.comp" : "default GEMM kernel");
    std::optional<ScopedSwitch> force_gpu_kernels;
    if (gpu_kernels) force_gpu_kernels.emplace("MEGANEURA_NO_CPU_KERNELS", "1");
    size_t fused = 0, unfused = 0;
    check_on_gpu(inputs, build, 1e-5, 7, {}, &fused);
    {
      const ScopedSwitch off("MEGANEURA_NO_EPILOGUE_FUSION", "1");
      check_on_gpu(inputs, build, 1e-5, 7, {}, &unfused);
    }
    EXPECT_EQ(fused + saved, unfused);
  }
}

TEST(GpuEpilogue, LinearBiasGelu) {
  check_fused(
      {{"x", {37, 29}}, {"w", {45, 29}}, {"bias", {45}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", gelu(linear(x[0], x[1], x[2])).id());
        // A different product, so that common-subexpression elimination keeps both.
        graph.set_output("tanh_gelu",
                         gelu(linear(x[0] * 2.0, x[1], x[2]) * 0.5, GeluApproximation::tanh).id());
      },
      2);
}

TEST(GpuEpilogue, LinearBiasResidualAdd) {
  check_fused(
      {{"x", {2, 19, 33}}, {"w", {33, 33}}, {"bias", {33}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor rows = reshape(x[0], {38, 33});
        graph.set_output("y", (linear(rows, x[1], x[2]) + rows).id());
      },
      1);
}

// A bias add whose elementwise reader comes after a reshape that prepends the batch axis joins that
// reader's DAG (fusion through prepended unit axes), which a GEMM's store would index by the
// product's axes: the product keeps a plain store, the bias add, GELU and residual product one
// launch after it, so the epilogue switch saves nothing here.
TEST(GpuEpilogue, BiasAddJoinedThroughPrependedUnitAxesStaysOutOfTheStore) {
  check_fused(
      {{"x", {37, 29}}, {"w", {45, 29}}, {"bias", {45}}, {"r", {1, 37, 45}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor h = reshape(linear(x[0], x[1], x[2]), {1, 37, 45});
        graph.set_output("y", (gelu(h) * x[3]).id());
      },
      0);
}

// Batch axes broadcast on both operands and in the epilogue inputs: bias over the columns, a
// scale per output batch entry of axis 1, a residual that repeats over axis 0.
TEST(GpuEpilogue, BatchedBroadcastWithBias) {
  check_fused(
      {{"a", {2, 1, 13, 21}},
       {"b", {1, 3, 21, 17}},
       {"bias", {17}},
       {"scale", {3, 1, 1}},
       {"residual", {3, 13, 17}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", relu((matmul(x[0], x[1]) + x[2]) * x[3] + x[4]).id());
      },
      1);
}

TEST(GpuEpilogue, Transposes) {
  check_fused(
      {{"a", {3, 13, 21}}, {"at", {3, 21, 13}}, {"b", {21, 35}}, {"bt", {35, 21}}, {"bias", {35}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("nt", tanh(matmul(x[0], x[3], false, true) + x[4]).id());
        graph.set_output("tn", sigmoid(matmul(x[1], x[2], true, false) - x[4]).id());
        graph.set_output("tt", (matmul(x[1], x[3], true, true) * x[4]).id());
      },
      3);
}

// An i32 input converted in the chain, and scalar constants that become literals.
TEST(GpuEpilogue, IntegerInputAndConstants) {
  check_fused(
      {{"a", {17, 23}}, {"b", {23, 31}}, {"counts", {31}, DType::i32, -4, 5}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor product = matmul(x[0], x[1]);
        graph.set_output("y", (product * 0.5 + cast(x[2], DType::f32) - 1.25).id());
      },
      1);
}

// Two products summed: one becomes the sum's GEMM, the other keeps its own launch.
TEST(GpuEpilogue, OneProductPerChain) {
  check_fused(
      {{"a", {19, 23}}, {"b", {23, 29}}, {"c", {19, 11}}, {"d", {11, 29}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", (matmul(x[0], x[1]) + matmul(x[2], x[3])).id());
      },
      1);
}

// A product that is itself an output stays materialised and unfused.
TEST(GpuEpilogue, ObservedProductIsNotFused) {
  check_fused(
      {{"a", {19, 23}}, {"b", {23, 29}}, {"bias", {29}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor product = matmul(x[0], x[1]);
        graph.set_output("product", product.id());
        graph.set_output("y", (product + x[2]).id());
      },
      0);
}

// A bias add that the graph keeps (an output here; in training, the pre-activation a GELU's
// backward reads) and that a later node reads too: the GEMM evaluates it and its ReLU, writing the
// ReLU as its result and the bias add beside it. Without epilogues the bias add and ReLU are one
// pointwise kernel that writes both, so the GEMM saves exactly that dispatch (with the bias add
// as the epilogue's end, as before extra outputs, the ReLU was a kernel of its own: none saved).
TEST(GpuEpilogue, KeptValueWrittenBesideTheActivation) {
  check_fused(
      {{"x", {37, 29}}, {"w", {45, 29}}, {"bias", {45}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor pre_activation = linear(x[0], x[1], x[2]);
        const Tensor activation = relu(pre_activation);
        graph.set_output("pre_activation", pre_activation.id());
        graph.set_output("activation", activation.id());
        graph.set_output("later", (pre_activation * 3.0).id());
      },
      1);
}

// An epilogue with 13 bound inputs: 16 bindings with a, b and the result, the most every
// Vulkan device supports.
constexpr int kEpilogueInputs = 13;

std::vector<HarnessInput> many_inputs() {
  std::vector<HarnessInput> inputs{{"a", {2, 11, 19}}, {"b", {19, 23}}};
  for (int k = 0; k < kEpilogueInputs; ++k) {
    inputs.push_back(
        {"e" + std::to_string(k), k % 2 ? Shape{23} : Shape{2, 11, 23}, DType::f32, 0.5, 1.5});
  }
  return inputs;
}

void build_many_inputs(Graph& graph, std::vector<Tensor>& x) {
  Tensor y = matmul(x[0], x[1]);
  for (int k = 0; k < kEpilogueInputs; ++k) y = k % 3 ? y + x[2 + k] : y * x[2 + k];
  graph.set_output("y", y.id());
}

TEST(GpuEpilogue, SixteenBindings) {
  check_fused(many_inputs(), build_many_inputs, 1);
}

size_t launch_count(const Graph& graph, uint32_t max_storage_buffers) {
  target::DeviceTraits device;
  device.max_storage_buffers = max_storage_buffers;
  return kernels::lower_graph(graph, device).size();
}

// Below 16 bindings the product gets its own launch; the chain stays fused.
TEST(GpuEpilogue, BindingLimitKeepsTheProductSeparate) {
  Graph graph;
  std::vector<Tensor> x;
  for (const HarnessInput& spec : many_inputs()) x.push_back(input(graph, spec.name, spec.shape));
  build_many_inputs(graph, x);
  EXPECT_EQ(launch_count(graph, 16), 1u);
  EXPECT_EQ(launch_count(graph, 15), 2u);
}

// Split-K partial products (attribute k_splits) never take an epilogue: a chain belongs after
// their sum.
TEST(GpuEpilogue, SplitKPartialsAreNotFused) {
  Graph graph;
  const Tensor a = input(graph, "a", {8, 32});
  const Tensor b = input(graph, "b", {32, 8});
  const Tensor bias = input(graph, "bias", {8});
  const Tensor partials(&graph, graph.add("matmul", {a.id(), b.id()}, {{"k_splits", int64_t{2}}}));
  graph.set_output("y", (partials + bias).id());
  EXPECT_EQ(launch_count(graph, 16), 2u);
}

// A split-K sum (a matmul's partial products over K slices summed over their leading axis)
// whose one reader, through a reshape, is elementwise of its shape is summed in that reader's
// kernel: the product and one fused launch, against four launches unfused, and the reference's
// values, on the vec4 path (96 elements) and the scalar one (63). A sum whose value is also an
// output and is read by a later node is written beside the reader's result by that kernel.
TEST(GpuEpilogue, SplitKSumsJoinTheirElementwiseReader) {
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{8, 12}, {7, 9}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n));
    const std::vector<HarnessInput> inputs{{"a", {m, 40}}, {"b", {40, n}}, {"residual", {1, m, n}}};
    for (const bool kept : {false, true}) {
      const Build build = [m, n, kept](Graph& graph, std::vector<Tensor>& x) {
        const Tensor partials(
            &graph, graph.add("matmul", {x[0].id(), x[1].id()}, {{"k_splits", int64_t{3}}}));
        const Tensor product = reshape(sum(partials, {0}), {1, m, n});
        const Tensor y = gelu(product + x[2]);
        graph.set_output("y", y.id());
        if (kept) {
          graph.set_output("product", product.id());
          graph.set_output("z", (sum_all(product) * y).id());
        }
      };
      size_t fused = 0, unfused = 0;
      check_on_gpu(inputs, build, 1e-5, 7, {}, &fused);
      {
        const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
        check_on_gpu(inputs, build, 1e-5, 7, {}, &unfused);
      }
      EXPECT_EQ(fused, kept ? 4u : 2u);  // kept: the product, the fused sum, sum_all, mul
      EXPECT_EQ(unfused, kept ? 6u : 4u);
    }
  }
}

// The kill switches: MEGANEURA_NO_EPILOGUE_FUSION keeps pointwise chains fused,
// MEGANEURA_NO_FUSION turns off both.
TEST(GpuEpilogue, KillSwitches) {
  const std::vector<HarnessInput> inputs{{"x", {37, 29}}, {"w", {45, 29}}, {"bias", {45}}};
  const Build build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("y", gelu(linear(x[0], x[1], x[2])).id());
  };
  size_t fused = 0, chains_only = 0, unfused = 0;
  check_on_gpu(inputs, build, 1e-5, 7, {}, &fused);
  {
    const ScopedSwitch off("MEGANEURA_NO_EPILOGUE_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 7, {}, &chains_only);
  }
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 7, {}, &unfused);
  }
  EXPECT_EQ(fused, 1u);
  EXPECT_EQ(chains_only, 2u);
  EXPECT_EQ(unfused, 3u);
}

}  // namespace
}  // namespace mg
