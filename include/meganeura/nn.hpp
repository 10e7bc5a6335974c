#pragma once
// Layers for writing models, on top of the builder functions of ops.hpp. Each layer creates its
// parameters in a Graph under a name prefix with Hugging Face conventions ("model.layers.0.mlp"
// + ".up_proj.weight"), so checkpoints map one to one, and PyTorch's default initialisation.
// Parameters are public members; operator() appends the layer's ops to the parameters' graph.
// Misuse throws mg::Error naming the layer's prefix and the shapes involved.
#include <cstdint>
#include <optional>
#include <string>

#include "meganeura/ops.hpp"

namespace mg::nn {

// y = x W^T + b on x [..., in]; weight [out, in], bias [out], both U(-1/sqrt(in), 1/sqrt(in)).
class Linear {
 public:
  Linear(Graph& graph, std::string prefix, int64_t in_features, int64_t out_features,
         bool bias = true);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  int64_t in_features;
  int64_t out_features;
  Tensor weight;
  std::optional<Tensor> bias;
};

// NCHW convolution; weight [out, in/groups, kernel, kernel], bias [out], both
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in/groups * kernel * kernel.
class Conv2d {
 public:
  Conv2d(Graph& graph, std::string prefix, int64_t in_channels, int64_t out_channels,
         int64_t kernel, Conv2dOptions options = {}, bool bias = true);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  int64_t in_channels;
  int64_t out_channels;
  Conv2dOptions options;
  Tensor weight;
  std::optional<Tensor> bias;
};

// Table lookup of i32 indices (any shape S) -> [S..., dim]; weight [vocab, dim] ~ N(0, 1).
class Embedding {
 public:
  Embedding(Graph& graph, std::string prefix, int64_t vocab, int64_t dim);
  Tensor operator()(Tensor indices) const;

  std::string prefix;
  int64_t vocab;
  int64_t dim;
  Tensor weight;
};

// Over the last axis of size `dim`; weight ones, bias zeros.
class LayerNorm {
 public:
  LayerNorm(Graph& graph, std::string prefix, int64_t dim, double eps = 1e-5);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  int64_t dim;
  double eps;
  Tensor weight;
  Tensor bias;
};

// Over the last axis of size `dim` (Llama's default eps); weight ones.
class RMSNorm {
 public:
  RMSNorm(Graph& graph, std::string prefix, int64_t dim, double eps = 1e-6);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  int64_t dim;
  double eps;
  Tensor weight;
};

// x [N, channels, ...] normalised over groups of channels; weight ones, bias zeros.
class GroupNorm {
 public:
  GroupNorm(Graph& graph, std::string prefix, int64_t groups, int64_t channels, double eps = 1e-5);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  int64_t groups;
  int64_t channels;
  double eps;
  Tensor weight;
  Tensor bias;
};

// x [N, channels, H, W]. running_mean (zeros) and running_var (ones) are state leaves: training
// normalises with the batch statistics and updates them after each run (PyTorch's rule);
// inference normalises with them.
class BatchNorm2d {
 public:
  BatchNorm2d(Graph& graph, std::string prefix, int64_t channels, double momentum = 0.1,
              double eps = 1e-5);
  Tensor operator()(Tensor x, bool training) const;

  std::string prefix;
  int64_t channels;
  double momentum;
  double eps;
  Tensor weight;
  Tensor bias;
  Tensor running_mean;
  Tensor running_var;
};

// Llama's gated feed-forward: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases by default.
class MLP {
 public:
  MLP(Graph& graph, std::string prefix, int64_t dim, int64_t hidden, bool bias = false);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  Linear gate_proj;
  Linear up_proj;
  Linear down_proj;
};

// The plain two-layer feed-forward of ViT/CLIP: fc2(gelu(fc1(x))).
class GeluMLP {
 public:
  GeluMLP(Graph& graph, std::string prefix, int64_t dim, int64_t hidden, bool bias = true,
          GeluApproximation approximation = GeluApproximation::none);
  Tensor operator()(Tensor x) const;

  std::string prefix;
  GeluApproximation approximation;
  Linear fc1;
  Linear fc2;
};

struct MultiHeadAttentionOptions {
  int64_t kv_heads = 0;              // grouped-query attention; 0 = as many as query heads
  bool causal = false;               // each position attends to itself and earlier ones
  std::optional<double> rope_theta;  // rotary embeddings on queries and keys when set
  bool bias = false;                 // biases on the four projections (Llama has none)
};

// Self-attention on x [B, S, dim] with heads of dim/heads features: q_proj, k_proj, v_proj
// project, heads attend through scaled_dot_product_attention, o_proj merges the heads.
class MultiHeadAttention {
 public:
  MultiHeadAttention(Graph& graph, std::string prefix, int64_t dim, int64_t heads,
                     MultiHeadAttentionOptions options = {});
  // `mask` is additive and broadcastable to [B, heads, S, S] (padding masks);
  // `position_offset` is the rotary position of the first token.
  Tensor operator()(Tensor x, std::optional<Tensor> mask = std::nullopt,
                    int64_t position_offset = 0) const;

  std::string prefix;
  int64_t dim;
  int64_t heads;
  int64_t head_dim;
  MultiHeadAttentionOptions options;
  Linear q_proj;
  Linear k_proj;
  Linear v_proj;
  Linear o_proj;
};

}  // namespace mg::nn
