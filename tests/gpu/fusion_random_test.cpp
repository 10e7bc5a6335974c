// Fusion keeps outputs unchanged on random graphs: products (transposes, broadcast batches) fed
// into random elementwise chains with broadcast operands (bias rows, residuals, scalars), values
// shared by several consumers and outputs taken from the middle of chains. Each graph runs on
// both GEMM paths with fusion on, against the f64 reference, and must take fewer dispatches
// than with fusion off.
#include <functional>
#include <optional>
#include <random>

#include "backends/vulkan/kernels/fusion.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "harness.hpp"
#include "meganeura/autodiff.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;
using testing::HarnessInput;
using testing::ScopedSwitch;

struct RandomGraph {
  std::vector<HarnessInput> inputs;
  std::function<void(Graph&, std::vector<Tensor>&)> build;
};

// Everything is drawn here, from `seed`, so that the graph is the same in every build call.
RandomGraph random_fusion_graph(uint64_t seed) {
  std::mt19937_64 generator(seed);
  const auto pick = [&](int64_t count) {
    return std::uniform_int_distribution<int64_t>(0, count - 1)(generator);
  };
  const int64_t batch = 1 + pick(3), m = 3 + pick(20), n = 2 + pick(20), k = 1 + pick(30);
  const bool transpose_a = pick(2) != 0, transpose_b = pick(2) != 0;
  const bool broadcast_b = pick(2) != 0;
  RandomGraph result;
  result.inputs = {{"a", transpose_a ? Shape{batch, k, m} : Shape{batch, m, k}},
                   {"b", broadcast_b ? (transpose_b ? Shape{n, k} : Shape{k, n})
                                     : (transpose_b ? Shape{batch, n, k} : Shape{batch, k, n})},
                   {"bias", {n}},
                   {"residual", {batch, m, n}},
                   {"column", {batch, m, 1}},
                   {"c", {batch, m, k}},
                   {"d", {batch, k, n}}};
  // Steps: 0-5 unary, 6-9 binary with an operand, 10 a second product added in, 11 branch.
  std::vector<int64_t> steps;
  const int64_t length = 3 + pick(6);
  for (int64_t i = 0; i < length; ++i) steps.push_back(pick(12));
  const int64_t output_mask = pick(1 << 4);
  result.build = [=](Graph& graph, std::vector<Tensor>& x) {
    Tensor value = matmul(x[0], x[1], transpose_a, transpose_b);
    std::vector<Tensor> earlier;
    int64_t outputs = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      switch (steps[i]) {
        case 0:
          value = tanh(value);
          break;
        case 1:
          value = gelu(value);
          break;
        case 2:
          value = sigmoid(value);
          break;
        case 3:
          value = relu(value);
          break;
        case 4:
          value = neg(value);
          break;
        case 5:
          value = square(tanh(value));
          break;
        case 6:
          value = value + x[2];
          break;
        case 7:
          value = value * x[3];
          break;
        case 8:
          value = value - x[4];
          break;
        case 9:
          value = value * 0.5 + 0.25;
          break;
        case 10:
          value = value + matmul(x[5], x[6]);
          break;
        default:
          earlier.push_back(value);  // a second consumer of this value comes at the end
          break;
      }
      if ((output_mask >> (i % 4)) & 1 && outputs < 2 && i + 1 < steps.size()) {
        graph.set_output("middle" + std::to_string(outputs++), value.id());
      }
    }
    for (const Tensor& branch : earlier) value = value + branch;
    graph.set_output("y", value.id());
  };
  return result;
}

TEST(GpuFusion, RandomGraphsKeepOutputsOnBothGemmPaths) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const RandomGraph random = random_fusion_graph(seed);
    for (bool gpu_kernels : {false, true}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (gpu_kernels ? ", gemm.comp" : ""));
      std::optional<ScopedSwitch> force;
      if (gpu_kernels) force.emplace("MEGANEURA_NO_CPU_KERNELS", "1");
      size_t fused = 0, unfused = 0;
      check_on_gpu(random.inputs, random.build, 1e-5, seed, {}, &fused);
      {
        const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
        check_on_gpu(random.inputs, random.build, 1e-5, seed, {}, &unfused);
      }
      EXPECT_LT(fused, unfused);
    }
  }
}

// A value the graph keeps (here an output) with one elementwise consumer of its shape is computed
// in the consumer's kernel, which writes it as well: h = x w + b and y = tanh(h) x in one
// dispatch, against the reference, on the vec4 path (32 elements, a bias row of 8), the vec4
// path with a scalar tail (21 elements, b of x's shape) and the scalar path of a bias row that
// is not whole vec4s (5 x 6).
TEST(GpuFusion, KeptValuesWrittenBesideTheirConsumer) {
  for (const auto& [shape, b_shape] :
       std::vector<std::pair<Shape, Shape>>{{{4, 8}, {8}}, {{3, 7}, {3, 7}}, {{5, 6}, {6}}}) {
    SCOPED_TRACE(shape_string(shape) + " + " + shape_string(b_shape));
    const std::vector<HarnessInput> inputs{{"x", shape}, {"w", shape}, {"b", b_shape}};
    const auto build = [](Graph& graph, std::vector<Tensor>& x) {
      const Tensor h = x[0] * x[1] + x[2];
      graph.set_output("h", h.id());
      graph.set_output("y", (tanh(h) * x[0]).id());
    };
    size_t fused = 0, unfused = 0;
    check_on_gpu(inputs, build, 1e-5, 11, {}, &fused);
    {
      const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
      check_on_gpu(inputs, build, 1e-5, 11, {}, &unfused);
    }
    EXPECT_EQ(fused, 1u);
    EXPECT_EQ(unfused, 4u);
  }
}

// A value that a later node reads as well is computed in the kernel of its first, elementwise
// consumer and written there: h = x w + b, y = tanh(h) x and the row sums of h in two dispatches
// (three before, five without fusion). Where another reader comes before the kernel that would
// write it (the row sums between tanh(h) and its product with x), h keeps a kernel of its own.
TEST(GpuFusion, SharedValuesWrittenBesideTheirFirstConsumer) {
  const std::vector<HarnessInput> inputs{{"x", {5, 12}}, {"w", {5, 12}}, {"b", {12}}};
  for (const bool sums_first : {false, true}) {
    SCOPED_TRACE(sums_first ? "row sums before the product" : "row sums last");
    const auto build = [sums_first](Graph& graph, std::vector<Tensor>& x) {
      const Tensor h = x[0] * x[1] + x[2];
      const Tensor t = tanh(h);
      std::optional<Tensor> sums;
      if (sums_first) sums = sum(h, {1});
      graph.set_output("y", (t * x[0]).id());
      if (!sums_first) sums = sum(h, {1});
      graph.set_output("sums", sums->id());
    };
    size_t fused = 0, unfused = 0;
    check_on_gpu(inputs, build, 1e-5, 12, {}, &fused);
    {
      const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
      check_on_gpu(inputs, build, 1e-5, 12, {}, &unfused);
    }
    EXPECT_EQ(fused, sums_first ? 3u : 2u);
    EXPECT_EQ(unfused, 5u);
  }
}

// The kernel that writes a kept value binds it as well: where the device's storage buffers
// run out, the value keeps a kernel of its own.
TEST(GpuFusion, KeptValuesStayWithinTheBindingLimit) {
  Graph graph;
  const Tensor x = input(graph, "x", {4, 8}), w = input(graph, "w", {4, 8});
  const Tensor b = input(graph, "b", {8});
  const Tensor h = x * w + b;
  graph.set_output("h", h.id());
  graph.set_output("y", (tanh(h) * x).id());
  const auto launches = [&](uint32_t max_storage_buffers) {
    target::DeviceTraits device;
    device.max_storage_buffers = max_storage_buffers;
    return kernels::lower_graph(graph, device).size();
  };
  EXPECT_EQ(launches(5), 1u);  // x, w, b, h and y
  EXPECT_EQ(launches(4), 2u);
}

// A sum or mean whose input is a pointwise result that nothing else reads evaluates that DAG as
// it reads each element: a channel variance over a broadcast mean, a gradient norm's full sum,
// a product of two full inputs reduced over rows, a square seen through a reshape, a column sum
// over the leading axis, and a product whose DAG also computes a value that later nodes read
// (a batch norm's incoming gradient), which the reduction then writes beside and, over the same
// rows, sums too (a sibling). Each output against the reference, in fewer dispatches than
// unfused.
void build_reductions_of_pointwise(Graph& graph, std::vector<Tensor>& x) {
  const Tensor mean_x = mean(x[0], {0, 2, 3}, true);
  graph.set_output("variance", mean(square(x[0] - mean_x), {0, 2, 3}).id());
  graph.set_output("norm", sum_all(square(x[1])).id());
  graph.set_output("weight gradient", sum(x[1] * (x[0] - mean_x), {0, 2, 3}).id());
  graph.set_output("rows", sum(reshape(square(x[0] * 0.5), {48, 35}), {1}).id());
  graph.set_output("columns", sum(relu(x[2]) * x[3], {0}).id());
  const Tensor gradient = relu(x[1]) * 2.0;
  graph.set_output("per row", sum(gradient * (x[0] - mean_x), {3}).id());
  graph.set_output("gradient sum", sum(gradient, {3}).id());
  graph.set_output("dx", (gradient * x[0]).id());
}

const std::vector<HarnessInput> kReductionInputs = {
    {"x", {8, 6, 5, 7}}, {"g", {8, 6, 5, 7}}, {"a", {64, 8}}, {"b", {64, 8}}};

TEST(GpuFusion, ReductionsEvaluateTheirPointwiseProducer) {
  size_t fused = 0, unfused = 0;
  check_on_gpu(kReductionInputs, build_reductions_of_pointwise, 1e-5, 21, {}, &fused);
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(kReductionInputs, build_reductions_of_pointwise, 1e-5, 21, {}, &unfused);
  }
  EXPECT_LT(fused, unfused);
}

// On a device with more compute units than the weight gradient's 6 rows and the column sum's 8,
// their two full-size inputs each would be read by that few workgroups alone: those keep their
// pointwise launches; the others, with one full-size input each or rows enough (the per-row
// sum's 240, which writes the gradient beside), take their producer. With fewer compute units
// than 6, all six do.
TEST(GpuFusion, FewRowsTakeAProducerOfOneFullInput) {
  Graph graph;
  std::vector<Tensor> x;
  for (const HarnessInput& spec : kReductionInputs)
    x.push_back(input(graph, spec.name, spec.shape));
  build_reductions_of_pointwise(graph, x);
  int64_t siblings = 0;
  const auto prologues = [&](int64_t compute_units) {
    target::DeviceTraits device;
    device.compute_units = compute_units;
    int64_t count = 0;
    siblings = 0;
    for (const kernels::Launch& launch : kernels::lower_graph(graph, device)) {
      count += launch.label.find(" of fused ") != std::string::npos;
      siblings += launch.label.find(" + sum %") != std::string::npos;
    }
    return count;
  };
  EXPECT_EQ(prologues(4), 6);
  EXPECT_EQ(prologues(132), 4);
  EXPECT_EQ(siblings, 1);  // the gradient's per-row sum, beside the per-row product's
}

// The lines of `list` (BuildReport::dispatch_list) that contain every one of `parts`.
size_t lines_with(const std::string& list, const std::vector<std::string>& parts) {
  size_t count = 0, start = 0;
  while (start < list.size()) {
    size_t end = list.find('\n', start);
    if (end == std::string::npos) end = list.size();
    const std::string line = list.substr(start, end - start);
    count += std::all_of(parts.begin(), parts.end(), [&](const std::string& part) {
      return line.find(part) != std::string::npos;
    });
    start = end + 1;
  }
  return count;
}

// A norm whose prologue sums split-K partial results (a residual add after a product split over
// K) loads each element once a partial: its workgroup takes threads by those loads, up to one
// a vec4 of its row (576 / 4 = 144, so 256), where the same norm over a plain residual add
// keeps the few threads its 576 elements take.
TEST(GpuFusion, NormPrologueThreadsFollowItsPartialLoads) {
  const auto norm_threads = [](bool partials) {
    Graph graph;
    const Tensor r = input(graph, "r", {128, 576});
    Tensor h = input(graph, "x", {128, 576}) + r;
    if (partials) {
      const Tensor a = input(graph, "a", {128, 1024});
      const Tensor b = input(graph, "b", {1024, 576});
      const ValueId split = graph.add("matmul", {a.id(), b.id()}, {{"k_splits", int64_t{16}}});
      h = sum(Tensor(&graph, split), {0}) + r;
    }
    graph.set_output("n", rms_norm(h, input(graph, "w", {576})).id());
    target::DeviceTraits device;
    device.compute_units = 132;
    for (const kernels::Launch& launch : kernels::lower_graph(graph, device)) {
      if (launch.label.find("rms_norm %") == std::string::npos) continue;
      EXPECT_NE(launch.label.find(" of fused "), std::string::npos) << launch.label;
      for (const auto& [name, value] : launch.defines)
        if (name == "LOCAL") return value;
    }
    return std::string("no norm launch");
  };
  EXPECT_EQ(norm_threads(true), "256u");
  EXPECT_EQ(norm_threads(false), "64u");
}

// A pre-norm residual block and its gradients: h = a b + r (the product split over K, which
// needs a K of 512, its
// partials summed by the residual add), n = norm(h), y = tanh(n) r + h, which reads h again
// after the norm. The norm evaluates h's DAG as it reads it and writes h beside; its gradient
// evaluates its incoming gradient's DAG (through tanh) and the residual gradient's add as it
// stores dh: one launch each, against the reference, for rms_norm and layer_norm, and apart
// with MEGANEURA_NO_NORM_FUSION=1.
TEST(GpuFusion, NormsEvaluateTheirInputsAndResultsReaders) {
  const std::vector<HarnessInput> inputs{{"a", {6, 512}}, {"b", {512, 24}}, {"r", {6, 24}},
                                         {"w", {24}},     {"bias", {24}},   {"dy", {6, 24}}};
  const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", "3");
  for (const bool rms : {true, false}) {
    SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
    const auto build = [rms](Graph& graph, std::vector<Tensor>& x) {
      const Tensor h = matmul(x[0], x[1]) + x[2];
      const Tensor n = rms ? rms_norm(h, x[3]) : layer_norm(h, x[3], x[4]);
      const Tensor y = tanh(n) * x[2] + h;
      graph.set_output("y", y.id());
      for (const auto& [leaf, gradient] :
           gradients(graph, y.id(), {x[0].id(), x[1].id(), x[3].id()}, x[5].id()))
        graph.set_output("d" + std::to_string(leaf), gradient);
    };
    const std::string norm = rms ? "rms_norm" : "layer_norm";
    size_t fused = 0, unfused = 0;
    std::string list;
    check_on_gpu(inputs, build, 1e-5, 23, {}, &fused, true, &list);
    EXPECT_EQ(lines_with(list, {norm + " %", " of fused 1 ops -> add"}), 1u) << list;
    EXPECT_EQ(lines_with(list, {norm + "_grad %", " of fused ", " + fused 1 ops -> add"}), 1u)
        << list;
    {
      const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
      check_on_gpu(inputs, build, 1e-5, 23, {}, &unfused);
    }
    EXPECT_LT(fused, unfused);
    // The kill switch: the DAGs take launches of their own, the values stay the same.
    size_t apart = 0;
    const ScopedSwitch off("MEGANEURA_NO_NORM_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 23, {}, &apart, true, &list);
    EXPECT_EQ(lines_with(list, {norm, " fused "}), 0u) << list;
    EXPECT_GT(apart, fused);
  }
}

// The same block, x = a + r, n = norm(x), y = tanh(n) r + x and its gradients, on the kernel's
// other paths: rows of 21 (scalar steps), group norm over planes of 35 (scalar) and of 16 (vec4
// steps of one channel), and a row of 40,000, whose threads walk more steps than the prologue's
// register cache holds, so the prologue is evaluated again in each pass.
TEST(GpuFusion, NormsEvaluateTheirNeighboursOnEveryPath) {
  struct Case {
    std::string name;
    Shape x, weight;
    std::function<Tensor(Tensor, Tensor)> norm;
  };
  const std::vector<Case> cases{
      {"rms_norm", {3, 21}, {21}, [](Tensor x, Tensor w) { return rms_norm(x, w); }},
      {"layer_norm", {3, 21}, {21}, [](Tensor x, Tensor w) { return layer_norm(x, w, w); }},
      {"group_norm", {2, 6, 5, 7}, {6}, [](Tensor x, Tensor w) { return group_norm(x, 3, w, w); }},
      {"group_norm", {2, 6, 4, 4}, {6}, [](Tensor x, Tensor w) { return group_norm(x, 3, w, w); }},
      {"layer_norm", {2, 40000}, {40000}, [](Tensor x, Tensor w) { return layer_norm(x, w, {}); }}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " " + shape_string(c.x));
    const std::vector<HarnessInput> inputs{{"a", c.x}, {"r", c.x}, {"w", c.weight}, {"dy", c.x}};
    const auto build = [&c](Graph& graph, std::vector<Tensor>& x) {
      const Tensor h = x[0] + x[1];
      const Tensor y = tanh(c.norm(h, x[2])) * x[1] + h;
      graph.set_output("y", y.id());
      for (const auto& [leaf, gradient] :
           gradients(graph, y.id(), {x[0].id(), x[2].id()}, x[3].id()))
        graph.set_output("d" + std::to_string(leaf), gradient);
    };
    std::string list;
    check_on_gpu(inputs, build, 1e-5, 31, {}, nullptr, true, &list);
    EXPECT_EQ(lines_with(list, {c.name + " %", " of fused 1 ops -> add"}), 1u) << list;
    EXPECT_EQ(lines_with(list, {c.name + "_grad %", " of fused ", " + fused 1 ops -> add"}), 1u)
        << list;
  }
}

// A linear layer's bias add over [rows, width] joins the elementwise DAG or the norm that reads it
// through a reshape that prepends the batch axis ([1, rows, width]), as a model's blocks give:
// y = silu(reshape(a b + bias)) x, the product split over K so that the DAG sums its partials
// too, and n = rms_norm(reshape(a c + bias) + r): one launch each after the products, against
// the reference, and more launches with fusion off. A reshape that moves extents elsewhere
// ([6, 24] to [2, 3, 24]) still parts the DAGs.
TEST(GpuFusion, ElementwiseDagsJoinThroughPrependedUnitAxes) {
  const std::vector<HarnessInput> inputs{{"a", {6, 512}}, {"b", {512, 24}},  {"c", {512, 24}},
                                         {"bias", {24}},  {"x", {1, 6, 24}}, {"r", {1, 6, 24}},
                                         {"w", {24}},     {"z", {2, 3, 24}}, {"d", {512, 24}}};
  const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", "3");
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor h = matmul(x[0], x[1]) + x[3];
    graph.set_output("y", (silu(reshape(h, {1, 6, 24})) * x[4]).id());
    const Tensor g = matmul(x[0], x[2]) + x[3];
    graph.set_output("n", rms_norm(reshape(g, {1, 6, 24}) + x[5], x[6]).id());
    const Tensor e = exp(matmul(x[0], x[8]) * 0.01);
    graph.set_output("m", (reshape(e, {2, 3, 24}) * x[7]).id());
  };
  size_t fused = 0, unfused = 0;
  std::string list;
  check_on_gpu(inputs, build, 1e-5, 37, {}, &fused, true, &list);
  EXPECT_EQ(lines_with(list, {"fused 3 ops -> mul %"}), 1u) << list;
  EXPECT_EQ(lines_with(list, {"rms_norm %", " of fused 2 ops -> add %"}), 1u) << list;
  EXPECT_EQ(lines_with(list, {"fused 2 ops -> exp %"}), 1u) << list;
  EXPECT_EQ(lines_with(list, {"  mul %"}), 1u) << list;  // the label alone: a launch of its own
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 37, {}, &unfused);
  }
  EXPECT_LT(fused, unfused);
}

// SwiGLU and its gradients: y = (silu(g) u) d with g = a wg, u = a wu. The incoming gradient of
// the product, dh = dy dᵀ (split over K), feeds du = dh silu(g), which only products read, and
// dg, whose DAG reads sigmoid(g) twice: du is computed in dg's kernel and written beside it
// (a sibling), sigmoid(g) once inside it, and dh's partials summed there, one launch for all
// of them.
TEST(GpuFusion, SiblingDagsShareOneLaunch) {
  const std::vector<HarnessInput> inputs{
      {"a", {6, 20}}, {"wg", {20, 24}}, {"wu", {20, 24}}, {"wd", {24, 512}}, {"dy", {6, 512}}};
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor h = silu(matmul(x[0], x[1])) * matmul(x[0], x[2]);
    const Tensor y = matmul(h, x[3]);
    graph.set_output("y", y.id());
    for (const auto& [leaf, gradient] :
         gradients(graph, y.id(), {x[0].id(), x[1].id(), x[2].id(), x[3].id()}, x[4].id()))
      graph.set_output("d" + std::to_string(leaf), gradient);
  };
  const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", "3");
  size_t fused = 0, unfused = 0;
  std::string list;
  check_on_gpu(inputs, build, 1e-5, 29, {}, &fused, true, &list);
  // The forward's silu(g) u and the backward's one DAG.
  EXPECT_EQ(lines_with(list, {"pointwise"}), 2u) << list;
  EXPECT_EQ(lines_with(list, {"sigmoid %"}), 0u) << list;
  EXPECT_EQ(lines_with(list, {"sum %"}), 0u) << list;
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 29, {}, &unfused);
  }
  EXPECT_LT(fused, unfused);
}

// The same gradients rounded to f16, as products that read f16 operands take them
// (passes/half_products.cpp): du and dg each end in a rounding and are read by a transpose, and
// still share one launch, which sums dh's partials too. Against the reference's rounded values.
TEST(GpuFusion, SiblingDagsRoundedToF16ShareOneLaunch) {
  const std::vector<HarnessInput> inputs{
      {"a", {6, 512}}, {"w", {512, 24}}, {"g", {6, 24}}, {"u", {6, 24}}};
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor dh = matmul(x[0], x[1]);
    const Tensor s = sigmoid(x[2]);
    const Tensor du = cast(dh * (x[2] * s), DType::f16);
    const Tensor dg = cast(dh * x[3] * s * (1.0 + x[2] * (1.0 - s)), DType::f16);
    graph.set_output("du", transpose(du, {1, 0}).id());
    graph.set_output("dg", transpose(dg, {1, 0}).id());
  };
  const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", "3");
  size_t dispatches = 0;
  std::string list;
  check_on_gpu(inputs, build, 1e-3, 43, {}, &dispatches, true, &list);
  EXPECT_EQ(lines_with(list, {"pointwise"}), 1u) << list;
  EXPECT_EQ(lines_with(list, {"sigmoid %"}), 0u) << list;
  EXPECT_EQ(lines_with(list, {"sum %"}), 0u) << list;
}

// A batch norm's backward over its per-channel vectors: A = rstd w, B = -A rstd S2 / n and
// C = -A S1 / n, read broadcast by dx = g A + x B + C. B's DAG computes A and writes it beside
// for dx; C's DAG reads A too and joins B's kernel as its sibling, which computes A once for
// both: one launch for the three vectors, one for dx.
TEST(GpuFusion, SiblingReadsAValueTheFirstDagWritesBeside) {
  const std::vector<HarnessInput> inputs{{"rstd", {5}, DType::f32, 0.5, 2.0},
                                         {"w", {5}},
                                         {"s1", {5}},
                                         {"s2", {5}},
                                         {"g", {3, 5, 8}},
                                         {"x", {3, 5, 8}}};
  const auto build = [](Graph& graph, std::vector<Tensor>& in) {
    const Tensor a = in[0] * in[1];
    const Tensor b = -(a * in[0] * in[3]) * (1.0 / 24);
    const Tensor c = -(a * in[2]) * (1.0 / 24);
    const auto channels = [](const Tensor& t) { return reshape(t, {1, 5, 1}); };
    graph.set_output("dx", (in[4] * channels(a) + in[5] * channels(b) + channels(c)).id());
  };
  size_t dispatches = 0;
  std::string list;
  check_on_gpu(inputs, build, 1e-5, 37, {}, &dispatches, true, &list);
  EXPECT_EQ(dispatches, 2u) << list;
  EXPECT_EQ(lines_with(list, {"pointwise"}), 2u) << list;
}

// Small DAGs evaluated again where they are read (fusion.cpp, inline_small_dags): a batch
// norm's per-channel scale and shift (from its statistics, the mean a reduction of x: the scale's
// DAG read by the shift's) read through reshapes by the normalisation, 144 times larger, which
// evaluates both itself from the statistics. With nothing else reading them they take no launch
// (one launch in all, against two with MEGANEURA_INLINE_SMALL_DAGS=0); with the scale also an
// output (as a backward would read it) its launch stays, but the normalisation no longer waits for
// it: no barrier between them, where switched off there is one.
TEST(GpuFusion, SmallDagsEvaluatedAgainWhereTheyAreRead) {
  const std::vector<HarnessInput> inputs{
      {"var", {16}, DType::f32, 0.5, 2.0}, {"gamma", {16}}, {"beta", {16}}, {"x", {4, 16, 12, 12}}};
  for (const bool scale_kept : {false, true}) {
    SCOPED_TRACE(scale_kept ? "scale also an output" : "scale and shift read once");
    const auto build = [&](Graph& graph, std::vector<Tensor>& in) {
      const Tensor scale = in[1] * rsqrt(in[0] + 1e-5);
      const Tensor shift = in[2] - mean(in[3], {0, 2, 3}) * scale;
      const auto channels = [](const Tensor& t) { return reshape(t, {1, 16, 1, 1}); };
      graph.set_output("y", relu(in[3] * channels(scale) + channels(shift)).id());
      if (scale_kept) graph.set_output("scale", scale.id());
    };
    size_t inlined = 0, apart = 0;
    std::string inlined_list, apart_list;
    check_on_gpu(inputs, build, 1e-5, 41, {}, &inlined, true, &inlined_list);
    {
      const ScopedSwitch off("MEGANEURA_INLINE_SMALL_DAGS", "0");
      check_on_gpu(inputs, build, 1e-5, 41, {}, &apart, true, &apart_list);
    }
    // The mean's launch (or two, one after the other, where a GPU splits it), then the
    // normalisation right after it: one barrier after each statistics launch.
    const size_t statistics = lines_with(apart_list, {"reduction"});
    EXPECT_EQ(inlined, statistics + (scale_kept ? 2u : 1u)) << inlined_list;
    EXPECT_EQ(apart, statistics + 2u) << apart_list;
    EXPECT_EQ(lines_with(inlined_list, {" *"}), statistics) << inlined_list;
    EXPECT_EQ(lines_with(apart_list, {" *"}), statistics + 1u) << apart_list;
  }
}

// Transposed stores (fusion.cpp): an elementwise DAG whose result a transpose reads, through a
// reshape, writes the transposed value itself, each element where the transpose moves it: one
// launch instead of two (MEGANEURA_TRANSPOSED_STORES=0), against the reference, in vec4s (the
// broadcast operands vary along whole vec4s), in scalars (a broadcast operand that varies inside
// them), in f16 (a rounded result, moved as f16) and element by element where the innermost axis
// is no multiple of four long. Where another elementwise DAG reads the
// result too (a ReLU's output and its gradient), it reads each element where the transpose put
// it, also a pointwise_moved launch; where a product reads it too, it is stored as it is and the
// transpose keeps its launch, as it does where it moves the innermost axis.
TEST(GpuFusion, ElementwiseResultsStoredWhereTheirTransposeMovesThem) {
  enum class AlsoRead { no, elementwise, product };
  struct Case {
    const char* name;
    Shape x, w;
    std::vector<int64_t> permutation;
    bool f16;
    AlsoRead also_read;
    size_t moved_launches;  // 0: the transpose keeps its launch
  };
  for (const Case& c :
       {Case{"vec4s", {2, 6, 5, 8}, {6, 1, 1}, {1, 0, 2}, false, AlsoRead::no, 1},
        Case{"scalars", {2, 6, 2, 6}, {1, 1, 2, 1}, {1, 0, 2}, false, AlsoRead::no, 1},
        Case{"f16", {2, 6, 5, 8}, {6, 1, 1}, {1, 0, 2}, true, AlsoRead::no, 1},
        Case{"f16, read elementwise too",
             {2, 6, 5, 8},
             {6, 1, 1},
             {1, 0, 2},
             true,
             AlsoRead::elementwise,
             2},
        Case{"rows of 35, read elementwise too",
             {2, 6, 5, 7},
             {6, 1, 1},
             {1, 0, 2},
             true,
             AlsoRead::elementwise,
             2},
        Case{"read by a product too",
             {2, 6, 5, 8},
             {6, 1, 1},
             {1, 0, 2},
             false,
             AlsoRead::product,
             0},
        Case{"innermost moved", {2, 6, 5, 8}, {6, 1, 1}, {2, 0, 1}, false, AlsoRead::no, 0}}) {
    SCOPED_TRACE(c.name);
    const auto build = [&](Graph& graph, std::vector<Tensor>& in) {
      Tensor y = relu(in[0] * in[1] + 1.0);
      if (c.f16) y = cast(y, DType::f16);
      const Tensor moved = transpose(reshape(y, {c.x[0], c.x[1], c.x[2] * c.x[3]}), c.permutation);
      graph.set_output("moved", moved.id());
      if (c.also_read == AlsoRead::elementwise)
        graph.set_output("gradient", (cast(y, DType::f32) * in[0] - 0.5).id());
      if (c.also_read == AlsoRead::product)
        graph.set_output("product", matmul(reshape(y, {c.x[0] * c.x[1], c.x[2] * c.x[3]}),
                                           reshape(in[0], {c.x[2] * c.x[3], c.x[0] * c.x[1]}))
                                        .id());
    };
    size_t stored = 0, apart = 0;
    std::string list;
    // f16 results hold the f16 rounding of the reference's values.
    const double tolerance = c.f16 ? 1e-3 : 1e-6;
    check_on_gpu({{"x", c.x}, {"w", c.w}}, build, tolerance, 43, {}, &stored, true, &list);
    {
      const ScopedSwitch off("MEGANEURA_TRANSPOSED_STORES", "0");
      check_on_gpu({{"x", c.x}, {"w", c.w}}, build, tolerance, 43, {}, &apart);
    }
    EXPECT_EQ(stored + (c.moved_launches > 0 ? 1 : 0), apart) << list;
    EXPECT_EQ(lines_with(list, {"pointwise_moved"}), c.moved_launches) << list;
  }
}

// Transposed stores of products (fusion.cpp): a matmul whose result a transpose reads, through a
// reshape (a projection split into heads and moved head-major), alone or through its epilogue (a
// bias add), writes the transposed value itself from its store: one launch instead of two
// (MEGANEURA_TRANSPOSED_STORES=0), against the reference, on the device's GEMM paths (its CPU
// kernels, and with MEGANEURA_NO_CPU_KERNELS=1 the tiled GEMM and, at 2 rows over a transposed
// weight, the few-rows one, which a GPU takes with or without the switch). Where the graph keeps
// the result too, the transpose keeps its launch.
TEST(GpuFusion, ProductsStoredWhereTheirTransposeMovesThem) {
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const bool cpu_device = devices[gpu::choose_device(devices, "")].kind == gpu::DeviceKind::cpu;
  for (const char* gpu_kernels : {"0", "1"}) {
    for (const int64_t rows : {12, 2}) {
      for (const bool bias : {false, true}) {
        for (const bool kept : {false, true}) {
          SCOPED_TRACE(std::string("MEGANEURA_NO_CPU_KERNELS=") + gpu_kernels + ", " +
                       std::to_string(rows) + " rows" + (bias ? ", bias" : "") +
                       (kept ? ", result kept" : ""));
          const ScopedSwitch kernels("MEGANEURA_NO_CPU_KERNELS", gpu_kernels);
          const auto build = [&](Graph& graph, std::vector<Tensor>& in) {
            Tensor y = matmul(in[0], in[1], false, true);
            if (bias) y = y + in[2];
            const Tensor heads = transpose(reshape(y, {1, rows, 4, 10}), {0, 2, 1, 3});
            graph.set_output("heads", heads.id());
            if (kept) graph.set_output("y", y.id());
          };
          const std::vector<HarnessInput> inputs{{"x", {rows, 48}}, {"w", {40, 48}}, {"b", {40}}};
          size_t stored = 0, apart = 0;
          std::string list;
          check_on_gpu(inputs, build, 1e-5, 47, {}, &stored, true, &list);
          {
            const ScopedSwitch off("MEGANEURA_TRANSPOSED_STORES", "0");
            check_on_gpu(inputs, build, 1e-5, 47, {}, &apart);
          }
          EXPECT_EQ(stored + (kept ? 0 : 1), apart) << list;
          EXPECT_EQ(lines_with(list, {"matmul %", " + transpose %"}), kept ? 0u : 1u) << list;
          const bool few_rows = rows == 2 && (gpu_kernels == std::string("1") || !cpu_device);
          EXPECT_EQ(lines_with(list, {"gemm_few_rows"}), few_rows ? 1u : 0u) << list;
        }
      }
    }
  }
}

// Transposed loads (fusion.cpp): a transpose that keeps the innermost axis, read only by
// elementwise DAGs, has no launch; they read its input where it took each element. A batch norm
// over f16 images side by side moved back (as ResNet's products over the batch leave them): the
// sums' prologues and the normalisation read through the transpose, each through a widening of
// its own, in vec4s and over planes of 7, whose vec4s the transpose splits (each element loaded
// alone); an f32 product moved back and read in scalars (a broadcast operand varying inside
// vec4s). One launch fewer than with MEGANEURA_TRANSPOSED_LOADS=0 (and
// MEGANEURA_TRANSPOSED_STORES=0, without which the product would store the moved value itself),
// against the reference. The transpose is no load of theirs where a product reads it too (the
// product before it then stores the moved value itself: one launch fewer all the same), or where it
// moves the innermost axis (its own launch).
TEST(GpuFusion, ElementwiseReadersLoadThroughTheirTranspose) {
  struct Case {
    const char* name;
    int64_t plane;  // the innermost axis
    std::vector<int64_t> permutation;
    bool statistics, read_by_product, taken;
    size_t fewer;  // launches
  };
  for (const Case& c : {Case{"batch norm, f16, vec4s", 8, {1, 0, 2}, true, false, true, 1},
                        Case{"batch norm, f16, planes of 7", 7, {1, 0, 2}, true, false, true, 1},
                        Case{"product, f32, scalars", 8, {1, 0, 2}, false, false, true, 1},
                        Case{"also read by a product", 8, {1, 0, 2}, false, true, false, 1},
                        Case{"innermost moved", 8, {0, 2, 1}, false, false, false, 0}}) {
    SCOPED_TRACE(c.name);
    const auto build = [&](Graph& graph, std::vector<Tensor>& in) {
      // [channels, images * plane] -> [images, channels, plane]
      const Tensor source = c.statistics ? in[0] : matmul(in[1], in[2]);
      const Tensor moved = transpose(reshape(source, {6, 2, c.plane}), c.permutation);
      if (c.statistics) {
        const Tensor x = reshape(moved, {2, 6, c.plane, 1});
        const auto widened = [&] { return cast(x, DType::f32); };
        const Tensor mu = mean(widened(), {0, 2, 3});
        const Tensor variance = relu(mean(square(widened()), {0, 2, 3}) - square(mu));
        const auto channels = [](const Tensor& t) { return reshape(t, {1, 6, 1, 1}); };
        graph.set_output(
            "y", relu((widened() - channels(mu)) * channels(in[3] * rsqrt(variance + 1e-5))).id());
        return;
      }
      const Tensor x = reshape(moved, {2, 6, 8});
      graph.set_output("y", relu(reshape(x, {2, 6, 4, 2}) * in[4] + 1.0).id());
      if (c.read_by_product) graph.set_output("product", matmul(x, in[5]).id());
    };
    const std::vector<HarnessInput> inputs{{"x", {6, 2 * c.plane}, DType::f16},
                                           {"a", {6, 5}},
                                           {"b", {5, 16}},
                                           {"gamma", {6}},
                                           {"c", {2}},
                                           {"d", {8, 3}}};
    size_t loaded = 0, apart = 0;
    std::string list, apart_list;
    // The f16 images hold the f16 rounding of the reference's draws.
    const double tolerance = c.statistics ? 1e-3 : 1e-5;
    check_on_gpu(inputs, build, tolerance, 47, {}, &loaded, true, &list);
    {
      const ScopedSwitch off("MEGANEURA_TRANSPOSED_LOADS", "0");
      const ScopedSwitch no_stores("MEGANEURA_TRANSPOSED_STORES", "0");
      check_on_gpu(inputs, build, tolerance, 47, {}, &apart, true, &apart_list);
    }
    EXPECT_EQ(loaded + c.fewer, apart) << list;
    EXPECT_EQ(lines_with(list, {"pointwise_moved"}), c.taken ? 1u : 0u) << list;
    EXPECT_EQ(lines_with(list, {"transpose"}), c.taken ? 0u : 1u) << list;
    EXPECT_EQ(lines_with(apart_list, {"transpose"}), 1u) << apart_list;
  }
}

// A scatter_add into a product that nothing else reads (a tied embedding's gradient; six rows
// drawn from three, so some repeat): the product is written straight into the scatter's result,
// which then takes the rows; no launch copies the product. Against the reference, and the same
// with fusion off (the copy back).
TEST(GpuFusion, ScatterAddsIntoItsTargetsMemory) {
  const std::vector<HarnessInput> inputs{
      {"a", {48, 16}}, {"b", {16, 40}}, {"rows", {6}, DType::i32, 0, 3}, {"updates", {6, 40}}};
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    graph.set_output("y", scatter_add(matmul(x[0], x[1]), x[2], x[3]).id());
  };
  size_t fused = 0, unfused = 0;
  std::string list, unfused_list;
  check_on_gpu(inputs, build, 1e-5, 31, {}, &fused, true, &list);
  EXPECT_EQ(lines_with(list, {"scatter_add %"}), 1u) << list;
  {
    const ScopedSwitch off("MEGANEURA_NO_FUSION", "1");
    check_on_gpu(inputs, build, 1e-5, 31, {}, &unfused, true, &unfused_list);
  }
  EXPECT_EQ(lines_with(unfused_list, {"scatter_add %"}), 2u) << unfused_list;
  EXPECT_LT(fused, unfused);
}

// The product over parameters alone would move to the setup (SessionOptions::setup) and the
// scatter run every time: written into the scatter's result, the product has another writer
// there and runs every time too, so that repeated runs add the rows once, not once per run.
TEST(GpuFusion, ScatterIntoItsTargetRepeatsItsTarget) {
  Graph graph;
  const Tensor w = parameter(graph, "w", {8, 4}, Init::uniform(-1.0, 1.0));
  const Tensor rows = input(graph, "rows", {3}, DType::i32);
  const Tensor updates = input(graph, "updates", {3, 4});
  graph.set_output("y", scatter_add(exp(w) * 0.5, rows, updates).id());
  std::mt19937_64 generator(37);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> weights(32), update_values(12);
  for (float& value : weights) value = uniform(generator);
  for (float& value : update_values) value = uniform(generator);
  const std::vector<int32_t> row_values{6, 1, 6};
  std::vector<double> expected(32);
  for (size_t i = 0; i < 32; ++i) expected[i] = std::exp(weights[i]) / 2;
  for (size_t p = 0; p < 3; ++p)
    for (size_t c = 0; c < 4; ++c) expected[row_values[p] * 4 + c] += update_values[p * 4 + c];
  SessionOptions options = testing::session_options();
  options.validation = true;
  Session session(graph, options);
  EXPECT_EQ(session.report().setup_dispatches, 0u);
  session.write("w", weights);
  session.set_input("rows", row_values);
  session.set_input("updates", update_values);
  for (int run = 0; run < 3; ++run) {
    session.run();
    const std::vector<float> y = session.output("y");
    ASSERT_EQ(y.size(), expected.size());
    for (size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], expected[i], 1e-5 * (1.0 + std::abs(expected[i])))
          << "run " << run << ", " << i;
  }
  EXPECT_EQ(session.validation_messages(), 0u);
}

}  // namespace
}  // namespace mg
