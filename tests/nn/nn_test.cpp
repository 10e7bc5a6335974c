// nn layers: parameter names, shapes and initialisation; each layer against the same
// computation written with the builder functions (same parameter values, all randomised so
// ones/zeros initialisations hide nothing); a tiny Llama-style transformer block end to end with
// a finite-difference check of one weight's gradient; misuse errors.
#include "meganeura/nn.hpp"

#include <cmath>
#include <random>

#include "ops/gradient_check.hpp"
#include "ops/op_expectations.hpp"

namespace mg {
namespace {

using testing::expect_error;
using testing::random_tensor;

void expect_init(const Tensor& leaf, Init::Kind kind, double a = 0, double b = 0) {
  const Init init = leaf_init(leaf.graph().node(leaf.id()));
  EXPECT_EQ(init.kind, kind) << leaf.graph().node(leaf.id()).name;
  EXPECT_DOUBLE_EQ(init.a, a) << leaf.graph().node(leaf.id()).name;
  EXPECT_DOUBLE_EQ(init.b, b) << leaf.graph().node(leaf.id()).name;
}

void expect_leaf(const Tensor& leaf, const std::string& name, const Shape& shape) {
  EXPECT_EQ(leaf.graph().node(leaf.id()).name, name);
  EXPECT_EQ(shape_string(leaf.shape()), shape_string(shape)) << name;
}

// Every parameter and state leaf gets random values in [-1, 1]; variances in [0.5, 1.5].
Environment random_environment(const Graph& graph, std::mt19937_64& generator) {
  Environment environment;
  for (const Node& node : graph.nodes()) {
    if (node.op != "parameter" && node.op != "state") continue;
    const bool variance = node.name.ends_with("running_var");
    environment.leaves[node.name] =
        random_tensor(node.type.shape, generator, variance ? 0.5 : -1.0, variance ? 1.5 : 1.0);
  }
  return environment;
}

Tensor random_input(Graph& graph, Environment& environment, std::mt19937_64& generator,
                    const std::string& name, const Shape& shape) {
  environment.leaves[name] = random_tensor(shape, generator);
  return input(graph, name, shape);
}

void expect_same(const Graph& graph, const Environment& environment, const Tensor& layer,
                 const Tensor& reference, double tolerance = 1e-12) {
  verify(graph);
  const std::vector<HostTensor> values = evaluate(graph, environment);
  const HostTensor& actual = values[layer.id()];
  const HostTensor& expected = values[reference.id()];
  ASSERT_EQ(shape_string(actual.shape), shape_string(expected.shape));
  double norm = 0;
  for (int64_t k = 0; k < expected.elements(); ++k) {
    EXPECT_NEAR(actual.data[k], expected.data[k], tolerance) << "element " << k;
    norm += expected.data[k] * expected.data[k];
  }
  EXPECT_GT(norm, 0.0) << "the reference is all zeros and proves nothing";
}

TEST(Nn, ParameterNamesShapesAndInitialisation) {
  Graph graph;
  const nn::Linear fc(graph, "model.fc", 4, 3);
  expect_leaf(fc.weight, "model.fc.weight", {3, 4});
  ASSERT_TRUE(fc.bias);
  expect_leaf(*fc.bias, "model.fc.bias", {3});
  expect_init(fc.weight, Init::Kind::uniform, -0.5, 0.5);
  expect_init(*fc.bias, Init::Kind::uniform, -0.5, 0.5);
  EXPECT_FALSE(nn::Linear(graph, "model.head", 4, 3, false).bias);

  const nn::Conv2d conv(graph, "model.conv", 4, 6, 3, {.groups = 2});
  expect_leaf(conv.weight, "model.conv.weight", {6, 2, 3, 3});
  expect_init(conv.weight, Init::Kind::uniform, -1 / std::sqrt(18.0), 1 / std::sqrt(18.0));

  const nn::Embedding embedding(graph, "model.embed_tokens", 10, 4);
  expect_leaf(embedding.weight, "model.embed_tokens.weight", {10, 4});
  expect_init(embedding.weight, Init::Kind::normal, 0, 1);

  const nn::LayerNorm layer_norm(graph, "model.ln", 4);
  expect_init(layer_norm.weight, Init::Kind::ones);
  expect_init(layer_norm.bias, Init::Kind::zeros);
  const nn::RMSNorm rms_norm(graph, "model.norm", 4);
  expect_leaf(rms_norm.weight, "model.norm.weight", {4});
  expect_init(rms_norm.weight, Init::Kind::ones);
  const nn::GroupNorm group_norm(graph, "model.gn", 2, 4);
  expect_leaf(group_norm.bias, "model.gn.bias", {4});

  const nn::BatchNorm2d batch_norm(graph, "model.bn", 3);
  expect_leaf(batch_norm.running_mean, "model.bn.running_mean", {3});
  expect_leaf(batch_norm.running_var, "model.bn.running_var", {3});
  EXPECT_EQ(graph.node(batch_norm.running_mean.id()).op, "state");
  expect_init(batch_norm.running_mean, Init::Kind::zeros);
  expect_init(batch_norm.running_var, Init::Kind::ones);

  const nn::MLP mlp(graph, "model.layers.0.mlp", 4, 8);
  expect_leaf(mlp.gate_proj.weight, "model.layers.0.mlp.gate_proj.weight", {8, 4});
  expect_leaf(mlp.up_proj.weight, "model.layers.0.mlp.up_proj.weight", {8, 4});
  expect_leaf(mlp.down_proj.weight, "model.layers.0.mlp.down_proj.weight", {4, 8});
  EXPECT_FALSE(mlp.up_proj.bias);
  const nn::GeluMLP gelu_mlp(graph, "vit.mlp", 4, 8);
  expect_leaf(*gelu_mlp.fc2.bias, "vit.mlp.fc2.bias", {4});

  const nn::MultiHeadAttention attention(graph, "model.layers.0.self_attn", 8, 4, {.kv_heads = 2});
  EXPECT_EQ(attention.head_dim, 2);
  expect_leaf(attention.q_proj.weight, "model.layers.0.self_attn.q_proj.weight", {8, 8});
  expect_leaf(attention.k_proj.weight, "model.layers.0.self_attn.k_proj.weight", {4, 8});
  expect_leaf(attention.v_proj.weight, "model.layers.0.self_attn.v_proj.weight", {4, 8});
  expect_leaf(attention.o_proj.weight, "model.layers.0.self_attn.o_proj.weight", {8, 8});
  verify(graph);
}

TEST(Nn, LinearAndConvMatchBuilders) {
  std::mt19937_64 generator(1);
  Graph graph;
  const nn::Linear fc(graph, "fc", 4, 3);
  const nn::Conv2d conv(graph, "conv", 4, 2, 3, {.stride = {2, 1}, .padding = {1, 1}});
  Environment environment = random_environment(graph, generator);
  const Tensor x = random_input(graph, environment, generator, "x", {2, 5, 4});
  expect_same(graph, environment, fc(x), matmul(x, fc.weight, false, true) + *fc.bias);
  const Tensor images = random_input(graph, environment, generator, "images", {2, 4, 5, 5});
  Conv2dOptions options;
  options.stride = {2, 1};
  options.padding = {1, 1};
  expect_same(graph, environment, conv(images), conv2d(images, conv.weight, conv.bias, options));
}

TEST(Nn, EmbeddingLooksUpRows) {
  std::mt19937_64 generator(2);
  Graph graph;
  const nn::Embedding embedding(graph, "embed", 5, 3);
  Environment environment = random_environment(graph, generator);
  const Tensor ids = input(graph, "ids", {2, 2}, DType::i32);
  environment.leaves["ids"] = HostTensor({2, 2}, {4, 0, 2, 4});
  const Tensor rows = embedding(ids);
  verify(graph);
  const HostTensor value = evaluate(graph, environment)[rows.id()];
  ASSERT_EQ(shape_string(value.shape), "[2, 2, 3]");
  const HostTensor& table = environment.leaves["embed.weight"];
  const std::vector<int> expected_rows = {4, 0, 2, 4};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(value.data[i * 3 + j], table.data[expected_rows[i] * 3 + j]);
    }
  }
}

TEST(Nn, NormsMatchHandWrittenFormulas) {
  std::mt19937_64 generator(3);
  Graph graph;
  const nn::LayerNorm layer_norm(graph, "ln", 4, 1e-5);
  const nn::RMSNorm rms_norm(graph, "rms", 4, 1e-6);
  const nn::GroupNorm group_norm(graph, "gn", 2, 4, 1e-5);
  Environment environment = random_environment(graph, generator);
  const Tensor x = random_input(graph, environment, generator, "x", {3, 4});

  const Tensor centred = x - mean(x, {-1}, true);
  const Tensor variance = mean(square(centred), {-1}, true);
  expect_same(graph, environment, layer_norm(x),
              centred * rsqrt(variance + 1e-5) * layer_norm.weight + layer_norm.bias);
  expect_same(graph, environment, rms_norm(x),
              x * rsqrt(mean(square(x), {-1}, true) + 1e-6) * rms_norm.weight);

  const Tensor images = random_input(graph, environment, generator, "images", {2, 4, 3, 3});
  const Tensor grouped = reshape(images, {2, 2, -1});
  const Tensor grouped_centred = grouped - mean(grouped, {-1}, true);
  const Tensor normalised =
      grouped_centred * rsqrt(mean(square(grouped_centred), {-1}, true) + 1e-5);
  expect_same(graph, environment, group_norm(images),
              reshape(normalised, {2, 4, 3, 3}) * reshape(group_norm.weight, {4, 1, 1}) +
                  reshape(group_norm.bias, {4, 1, 1}));
}

TEST(Nn, BatchNormTrainsAndInfers) {
  std::mt19937_64 generator(4);
  Graph graph;
  const nn::BatchNorm2d batch_norm(graph, "bn", 3, 0.1, 1e-5);
  Environment environment = random_environment(graph, generator);
  const Tensor x = random_input(graph, environment, generator, "x", {2, 3, 2, 2});
  const auto per_channel = [](Tensor v) { return reshape(v, {3, 1, 1}); };

  const Tensor inferred = batch_norm(x, false);
  expect_same(graph, environment, inferred,
              (x - per_channel(batch_norm.running_mean)) *
                      rsqrt(per_channel(batch_norm.running_var) + 1e-5) *
                      per_channel(batch_norm.weight) +
                  per_channel(batch_norm.bias));
  EXPECT_TRUE(graph.updates().empty());

  const Tensor trained = batch_norm(x, true);
  const Tensor batch_mean = mean(x, {0, 2, 3}, true);
  const Tensor centred = x - batch_mean;
  const Tensor batch_variance = mean(square(centred), {0, 2, 3}, true);
  expect_same(graph, environment, trained,
              centred * rsqrt(batch_variance + 1e-5) * per_channel(batch_norm.weight) +
                  per_channel(batch_norm.bias));
  ASSERT_EQ(graph.updates().size(), 2u);

  // One step moves the running mean 10% of the way to the batch mean.
  const std::vector<HostTensor> values = evaluate(graph, environment);
  const HostTensor old_mean = environment.leaves["bn.running_mean"];
  step(graph, environment);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(environment.leaves["bn.running_mean"].data[c],
                0.9 * old_mean.data[c] + 0.1 * values[batch_mean.id()].data[c], 1e-12);
  }
}

TEST(Nn, FeedForwardsMatchBuilders) {
  std::mt19937_64 generator(5);
  Graph graph;
  const nn::MLP mlp(graph, "mlp", 4, 6);
  const nn::GeluMLP gelu_mlp(graph, "ffn", 4, 6, true, GeluApproximation::tanh);
  Environment environment = random_environment(graph, generator);
  const Tensor x = random_input(graph, environment, generator, "x", {2, 3, 4});
  expect_same(graph, environment, mlp(x),
              linear(silu(linear(x, mlp.gate_proj.weight)) * linear(x, mlp.up_proj.weight),
                     mlp.down_proj.weight));
  expect_same(
      graph, environment, gelu_mlp(x),
      linear(gelu(linear(x, gelu_mlp.fc1.weight, gelu_mlp.fc1.bias), GeluApproximation::tanh),
             gelu_mlp.fc2.weight, gelu_mlp.fc2.bias));
}

// Attention written head by head: slices of the projections, a shared key/value head for each
// group of query heads, an explicit causal mask and softmax.
Tensor attention_by_hand(const nn::MultiHeadAttention& attention, Tensor x, double theta) {
  Graph& graph = x.graph();
  const int64_t length = x.dim(1);
  const int64_t head_dim = attention.head_dim;
  const int64_t group = attention.heads / attention.options.kv_heads;
  std::vector<double> causal(static_cast<size_t>(length * length), 0.0);
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t j = i + 1; j < length; ++j) causal[i * length + j] = -1e30;
  }
  const Tensor mask(&graph, graph.constant(causal, {DType::f32, {length, length}}));
  const auto head = [&](Tensor projected, int64_t index, bool rotate) {
    Tensor part = unsqueeze(slice(projected, 2, index * head_dim, (index + 1) * head_dim), 1);
    if (rotate) part = rope(part, theta);
    return squeeze(part, 1);  // [B, S, Dh]
  };
  const Tensor q = linear(x, attention.q_proj.weight);
  const Tensor k = linear(x, attention.k_proj.weight);
  const Tensor v = linear(x, attention.v_proj.weight);
  std::vector<Tensor> outputs;
  for (int64_t h = 0; h < attention.heads; ++h) {
    const Tensor scores = matmul(head(q, h, true), head(k, h / group, true), false, true) /
                          std::sqrt(static_cast<double>(head_dim));
    outputs.push_back(matmul(softmax(scores + mask), head(v, h / group, false)));
  }
  return linear(concat(outputs, -1), attention.o_proj.weight);
}

TEST(Nn, GroupedQueryAttentionMatchesHeadByHead) {
  std::mt19937_64 generator(6);
  Graph graph;
  const nn::MultiHeadAttention attention(graph, "attn", 8, 4,
                                         {.kv_heads = 2, .causal = true, .rope_theta = 100.0});
  Environment environment = random_environment(graph, generator);
  const Tensor x = random_input(graph, environment, generator, "x", {2, 3, 8});
  expect_same(graph, environment, attention(x), attention_by_hand(attention, x, 100.0), 1e-10);
}

TEST(Nn, TransformerBlockGradientMatchesFiniteDifferences) {
  std::mt19937_64 generator(7);
  Graph graph;
  const std::string prefix = "model.layers.0";
  const nn::RMSNorm input_norm(graph, prefix + ".input_layernorm", 8);
  const nn::MultiHeadAttention attention(graph, prefix + ".self_attn", 8, 4,
                                         {.kv_heads = 2, .causal = true, .rope_theta = 10000.0});
  const nn::RMSNorm post_norm(graph, prefix + ".post_attention_layernorm", 8);
  const nn::MLP mlp(graph, prefix + ".mlp", 8, 12);
  Environment environment = random_environment(graph, generator);

  const Tensor x = random_input(graph, environment, generator, "x", {2, 3, 8});
  const Tensor hidden = x + attention(input_norm(x));
  const Tensor out = hidden + mlp(post_norm(hidden));
  // Each output element counts with its own weight, so no symmetry cancels a gradient.
  const Tensor weights = random_input(graph, environment, generator, "weights", out.shape());
  const Tensor loss = sum_all(out * weights);
  const Tensor& checked = attention.k_proj.weight;
  const std::map<ValueId, ValueId> grads = gradients(graph, loss.id(), {checked.id()});
  verify(graph);

  const std::string name = graph.node(checked.id()).name;
  const HostTensor analytic = evaluate(graph, environment)[grads.at(checked.id())];
  const double step_size = 1e-6;
  double difference = 0, norm = 0;
  for (int64_t k = 0; k < analytic.elements(); ++k) {
    Environment shifted = environment;
    shifted.leaves[name].data[k] += step_size;
    const double plus = evaluate(graph, shifted)[loss.id()].data[0];
    shifted.leaves[name].data[k] -= 2 * step_size;
    const double minus = evaluate(graph, shifted)[loss.id()].data[0];
    const double numeric = (plus - minus) / (2 * step_size);
    difference += std::pow(analytic.data[k] - numeric, 2);
    norm += numeric * numeric;
  }
  EXPECT_GT(std::sqrt(norm), 0.0);
  EXPECT_LT(std::sqrt(difference) / std::sqrt(norm), 1e-6);
}

TEST(Nn, MisuseNamesLayerAndShapes) {
  Graph graph;
  const Tensor x = input(graph, "x", {2, 5});
  const nn::Linear fc(graph, "model.fc1", 4, 3);
  expect_error([&] { fc(x); }, {"nn::Linear", "model.fc1", "f32[2, 5]", "[..., 4]"});

  expect_error([&] { nn::MultiHeadAttention(graph, "model.attn", 10, 4); },
               {"model.attn", "4 heads", "dim 10"});
  expect_error([&] { nn::MultiHeadAttention(graph, "model.attn", 12, 4, {.kv_heads = 3}); },
               {"model.attn", "3 kv_heads", "4 heads"});
  EXPECT_EQ(graph.find_leaf("model.attn.q_proj.weight"), kNoValue)
      << "a rejected layer must not leave parameters behind";
  const nn::MultiHeadAttention attention(graph, "model.self_attn", 8, 2);
  expect_error(
      [&] {
        attention(input(graph, "tokens", {2, 3, 6}));
      },
      {"model.self_attn", "f32[2, 3, 6]", "8 features"});

  const nn::Conv2d conv(graph, "model.conv", 3, 4, 3);
  expect_error(
      [&] {
        conv(input(graph, "images", {1, 2, 5, 5}));
      },
      {"nn::Conv2d", "model.conv", "f32[1, 2, 5, 5]", "3 channels"});
  expect_error([&] { nn::Conv2d(graph, "model.grouped", 3, 4, 3, {.groups = 2}); },
               {"model.grouped", "2 groups"});
  expect_error([&] { nn::GroupNorm(graph, "model.gn", 3, 4); },
               {"model.gn", "3 groups", "4 channels"});
  const nn::Embedding embedding(graph, "model.embed", 5, 2);
  expect_error([&] { embedding(x); }, {"model.embed", "f32[2, 5]", "i32"});
  const nn::BatchNorm2d batch_norm(graph, "model.bn", 3);
  expect_error([&] { batch_norm(x, true); }, {"model.bn", "f32[2, 5]"});
}

}  // namespace
}  // namespace mg
