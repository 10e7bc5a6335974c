// The memory planner on the classifier programs (no device needed: planning is pure).
#include <gtest/gtest.h>

#include <algorithm>

#include <map>

#include "backends/vulkan/kernels/fusion.hpp"
#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/ops.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"
#include "ops/op.hpp"
#include "plan/program.hpp"

namespace mg {
namespace {

// A device of the default traits with switches set (docs/SWITCHES.md).
target::DeviceTraits with_switches(
    const std::map<std::string, std::string, std::less<>>& switches) {
  target::DeviceTraits device;
  device.switches = Switches::from_environment(switches);
  return device;
}

plan::Program plan_for(const Graph& graph, bool reuse = true,
                       const target::DeviceTraits& device = {}, bool scheduled = true) {
  plan::PlanOptions options;
  options.reuse_memory = reuse;
  options.schedule_epochs = scheduled;
  return plan::build_program(graph, vulkan::VulkanTarget(device), options);
}

double saving(const plan::Program& program) {
  return 1.0 - static_cast<double>(program.memory.physical_transient_bytes) /
                   static_cast<double>(program.memory.logical_transient_bytes);
}

TEST(Planner, TrainingReusesAtLeastFortyPercent) {
  const plan::Program program = plan_for(
      models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{}));
  EXPECT_GT(saving(program), 0.40) << plan::describe_memory(program);
}

// A deep MLP, where values are many and short-lived: the case the planner is for.
Graph deep_mlp(int64_t batch, int64_t layers, bool training) {
  Graph graph;
  Tensor x = input(graph, "x", {batch, 256});
  for (int64_t layer = 0; layer < layers; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer);
    const Tensor weight =
        parameter(graph, name + ".weight", {256, 256}, Init::uniform(-0.06, 0.06));
    const Tensor bias = parameter(graph, name + ".bias", {256}, Init::zeros());
    x = gelu(linear(x, weight, bias));
  }
  if (training) {
    const Tensor labels = input(graph, "labels", {batch}, DType::i32);
    add_training(graph, cross_entropy(x, labels).id(), OptimizerConfig{});
  } else {
    graph.set_output("logits", x.id());
  }
  return graph;
}

TEST(Planner, DeepMlpInferenceReusesAtLeastSeventyPercent) {
  const plan::Program program = plan_for(deep_mlp(64, 12, false));
  EXPECT_GT(saving(program), 0.70) << plan::describe_memory(program);
}

// Matmul epilogues keep the products before bias and activation, the shortest-lived values,
// out of memory altogether, which shrinks the logical bytes the ratio is taken of. The ratio is
// the planner's, measured on the program that stores them; in the lowering's order, fusing them
// must not cost bytes (in epochs, whatever runs side by side is live at once, fused or not).
TEST(Planner, DeepMlpTrainingReusesAtLeastFortyPercent) {
  const plan::Program stored_products = plan_for(
      deep_mlp(64, 12, true), true, with_switches({{"MEGANEURA_NO_EPILOGUE_FUSION", "1"}}), false);
  EXPECT_GT(saving(stored_products), 0.40) << plan::describe_memory(stored_products);
  const plan::Program fused = plan_for(deep_mlp(64, 12, true), true, {}, false);
  EXPECT_LE(fused.memory.physical_transient_bytes, stored_products.memory.physical_transient_bytes);
  EXPECT_LT(fused.launches.size(), stored_products.launches.size());
}

TEST(Planner, CnnInferenceReusesAtLeastSixtyPercent) {
  // Two conv layers bound the saving: the first conv's output is live with its pooled result.
  // Implicit-GEMM convolutions: the im2col rewrite below adds values of its own.
  plan::PlanOptions implicit;
  implicit.im2col = false;
  const Graph classifier = models::build_classifier(models::ClassifierConfig{}, 64);
  const plan::Program program =
      plan::build_program(classifier, vulkan::VulkanTarget(target::DeviceTraits{}), implicit);
  EXPECT_GT(saving(program), 0.60) << plan::describe_memory(program);
  // Each im2col's columns live only until their product: the second convolution's (64 x 144 x
  // 196 floats, 6.9 MiB) set the peak.
  const plan::Program columns = plan_for(classifier);
  EXPECT_GT(saving(columns), 0.50) << plan::describe_memory(columns);
  EXPECT_LT(columns.memory.physical_transient_bytes, uint64_t{9} << 20)
      << plan::describe_memory(columns);
}

// The column limit grows with the device's memory, from a quarter of an arena and 256 MiB up to
// half an arena and a 64th of the memory, and never drops below the former.
TEST(Planner, ColumnLimitFollowsDeviceMemory) {
  constexpr uint64_t MiB = uint64_t{1} << 20, GiB = uint64_t{1} << 30;
  EXPECT_EQ(plan::column_limit_for(128 * MiB, 0), 32 * MiB);
  EXPECT_EQ(plan::column_limit_for(4 * GiB, 0), 256 * MiB);
  EXPECT_EQ(plan::column_limit_for(4 * GiB, 8 * GiB), 256 * MiB);
  EXPECT_EQ(plan::column_limit_for(4 * GiB, 64 * GiB), 1 * GiB);
  EXPECT_EQ(plan::column_limit_for(4 * GiB, 140 * GiB), 2 * GiB);
  EXPECT_EQ(plan::column_limit_for(1 * GiB, 140 * GiB), 512 * MiB);
}

TEST(Planner, NoReuseMeansPhysicalEqualsLogicalUpToAlignment) {
  const plan::Program program =
      plan_for(models::build_classifier(models::ClassifierConfig{"mlp", 28, 10}, 16), false);
  EXPECT_GE(program.memory.physical_transient_bytes, program.memory.logical_transient_bytes);
}

size_t launches_of(const plan::Program& program, const std::string& op) {
  return static_cast<size_t>(std::count_if(
      program.launches.begin(), program.launches.end(),
      [&](const plan::PlannedLaunch& p) { return p.launch.label.starts_with(op + " "); }));
}

// Operands of one launch occupy disjoint bytes, or else a kernel would read what another of its
// invocations is overwriting.
void expect_operands_apart(const plan::Program& program) {
  for (const plan::PlannedLaunch& launch : program.launches) {
    for (size_t a = 0; a < launch.regions.size(); ++a) {
      for (size_t b = a + 1; b < launch.regions.size(); ++b) {
        const plan::Region& x = launch.regions[a];
        const plan::Region& y = launch.regions[b];
        if (launch.launch.operands[a].value == launch.launch.operands[b].value) continue;
        const bool overlap =
            x.arena == y.arena && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
        // The one legal overlap: a pointwise kernel writing a result in place over an input of
        // its shape (the last operand over a transient input, or a new parameter or optimizer
        // moment over the leaf it replaces).
        const bool exact_in_place =
            launch.launch.kernel == "pointwise" && launch.launch.operands[b].write &&
            !launch.launch.operands[a].write && x.offset == y.offset && x.bytes == y.bytes;
        EXPECT_TRUE(!overlap || exact_in_place)
            << launch.launch.label << " operands " << a << " and " << b;
      }
    }
  }
}

// The classifier's training program; and a diffusion U-Net's timestep features, whose sines'
// DAG (the angles written beside for the cosines' DAG) joins the cosines' kernel as its sibling:
// the angles then stay in registers, and no result is placed over a value the same launch writes.
TEST(Planner, ValuesWithOverlappingLifetimesNeverShareBytes) {
  expect_operands_apart(plan_for(
      models::build_classifier_training(models::ClassifierConfig{}, 8, OptimizerConfig{})));
  Graph graph;
  const Tensor timestep = input(graph, "timestep", {2});
  std::vector<double> frequencies(16);
  for (size_t i = 0; i < frequencies.size(); ++i)
    frequencies[i] = std::exp(-0.5 * static_cast<double>(i));
  const Tensor frequency(&graph, graph.constant(frequencies, {DType::f32, {1, 16}}));
  const Tensor angles = reshape(timestep, {2, 1}) * frequency;
  const Tensor sines = sin(angles), cosines = cos(angles);
  const Tensor weight = parameter(graph, "linear.weight", {8, 32}, Init::uniform(-0.1, 0.1));
  graph.set_output("y", silu(linear(concat({cosines, sines}, 1), weight)).id());
  const plan::Program program = plan_for(graph);
  EXPECT_EQ(launches_of(program, "fused"), 1u) << plan::describe_dispatches(program);
  expect_operands_apart(program);
}

// Attention with its gradients: the forward launch writes the log-sum-exp the backward reads,
// so attention_lse has no launch of its own (unless fusion is off), and every launch that reads
// it comes after the forward's.
Graph attention_training(bool causal, bool lse_differs, int64_t length = 24) {
  Graph graph;
  const Tensor q = input(graph, "q", {1, 2, length, 16});
  const Tensor k = input(graph, "k", {1, 2, length, 16});
  const Tensor v = input(graph, "v", {1, 2, length, 16});
  const Tensor seed = input(graph, "seed", {1, 2, length, 16});
  const Tensor y = scaled_dot_product_attention(q, k, v, {.causal = causal});
  graph.set_output("y", y.id());
  for (const auto& [leaf, grad] : gradients(graph, y.id(), {q.id(), k.id(), v.id()}, seed.id()))
    graph.set_output("grad" + std::to_string(leaf), grad);
  if (lse_differs) {
    // A log-sum-exp under another scale: the forward cannot provide it.
    const Attrs attrs{{"causal", int64_t{causal}}, {"scale", 0.5}, {"has_mask", int64_t{0}}};
    graph.set_output("other_lse", graph.add("attention_lse", {q.id(), k.id()}, attrs));
  }
  return graph;
}

TEST(Planner, AttentionForwardWritesTheBackwardsLogSumExp) {
  for (const bool causal : {false, true}) {
    const plan::Program program = plan_for(attention_training(causal, false));
    EXPECT_EQ(launches_of(program, "attention_lse"), 0u);
    int64_t forward_index = -1;
    ValueId lse = kNoValue;
    for (size_t t = 0; t < program.launches.size(); ++t) {
      const target::Launch& launch = program.launches[t].launch;
      if (!launch.label.starts_with("scaled_dot_product_attention ")) continue;
      forward_index = static_cast<int64_t>(t);
      ASSERT_EQ(launch.operands.back().name, "lse");
      EXPECT_TRUE(launch.operands.back().write);
      lse = launch.operands.back().value;
      EXPECT_EQ(program.graph.node(lse).op, "attention_lse");
      EXPECT_TRUE(launch.label.ends_with(" + attention_lse %" + std::to_string(lse)))
          << launch.label;
    }
    ASSERT_GE(forward_index, 0);
    size_t readers = 0;
    for (size_t t = 0; t < program.launches.size(); ++t) {
      for (const target::Operand& operand : program.launches[t].launch.operands) {
        if (operand.value != lse || operand.write) continue;
        ++readers;
        EXPECT_GT(static_cast<int64_t>(t), forward_index) << program.launches[t].launch.label;
      }
    }
    // dK with dV (and, without causal masking, W for dQ's matmul), and the causal dQ kernel.
    EXPECT_EQ(readers, causal ? 2u : 1u);
  }
}

TEST(Planner, AttentionLogSumExpKeepsItsLaunchWhereTheForwardCannotWriteIt) {
  const plan::Program mismatched = plan_for(attention_training(false, true));
  EXPECT_EQ(launches_of(mismatched, "attention_lse"), 1u);  // the other scale's
  const plan::Program unfused = plan_for(attention_training(false, false), true,
                                         with_switches({{"MEGANEURA_NO_FUSION", "1"}}));
  EXPECT_EQ(launches_of(unfused, "attention_lse"), 1u);
}

// Attention over slices: the forward's and dQ's launches cover two key slices in grid z, the
// fused dK / dV launch two query slices (its companion split alike); the attention_combine after
// the forward writes the backward's log-sum-exp, and sums join the gradients' partials. (dQ as
// the dQ kernel: MEGANEURA_ATTENTION_DQ_GEMM=0.)
TEST(Planner, AttentionOverSlices) {
  const plan::Program program = plan_for(
      attention_training(false, false, 100), true,
      with_switches({{"MEGANEURA_ATTENTION_SPLITS", "2"}, {"MEGANEURA_ATTENTION_DQ_GEMM", "0"}}));
  EXPECT_EQ(launches_of(program, "attention_lse"), 0u);
  EXPECT_EQ(launches_of(program, "attention_grad_v"), 0u);
  ASSERT_EQ(launches_of(program, "attention_combine"), 1u);
  EXPECT_EQ(launches_of(program, "sum"), 3u);  // dQ, dK, dV
  for (const plan::PlannedLaunch& planned : program.launches) {
    const target::Launch& launch = planned.launch;
    SCOPED_TRACE(launch.label);
    if (launch.label.starts_with("scaled_dot_product_attention ") ||
        launch.label.starts_with("attention_grad_q ")) {
      EXPECT_EQ(launch.groups[2], 2u);
    }
    if (launch.label.starts_with("attention_grad_k ")) {
      EXPECT_EQ(launch.groups[2], 2u);
      ASSERT_EQ(launch.operands.back().name, "result_v");
      EXPECT_EQ(program.graph.node(launch.operands.back().value).attrs.get_int("q_splits"), 2);
    }
    if (launch.label.starts_with("attention_combine ")) {
      ASSERT_EQ(launch.operands.back().name, "lse");
      EXPECT_EQ(program.graph.node(launch.operands.back().value).op, "attention_lse");
    }
  }
}

// dK's launch writes dV too, on CPU and GPU devices alike, unless MEGANEURA_ATTENTION_FUSED_KV=0.
TEST(Planner, AttentionGradKWritesGradV) {
  target::DeviceTraits cpu;
  cpu.cpu = true;
  for (const target::DeviceTraits& device : {cpu, target::DeviceTraits{}}) {
    SCOPED_TRACE(device.cpu ? "cpu device" : "gpu device");
    const plan::Program fused = plan::build_program(
        attention_training(false, false), vulkan::VulkanTarget(device), plan::PlanOptions{});
    EXPECT_EQ(launches_of(fused, "attention_grad_v"), 0u);
    ASSERT_EQ(launches_of(fused, "attention_grad_k"), 1u);
    for (const plan::PlannedLaunch& planned : fused.launches) {
      if (!planned.launch.label.starts_with("attention_grad_k ")) continue;
      const auto& operands = planned.launch.operands;
      const auto result_v = std::find_if(operands.begin(), operands.end(),
                                         [](const auto& o) { return o.name == "result_v"; });
      ASSERT_NE(result_v, operands.end());
      EXPECT_TRUE(result_v->write);
      EXPECT_EQ(fused.graph.node(result_v->value).op, "attention_grad_v");
    }
  }
  target::DeviceTraits separate = cpu;
  separate.switches = Switches::from_environment({{"MEGANEURA_ATTENTION_FUSED_KV", "0"}});
  const plan::Program split = plan::build_program(
      attention_training(false, false), vulkan::VulkanTarget(separate), plan::PlanOptions{});
  EXPECT_EQ(launches_of(split, "attention_grad_v"), 1u);
}

// The strict attention kernels' blocks (docs/KERNELS.md, Attention) on an H200-sized device, each
// node whole (the lowering alone, before the passes that split attention): where 64-row owned
// blocks would leave three quarters of the compute units idle, the owned rows are 32, and where the
// stream is at most 256 rows as well, the streamed rows are 16 (SmolLM2-135M's attention at
// sequence 128: 9 query heads over 3 key/value heads; 1,024 queries over 128 keys, whose forward
// streams the short side); a long stream keeps 32-row streamed blocks (that case's dK and dV), and
// enough owned blocks (Whisper-tiny's encoder) keep the largest blocks that fit: 64 x 32 for the
// forward, 32 x 32 for dK with dV.
TEST(Planner, StrictAttentionBlocksFollowTheIdleUnitsAndTheStream) {
  target::DeviceTraits device;
  device.compute_units = 132;
  device.max_shared_memory_bytes = 49152;
  device.max_workgroup_invocations = 1024;
  struct Case {
    int64_t heads, kv_heads, q_len, kv_len;
    int64_t forward_owned, forward_streamed, kv_owned, kv_streamed;
  };
  for (const Case& c : {Case{9, 3, 128, 128, 32, 16, 32, 16}, Case{2, 2, 1024, 128, 32, 16, 32, 32},
                        Case{6, 6, 1500, 1500, 64, 32, 32, 32}}) {
    SCOPED_TRACE(std::to_string(c.heads) + " heads over " + std::to_string(c.kv_heads) + ", " +
                 std::to_string(c.q_len) + " queries, " + std::to_string(c.kv_len) + " keys");
    Graph graph;
    const Tensor q = input(graph, "q", {1, c.heads, c.q_len, 64});
    const Tensor k = input(graph, "k", {1, c.kv_heads, c.kv_len, 64});
    const Tensor v = input(graph, "v", {1, c.kv_heads, c.kv_len, 64});
    const Tensor seed = input(graph, "seed", {1, c.heads, c.q_len, 64});
    const Tensor y = scaled_dot_product_attention(q, k, v);
    graph.set_output("y", y.id());
    for (const auto& [leaf, grad] : gradients(graph, y.id(), {q.id(), k.id(), v.id()}, seed.id()))
      graph.set_output("grad" + std::to_string(leaf), grad);
    const std::vector<kernels::Launch> launches = kernels::lower_graph(graph, device);
    const auto blocks = [&](const std::string& op) {
      std::pair<std::string, std::string> found;
      for (const kernels::Launch& launch : launches) {
        if (!launch.label.starts_with(op + " ")) continue;
        for (const auto& [name, value] : launch.defines) {
          if (name == "BO") found.first = value;
          if (name == "BS") found.second = value;
        }
      }
      return found;
    };
    const auto expected = [](int64_t owned, int64_t streamed) {
      return std::pair{std::to_string(owned) + "u", std::to_string(streamed) + "u"};
    };
    EXPECT_EQ(blocks("scaled_dot_product_attention"),
              expected(c.forward_owned, c.forward_streamed));
    EXPECT_EQ(blocks("attention_grad_k"), expected(c.kv_owned, c.kv_streamed));
  }
}

// The Winograd weight gradients (forced on) of two convolutions over the same tile grid: each
// pair of tile transforms runs in one launch, the grad_out tiles written beside the input tiles
// that their own product multiplies them with, never another layer's.
TEST(Planner, WinogradTilesShareALaunchWithTheirOwnPartner) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 4, 8, 8});
  const Tensor w1 = input(graph, "w1", {4, 4, 3, 3});
  const Tensor w2 = input(graph, "w2", {4, 4, 3, 3});
  const Tensor hidden = relu(conv2d(x, w1, std::nullopt, {.padding = {1, 1}}));
  const Tensor y = conv2d(hidden, w2, std::nullopt, {.padding = {1, 1}});
  const std::map<ValueId, ValueId> grads =
      gradients(graph, sum_all(y * y).id(), {w1.id(), w2.id()});
  graph.set_output("dw1", grads.at(w1.id()));
  graph.set_output("dw2", grads.at(w2.id()));
  plan::PlanOptions options;
  options.im2col = true;
  const plan::Program program = plan::build_program(
      graph, vulkan::VulkanTarget(with_switches({{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1"}})),
      options);
  EXPECT_EQ(launches_of(program, "winograd_grad_tiles"), 0u);
  size_t pairs = 0;
  for (const plan::PlannedLaunch& planned : program.launches) {
    if (!planned.launch.label.starts_with("winograd_tiles ")) continue;
    ValueId tiles = kNoValue, grad_tiles = kNoValue;
    for (const target::Operand& operand : planned.launch.operands) {
      if (operand.name == "tiles") tiles = operand.value;
      if (operand.name == "grad_tiles") grad_tiles = operand.value;
    }
    ASSERT_NE(grad_tiles, kNoValue) << planned.launch.label;
    const std::vector<Node>& nodes = program.graph.nodes();
    EXPECT_TRUE(std::any_of(nodes.begin(), nodes.end(), [&](const Node& node) {
      return node.op == "matmul" && node.inputs == std::vector<ValueId>{grad_tiles, tiles};
    })) << planned.launch.label;
    ++pairs;
  }
  EXPECT_EQ(pairs, 2u);
}

// Inference on parameters: the launches that read only fixed values (Winograd's transform of
// the convolution's weights, forced on, and a pointwise op on another parameter) move to the
// setup, their results to a persistent arena, where no launch of every run writes them; the
// rest stays. In training, where the parameters are assigned, nothing moves; nor with the
// setup off, which runs the same launches every time.
TEST(Planner, LaunchesOverFixedValuesMoveToTheSetup) {
  const target::DeviceTraits winograd = with_switches({{"MEGANEURA_WINOGRAD_CONV", "1"}});
  const auto build = [](bool training) {
    Graph graph;
    const Tensor x = input(graph, "x", {2, 4, 8, 8});
    const Tensor w = parameter(graph, "w", {4, 4, 3, 3}, Init::uniform(-0.5, 0.5));
    const Tensor scale = parameter(graph, "scale", {4, 1, 1}, Init::uniform(0.5, 1.5));
    const Tensor y = conv2d(x, w, std::nullopt, {.padding = {1, 1}}) * exp(scale);
    graph.set_output("y", y.id());
    if (training) add_training(graph, sum_all(y * y).id(), OptimizerConfig{});
    return graph;
  };
  plan::PlanOptions options;
  options.im2col = true;
  const plan::Program program =
      plan::build_program(build(false), vulkan::VulkanTarget(winograd), options);
  std::vector<std::string> setup_ops;
  for (const plan::PlannedLaunch& planned : program.setup) {
    setup_ops.push_back(planned.launch.label.substr(0, planned.launch.label.find(' ')));
    for (size_t k = 0; k < planned.launch.operands.size(); ++k) {
      if (planned.launch.operands[k].write) {
        EXPECT_EQ(program.arenas[planned.regions[k].arena].kind, plan::ArenaKind::persistent)
            << planned.launch.label;
      }
    }
  }
  std::sort(setup_ops.begin(), setup_ops.end());
  EXPECT_EQ(setup_ops, (std::vector<std::string>{"exp", "winograd_filter"}));
  EXPECT_EQ(program.setup_results.size(), 2u);
  for (const plan::PlannedLaunch& planned : program.launches) {
    for (const target::Operand& operand : planned.launch.operands) {
      if (!operand.write) continue;
      EXPECT_EQ(
          std::count(program.setup_results.begin(), program.setup_results.end(), operand.value), 0)
          << planned.launch.label << " writes a setup result";
    }
  }

  plan::PlanOptions every_run = options;
  every_run.setup = false;
  const plan::Program without =
      plan::build_program(build(false), vulkan::VulkanTarget(winograd), every_run);
  EXPECT_TRUE(without.setup.empty());
  EXPECT_EQ(without.launches.size(), program.launches.size() + program.setup.size());
  const plan::Program training =
      plan::build_program(build(true), vulkan::VulkanTarget(winograd), options);
  EXPECT_TRUE(training.setup.empty());
}

// dQ as a matmul (passes/attention_grad_q_gemm.cpp): without causal masking the dK launch also
// writes W (attention_grad_scores), which a later matmul launch reads; there is no dQ kernel.
// Causal attention, the option off, or W past a quarter of the arena keep the dQ kernel.
TEST(Planner, AttentionGradQAsMatmul) {
  const auto dq_launches = [](const Graph& graph, bool option, uint64_t arena_limit) {
    plan::PlanOptions options;
    options.attention_dq_gemm = option;
    options.arena_limit = arena_limit;
    return launches_of(
        plan::build_program(graph, vulkan::VulkanTarget(target::DeviceTraits{}), options),
        "attention_grad_q");
  };
  const Graph plain = attention_training(false, false, 40);
  const plan::Program program =
      plan::build_program(plain, vulkan::VulkanTarget(target::DeviceTraits{}), plan::PlanOptions{});
  EXPECT_EQ(launches_of(program, "attention_grad_q"), 0u);
  EXPECT_EQ(launches_of(program, "attention_grad_scores"), 0u);
  int64_t writer = -1, reader = -1;
  for (size_t t = 0; t < program.launches.size(); ++t) {
    const target::Launch& launch = program.launches[t].launch;
    for (const target::Operand& operand : launch.operands) {
      if (program.graph.node(operand.value).op != "attention_grad_scores") continue;
      if (operand.write) {
        EXPECT_TRUE(launch.label.starts_with("attention_grad_k ")) << launch.label;
        EXPECT_NE(launch.label.find(" + attention_grad_scores %"), std::string::npos);
        writer = static_cast<int64_t>(t);
      } else {
        EXPECT_EQ(launch.kernel, "gemm") << launch.label;
        reader = static_cast<int64_t>(t);
      }
    }
  }
  EXPECT_GE(writer, 0);
  EXPECT_GT(reader, writer);
  EXPECT_EQ(dq_launches(attention_training(true, false, 40), true, 128ull << 20), 1u);
  EXPECT_EQ(dq_launches(plain, false, 128ull << 20), 1u);
  // W is 2 x 40 x 40 floats (12.5 KiB): over a quarter of a 48 KiB arena.
  EXPECT_EQ(dq_launches(plain, true, 48ull << 10), 1u);
  EXPECT_EQ(dq_launches(plain, true, 64ull << 10), 0u);
}

// Whether two launches touch overlapping bytes with one of them writing them.
bool conflict(const plan::PlannedLaunch& a, const plan::PlannedLaunch& b) {
  for (size_t i = 0; i < a.regions.size(); ++i) {
    for (size_t j = 0; j < b.regions.size(); ++j) {
      const plan::Region& x = a.regions[i];
      const plan::Region& y = b.regions[j];
      const bool overlap =
          x.arena == y.arena && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      if (overlap && (a.launch.operands[i].write || b.launch.operands[j].write)) return true;
    }
  }
  return false;
}

// The value whose bytes `value` reads: views share their source's.
ValueId view_root(const Graph& graph, ValueId value) {
  while (is_view_op(graph.node(value).op)) value = graph.node(value).inputs[0];
  return value;
}

// Runs `program`'s schedule on a model of its memory: every 4-byte word of every arena holds
// the value last written there. Launches of one epoch run at once, so each reads the words as
// they were when the epoch began and their writes land when it ends. Every read must find the
// value it reads (a view its source, an in-place result's input the input), and at the end every
// output and update must be where the program says. A missing barrier or a value placed over
// one still to be read fails here.
void expect_schedule_computes_every_value(const plan::Program& program) {
  const Graph& graph = program.graph;
  std::vector<std::vector<int64_t>> words(program.arenas.size());
  for (size_t a = 0; a < program.arenas.size(); ++a)
    words[a].assign(program.arenas[a].bytes / 4 + 1, -1);
  const auto put = [&](const plan::Region& region, ValueId value) {
    for (uint64_t w = region.offset / 4; w < (region.offset + region.bytes + 3) / 4; ++w)
      words[region.arena][w] = value;
  };
  const auto holds = [&](const plan::Region& region, ValueId value) {
    for (uint64_t w = region.offset / 4; w < (region.offset + region.bytes + 3) / 4; ++w)
      if (words[region.arena][w] != static_cast<int64_t>(value)) return false;
    return true;
  };
  for (ValueId value : program.persistent) put(program.regions.at(value), value);
  for (ValueId value : program.inputs) put(program.regions.at(value), value);
  size_t begin = 0;
  while (begin < program.launches.size()) {
    size_t end = begin + 1;
    while (end < program.launches.size() && !program.launches[end].barrier_before) ++end;
    for (size_t t = begin; t < end; ++t) {
      const plan::PlannedLaunch& planned = program.launches[t];
      for (size_t k = 0; k < planned.regions.size(); ++k) {
        const target::Operand& operand = planned.launch.operands[k];
        if (!operand.write) {
          EXPECT_TRUE(holds(planned.regions[k], view_root(graph, operand.value)))
              << planned.launch.label << " reads %" << operand.value << " overwritten or unwritten";
        }
      }
    }
    for (size_t t = begin; t < end; ++t) {
      const plan::PlannedLaunch& planned = program.launches[t];
      for (size_t k = 0; k < planned.regions.size(); ++k)
        if (planned.launch.operands[k].write)
          put(planned.regions[k], view_root(graph, planned.launch.operands[k].value));
    }
    begin = end;
  }
  for (const auto& [name, id] : graph.outputs())
    EXPECT_TRUE(holds(program.regions.at(id), view_root(graph, id))) << "output " << name;
  for (const auto& [leaf, value] : graph.updates())
    EXPECT_TRUE(holds(program.regions.at(value), view_root(graph, value))) << "update %" << value;
}

// The scheduler orders the launches into epochs that barriers separate and places the transients
// by those epochs: the same launches run, no two launches of one epoch touch the same bytes with
// one writing, and the schedule computes every value (above); with fusion and without. Without
// fusion it needs fewer barriers than the lowering's order (Adam's dozen elementwise ops of each
// parameter, one parameter after another in the lowering, run side by side). The values of
// launches that run side by side are live at once (both convolutions' columns of the CNN's
// backward): at most half as much transient memory again as in the lowering's order here.
TEST(Planner, ScheduledEpochsSeparateEveryConflict) {
  for (const bool fusion : {true, false}) {
    SCOPED_TRACE(fusion ? "fusion" : "no fusion");
    const target::DeviceTraits device =
        with_switches({{"MEGANEURA_NO_FUSION", fusion ? "0" : "1"}});
    for (const Graph& graph :
         {models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{}),
          deep_mlp(16, 6, true)}) {
      plan::PlanOptions in_order_options;
      in_order_options.schedule_epochs = false;
      const plan::Program in_order =
          plan::build_program(graph, vulkan::VulkanTarget(device), in_order_options);
      const plan::Program scheduled =
          plan::build_program(graph, vulkan::VulkanTarget(device), plan::PlanOptions{});
      ASSERT_EQ(scheduled.launches.size(), in_order.launches.size());
      EXPECT_LE(static_cast<double>(scheduled.memory.physical_transient_bytes),
                1.5 * static_cast<double>(in_order.memory.physical_transient_bytes));
      std::map<std::string, size_t> lowering_index;
      for (size_t t = 0; t < in_order.launches.size(); ++t)
        lowering_index[in_order.launches[t].launch.label] = t;
      ASSERT_EQ(lowering_index.size(), in_order.launches.size()) << "labels name launches";
      std::vector<size_t> epoch(scheduled.launches.size(), 0);
      for (size_t t = 1; t < scheduled.launches.size(); ++t)
        epoch[t] = epoch[t - 1] + (scheduled.launches[t].barrier_before ? 1 : 0);
      EXPECT_EQ(epoch.back(), scheduled.memory.barriers);
      for (size_t a = 0; a < scheduled.launches.size(); ++a) {
        const plan::PlannedLaunch& first = scheduled.launches[a];
        ASSERT_TRUE(lowering_index.count(first.launch.label)) << first.launch.label;
        for (size_t b = a + 1; b < scheduled.launches.size(); ++b) {
          const plan::PlannedLaunch& second = scheduled.launches[b];
          if (!conflict(first, second)) continue;
          EXPECT_LT(epoch[a], epoch[b]) << first.launch.label << " / " << second.launch.label;
        }
      }
      expect_schedule_computes_every_value(scheduled);
      expect_schedule_computes_every_value(in_order);
      if (fusion)
        EXPECT_LE(scheduled.memory.barriers, in_order.memory.barriers);
      else
        EXPECT_LT(scheduled.memory.barriers, in_order.memory.barriers);
    }
  }
  const Graph training =
      models::build_classifier_training(models::ClassifierConfig{}, 64, OptimizerConfig{});
  const plan::Program cnn = plan::build_program(
      training, vulkan::VulkanTarget(target::DeviceTraits{}), plan::PlanOptions{});
  ASSERT_EQ(training.updates().size(), 3u * 8u) << "8 parameters, each with two moments";
  // Each parameter's update is one pointwise launch that writes the parameter and both moments
  // over themselves (no copies after the run); it runs as soon as its gradient is ready, in an
  // epoch the backward pass has anyway.
  size_t update_launches = 0, update_barriers = 0;
  for (const plan::PlannedLaunch& planned : cnn.launches) {
    std::vector<size_t> written;
    for (size_t k = 0; k < planned.launch.operands.size(); ++k)
      if (planned.launch.operands[k].write) written.push_back(k);
    if (written.size() != 3) continue;
    ++update_launches;
    EXPECT_EQ(planned.launch.kernel, "pointwise") << planned.launch.label;
    for (size_t k : written) {
      const ValueId value = planned.launch.operands[k].value;
      const auto update =
          std::find_if(cnn.graph.updates().begin(), cnn.graph.updates().end(),
                       [&](const auto& assignment) { return assignment.second == value; });
      ASSERT_NE(update, cnn.graph.updates().end()) << planned.launch.label;
      const plan::Region& leaf = cnn.regions.at(update->first);
      EXPECT_TRUE(leaf.arena == planned.regions[k].arena &&
                  leaf.offset == planned.regions[k].offset)
          << planned.launch.label << " writes " << cnn.graph.node(update->first).name
          << " in place";
    }
    update_barriers += planned.barrier_before ? 1 : 0;
  }
  EXPECT_EQ(update_launches, 8u);
  EXPECT_LE(update_barriers, 1u);
}

// A chain of products long enough that its nodes are lowered on several threads, with attention
// at two places along it (four dimensions: [1, 1, 64, 64]).
Graph long_product_chain(int64_t products, const std::vector<int64_t>& attention_after) {
  Graph graph;
  Tensor x = input(graph, "x", {1, 1, 64, 64});
  for (int64_t i = 0; i < products; ++i) {
    x = relu(
        matmul(x, parameter(graph, "w" + std::to_string(i), {64, 64}, Init::normal(0.0, 0.125))));
    if (std::find(attention_after.begin(), attention_after.end(), i) != attention_after.end())
      x = scaled_dot_product_attention(x, x, x);
  }
  graph.set_output("y", x.id());
  return graph;
}

TEST(Planner, NodesLoweredSideBySideKeepTheGraphsOrderAndItsFirstError) {
  const Graph graph = long_product_chain(300, {100, 200});
  const plan::Program program = plan_for(graph, true, {}, false);
  // In the lowering's order every launch's first value follows the one before.
  ValueId previous = kNoValue;
  size_t attentions = 0;
  for (const plan::PlannedLaunch& planned : program.launches) {
    const std::string& label = planned.launch.label;
    const size_t mark = label.find('%');
    ASSERT_NE(mark, std::string::npos) << label;
    const ValueId first = static_cast<ValueId>(std::stoi(label.substr(mark + 1)));
    EXPECT_GT(first, previous) << label;
    previous = first;
    if (label.starts_with("scaled_dot_product_attention")) ++attentions;
  }
  EXPECT_EQ(attentions, 2u);
  EXPECT_EQ(plan::describe_dispatches(plan_for(graph, true, {}, false)),
            plan::describe_dispatches(program));

  // Subgroups of two lanes leave both attentions without a kernel: the error names the first.
  target::DeviceTraits narrow;
  narrow.subgroup_size = 2;
  ValueId first_attention = kNoValue;
  for (size_t i = 0; i < program.graph.size() && first_attention == kNoValue; ++i) {
    if (program.graph.nodes()[i].op == "scaled_dot_product_attention")
      first_attention = static_cast<ValueId>(i);
  }
  ASSERT_NE(first_attention, kNoValue);
  try {
    plan_for(graph, true, narrow, false);
    ADD_FAILURE() << "lowering for subgroups of two lanes succeeded";
  } catch (const Error& error) {
    EXPECT_TRUE(
        std::string(error.what())
            .starts_with("scaled_dot_product_attention %" + std::to_string(first_attention) + ":"))
        << error.what();
  }
}

TEST(Planner, ArenasRespectTheBufferLimit) {
  plan::PlanOptions options;
  options.arena_limit = 1 << 20;
  const plan::Program program = plan::build_program(
      models::build_classifier_training(models::ClassifierConfig{}, 4, OptimizerConfig{}),
      vulkan::VulkanTarget(target::DeviceTraits{}), options);
  EXPECT_GT(program.arenas.size(), 2u);
  for (const plan::Arena& arena : program.arenas) EXPECT_LE(arena.bytes, options.arena_limit);
}

// A leaf layout (PlanOptions::leaf_layout, made before planning so that a session allocates the
// leaves' memory while it plans) puts every parameter and state leaf of the classifier's
// training program, Adam's moments included, where it says: its arenas come first, at the
// layout's sizes, under the arena limit, holding nothing else; the constants follow in arenas of
// their own; and the rest of the program is the one planned without the layout (the same
// dispatches, the same transient memory).
TEST(Planner, LeafLayoutPlacesTheLeavesBeforePlanning) {
  OptimizerConfig adam;
  adam.kind = OptimizerConfig::Kind::adam;
  const Graph graph = models::build_classifier_training(models::ClassifierConfig{}, 4, adam);
  plan::PlanOptions options;
  options.arena_limit = 1 << 20;
  const plan::Program without = plan::build_program(graph, vulkan::VulkanTarget({}), options);
  const plan::LeafLayout layout = plan::layout_leaves(graph, options);
  options.leaf_layout = &layout;
  const plan::Program program = plan::build_program(graph, vulkan::VulkanTarget({}), options);

  size_t leaves = 0;
  for (const Node& node : graph.nodes()) leaves += node.op == "parameter" || node.op == "state";
  EXPECT_EQ(layout.regions.size(), leaves);
  EXPECT_GT(layout.arena_bytes.size(), 1u);
  ASSERT_GE(program.arenas.size(), layout.arena_bytes.size());
  for (size_t a = 0; a < layout.arena_bytes.size(); ++a) {
    EXPECT_EQ(program.arenas[a].kind, plan::ArenaKind::persistent);
    EXPECT_EQ(program.arenas[a].bytes, layout.arena_bytes[a]);
    EXPECT_LE(program.arenas[a].bytes, options.arena_limit);
  }
  size_t placed = 0, constants = 0;
  for (ValueId value : program.persistent) {
    const Node& node = program.graph.node(value);
    const plan::Region& region = program.regions.at(value);
    if (node.op == "parameter" || node.op == "state") {
      ++placed;
      const plan::Region& wanted = layout.regions.at(node.name);
      EXPECT_EQ(region.arena, wanted.arena) << node.name;
      EXPECT_EQ(region.offset, wanted.offset) << node.name;
      EXPECT_EQ(region.bytes, wanted.bytes) << node.name;
    } else {
      ++constants;
      EXPECT_GE(region.arena, layout.arena_bytes.size()) << node.op;
    }
  }
  EXPECT_GT(placed, 0u);
  EXPECT_GT(constants, 0u);
  EXPECT_EQ(plan::describe_dispatches(program), plan::describe_dispatches(without));
  EXPECT_EQ(program.memory.physical_transient_bytes, without.memory.physical_transient_bytes);
  EXPECT_EQ(program.memory.persistent_bytes, without.memory.persistent_bytes);
}

// The gemm.comp launches of `program` that read A as 4 rows at one k (its A_QUADS define).
size_t quad_a_launches(const plan::Program& program) {
  return static_cast<size_t>(std::count_if(
      program.launches.begin(), program.launches.end(), [](const plan::PlannedLaunch& p) {
        const auto& defines = vulkan::glsl_launch(p.launch).defines;
        return p.launch.kernel == "gemm" &&
               std::find(defines.begin(), defines.end(),
                         std::pair<std::string, std::string>{"A_QUADS", "1"}) != defines.end();
      }));
}

// `graph` with the gradients of `y` (seeded by a leaf of y's shape) for `leaves` as outputs.
void add_gradients(Graph& graph, Tensor y, const std::vector<Tensor>& leaves) {
  graph.set_output("y", y.id());
  const Tensor seed = input(graph, "seed", y.shape());
  std::vector<ValueId> ids;
  for (const Tensor& leaf : leaves) ids.push_back(leaf.id());
  for (const auto& [leaf, grad] : gradients(graph, y.id(), ids, seed.id()))
    graph.set_output("grad" + std::to_string(leaf), grad);
}

// Built for an H200-like device, the products of `meganeura bench kernels` keep the A loads they
// were measured with, except the 4096^3 product, which reads A as 4 rows at one k (gemm.comp's
// A_QUADS, faster there: run 43 in git's history of docs/BENCHMARKS.md): SmolLM's layers,
// ResNet-50's convolutions and U-Net's block with their gradients, and Whisper's attention training
// step.
TEST(Planner, OnlyTheLargeSquareProductReadsAAsRowQuads) {
  target::DeviceTraits h200;
  h200.compute_units = 132;
  h200.max_shared_memory_bytes = 49152;
  h200.max_workgroup_invocations = 1024;
  const auto quads = [&](const Graph& graph) {
    return quad_a_launches(
        plan::build_program(graph, vulkan::VulkanTarget(h200), plan::PlanOptions{}));
  };
  {
    Graph graph;
    graph.set_output("y",
                     matmul(input(graph, "a", {4096, 4096}), input(graph, "b", {4096, 4096})).id());
    EXPECT_EQ(quads(graph), 1u);
  }
  for (const auto& [inputs, outputs] : std::vector<std::pair<int64_t, int64_t>>{
           {576, 576}, {576, 1536}, {1536, 576}, {576, 49152}}) {
    SCOPED_TRACE("smollm " + std::to_string(inputs) + " -> " + std::to_string(outputs));
    Graph graph;
    const Tensor x = input(graph, "x", {128, inputs}), w = input(graph, "w", {outputs, inputs});
    add_gradients(graph, matmul(x, w, false, true), {x, w});
    EXPECT_EQ(quads(graph), 0u);
  }
  struct Conv {
    int64_t channels, outputs, side, kernel, stride;
  };
  for (const Conv& c :
       {Conv{3, 64, 224, 7, 2}, Conv{64, 64, 56, 3, 1}, Conv{256, 64, 56, 1, 1},
        Conv{512, 128, 28, 1, 1}, Conv{128, 128, 56, 3, 2}, Conv{128, 128, 28, 3, 1},
        Conv{256, 256, 14, 3, 1}, Conv{512, 512, 7, 3, 1}}) {
    SCOPED_TRACE("resnet " + std::to_string(c.channels) + " -> " + std::to_string(c.outputs) +
                 " at " + std::to_string(c.side));
    Graph graph;
    const Tensor x = input(graph, "x", {4, c.channels, c.side, c.side});
    const Tensor w = input(graph, "w", {c.outputs, c.channels, c.kernel, c.kernel});
    Conv2dOptions options;
    options.stride = {c.stride, c.stride};
    options.padding = {c.kernel / 2, c.kernel / 2};
    add_gradients(graph, conv2d(x, w, std::nullopt, options), {x, w});
    EXPECT_EQ(quads(graph), 0u);
  }
  for (const int64_t side : {32, 64}) {
    SCOPED_TRACE("unet at " + std::to_string(side));
    Graph graph;
    const Tensor x = input(graph, "x", {2, 320, side, side});
    const Tensor gamma = input(graph, "gamma", {320}), beta = input(graph, "beta", {320});
    const Tensor w = input(graph, "w", {320, 320, 3, 3}), bias = input(graph, "bias", {320});
    Conv2dOptions options;
    options.padding = {1, 1};
    add_gradients(graph, conv2d(silu(group_norm(x, 32, gamma, beta)), w, bias, options), {x, w});
    EXPECT_EQ(quads(graph), 0u);
  }
  Graph attention;
  const Shape heads{1, 6, 1500, 64};
  const Tensor q = input(attention, "q", heads), k = input(attention, "k", heads),
               v = input(attention, "v", heads);
  add_gradients(attention, scaled_dot_product_attention(q, k, v), {q, k, v});
  EXPECT_EQ(quads(attention), 0u);
}

// A list run in part keeps a barrier between two of its chosen launches exactly where the whole
// list had one between them (on either launch or on one left out), none before the first chosen
// one: six launches in three epochs of two, {0, 1} {2, 3} {4, 5}, worked out by hand.
TEST(Planner, PartOfAListKeepsTheBarriersBetweenItsLaunches) {
  std::vector<plan::PlannedLaunch> launches(6);
  for (size_t i : {2, 4}) launches[i].barrier_before = true;
  const auto part = [&](std::initializer_list<size_t> chosen) {
    std::vector<bool> mask(launches.size(), false);
    for (size_t i : chosen) mask[i] = true;
    return plan::barriers_of_part(launches, mask);
  };
  using Flags = std::vector<bool>;
  EXPECT_EQ(part({0, 1}), Flags({false, false, false, false, false, false}));
  EXPECT_EQ(part({1, 3}), Flags({false, false, false, true, false, false}));
  EXPECT_EQ(part({2, 3}), Flags({false, false, false, false, false, false}));
  EXPECT_EQ(part({0, 5}), Flags({false, false, false, false, false, true}));
  EXPECT_EQ(part({3, 4, 5}), Flags({false, false, false, false, true, false}));
  EXPECT_EQ(part({0, 1, 2, 3, 4, 5}), Flags({false, false, true, false, true, false}));
  EXPECT_EQ(part({}), Flags(6, false));
}

}  // namespace
}  // namespace mg
