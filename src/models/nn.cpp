#include "meganeura/nn.hpp"

#include <cmath>
#include <utility>

namespace mg::nn {
namespace {

// Every message starts with the layer kind and its prefix, so the user finds the faulty line.
[[noreturn]] void fail(std::string_view layer, const std::string& prefix,
                       const std::string& problem) {
  throw Error("nn::" + std::string(layer) + " '" + prefix + "': " + problem);
}

void check_positive(std::string_view layer, const std::string& prefix, std::string_view what,
                    int64_t value) {
  if (value <= 0) {
    fail(layer, prefix, std::string(what) + " must be positive, got " + std::to_string(value));
  }
}

// Checks that x has rank `rank` (or at least 1 when rank is 0) and `expected` at `axis`.
void check_input(std::string_view layer, const std::string& prefix, const Tensor& x, int64_t rank,
                 int64_t axis, int64_t expected, std::string_view what) {
  const bool rank_fits = rank == 0 ? x.rank() >= 1 : x.rank() == rank;
  if (!rank_fits || x.dim(axis) != expected) {
    const std::string layout = rank == 0 ? "[..., " + std::to_string(expected) + "]"
                                         : "rank " + std::to_string(rank) + " with " +
                                               std::to_string(expected) + " " + std::string(what);
    fail(layer, prefix, "input " + type_string(x.type()) + " does not fit, expected " + layout);
  }
}

// PyTorch's default initialisation for Linear and Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Init fan_in_uniform(int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return Init::uniform(-bound, bound);
}

// Runs before any projection is created, so a misconfigured layer leaves no parameters behind.
int64_t checked_head_dim(const std::string& prefix, int64_t dim, int64_t heads,
                         MultiHeadAttentionOptions& options) {
  check_positive("MultiHeadAttention", prefix, "dim", dim);
  check_positive("MultiHeadAttention", prefix, "heads", heads);
  if (options.kv_heads == 0) options.kv_heads = heads;
  check_positive("MultiHeadAttention", prefix, "kv_heads", options.kv_heads);
  if (dim % heads != 0) {
    fail("MultiHeadAttention", prefix,
         std::to_string(heads) + " heads do not divide dim " + std::to_string(dim));
  }
  if (heads % options.kv_heads != 0) {
    fail("MultiHeadAttention", prefix,
         std::to_string(options.kv_heads) + " kv_heads do not divide " + std::to_string(heads) +
             " heads");
  }
  const int64_t head_dim = dim / heads;
  if (options.rope_theta && head_dim % 2 != 0) {
    fail("MultiHeadAttention", prefix,
         "rotary embeddings need an even head dimension, got " + std::to_string(head_dim));
  }
  return head_dim;
}

}  // namespace

Linear::Linear(Graph& graph, std::string prefix_, int64_t in_features_, int64_t out_features_,
               bool bias_)
    : prefix(std::move(prefix_)), in_features(in_features_), out_features(out_features_) {
  check_positive("Linear", prefix, "in_features", in_features);
  check_positive("Linear", prefix, "out_features", out_features);
  weight = parameter(graph, prefix + ".weight", {out_features, in_features},
                     fan_in_uniform(in_features));
  if (bias_) bias = parameter(graph, prefix + ".bias", {out_features}, fan_in_uniform(in_features));
}

Tensor Linear::operator()(Tensor x) const {
  check_input("Linear", prefix, x, 0, -1, in_features, "features");
  return linear(x, weight, bias);
}

Conv2d::Conv2d(Graph& graph, std::string prefix_, int64_t in_channels_, int64_t out_channels_,
               int64_t kernel, Conv2dOptions options_, bool bias_)
    : prefix(std::move(prefix_)),
      in_channels(in_channels_),
      out_channels(out_channels_),
      options(std::move(options_)) {
  check_positive("Conv2d", prefix, "in_channels", in_channels);
  check_positive("Conv2d", prefix, "out_channels", out_channels);
  check_positive("Conv2d", prefix, "kernel", kernel);
  check_positive("Conv2d", prefix, "groups", options.groups);
  if (in_channels % options.groups != 0 || out_channels % options.groups != 0) {
    fail("Conv2d", prefix,
         std::to_string(options.groups) + " groups must divide in_channels " +
             std::to_string(in_channels) + " and out_channels " + std::to_string(out_channels));
  }
  const int64_t group_channels = in_channels / options.groups;
  const Init init = fan_in_uniform(group_channels * kernel * kernel);
  weight =
      parameter(graph, prefix + ".weight", {out_channels, group_channels, kernel, kernel}, init);
  if (bias_) bias = parameter(graph, prefix + ".bias", {out_channels}, init);
}

Tensor Conv2d::operator()(Tensor x) const {
  check_input("Conv2d", prefix, x, 4, 1, in_channels, "channels at axis 1");
  return conv2d(x, weight, bias, options);
}

Embedding::Embedding(Graph& graph, std::string prefix_, int64_t vocab_, int64_t dim_)
    : prefix(std::move(prefix_)), vocab(vocab_), dim(dim_) {
  check_positive("Embedding", prefix, "vocab", vocab);
  check_positive("Embedding", prefix, "dim", dim);
  weight = parameter(graph, prefix + ".weight", {vocab, dim}, Init::normal(0.0, 1.0));
}

Tensor Embedding::operator()(Tensor indices) const {
  if (indices.dtype() != DType::i32) {
    fail("Embedding", prefix, "indices " + type_string(indices.type()) + " must be i32");
  }
  return gather(weight, indices);
}

LayerNorm::LayerNorm(Graph& graph, std::string prefix_, int64_t dim_, double eps_)
    : prefix(std::move(prefix_)), dim(dim_), eps(eps_) {
  check_positive("LayerNorm", prefix, "dim", dim);
  weight = parameter(graph, prefix + ".weight", {dim}, Init::ones());
  bias = parameter(graph, prefix + ".bias", {dim}, Init::zeros());
}

Tensor LayerNorm::operator()(Tensor x) const {
  check_input("LayerNorm", prefix, x, 0, -1, dim, "features");
  return layer_norm(x, weight, bias, eps);
}

RMSNorm::RMSNorm(Graph& graph, std::string prefix_, int64_t dim_, double eps_)
    : prefix(std::move(prefix_)), dim(dim_), eps(eps_) {
  check_positive("RMSNorm", prefix, "dim", dim);
  weight = parameter(graph, prefix + ".weight", {dim}, Init::ones());
}

Tensor RMSNorm::operator()(Tensor x) const {
  check_input("RMSNorm", prefix, x, 0, -1, dim, "features");
  return rms_norm(x, weight, eps);
}

GroupNorm::GroupNorm(Graph& graph, std::string prefix_, int64_t groups_, int64_t channels_,
                     double eps_)
    : prefix(std::move(prefix_)), groups(groups_), channels(channels_), eps(eps_) {
  check_positive("GroupNorm", prefix, "groups", groups);
  check_positive("GroupNorm", prefix, "channels", channels);
  if (channels % groups != 0) {
    fail(
        "GroupNorm", prefix,
        std::to_string(groups) + " groups do not divide " + std::to_string(channels) + " channels");
  }
  weight = parameter(graph, prefix + ".weight", {channels}, Init::ones());
  bias = parameter(graph, prefix + ".bias", {channels}, Init::zeros());
}

Tensor GroupNorm::operator()(Tensor x) const {
  if (x.rank() < 2 || x.dim(1) != channels) {
    fail("GroupNorm", prefix,
         "input " + type_string(x.type()) + " does not fit, expected [N, " +
             std::to_string(channels) + ", ...]");
  }
  return group_norm(x, groups, weight, bias, eps);
}

BatchNorm2d::BatchNorm2d(Graph& graph, std::string prefix_, int64_t channels_, double momentum_,
                         double eps_)
    : prefix(std::move(prefix_)), channels(channels_), momentum(momentum_), eps(eps_) {
  check_positive("BatchNorm2d", prefix, "channels", channels);
  weight = parameter(graph, prefix + ".weight", {channels}, Init::ones());
  bias = parameter(graph, prefix + ".bias", {channels}, Init::zeros());
  running_mean = Tensor(
      &graph, graph.state(prefix + ".running_mean", {DType::f32, {channels}}, Init::zeros()));
  running_var =
      Tensor(&graph, graph.state(prefix + ".running_var", {DType::f32, {channels}}, Init::ones()));
}

Tensor BatchNorm2d::operator()(Tensor x, bool training) const {
  check_input("BatchNorm2d", prefix, x, 4, 1, channels, "channels at axis 1");
  return batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps);
}

MLP::MLP(Graph& graph, std::string prefix_, int64_t dim, int64_t hidden, bool bias)
    : prefix(std::move(prefix_)),
      gate_proj(graph, prefix + ".gate_proj", dim, hidden, bias),
      up_proj(graph, prefix + ".up_proj", dim, hidden, bias),
      down_proj(graph, prefix + ".down_proj", hidden, dim, bias) {}

Tensor MLP::operator()(Tensor x) const {
  return down_proj(silu(gate_proj(x)) * up_proj(x));
}

GeluMLP::GeluMLP(Graph& graph, std::string prefix_, int64_t dim, int64_t hidden, bool bias,
                 GeluApproximation approximation_)
    : prefix(std::move(prefix_)),
      approximation(approximation_),
      fc1(graph, prefix + ".fc1", dim, hidden, bias),
      fc2(graph, prefix + ".fc2", hidden, dim, bias) {}

Tensor GeluMLP::operator()(Tensor x) const {
  return fc2(gelu(fc1(x), approximation));
}

MultiHeadAttention::MultiHeadAttention(Graph& graph, std::string prefix_, int64_t dim_,
                                       int64_t heads_, MultiHeadAttentionOptions options_)
    : prefix(std::move(prefix_)),
      dim(dim_),
      heads(heads_),
      head_dim(checked_head_dim(prefix, dim_, heads_, options_)),
      options(options_),
      q_proj(graph, prefix + ".q_proj", dim, heads * head_dim, options.bias),
      k_proj(graph, prefix + ".k_proj", dim, options.kv_heads * head_dim, options.bias),
      v_proj(graph, prefix + ".v_proj", dim, options.kv_heads * head_dim, options.bias),
      o_proj(graph, prefix + ".o_proj", heads * head_dim, dim, options.bias) {}

Tensor MultiHeadAttention::operator()(Tensor x, std::optional<Tensor> mask,
                                      int64_t position_offset) const {
  check_input("MultiHeadAttention", prefix, x, 3, 2, dim, "features ([B, S, D])");
  const int64_t batch = x.dim(0);
  const int64_t length = x.dim(1);
  // [B, S, H * Dh] -> [B, H, S, Dh], the layout scaled_dot_product_attention and rope take.
  const auto split_heads = [&](Tensor projected, int64_t count) {
    return transpose(reshape(projected, {batch, length, count, head_dim}), 1, 2);
  };
  Tensor q = split_heads(q_proj(x), heads);
  Tensor k = split_heads(k_proj(x), options.kv_heads);
  const Tensor v = split_heads(v_proj(x), options.kv_heads);
  if (options.rope_theta) {
    q = rope(q, *options.rope_theta, position_offset);
    k = rope(k, *options.rope_theta, position_offset);
  }
  const Tensor attended =
      scaled_dot_product_attention(q, k, v, {.causal = options.causal, .mask = mask});
  return o_proj(reshape(transpose(attended, 1, 2), {batch, length, heads * head_dim}));
}

}  // namespace mg::nn
