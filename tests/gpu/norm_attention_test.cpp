// Normalisation, attention, rope, cross-entropy and max_grad kernels against the f64 reference.
// Backward ops are reached through mg::gradients with a random seed gradient, so that the
// gradients are not the degenerate ones of a plain sum (a norm's x-gradient of sum(y) is zero).
#include <limits>
#include <random>
#include <regex>
#include <string>

#include "backends/vulkan/kernels/lowering.hpp"
#include "harness.hpp"
#include "meganeura/autodiff.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;

// Sets "<prefix>d<k>" to the gradient of `output` (seeded with `seed`) for each of `wrt`.
void output_gradients(Graph& graph, const std::string& prefix, Tensor output,
                      const std::vector<Tensor>& wrt, Tensor seed) {
  std::vector<ValueId> ids;
  for (const Tensor& tensor : wrt) ids.push_back(tensor.id());
  const std::map<ValueId, ValueId> grads = gradients(graph, output.id(), ids, seed.id());
  for (size_t k = 0; k < wrt.size(); ++k) {
    graph.set_output(prefix + "d" + std::to_string(k), grads.at(wrt[k].id()));
  }
}

TEST(GpuNorm, LayerNormWithAndWithoutAffine) {
  check_on_gpu(
      {{"x", {3, 5, 37}, DType::f32, -2.0, 3.0}, {"w", {37}}, {"b", {37}}, {"g", {3, 5, 37}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor affine = layer_norm(x[0], x[1], x[2]);
        graph.set_output("affine", affine.id());
        output_gradients(graph, "affine_", affine, {x[0], x[1], x[2]}, x[3]);
        const Tensor plain = layer_norm(x[0], std::nullopt, std::nullopt, 1e-3);
        graph.set_output("plain", plain.id());
        output_gradients(graph, "plain_", plain, {x[0]}, x[3]);
      });
}

TEST(GpuNorm, LayerNormLongRows) {
  check_on_gpu({{"x", {3, 701}}, {"w", {701}}, {"g", {3, 701}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor y = layer_norm(x[0], x[1], std::nullopt);
                 graph.set_output("y", y.id());
                 output_gradients(graph, "", y, {x[0], x[1]}, x[2]);
               });
}

TEST(GpuNorm, RmsNormWithAndWithoutWeight) {
  check_on_gpu({{"x", {4, 45}}, {"w", {45}}, {"g", {4, 45}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor weighted = rms_norm(x[0], x[1]);
                 graph.set_output("weighted", weighted.id());
                 output_gradients(graph, "weighted_", weighted, {x[0], x[1]}, x[2]);
                 const Tensor plain = rms_norm(x[0], std::nullopt, 1e-5);
                 graph.set_output("plain", plain.id());
                 output_gradients(graph, "plain_", plain, {x[0]}, x[2]);
               });
}

TEST(GpuNorm, GroupNorm) {
  check_on_gpu({{"x", {2, 6, 5, 5}}, {"w", {6}}, {"b", {6}}, {"g", {2, 6, 5, 5}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor affine = group_norm(x[0], 3, x[1], x[2]);
                 graph.set_output("affine", affine.id());
                 output_gradients(graph, "affine_", affine, {x[0], x[1], x[2]}, x[3]);
                 const Tensor plain = group_norm(x[0], 3, std::nullopt, std::nullopt);
                 graph.set_output("plain", plain.id());
                 output_gradients(graph, "plain_", plain, {x[0]}, x[3]);
               });
}

TEST(GpuNorm, BatchNormTrainingUpdatesRunningStatistics) {
  check_on_gpu(
      {{"x", {4, 3, 5, 5}, DType::f32, -1.0, 2.0}, {"w", {3}}, {"b", {3}}, {"g", {4, 3, 5, 5}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor running_mean(
            &graph, graph.state("running_mean", {DType::f32, {3}}, Init::uniform(-1, 1)));
        const Tensor running_var(
            &graph, graph.state("running_var", {DType::f32, {3}}, Init::uniform(0.5, 2)));
        const Tensor y = batch_norm(x[0], x[1], x[2], running_mean, running_var, true);
        graph.set_output("y", y.id());
        output_gradients(graph, "", y, {x[0], x[1], x[2]}, x[3]);
        const Tensor plain_mean(&graph, graph.state("plain_mean", {DType::f32, {3}}));
        const Tensor plain_var(&graph, graph.state("plain_var", {DType::f32, {3}}));
        const Tensor plain =
            batch_norm(x[0], std::nullopt, std::nullopt, plain_mean, plain_var, true, 0.3);
        graph.set_output("plain", plain.id());
        output_gradients(graph, "plain_", plain, {x[0]}, x[3]);
        for (size_t k = 0; k < graph.updates().size(); ++k) {
          graph.set_output("update" + std::to_string(k), graph.updates()[k].second);
        }
      });
}

// A training batch norm with its ReLU, gradients and running statistics over channels of 9216
// elements drawn from [low, high], run with GPU parallelism on (split-K and its kin, forced here
// on the CPU device), so that it runs decomposed into means, sums and pointwise kernels
// (passes::decompose_batch_norm).
void check_decomposed_batch_norm(double low, double high, double tolerance,
                                 std::string* dispatch_list = nullptr) {
  const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  check_on_gpu(
      {{"x", {2, 4, 64, 72}, DType::f32, low, high}, {"w", {4}}, {"b", {4}}, {"g", {2, 4, 64, 72}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor running_mean(
            &graph, graph.state("running_mean", {DType::f32, {4}}, Init::uniform(-1, 1)));
        const Tensor running_var(
            &graph, graph.state("running_var", {DType::f32, {4}}, Init::uniform(0.5, 2)));
        const Tensor y = relu(batch_norm(x[0], x[1], x[2], running_mean, running_var, true));
        graph.set_output("y", y.id());
        output_gradients(graph, "", y, {x[0], x[1], x[2]}, x[3]);
        for (size_t k = 0; k < graph.updates().size(); ++k) {
          graph.set_output("update" + std::to_string(k), graph.updates()[k].second);
        }
      },
      tolerance, 7, {}, nullptr, true, dispatch_list);
}

TEST(GpuNorm, DecomposedBatchNormTraining) {
  check_decomposed_batch_norm(-1.0, 3.0, 1e-5);
}

// The variance in one pass (fast precision's, forced here in strict), over an input whose mean is
// about nine times its spread, so that the mean of squares less the squared mean cancels about
// two digits: its two means in one launch, within f32's rounding of that cancellation (mean^2 /
// var is about 75, which multiplies the variance's rounding error).
TEST(GpuNorm, DecomposedBatchNormOnePassVariance) {
  const testing::ScopedSwitch one_pass("MEGANEURA_ONE_PASS_VARIANCE", "1");
  std::string dispatches;
  check_decomposed_batch_norm(8.0, 12.0, 2e-5, &dispatches);
  EXPECT_NE(dispatches.find("of fused 2 ops -> square"), std::string::npos) << dispatches;
  EXPECT_NE(dispatches.find(" + mean %"), std::string::npos) << dispatches;
}

// A residual block of two training batch norms (tanh after the first, SiLU after the second),
// its step planned with the values in f32 and with half activations (passes::half_activations,
// fast precision's and bf16's, forced here in strict on a device without 16-bit products): the
// values that several elementwise kernels and reductions read (the first norm's tanh, whose
// gradient reads it, the block's sum, the incoming gradients the norms' backward reads) are
// stored in f16, or in bfloat16, and converted in registers. Each planned step matches the f64
// reference: within f32's rounding in f32, within the 16-bit format's rounding of those values
// otherwise (a weight gradient sums thousands of products that cancel, which multiplies their
// rounding), and in 16 bits binds fewer bytes (`most_bytes` of f32's) in no more dispatches. No
// ReLU: its mask would flip where a rounding moves a value across zero, by a whole gradient value,
// which no rounding bound describes.
void check_residual_block_over_half_activations(const Shape& images, double most_bytes) {
  Graph graph;
  const int64_t channels = images[1];
  const Tensor x = input(graph, "x", images);
  const Tensor w1 = input(graph, "w1", {channels}), b1 = input(graph, "b1", {channels});
  const Tensor w2 = input(graph, "w2", {channels}), b2 = input(graph, "b2", {channels});
  const Tensor seed = input(graph, "seed", images);
  const auto statistics = [&](const std::string& name) {
    return std::pair{
        Tensor(&graph, graph.state(name + "_mean", {DType::f32, {channels}}, Init::uniform(-1, 1))),
        Tensor(&graph,
               graph.state(name + "_var", {DType::f32, {channels}}, Init::uniform(0.5, 2)))};
  };
  const auto [mean1, var1] = statistics("bn1");
  const auto [mean2, var2] = statistics("bn2");
  const Tensor hidden = tanh(batch_norm(x, w1, b1, mean1, var1, true));
  const Tensor y = silu(batch_norm(hidden * 1.5 + x, w2, b2, mean2, var2, true));
  graph.set_output("y", y.id());
  output_gradients(graph, "", y, {x, w1, b1, w2, b2}, seed);
  for (size_t k = 0; k < graph.updates().size(); ++k)
    graph.set_output("update" + std::to_string(k), graph.updates()[k].second);

  Environment environment;
  std::mt19937_64 generator(29);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (const char* name : {"x", "w1", "b1", "w2", "b2", "seed"}) {
    HostTensor value(graph.type(graph.find_leaf(name)).shape);
    for (double& element : value.data) element = static_cast<float>(uniform(generator));
    environment.leaves[name] = value;
  }
  initialise_leaves(graph, environment, 0);
  const std::vector<HostTensor> reference = evaluate(graph, environment);

  struct Planned {
    double bytes = 0;
    size_t dispatches = 0;
  };
  const auto planned_step = [&](const char* half, double tolerance) {
    const testing::ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
    const testing::ScopedSwitch half_activations("MEGANEURA_HALF_ACTIVATIONS", half);
    SessionOptions options;
    options.switches = testing::switches();
    Session session(graph, options);
    for (const char* name : {"x", "w1", "b1", "w2", "b2", "seed"}) {
      const std::vector<double>& data = environment.leaves[name].data;
      session.set_input(name, std::vector<float>(data.begin(), data.end()));
    }
    session.run();
    for (const auto& [name, id] : graph.outputs())
      EXPECT_LT(testing::normalized_error(session.output(name), reference[id]), tolerance)
          << "output '" << name << "' with MEGANEURA_HALF_ACTIVATIONS=" << half;
    Planned planned;
    planned.dispatches = session.report().dispatches;
    for (const DispatchCost& cost : session.report().dispatch_costs) planned.bytes += cost.bytes;
    return planned;
  };
  const Planned in_f32 = planned_step("0", 1e-5);
  // bfloat16 keeps 8 significant bits to f16's 11: its roundings are 8 times as coarse.
  for (const auto& [format, tolerance] : {std::pair{"1", 8e-3}, std::pair{"bf16", 0.1}}) {
    const Planned in_half = planned_step(format, tolerance);
    EXPECT_LT(in_half.bytes, most_bytes * in_f32.bytes) << format;
    EXPECT_LE(in_half.dispatches, in_f32.dispatches) << format;
  }
}

TEST(GpuNorm, ResidualBlockOverHalfActivations) {
  // 9,216 elements a channel: the batch norms decomposed into means and elementwise kernels,
  // which move a fifth fewer bytes.
  check_residual_block_over_half_activations({2, 8, 64, 72}, 0.8);
  // 6,400: the norm kernels, whose f32 inputs and results stay f32 (only the tanh between them
  // is stored in f16, its gradient's prologue in the backward norm widening it).
  check_residual_block_over_half_activations({4, 16, 40, 40}, 1.0);
  // 13,467 elements a channel, an odd count: the pointwise kernels' scalar tails convert too.
  check_residual_block_over_half_activations({3, 5, 67, 67}, 0.8);
}

// The GPU kernels' rule (forced on CPU devices): few groups of many elements take workgroups of
// up to 1024 threads, and groups whose elements come in aligned fours of one channel take vec4
// steps; the odd plane keeps scalar steps over the same wide workgroups.
TEST(GpuNorm, WideWorkgroupsAndVectorSteps) {
  const testing::ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_on_gpu({{"x", {2, 8, 48, 48}, DType::f32, -1.0, 2.0},
                {"w", {8}},
                {"b", {8}},
                {"g", {2, 8, 48, 48}},
                {"rows", {2, 12288}},
                {"row_w", {12288}},
                {"row_g", {2, 12288}},
                {"odd", {2, 4, 45, 45}},
                {"odd_g", {2, 4, 45, 45}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor grouped = group_norm(x[0], 2, x[1], x[2]);
                 graph.set_output("grouped", grouped.id());
                 output_gradients(graph, "grouped_", grouped, {x[0], x[1], x[2]}, x[3]);
                 const Tensor running_mean(&graph, graph.state("running_mean", {DType::f32, {8}}));
                 const Tensor running_var(&graph, graph.state("running_var", {DType::f32, {8}}));
                 const Tensor batched =
                     batch_norm(x[0], x[1], x[2], running_mean, running_var, true);
                 graph.set_output("batched", batched.id());
                 output_gradients(graph, "batched_", batched, {x[0], x[1]}, x[3]);
                 const Tensor rows = layer_norm(x[4], x[5], std::nullopt);
                 graph.set_output("rows", rows.id());
                 output_gradients(graph, "rows_", rows, {x[4], x[5]}, x[6]);
                 const Tensor rms = rms_norm(x[4], x[5]);
                 graph.set_output("rms", rms.id());
                 output_gradients(graph, "rms_", rms, {x[4]}, x[6]);
                 const Tensor odd = group_norm(x[7], 1, std::nullopt, std::nullopt);
                 graph.set_output("odd", odd.id());
                 output_gradients(graph, "odd_", odd, {x[7]}, x[8]);
               });
}

// The workgroup of a norm over few large groups: the largest power of two the device allows,
// 1024 on an H200-like GPU and 256 where the limit is 384; many groups and CPU devices keep
// 256.
TEST(NormLowering, WorkgroupsWithinTheDeviceLimit) {
  const auto local_size = [](const Shape& x, int64_t groups, const target::DeviceTraits& device) {
    Graph graph;
    const Tensor y = group_norm(input(graph, "x", x), groups, std::nullopt, std::nullopt);
    const std::vector<kernels::Launch> launches = kernels::lower_node(graph, y.id(), device);
    for (const auto& [name, value] : launches.at(0).defines)
      if (name == "LOCAL") return value;
    return std::string("missing");
  };
  target::DeviceTraits gpu;
  gpu.max_workgroup_invocations = 1024;
  EXPECT_EQ(local_size({2, 320, 64, 64}, 32, gpu), "1024u");
  target::DeviceTraits mobile = gpu;
  mobile.max_workgroup_invocations = 384;
  EXPECT_EQ(local_size({2, 320, 64, 64}, 32, mobile), "256u");
  EXPECT_EQ(local_size({64, 320, 8, 8}, 32, gpu), "256u");  // 2048 groups
  target::DeviceTraits smallest = gpu;
  smallest.max_workgroup_invocations = 128;  // Vulkan's minimum
  EXPECT_EQ(local_size({64, 320, 8, 8}, 32, smallest), "128u");
  EXPECT_EQ(local_size({2, 320, 64, 64}, 32, smallest), "128u");
  target::DeviceTraits cpu = gpu;
  cpu.cpu = true;
  cpu.subgroup_size = 8;
  EXPECT_EQ(local_size({2, 320, 64, 64}, 32, cpu), "256u");
}

TEST(GpuNorm, BatchNormEval) {
  check_on_gpu({{"x", {3, 4, 7}},
                {"w", {4}},
                {"b", {4}},
                {"mean", {4}},
                {"var", {4}, DType::f32, 0.5, 1.5},
                {"g", {3, 4, 7}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor y = batch_norm(x[0], x[1], x[2], x[3], x[4], false);
                 graph.set_output("y", y.id());
                 output_gradients(graph, "", y, {x[0], x[1], x[2]}, x[5]);
                 const Tensor plain =
                     batch_norm(x[0], std::nullopt, std::nullopt, x[3], x[4], false);
                 graph.set_output("plain", plain.id());
                 output_gradients(graph, "plain_", plain, {x[0]}, x[5]);
               });
}

// Attention forward and all three gradients for q [B, Hq, Sq, D], k [B, Hkv, Sk, D],
// v [B, Hkv, Sk, Dv].
void check_attention(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_len,
                     int64_t kv_len, int64_t head_dim, int64_t value_dim, bool causal,
                     bool random_mask = false, bool padding_mask = false) {
  std::vector<testing::HarnessInput> inputs = {{"q", {batch, q_heads, q_len, head_dim}},
                                               {"k", {batch, kv_heads, kv_len, head_dim}},
                                               {"v", {batch, kv_heads, kv_len, value_dim}},
                                               {"g", {batch, q_heads, q_len, value_dim}}};
  if (random_mask) inputs.push_back({"mask", {q_len, kv_len}, DType::f32, -2.0, 2.0});
  check_on_gpu(inputs, [&](Graph& graph, std::vector<Tensor>& x) {
    AttentionOptions options;
    options.causal = causal;
    if (random_mask) options.mask = x[4];
    if (padding_mask) {
      // Sample b keeps its first kv_len - 2 * b keys.
      std::vector<double> values(static_cast<size_t>(batch * kv_len), 0.0);
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t j = kv_len - 2 * b; j < kv_len; ++j) {
          values[b * kv_len + j] = -std::numeric_limits<double>::infinity();
        }
      }
      options.mask = Tensor(&graph, graph.constant(values, {DType::f32, {batch, 1, 1, kv_len}}));
    }
    const Tensor y = scaled_dot_product_attention(x[0], x[1], x[2], options);
    graph.set_output("y", y.id());
    output_gradients(graph, "", y, {x[0], x[1], x[2]}, x[3]);
  });
}

TEST(GpuNormAttention, GroupedQueryHeads) {
  check_attention(2, 4, 2, 7, 7, 16, 16, false);
}

TEST(GpuNormAttention, CausalMultipleBlocks) {
  check_attention(1, 4, 2, 37, 37, 16, 16, true);
}

TEST(GpuNormAttention, CrossAttentionWithMaskAndValueDim) {
  check_attention(2, 2, 1, 5, 9, 16, 8, false, true);
}

TEST(GpuNormAttention, CrossAttentionCausal) {
  check_attention(1, 2, 2, 5, 9, 16, 16, true);
}

TEST(GpuNormAttention, PaddingMaskHeadDim64) {
  check_attention(2, 4, 2, 6, 9, 64, 64, true, false, true);
}

// The kernels hold head dimensions as vec4s: 6 and 5 are padded with zeros to 8.
TEST(GpuNormAttention, HeadDimsNotMultiplesOfFour) {
  check_attention(2, 2, 1, 6, 11, 6, 5, true, true);
}

TEST(GpuNormAttention, HeadDim128) {
  check_attention(1, 2, 1, 5, 19, 128, 128, false);
}

// The strict kernel under other blocks than the built-in choice: 4 lanes per row, 256 threads,
// the smallest blocks; causal cross attention with more keys than queries, so that whole key
// blocks see no query (dK / dV of those keys are zero), grouped heads, a mask and head
// dimensions that are not multiples of 4. dK and dV in separate launches as well as in one
// (the default, which the other tests run).
TEST(GpuNormAttention, TiledBlockVariants) {
  for (const auto& [blocks, fused_kv] : {std::pair<const char*, const char*>{"16,8,64,4", "0"},
                                         {"32,16,256,8", "1"},
                                         {"64,32,128,8", "0"}}) {
    SCOPED_TRACE(std::string(blocks) + " fused dK/dV " + fused_kv);
    const testing::ScopedSwitch forced("MEGANEURA_ATTENTION_BLOCKS", blocks);
    const testing::ScopedSwitch fused("MEGANEURA_ATTENTION_FUSED_KV", fused_kv);
    check_attention(1, 2, 1, 11, 40, 6, 10, true, true);
  }
}

// attention_lse without its forward in the graph (a backward over a saved forward) has its own
// launch; with the forward, the forward writes it (tests/plan/planner_test.cpp).
TEST(GpuNormAttention, LogSumExpAlone) {
  check_on_gpu(
      {{"q", {1, 2, 9, 8}}, {"k", {1, 2, 13, 8}}}, [](Graph& graph, std::vector<Tensor>& x) {
        const Attrs attrs{{"causal", int64_t{1}}, {"scale", 0.3}, {"has_mask", int64_t{0}}};
        graph.set_output("lse", graph.add("attention_lse", {x[0].id(), x[1].id()}, attrs));
      });
}

// Gradients given max |dO| (passes/scale_attention_gradients.cpp, forced: the fast precision's
// cooperative matrices take it by default), which the strict kernels leave unread: grouped heads
// with a mask (one per batch), and causal heads with a narrower value (one per head).
TEST(GpuNormAttention, GradientsOverAScaledCotangent) {
  const testing::ScopedSwitch scaled("MEGANEURA_ATTENTION_GRAD_SCALE", "1");
  check_attention(2, 4, 2, 37, 45, 16, 16, false, true);
  check_attention(2, 2, 2, 20, 30, 16, 8, true);
  // Whisper-tiny's encoder: 1500 queries and keys, heads of 64, and a cotangent of an untrained
  // model's size, in fast precision on the strict kernels, also on a device with cooperative
  // matrices (the cooperative-matrix ones, with their f16 tolerance, in
  // tests/gpu/coopmat_test.cpp).
  const testing::ScopedSwitch strict_kernels("MEGANEURA_NO_COOPMAT", "1");
  const Shape q{1, 1, 1500, 64};
  SessionOptions fast;
  fast.precision = Precision::fast;
  check_on_gpu(
      {{"q", q}, {"k", q}, {"v", q}, {"g", q, DType::f32, -1e-6, 1e-6}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Tensor y = scaled_dot_product_attention(x[0], x[1], x[2], {});
        output_gradients(graph, "", y, {x[0], x[1], x[2]}, x[3]);
      },
      1e-4, 7, fast);
}

// A malformed tuning switch stops the build with an error that quotes it.
void expect_switch_rejected(const char* variable, const char* bad) {
  testing::expect_switch_rejected(variable, bad,
                                  [] { check_attention(1, 1, 1, 4, 4, 4, 4, false); });
}

TEST(GpuNormAttention, TiledBlocksSwitchNamesBadValues) {
  for (const char* bad : {"48,8", "abc", "64,32,0", "16,8,64,4,1"})
    expect_switch_rejected("MEGANEURA_ATTENTION_BLOCKS", bad);
}

// Attention over slices (passes/split_attention.cpp: the forward and dQ over key slices, the
// forward's joined by attention_combine, dK and dV over query slices), forced since the
// built-in rule leaves these short sequences whole: causal cross attention whose first
// queries see no key of the later slices, a mask, grouped heads, head dimensions that are no
// multiple of 4, a single query over many keys; the backward reads the log-sum-exp that the
// combine writes.
TEST(GpuNormAttention, KeySlices) {
  const testing::ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "3");
  check_attention(1, 2, 1, 70, 150, 6, 10, true, true);
  check_attention(2, 4, 2, 20, 200, 16, 16, false, true);
  check_attention(1, 2, 1, 1, 700, 8, 8, false);  // one query (decoding): slices of 256 keys
  const testing::ScopedSwitch separate("MEGANEURA_ATTENTION_FUSED_KV", "0");  // dK, dV apart
  check_attention(1, 2, 1, 70, 150, 6, 10, true, true);
}

// A multi-head layer's output: the heads moved after the queries ([B, Sq, H * Dv]) and
// projected, over key slices, so that the combine writes that layout itself (heads_last), at
// inference (the forward alone) and in training (the backward also reads the forward's output
// with its heads in place, and takes the gradients of q, k, v and the projection); causal and
// grouped, a mask with the heads of one value width. The projection joins the slices itself as
// it loads them (MEGANEURA_JOIN_SLICES, on by default), value widths of 6 (four elements of the
// result may span two heads) and 8; with the tiled buffer GEMM (MEGANEURA_NO_CPU_KERNELS=1) over
// whole and split K too. Returns the dispatches a run took.
size_t check_projected_heads(bool training, bool causal, int64_t value_dim = 6,
                             int64_t projected = 10) {
  const testing::ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "3");
  size_t dispatches = 0;
  check_on_gpu(
      {{"q", {2, 4, 20, 8}},
       {"k", {2, 2, 150, 8}},
       {"v", {2, 2, 150, value_dim}},
       {"w", {4 * value_dim, projected}},
       {"g", {2, 20, projected}}},
      [&](Graph& graph, std::vector<Tensor>& x) {
        AttentionOptions options;
        options.causal = causal;
        const Tensor heads = scaled_dot_product_attention(x[0], x[1], x[2], options);
        const Tensor moved = reshape(transpose(heads, {0, 2, 1, 3}), {2, 20, 4 * value_dim});
        const Tensor y = matmul(moved, x[3]);
        graph.set_output("y", y.id());
        if (training) output_gradients(graph, "", y, {x[0], x[1], x[2], x[3]}, x[4]);
      },
      1e-5, 7, {}, &dispatches);
  return dispatches;
}

TEST(GpuNormAttention, KeySlicesWriteTheHeadsAfterTheQueries) {
  for (const bool training : {false, true}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(std::string(training ? "training" : "inference") + (causal ? ", causal" : ""));
      check_projected_heads(training, causal);
    }
  }
}

TEST(GpuNormAttention, ProductsJoinKeySlicesThemselves) {
  for (const char* gpu_kernels : {"0", "1"}) {
    const testing::ScopedSwitch kernels("MEGANEURA_NO_CPU_KERNELS", gpu_kernels);
    for (const int64_t value_dim : {6, 8}) {
      // 40 rows over K = 4 Dv: one launch over all of K, and K in slices (split-K partials).
      for (const char* k_slices : {"1", "2"}) {
        SCOPED_TRACE(std::string("GPU kernels ") + gpu_kernels + ", Dv " +
                     std::to_string(value_dim) + ", K slices " + k_slices);
        const testing::ScopedSwitch split_k("MEGANEURA_SPLIT_K_SLICES", k_slices);
        size_t joined = 0, apart = 0;
        for (const bool training : {false, true}) {
          joined = check_projected_heads(training, true, value_dim, 12);
          const testing::ScopedSwitch off("MEGANEURA_JOIN_SLICES", "0");
          apart = check_projected_heads(training, true, value_dim, 12);
          // At inference nothing else reads the joined result: the combine takes no launch.
          // In training the backward reads it, so the combine runs beside the product.
          EXPECT_EQ(joined + (training ? 0 : 1), apart) << (training ? "training" : "inference");
        }
      }
    }
  }
}

// An attention forward over whole key streams whose output a transpose reads, moving the heads
// after the queries (an attention layer before its output projection), writes that transpose's
// value itself: one launch fewer than with MEGANEURA_TRANSPOSED_STORES=0, against the reference;
// grouped heads, a mask, value widths 8 and 5 (padded to whole vec4s). At inference the transpose
// alone reads the output, which the forward then writes heads last only; in training the backward
// reads it too, and the forward, which writes its log-sum-exp beside it, writes both.
TEST(GpuNormAttention, ForwardsWriteHeadsLastForTheirTranspose) {
  for (const int64_t value_dim : {8, 5}) {
    for (const bool training : {false, true}) {
      SCOPED_TRACE("Dv " + std::to_string(value_dim) + (training ? ", training" : ""));
      const std::vector<testing::HarnessInput> inputs{{"q", {2, 4, 7, 8}},
                                                      {"k", {2, 2, 11, 8}},
                                                      {"v", {2, 2, 11, value_dim}},
                                                      {"mask", {7, 11}, DType::f32, -2.0, 2.0},
                                                      {"g", {2, 7, 4, value_dim}}};
      const auto build = [&](Graph& graph, std::vector<Tensor>& x) {
        AttentionOptions options;
        options.mask = x[3];
        const Tensor moved =
            transpose(scaled_dot_product_attention(x[0], x[1], x[2], options), {0, 2, 1, 3});
        graph.set_output("moved", moved.id());
        if (training) output_gradients(graph, "", moved, {x[0], x[1], x[2]}, x[4]);
      };
      size_t written = 0, apart = 0;
      std::string list;
      check_on_gpu(inputs, build, 1e-5, 53, {}, &written, true, &list);
      {
        const testing::ScopedSwitch off("MEGANEURA_TRANSPOSED_STORES", "0");
        check_on_gpu(inputs, build, 1e-5, 53, {}, &apart);
      }
      EXPECT_EQ(written + 1, apart) << list;
      const std::string forward = training ? "attention_lse %[0-9]+ \\+ transpose %"
                                           : "scaled_dot_product_attention %[0-9]+ \\+ transpose %";
      EXPECT_TRUE(std::regex_search(list, std::regex(forward))) << list;
      if (!training) {
        EXPECT_EQ(list.find("layout"), std::string::npos) << list;
      }
    }
  }
}

// dK and dV of grouped-query attention over each query head of a group apart
// (MEGANEURA_ATTENTION_HEAD_SPLITS=1, which the built-in rule does on GPUs where compute units
// would idle), alone, beside query slices, causal and masked, with dK and dV in one launch and
// apart, and with dQ as a matmul of the W that the dK launch writes.
TEST(GpuNormAttention, HeadSplits) {
  const testing::ScopedSwitch heads("MEGANEURA_ATTENTION_HEAD_SPLITS", "1");
  check_attention(1, 6, 2, 40, 40, 16, 16, true);
  check_attention(2, 4, 2, 20, 70, 6, 10, false, true);
  {
    const testing::ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "3");
    check_attention(1, 6, 2, 150, 150, 8, 8, true);
  }
  {
    const testing::ScopedSwitch separate("MEGANEURA_ATTENTION_FUSED_KV", "0");
    check_attention(1, 4, 1, 30, 30, 8, 8, false, true);
  }
  const testing::ScopedSwitch dq_gemm("MEGANEURA_ATTENTION_DQ_GEMM", "1");
  check_attention(1, 6, 2, 37, 44, 6, 10, false, true);
}

// dQ as a matmul of the scores' gradient W (passes/attention_grad_q_gemm.cpp; on by default on
// GPUs, forced here on Lavapipe): W written by the launch of dK and dV together, of dK alone,
// and by its own launch (fusion off), beside query slices of dK and dV, in whole vec4s (key
// counts 44, 68) and in floats (33, 70); grouped heads, a mask, head dimensions that are no
// multiple of 4. Causal attention keeps its dQ kernel, but W alone
// must still hold every pair (the launch visits the blocks that causal masking skips).
TEST(GpuNormAttention, GradQAsMatmul) {
  const testing::ScopedSwitch dq_gemm("MEGANEURA_ATTENTION_DQ_GEMM", "1");
  check_attention(2, 4, 2, 37, 44, 6, 10, false, true);
  {
    const testing::ScopedSwitch separate("MEGANEURA_ATTENTION_FUSED_KV", "0");
    check_attention(1, 2, 1, 70, 33, 16, 16, false);
  }
  {
    const testing::ScopedSwitch unfused("MEGANEURA_NO_FUSION", "1");
    check_attention(1, 2, 2, 9, 68, 8, 8, false, true);
  }
  {
    const testing::ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "3");
    check_attention(1, 2, 1, 150, 70, 8, 8, false);
  }
  check_on_gpu(
      {{"q", {1, 2, 40, 8}},
       {"k", {1, 1, 70, 8}},
       {"v", {1, 1, 70, 6}},
       {"out", {1, 2, 40, 6}},
       {"grad_out", {1, 2, 40, 6}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        const Attrs attrs{{"causal", int64_t{1}}, {"scale", 0.4}, {"has_mask", int64_t{0}}};
        const ValueId lse = graph.add("attention_lse", {x[0].id(), x[1].id()}, attrs);
        graph.set_output(
            "scores",
            graph.add("attention_grad_scores",
                      {x[0].id(), x[1].id(), x[2].id(), x[3].id(), x[4].id(), lse}, attrs));
      });
}

TEST(GpuNormAttention, KeySlicesSwitchNamesBadValues) {
  for (const char* bad : {"0", "three", "-2", "2,2"})
    expect_switch_rejected("MEGANEURA_ATTENTION_SPLITS", bad);
}

// Positions near 40000 (and a negative offset): the angle must stay accurate where one f32
// product p * f would already be off by about 2e-3 radians.
TEST(GpuNormAttention, RopeAtLongPositions) {
  for (int64_t offset : {39990, -20}) {
    SCOPED_TRACE(offset);
    check_on_gpu({{"x", {1, 2, 30, 64}}}, [&](Graph& graph, std::vector<Tensor>& x) {
      graph.set_output("y", rope(x[0], 10000.0, offset).id());
    });
  }
}

TEST(GpuNormAttention, RopeForwardAndBackward) {
  check_on_gpu({{"x", {2, 3, 11, 8}}, {"g", {2, 3, 11, 8}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor y = rope(x[0], 10000.0, 3);
                 graph.set_output("y", y.id());
                 output_gradients(graph, "", y, {x[0]}, x[1]);
               });
}

TEST(GpuNormLoss, CrossEntropyClassifierShape) {
  // Labels in [-1, 10): rows labelled -1 are ignored.
  check_on_gpu({{"logits", {64, 10}, DType::f32, -3.0, 3.0},
                {"labels", {64}, DType::i32, -1.0, 10.0},
                {"seed", {}, DType::f32, 0.5, 2.0}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor plain = cross_entropy(x[0], x[1], 0.0, -1);
                 graph.set_output("plain", plain.id());
                 output_gradients(graph, "plain_", plain, {x[0]}, x[2]);
                 const Tensor smoothed = cross_entropy(x[0], x[1], 0.1, -1);
                 graph.set_output("smoothed", smoothed.id());
                 output_gradients(graph, "smoothed_", smoothed, {x[0]}, x[2]);
               });
}

// More rows of few classes than a workgroup has lanes (one lane a row): several rounds of rows
// in the loss, several workgroups in its gradient.
TEST(GpuNormLoss, CrossEntropyManyShortRows) {
  check_on_gpu({{"logits", {700, 7}, DType::f32, -3.0, 3.0},
                {"labels", {700}, DType::i32, -1.0, 7.0},
                {"seed", {}, DType::f32, 0.5, 2.0}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor loss = cross_entropy(x[0], x[1], 0.1, -1);
                 graph.set_output("loss", loss.id());
                 output_gradients(graph, "", loss, {x[0]}, x[2]);
               });
}

TEST(GpuNormLoss, CrossEntropyWideRows) {
  check_on_gpu({{"logits", {5, 300}, DType::f32, -4.0, 4.0},
                {"labels", {5}, DType::i32, 0.0, 300.0},
                {"seed", {}, DType::f32, 0.5, 2.0}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor loss = cross_entropy(x[0], x[1], 0.2);
                 graph.set_output("loss", loss.id());
                 output_gradients(graph, "", loss, {x[0]}, x[2]);
               });
}

TEST(GpuNormLoss, MaxGradient) {
  check_on_gpu({{"x", {3, 5, 7}}, {"g1", {3, 7}}, {"g2", {}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 output_gradients(graph, "axis1_", max(x[0], {1}), {x[0]}, x[1]);
                 output_gradients(graph, "all_", max(x[0], {}), {x[0]}, x[2]);
               });
}

}  // namespace
}  // namespace mg
