// SmolVLA's graphs: the SigLIP tower, the connector, the cut text model over the prefix, and the
// action expert over the action chunk (models/smolvla.hpp).
#include "models/smolvla.hpp"

#include <cmath>
#include <functional>
#include <map>

#include "meganeura/error.hpp"
#include "meganeura/ops.hpp"

namespace mg::models {
namespace {

// LeRobot's apply_rope uses a fixed max_wavelength, not the text model's rope_theta.
constexpr double kRopeWavelength = 10000.0;

// The input width of one of LeRobot's projections (for its bias's initialisation).
int64_t in_features(const SmolVLAConfig& config, const std::string& bias_name) {
  const std::string weight = bias_name.substr(0, bias_name.size() - 4) + "weight";
  for (const SmolVLAParameter& parameter : smolvla_parameters(config))
    if (parameter.name == weight) return parameter.shape[1];
  return 1;
}

class Weights {
 public:
  Weights(Graph& graph, const SmolVLAConfig& config,
          const std::function<bool(const SmolVLAParameter&)>& trainable) {
    for (const SmolVLAParameter& parameter : smolvla_parameters(config)) {
      const std::string& name = parameter.name;
      const bool norm = parameter.shape.size() == 1 && name.ends_with("norm.weight");
      const bool layer_norm = name.find("layer_norm") != std::string::npos ||
                              name.find("post_layernorm") != std::string::npos;
      Init init = Init::normal(0.0, 0.02);
      if (name.ends_with(".bias")) init = Init::zeros();
      if (parameter.part == SmolVLAPart::projections) {
        // LeRobot's own projections are torch.nn.Linear with PyTorch's default initialisation.
        const double bound =
            1.0 / std::sqrt(static_cast<double>(name.ends_with(".bias") ? in_features(config, name)
                                                                        : parameter.shape[1]));
        init = Init::uniform(-bound, bound);
      }
      if (norm || (layer_norm && name.ends_with(".weight"))) init = Init::ones();
      tensors_[name] = trainable(parameter)
                           ? mg::parameter(graph, name, parameter.shape, init)
                           : Tensor(&graph, graph.state(name, {DType::f32, parameter.shape}, init));
    }
  }
  Tensor operator[](const std::string& name) const { return tensors_.at(name); }
  std::optional<Tensor> optional(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? std::nullopt : std::optional<Tensor>(it->second);
  }
  Tensor linear(Tensor x, const std::string& prefix) const {
    return mg::linear(x, (*this)[prefix + ".weight"], optional(prefix + ".bias"));
  }

 private:
  std::map<std::string, Tensor> tensors_;
};

// [B, S, heads * D] <-> [B, heads, S, D].
Tensor split_heads(Tensor x, int64_t heads, int64_t head_dim) {
  return transpose(reshape(x, {x.dim(0), x.dim(1), heads, head_dim}), {0, 2, 1, 3});
}

Tensor merge_heads(Tensor x) {
  const Tensor moved = transpose(x, {0, 2, 1, 3});
  return reshape(moved, {moved.dim(0), moved.dim(1), moved.dim(2) * moved.dim(3)});
}

Tensor vision_tower(const Weights& w, const SmolVLAConfig& config, Tensor pixels) {
  const SmolVLMVisionConfig& vision = config.vision;
  const std::string p = kSmolVLAVisionPrefix;
  Conv2dOptions patches;
  patches.stride = {vision.patch_size, vision.patch_size};
  Tensor x = conv2d(pixels, w[p + "embeddings.patch_embedding.weight"],
                    w[p + "embeddings.patch_embedding.bias"], patches);
  const int64_t images = x.dim(0), tokens = x.dim(2) * x.dim(3);
  x = transpose(reshape(x, {images, vision.hidden_size, tokens}), {0, 2, 1});
  x = x + w[p + "embeddings.position_embedding.weight"];
  const int64_t head_dim = vision.hidden_size / vision.heads;
  const GeluApproximation gelu_kind =
      vision.gelu_tanh ? GeluApproximation::tanh : GeluApproximation::none;
  for (int64_t i = 0; i < vision.layers; ++i) {
    const std::string layer = p + "encoder.layers." + std::to_string(i) + ".";
    Tensor h = layer_norm(x, w[layer + "layer_norm1.weight"], w[layer + "layer_norm1.bias"],
                          vision.layer_norm_eps);
    const Tensor q = split_heads(w.linear(h, layer + "self_attn.q_proj"), vision.heads, head_dim);
    const Tensor k = split_heads(w.linear(h, layer + "self_attn.k_proj"), vision.heads, head_dim);
    const Tensor v = split_heads(w.linear(h, layer + "self_attn.v_proj"), vision.heads, head_dim);
    x = x +
        w.linear(merge_heads(scaled_dot_product_attention(q, k, v)), layer + "self_attn.out_proj");
    h = layer_norm(x, w[layer + "layer_norm2.weight"], w[layer + "layer_norm2.bias"],
                   vision.layer_norm_eps);
    x = x + w.linear(gelu(w.linear(h, layer + "mlp.fc1"), gelu_kind), layer + "mlp.fc2");
  }
  return layer_norm(x, w[p + "post_layernorm.weight"], w[p + "post_layernorm.bias"],
                    vision.layer_norm_eps);
}

// Idefics3's pixel shuffle (groups of scale x scale neighbouring patches into one token of
// scale^2 times the width), then the modality projection.
Tensor connector(const Weights& w, const SmolVLAConfig& config, Tensor x) {
  const int64_t images = x.dim(0), tokens = x.dim(1), width = x.dim(2);
  const int64_t side = config.vision.image_size / config.vision.patch_size;
  const int64_t s = config.scale_factor;
  x = reshape(x, {images, side, side / s, width * s});
  x = transpose(x, {0, 2, 1, 3});
  x = reshape(x, {images, side / s, side / s, width * s * s});
  x = transpose(x, {0, 2, 1, 3});
  x = reshape(x, {images, tokens / (s * s), width * s * s});
  return mg::linear(x, w[kSmolVLAConnectorWeight]);
}

Tensor embed_prefix(const Weights& w, const SmolVLAConfig& config, Tensor pixels, Tensor ids,
                    Tensor state) {
  const int64_t batch = ids.dim(0);
  const int64_t hidden = config.text.hidden_size;
  const int64_t side = config.vision.image_size;
  Tensor images = vision_tower(
      w, config, reshape(pixels, {batch * config.cameras(), config.vision.channels, side, side}));
  images = reshape(connector(w, config, images),
                   {batch, config.cameras() * config.image_tokens(), hidden});
  const double scale = static_cast<float>(std::sqrt(static_cast<double>(hidden)));
  const Tensor language = gather(w[std::string(kSmolVLATextPrefix) + "embed_tokens.weight"], ids);
  const Tensor state_token = reshape(w.linear(state, "model.state_proj"), {batch, 1, hidden});
  return concat({images * scale, language * scale, state_token}, 1);
}

Tensor embed_suffix(const Weights& w, const SmolVLAConfig& config, Tensor noisy_actions,
                    Tensor time_embedding) {
  const int64_t batch = noisy_actions.dim(0), width = config.expert_hidden_size;
  const Tensor actions = w.linear(noisy_actions, "model.action_in_proj");
  const Tensor time =
      broadcast_to(reshape(time_embedding, {batch, 1, width}), {batch, config.chunk_size, width});
  const Tensor fused = w.linear(concat({actions, time}, 2), "model.action_time_mlp_in");
  return w.linear(silu(fused), "model.action_time_mlp_out");
}

// Rotary embedding in the rotate-half form at LeRobot's wavelength, of x [B, H, S, D]: at each
// sample's positions ([B, S], a slice of the positions input), or at 0..S-1 where there are none.
struct Rotary {
  std::optional<Tensor> positions;
};

Tensor rotate(Tensor x, const Rotary& rotary) {
  return rotary.positions ? rope(x, *rotary.positions, kRopeWavelength) : rope(x, kRopeWavelength);
}

// Everything the expert needs from the prefix, per VLM layer: its keys (rotated) and values
// [B, kv_heads, P, D], and in cross-attention layers the expert's projections of them.
struct PrefixContext {
  std::vector<Tensor> keys, values;
  std::vector<std::optional<Tensor>> expert_keys, expert_values;
  std::optional<Tensor> hidden;
};

Tensor feed_forward(const Weights& w, const std::string& layer, double eps, Tensor h) {
  const Tensor x = rms_norm(h, w[layer + "post_attention_layernorm.weight"], eps);
  const Tensor gated =
      silu(w.linear(x, layer + "mlp.gate_proj")) * w.linear(x, layer + "mlp.up_proj");
  return h + w.linear(gated, layer + "mlp.down_proj");
}

PrefixContext run_prefix(const Weights& w, const SmolVLAConfig& config, Tensor h, Tensor mask,
                         const Rotary& rotary, bool with_hidden) {
  const LlamaConfig& text = config.text;
  PrefixContext context;
  AttentionOptions options;
  options.mask = mask;
  for (int64_t i = 0; i < text.layers; ++i) {
    const std::string layer = std::string(kSmolVLATextPrefix) + "layers." + std::to_string(i) + ".";
    const Tensor x = rms_norm(h, w[layer + "input_layernorm.weight"], text.rms_norm_eps);
    const Tensor q = rotate(
        split_heads(w.linear(x, layer + "self_attn.q_proj"), text.heads, text.head_dim), rotary);
    const Tensor k = rotate(
        split_heads(w.linear(x, layer + "self_attn.k_proj"), text.kv_heads, text.head_dim), rotary);
    const Tensor v =
        split_heads(w.linear(x, layer + "self_attn.v_proj"), text.kv_heads, text.head_dim);
    context.keys.push_back(k);
    context.values.push_back(v);
    const int64_t expert = config.expert_layer_of(i);
    if (expert >= 0 && config.is_cross_layer(i)) {
      const std::string e =
          std::string(kSmolVLAExpertPrefix) + "layers." + std::to_string(expert) + ".self_attn.";
      context.expert_keys.push_back(
          split_heads(w.linear(merge_heads(k), e + "k_proj"), text.kv_heads, text.head_dim));
      context.expert_values.push_back(
          split_heads(w.linear(merge_heads(v), e + "v_proj"), text.kv_heads, text.head_dim));
    } else {
      context.expert_keys.push_back(std::nullopt);
      context.expert_values.push_back(std::nullopt);
    }
    // Later layers reach only the backbone's own hidden states.
    if (i == smolvla_last_expert_layer(config) && !with_hidden) break;
    h = h + w.linear(merge_heads(scaled_dot_product_attention(q, k, v, options)),
                     layer + "self_attn.o_proj");
    h = feed_forward(w, layer, text.rms_norm_eps, h);
  }
  if (with_hidden)
    context.hidden =
        rms_norm(h, w[std::string(kSmolVLATextPrefix) + "norm.weight"], text.rms_norm_eps);
  return context;
}

// The expert over the suffix [B, C, width]: `mask` [B, 1, C, P + C] (rows of the action tokens),
// `self_rotary` at the actions' positions after the prefix, `cross_rotary` at 0..C-1 (LeRobot
// restarts the positions of the queries that cross-attend).
Tensor run_expert(const Weights& w, const SmolVLAConfig& config, const PrefixContext& context,
                  Tensor h, Tensor mask, const Rotary& self_rotary, const Rotary& cross_rotary) {
  const LlamaConfig& text = config.text;
  const int64_t prefix = context.keys.front().dim(2);
  const Tensor prefix_mask = slice(mask, 3, 0, prefix);
  for (int64_t i = 0; i < text.layers; ++i) {
    const int64_t expert = config.expert_layer_of(i);
    if (expert < 0) continue;
    const std::string layer =
        std::string(kSmolVLAExpertPrefix) + "layers." + std::to_string(expert) + ".";
    const bool cross = config.is_cross_layer(i);
    const Tensor x = rms_norm(h, w[layer + "input_layernorm.weight"], text.rms_norm_eps);
    const Tensor q =
        rotate(split_heads(w.linear(x, layer + "self_attn.q_proj"), text.heads, text.head_dim),
               cross ? cross_rotary : self_rotary);
    AttentionOptions options;
    Tensor k, v;
    if (cross) {
      k = *context.expert_keys[i];
      v = *context.expert_values[i];
      options.mask = prefix_mask;
    } else {
      const Tensor own_k =
          rotate(split_heads(w.linear(x, layer + "self_attn.k_proj"), text.kv_heads, text.head_dim),
                 self_rotary);
      const Tensor own_v =
          split_heads(w.linear(x, layer + "self_attn.v_proj"), text.kv_heads, text.head_dim);
      k = concat({context.keys[i], own_k}, 2);
      v = concat({context.values[i], own_v}, 2);
      options.mask = mask;
    }
    h = h + w.linear(merge_heads(scaled_dot_product_attention(q, k, v, options)),
                     layer + "self_attn.o_proj");
    h = feed_forward(w, layer, text.rms_norm_eps, h);
  }
  return rms_norm(h, w[std::string(kSmolVLAExpertPrefix) + "norm.weight"], text.rms_norm_eps);
}

// The inputs and derived tensors both graphs share.
struct Prepared {
  PrefixContext context;
  Tensor suffix_mask;
  Rotary self_rotary, cross_rotary;
};

Prepared prepare(Graph& graph, const Weights& w, const SmolVLAConfig& config, int64_t batch,
                 int64_t language, bool with_hidden) {
  if (batch <= 0 || language <= 0)
    throw Error("a SmolVLA batch needs at least one sample and one language token");
  const int64_t prefix = smolvla_prefix_length(config, language);
  const int64_t total = prefix + config.chunk_size;
  const int64_t side = config.vision.image_size;
  const Tensor pixels =
      input(graph, kPixelValues, {batch, config.cameras(), config.vision.channels, side, side});
  const Tensor ids = input(graph, kLanguageIds, {batch, language}, DType::i32);
  const Tensor state = input(graph, kState, {batch, config.max_state_dim});
  const Tensor mask = input(graph, kAttentionMask, {batch, 1, total, total});
  const Tensor positions = input(graph, kPositionIds, {batch, total}, DType::i32);

  Prepared prepared;
  prepared.self_rotary = {slice(positions, 1, prefix, total)};
  const Tensor prefix_mask = slice(slice(mask, 2, 0, prefix), 3, 0, prefix);
  prepared.suffix_mask = slice(mask, 2, prefix, total);
  prepared.context = run_prefix(w, config, embed_prefix(w, config, pixels, ids, state), prefix_mask,
                                Rotary{slice(positions, 1, 0, prefix)}, with_hidden);
  return prepared;
}

Tensor velocity(const Weights& w, const SmolVLAConfig& config, const Prepared& prepared,
                Tensor noisy_actions, Tensor time_embedding) {
  const Tensor suffix = embed_suffix(w, config, noisy_actions, time_embedding);
  const Tensor out = run_expert(w, config, prepared.context, suffix, prepared.suffix_mask,
                                prepared.self_rotary, prepared.cross_rotary);
  return w.linear(out, "model.action_out_proj");
}

}  // namespace

Graph smolvla_loss_graph(const SmolVLAConfig& config, int64_t batch, int64_t language,
                         const SmolVLALossOptions& options) {
  Graph graph;
  const auto trainable = [&](const SmolVLAParameter& p) {
    switch (p.part) {
      case SmolVLAPart::vision:
        return options.train_backbone && !config.freeze_vision_encoder;
      case SmolVLAPart::connector:
        return options.train_backbone;
      case SmolVLAPart::text:
        return options.train_backbone && smolvla_loss_reaches(config, p.name);
      case SmolVLAPart::expert:
        return true;
      case SmolVLAPart::projections:
        return p.name.find("state_proj") == std::string::npos || config.train_state_proj;
    }
    return true;
  };
  const Weights w(graph, config, trainable);
  const Prepared prepared = prepare(graph, w, config, batch, language, options.with_prefix_hidden);
  const Shape chunk{batch, config.chunk_size, config.max_action_dim};
  const Tensor actions = input(graph, kActions, chunk);
  const Tensor noise = input(graph, kNoise, chunk);
  const Tensor time = reshape(input(graph, kFlowTime, {batch}), {batch, 1, 1});
  const Tensor time_embedding = input(graph, kTimeEmbedding, {batch, config.expert_hidden_size});
  const Tensor noisy = time * noise + (1.0 - time) * actions;
  const Tensor target = noise - actions;
  const Tensor predicted = velocity(w, config, prepared, noisy, time_embedding);
  graph.set_output(kLoss, mse_loss(predicted, target).id());
  graph.set_output(kVelocity, predicted.id());
  if (prepared.context.hidden) graph.set_output(kPrefixHidden, prepared.context.hidden->id());
  return graph;
}

Graph smolvla_chunk_graph(const SmolVLAConfig& config, int64_t batch, int64_t language,
                          int64_t steps) {
  if (steps <= 0) throw Error("the number of flow steps must be positive");
  Graph graph;
  const Weights w(graph, config, [](const SmolVLAParameter&) { return true; });
  const Prepared prepared = prepare(graph, w, config, batch, language, false);
  Tensor x = input(graph, kNoise, {batch, config.chunk_size, config.max_action_dim});
  const double dt = -1.0f / static_cast<float>(steps);
  for (float time : smolvla_flow_times(steps)) {
    const std::vector<float> embedding =
        smolvla_time_embedding(config, std::vector<float>(batch, time));
    const Tensor time_embedding(
        &graph, graph.constant(std::vector<double>(embedding.begin(), embedding.end()),
                               TensorType{DType::f32, {batch, config.expert_hidden_size}}));
    x = x + velocity(w, config, prepared, x, time_embedding) * dt;
  }
  graph.set_output(kActionChunk, x.id());
  return graph;
}

}  // namespace mg::models
