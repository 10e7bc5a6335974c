// The UNet2DConditionModel graph, block by block as diffusers composes it (unet_2d_condition.py,
// unet_2d_blocks.py, resnet.py, transformers/transformer_2d.py, attention.py, embeddings.py).
#include "models/unet.hpp"

#include <cmath>

#include "meganeura/error.hpp"
#include "meganeura/nn.hpp"

namespace mg::models {
namespace {

class UNetBuilder {
 public:
  UNetBuilder(const UNetConfig& config, Graph& graph, Tensor context)
      : config_(config), graph_(graph), context_(context) {}

  // Timesteps -> sinusoidal features (diffusers' get_timestep_embedding, f32 frequencies) ->
  // time_embedding.linear_1, SiLU, linear_2.
  Tensor time_embedding(Tensor timestep) {
    const int64_t dim = config_.block_out_channels[0];
    const int64_t half = dim / 2;
    std::vector<double> frequencies(half);
    for (int64_t i = 0; i < half; ++i) {
      const float exponent = static_cast<float>(-std::log(10000.0) * static_cast<double>(i)) /
                             static_cast<float>(static_cast<double>(half) - config_.freq_shift);
      frequencies[i] = static_cast<double>(std::exp(exponent));
    }
    const Tensor frequency(&graph_, graph_.constant(frequencies, {DType::f32, {1, half}}));
    const Tensor angles = reshape(timestep, {timestep.dim(0), 1}) * frequency;
    const Tensor sines = sin(angles), cosines = cos(angles);
    Tensor features =
        config_.flip_sin_to_cos ? concat({cosines, sines}, 1) : concat({sines, cosines}, 1);
    if (dim % 2 == 1) features = pad(features, {{0, 0}, {0, 1}});
    const nn::Linear linear_1(graph_, "time_embedding.linear_1", dim, config_.time_embed_dim);
    const nn::Linear linear_2(graph_, "time_embedding.linear_2", config_.time_embed_dim,
                              config_.time_embed_dim);
    return linear_2(silu(linear_1(features)));
  }

  // ResnetBlock2D with time_embedding_norm "default".
  Tensor resnet(Tensor x, const std::string& prefix, int64_t out, Tensor time,
                double output_scale = 1.0) {
    const int64_t in = x.dim(1);
    const nn::GroupNorm norm1(graph_, prefix + ".norm1", config_.norm_num_groups, in,
                              config_.norm_eps);
    const nn::Conv2d conv1(graph_, prefix + ".conv1", in, out, 3, padded(1));
    const nn::Linear time_emb_proj(graph_, prefix + ".time_emb_proj", config_.time_embed_dim, out);
    const nn::GroupNorm norm2(graph_, prefix + ".norm2", config_.norm_num_groups, out,
                              config_.norm_eps);
    const nn::Conv2d conv2(graph_, prefix + ".conv2", out, out, 3, padded(1));
    Tensor h = conv1(silu(norm1(x)));
    h = h + reshape(time_emb_proj(silu(time)), {x.dim(0), out, 1, 1});
    h = conv2(silu(norm2(h)));
    if (in != out) x = nn::Conv2d(graph_, prefix + ".conv_shortcut", in, out, 1)(x);
    const Tensor sum = x + h;
    return output_scale == 1.0 ? sum : sum / output_scale;
  }

  // Attention (attention_processor.py): to_q, to_k, to_v without bias, to_out.0 with bias.
  Tensor attention(Tensor x, const std::string& prefix, int64_t heads, Tensor keys_from) {
    const int64_t dim = x.dim(2), head_dim = dim / heads;
    const nn::Linear to_q(graph_, prefix + ".to_q", dim, dim, false);
    const nn::Linear to_k(graph_, prefix + ".to_k", keys_from.dim(2), dim, false);
    const nn::Linear to_v(graph_, prefix + ".to_v", keys_from.dim(2), dim, false);
    const nn::Linear to_out(graph_, prefix + ".to_out.0", dim, dim);
    const auto split_heads = [&](Tensor projected) {
      return transpose(reshape(projected, {projected.dim(0), projected.dim(1), heads, head_dim}), 1,
                       2);
    };
    const Tensor attended = scaled_dot_product_attention(
        split_heads(to_q(x)), split_heads(to_k(keys_from)), split_heads(to_v(keys_from)));
    return to_out(reshape(transpose(attended, 1, 2), {x.dim(0), x.dim(1), dim}));
  }

  // BasicTransformerBlock: self-attention, cross-attention to the context, GEGLU feed-forward,
  // each after a LayerNorm and added to its input.
  Tensor transformer_block(Tensor x, const std::string& prefix, int64_t heads) {
    const int64_t dim = x.dim(2), inner = dim * 4;
    const nn::LayerNorm norm1(graph_, prefix + ".norm1", dim);
    const Tensor normed = norm1(x);
    x = x + attention(normed, prefix + ".attn1", heads, normed);
    const nn::LayerNorm norm2(graph_, prefix + ".norm2", dim);
    x = x + attention(norm2(x), prefix + ".attn2", heads, context_);
    const nn::LayerNorm norm3(graph_, prefix + ".norm3", dim);
    const nn::Linear proj(graph_, prefix + ".ff.net.0.proj", dim, inner * 2);
    const nn::Linear out(graph_, prefix + ".ff.net.2", inner, dim);
    const std::vector<Tensor> halves = split(proj(norm3(x)), {inner, inner}, 2);
    return x + out(halves[0] * gelu(halves[1]));
  }

  // Transformer2DModel on continuous input: GroupNorm (eps 1e-6), proj_in (1x1 conv or linear),
  // the blocks over the H*W positions, proj_out, plus the input.
  Tensor transformer(Tensor x, const std::string& prefix, int64_t heads, int64_t layers) {
    const int64_t batch = x.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
    const nn::GroupNorm norm(graph_, prefix + ".norm", config_.norm_num_groups, channels, 1e-6);
    const auto to_tokens = [&](Tensor image) {
      return reshape(transpose(image, {0, 2, 3, 1}), {batch, height * width, image.dim(1)});
    };
    const auto to_image = [&](Tensor tokens) {
      return transpose(reshape(tokens, {batch, height, width, tokens.dim(2)}), {0, 3, 1, 2});
    };
    Tensor h = norm(x);
    if (config_.use_linear_projection) {
      h = nn::Linear(graph_, prefix + ".proj_in", channels, channels)(to_tokens(h));
    } else {
      h = to_tokens(nn::Conv2d(graph_, prefix + ".proj_in", channels, channels, 1)(h));
    }
    for (int64_t i = 0; i < layers; ++i) {
      h = transformer_block(h, prefix + ".transformer_blocks." + std::to_string(i), heads);
    }
    if (config_.use_linear_projection) {
      h = to_image(nn::Linear(graph_, prefix + ".proj_out", channels, channels)(h));
    } else {
      h = nn::Conv2d(graph_, prefix + ".proj_out", channels, channels, 1)(to_image(h));
    }
    return h + x;
  }

  Tensor downsample(Tensor x, const std::string& prefix) {
    Conv2dOptions options = padded(config_.downsample_padding);
    options.stride = {2, 2};
    // diffusers pads right and bottom by one when the convolution itself pads nothing.
    if (config_.downsample_padding == 0) x = pad(x, {{0, 0}, {0, 0}, {0, 1}, {0, 1}});
    return nn::Conv2d(graph_, prefix + ".conv", x.dim(1), x.dim(1), 3, options)(x);
  }

  Tensor upsample(Tensor x, const std::string& prefix) {
    return nn::Conv2d(graph_, prefix + ".conv", x.dim(1), x.dim(1), 3,
                      padded(1))(upsample_nearest2d(x, 2));
  }

  Tensor forward(Tensor sample, Tensor timestep) {
    const Tensor time = time_embedding(timestep);
    const int64_t blocks = static_cast<int64_t>(config_.block_out_channels.size());
    if (config_.center_input_sample) sample = 2.0 * sample - 1.0;
    Tensor x = nn::Conv2d(graph_, "conv_in", config_.in_channels, config_.block_out_channels[0],
                          config_.conv_in_kernel, padded(config_.conv_in_kernel / 2))(sample);
    std::vector<Tensor> skips = {x};
    for (int64_t i = 0; i < blocks; ++i) {
      const UNetBlockConfig& block = config_.down_blocks[i];
      const std::string prefix = "down_blocks." + std::to_string(i);
      for (int64_t j = 0; j < block.layers; ++j) {
        const std::string index = std::to_string(j);
        x = resnet(x, prefix + ".resnets." + index, config_.block_out_channels[i], time);
        if (block.has_attention()) {
          x = transformer(x, prefix + ".attentions." + index, block.heads,
                          block.transformer_layers);
        }
        skips.push_back(x);
      }
      if (i + 1 < blocks) {
        x = downsample(x, prefix + ".downsamplers.0");
        skips.push_back(x);
      }
    }
    if (config_.mid_block) {
      const int64_t channels = x.dim(1);
      x = resnet(x, "mid_block.resnets.0", channels, time, config_.mid_block_scale_factor);
      x = transformer(x, "mid_block.attentions.0", config_.mid_heads,
                      config_.mid_transformer_layers);
      x = resnet(x, "mid_block.resnets.1", channels, time, config_.mid_block_scale_factor);
    }
    for (int64_t i = 0; i < blocks; ++i) {
      const UNetBlockConfig& block = config_.up_blocks[i];
      const std::string prefix = "up_blocks." + std::to_string(i);
      const int64_t out = config_.block_out_channels[blocks - 1 - i];
      for (int64_t j = 0; j < block.layers; ++j) {
        const std::string index = std::to_string(j);
        x = concat({x, skips.back()}, 1);
        skips.pop_back();
        x = resnet(x, prefix + ".resnets." + index, out, time);
        if (block.has_attention()) {
          x = transformer(x, prefix + ".attentions." + index, block.heads,
                          block.transformer_layers);
        }
      }
      if (i + 1 < blocks) x = upsample(x, prefix + ".upsamplers.0");
    }
    const nn::GroupNorm conv_norm_out(graph_, "conv_norm_out", config_.norm_num_groups,
                                      config_.block_out_channels[0], config_.norm_eps);
    return nn::Conv2d(graph_, "conv_out", config_.block_out_channels[0], config_.out_channels,
                      config_.conv_out_kernel,
                      padded(config_.conv_out_kernel / 2))(silu(conv_norm_out(x)));
  }

 private:
  static Conv2dOptions padded(int64_t padding) {
    Conv2dOptions options;
    options.padding = {padding, padding};
    return options;
  }

  const UNetConfig& config_;
  Graph& graph_;
  Tensor context_;
};

void check_inputs(const UNetConfig& config, Tensor sample, Tensor timestep, Tensor context) {
  const Shape& shape = sample.shape();
  const int64_t factor = config.downsampling_factor();
  if (shape.size() != 4 || shape[1] != config.in_channels || shape[2] % factor != 0 ||
      shape[3] % factor != 0) {
    throw Error("U-Net sample " + shape_string(shape) + " does not fit: expected [B, " +
                std::to_string(config.in_channels) + ", H, W] with H and W multiples of " +
                std::to_string(factor));
  }
  if (timestep.rank() != 1 || timestep.dim(0) != shape[0]) {
    throw Error("U-Net timestep " + shape_string(timestep.shape()) + " does not fit: expected [" +
                std::to_string(shape[0]) + "]");
  }
  if (context.rank() != 3 || context.dim(0) != shape[0] ||
      context.dim(2) != config.cross_attention_dim) {
    throw Error("U-Net encoder_hidden_states " + shape_string(context.shape()) +
                " does not fit: expected [" + std::to_string(shape[0]) + ", tokens, " +
                std::to_string(config.cross_attention_dim) +
                "] (the config's cross_attention_dim)");
  }
}

struct UNetInputs {
  Tensor sample, timestep, context;
};

UNetInputs declare_inputs(Graph& graph, const UNetConfig& config, const UNetShape& shape) {
  if (shape.batch < 1 || shape.height < 1 || shape.width < 1 || shape.tokens < 1) {
    throw Error("U-Net batch, height, width and tokens must be positive");
  }
  return {input(graph, kUNetSample, {shape.batch, config.in_channels, shape.height, shape.width}),
          input(graph, kUNetTimestep, {shape.batch}),
          input(graph, kUNetContext, {shape.batch, shape.tokens, config.cross_attention_dim})};
}

}  // namespace

Tensor unet_forward(const UNetConfig& config, Tensor sample, Tensor timestep, Tensor context) {
  check_inputs(config, sample, timestep, context);
  return UNetBuilder(config, sample.graph(), context).forward(sample, timestep);
}

Graph unet_graph(const UNetConfig& config, const UNetShape& shape) {
  Graph graph;
  const UNetInputs inputs = declare_inputs(graph, config, shape);
  graph.set_output(kUNetNoisePrediction,
                   unet_forward(config, inputs.sample, inputs.timestep, inputs.context).id());
  return graph;
}

Graph unet_loss_graph(const UNetConfig& config, const UNetShape& shape, bool with_prediction) {
  Graph graph;
  const UNetInputs inputs = declare_inputs(graph, config, shape);
  const Tensor prediction = unet_forward(config, inputs.sample, inputs.timestep, inputs.context);
  const Tensor noise = input(graph, kUNetNoise, prediction.shape());
  graph.set_output(kUNetLoss, mse_loss(prediction, noise).id());
  if (with_prediction) graph.set_output(kUNetNoisePrediction, prediction.id());
  return graph;
}

std::vector<std::pair<std::string, Shape>> unet_parameters(const UNetConfig& config) {
  const int64_t side = config.downsampling_factor();
  const Graph graph = unet_graph(config, {1, side, side, 1});
  std::vector<std::pair<std::string, Shape>> parameters;
  for (ValueId id : graph.leaves("parameter"))
    parameters.emplace_back(graph.node(id).name, graph.type(id).shape);
  return parameters;
}

}  // namespace mg::models
