#include "models/whisper.hpp"

#include <cmath>
#include <fstream>
#include <map>
#include <optional>

#include "meganeura/error.hpp"
#include "meganeura/ops.hpp"
#include "models/config_fields.hpp"

namespace mg::models {
namespace {

int32_t token_id(const nlohmann::json& config, const char* key, int32_t fallback,
                 const std::string& where) {
  const std::vector<int32_t> ids = token_ids(config, key, where);
  return ids.empty() ? fallback : ids.front();
}

struct Attention {
  Tensor q, k, v, out;
  Tensor q_bias, v_bias, out_bias;
};

struct Norm {
  Tensor weight, bias;
};

struct FeedForward {
  Tensor fc1, fc1_bias, fc2, fc2_bias;
};

struct EncoderLayer {
  Attention self_attn;
  Norm self_attn_norm, final_norm;
  FeedForward mlp;
};

struct DecoderLayer {
  Attention self_attn, cross_attn;
  Norm self_attn_norm, cross_attn_norm, final_norm;
  FeedForward mlp;
};

struct Weights {
  Tensor conv1, conv1_bias, conv2, conv2_bias, encoder_positions;
  std::vector<EncoderLayer> encoder_layers;
  Norm encoder_norm;
  Tensor embed_tokens, decoder_positions;
  std::vector<DecoderLayer> decoder_layers;
  Norm decoder_norm;
  Tensor proj_out;  // embed_tokens when tied
};

// Declares every tensor; encoder ones as state leaves (not trained) unless `train_encoder`, the
// encoder's sinusoidal positions always.
Weights declare_weights(Graph& graph, const WhisperConfig& config, bool train_encoder) {
  const Init normal = Init::normal(0.0, config.init_std);
  std::map<std::string, Tensor> declared;
  for (const auto& [name, shape] : whisper_parameters(config)) {
    const bool norm = name.find("layer_norm.") != std::string::npos;
    const bool bias = name.ends_with(".bias");
    const Init init = norm && !bias ? Init::ones() : (bias ? Init::zeros() : normal);
    const TensorType type{DType::f32, shape};
    const bool frozen =
        name == kEncoderPositions || (!train_encoder && is_whisper_encoder_tensor(name));
    declared[name] =
        Tensor(&graph, frozen ? graph.state(name, type, init) : graph.parameter(name, type, init));
  }
  const auto at = [&](const std::string& name) { return declared.at(name); };
  const auto attention = [&](const std::string& prefix) {
    return Attention{at(prefix + "q_proj.weight"), at(prefix + "k_proj.weight"),
                     at(prefix + "v_proj.weight"), at(prefix + "out_proj.weight"),
                     at(prefix + "q_proj.bias"),   at(prefix + "v_proj.bias"),
                     at(prefix + "out_proj.bias")};
  };
  const auto norm = [&](const std::string& prefix) {
    return Norm{at(prefix + ".weight"), at(prefix + ".bias")};
  };
  const auto feed_forward = [&](const std::string& prefix) {
    return FeedForward{at(prefix + "fc1.weight"), at(prefix + "fc1.bias"),
                       at(prefix + "fc2.weight"), at(prefix + "fc2.bias")};
  };
  Weights weights;
  weights.conv1 = at("model.encoder.conv1.weight");
  weights.conv1_bias = at("model.encoder.conv1.bias");
  weights.conv2 = at("model.encoder.conv2.weight");
  weights.conv2_bias = at("model.encoder.conv2.bias");
  weights.encoder_positions = at(kEncoderPositions);
  for (int64_t i = 0; i < config.encoder_layers; ++i) {
    const std::string prefix = "model.encoder.layers." + std::to_string(i) + ".";
    weights.encoder_layers.push_back({attention(prefix + "self_attn."),
                                      norm(prefix + "self_attn_layer_norm"),
                                      norm(prefix + "final_layer_norm"), feed_forward(prefix)});
  }
  weights.encoder_norm = norm("model.encoder.layer_norm");
  weights.embed_tokens = at("model.decoder.embed_tokens.weight");
  weights.decoder_positions = at("model.decoder.embed_positions.weight");
  for (int64_t i = 0; i < config.decoder_layers; ++i) {
    const std::string prefix = "model.decoder.layers." + std::to_string(i) + ".";
    weights.decoder_layers.push_back(
        {attention(prefix + "self_attn."), attention(prefix + "encoder_attn."),
         norm(prefix + "self_attn_layer_norm"), norm(prefix + "encoder_attn_layer_norm"),
         norm(prefix + "final_layer_norm"), feed_forward(prefix)});
  }
  weights.decoder_norm = norm("model.decoder.layer_norm");
  weights.proj_out = config.tie_word_embeddings ? weights.embed_tokens : at("proj_out.weight");
  return weights;
}

Tensor normalise(Tensor x, const Norm& norm) {
  return layer_norm(x, norm.weight, norm.bias, 1e-5);
}

// x [B, S, heads * D] -> [B, heads, S, D].
Tensor split_heads(Tensor x, int64_t heads) {
  const int64_t head_dim = x.dim(2) / heads;
  return transpose(reshape(x, {x.dim(0), x.dim(1), heads, head_dim}), {0, 2, 1, 3});
}

Tensor merge_heads(Tensor x) {
  const Tensor moved = transpose(x, {0, 2, 1, 3});
  return reshape(moved, {moved.dim(0), moved.dim(1), moved.dim(2) * moved.dim(3)});
}

Tensor queries(const Attention& a, Tensor x, int64_t heads) {
  return split_heads(linear(x, a.q, a.q_bias), heads);
}
Tensor keys(const Attention& a, Tensor x, int64_t heads) {
  return split_heads(linear(x, a.k), heads);  // Whisper's k_proj has no bias
}
Tensor values(const Attention& a, Tensor x, int64_t heads) {
  return split_heads(linear(x, a.v, a.v_bias), heads);
}
Tensor attended_output(const Attention& a, Tensor attended) {
  return linear(merge_heads(attended), a.out, a.out_bias);
}

Tensor feed_forward(const FeedForward& f, Tensor x) {
  return linear(gelu(linear(x, f.fc1, f.fc1_bias)), f.fc2, f.fc2_bias);
}

Tensor encoder_hidden_states(const WhisperConfig& config, const Weights& weights, Tensor features) {
  Tensor x = gelu(conv1d(features, weights.conv1, weights.conv1_bias, 1, 1));
  x = gelu(conv1d(x, weights.conv2, weights.conv2_bias, 2, 1));
  Tensor h = transpose(x, {0, 2, 1}) + weights.encoder_positions;
  for (const EncoderLayer& layer : weights.encoder_layers) {
    const Tensor y = normalise(h, layer.self_attn_norm);
    const int64_t heads = config.encoder_heads;
    h = h + attended_output(layer.self_attn,
                            scaled_dot_product_attention(queries(layer.self_attn, y, heads),
                                                         keys(layer.self_attn, y, heads),
                                                         values(layer.self_attn, y, heads)));
    h = h + feed_forward(layer.mlp, normalise(h, layer.final_norm));
  }
  return normalise(h, weights.encoder_norm);
}

// Token embeddings of ids [B, T]; like nn.Embedding's padding_idx, the pad token's row gets no
// gradient from the lookup (it still does through a tied proj_out).
Tensor embed(Graph& graph, const WhisperConfig& config, const Weights& weights, Tensor ids) {
  const Tensor looked_up = gather(weights.embed_tokens, ids);
  const Tensor is_pad = unsqueeze(
      equal(cast(ids, DType::f32), scalar(graph, static_cast<double>(config.pad_token_id))), -1);
  return where(is_pad, stop_gradient(looked_up), looked_up);
}

Tensor decoder_block_tail(const WhisperConfig& config, const DecoderLayer& layer, Tensor h,
                          Tensor cross_keys, Tensor cross_values) {
  const Tensor y = normalise(h, layer.cross_attn_norm);
  h = h + attended_output(layer.cross_attn, scaled_dot_product_attention(
                                                queries(layer.cross_attn, y, config.decoder_heads),
                                                cross_keys, cross_values));
  return h + feed_forward(layer.mlp, normalise(h, layer.final_norm));
}

Tensor decoder_hidden_states(Graph& graph, const WhisperConfig& config, const Weights& weights,
                             Tensor ids, Tensor encoded) {
  const int64_t tokens = ids.dim(1);
  Tensor h = embed(graph, config, weights, ids) + slice(weights.decoder_positions, 0, 0, tokens);
  const int64_t heads = config.decoder_heads;
  for (const DecoderLayer& layer : weights.decoder_layers) {
    const Tensor y = normalise(h, layer.self_attn_norm);
    AttentionOptions causal;
    causal.causal = true;
    h = h + attended_output(layer.self_attn,
                            scaled_dot_product_attention(
                                queries(layer.self_attn, y, heads), keys(layer.self_attn, y, heads),
                                values(layer.self_attn, y, heads), causal));
    h = decoder_block_tail(config, layer, h, keys(layer.cross_attn, encoded, heads),
                           values(layer.cross_attn, encoded, heads));
  }
  return normalise(h, weights.decoder_norm);
}

void check_batch(int64_t batch) {
  if (batch <= 0) throw Error("Whisper batch size must be positive");
}

void check_tokens(const WhisperConfig& config, int64_t tokens, const char* what) {
  if (tokens <= 0) throw Error(std::string(what) + " must be positive");
  if (tokens > config.max_target_positions) {
    throw Error(std::string(what) + " " + std::to_string(tokens) +
                " exceeds the decoder's max_target_positions (" +
                std::to_string(config.max_target_positions) + ")");
  }
}

Tensor features_input(Graph& graph, const WhisperConfig& config, int64_t batch) {
  return input(graph, whisper_io::kInputFeatures,
               {batch, config.num_mel_bins, config.input_frames()});
}

}  // namespace

WhisperConfig whisper_config_from_json(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object()) throw Error(where + " is not a JSON object");
  const nlohmann::json* model_type = find_key(config, "model_type");
  if (!model_type || !model_type->is_string() || model_type->get<std::string>() != "whisper") {
    throw Error(where + ": model_type " + (model_type ? model_type->dump() : "(none)") +
                " is not Whisper's (expected \"whisper\")");
  }
  if (const nlohmann::json* act = find_key(config, "activation_function");
      act && (!act->is_string() || act->get<std::string>() != "gelu")) {
    throw Error(where + ": activation_function " + act->dump() +
                " is not supported (Whisper uses \"gelu\")");
  }
  WhisperConfig whisper;
  whisper.vocab_size = required_int(config, "vocab_size", where);
  whisper.d_model = required_int(config, "d_model", where);
  whisper.encoder_layers = required_int(config, "encoder_layers", where);
  whisper.encoder_heads = required_int(config, "encoder_attention_heads", where);
  whisper.encoder_ffn_dim = required_int(config, "encoder_ffn_dim", where);
  whisper.decoder_layers = required_int(config, "decoder_layers", where);
  whisper.decoder_heads = required_int(config, "decoder_attention_heads", where);
  whisper.decoder_ffn_dim = required_int(config, "decoder_ffn_dim", where);
  whisper.num_mel_bins = required_int(config, "num_mel_bins", where);
  whisper.max_source_positions = required_int(config, "max_source_positions", where);
  whisper.max_target_positions = required_int(config, "max_target_positions", where);
  for (int64_t heads : {whisper.encoder_heads, whisper.decoder_heads}) {
    if (whisper.d_model % heads != 0) {
      throw Error(where + ": d_model (" + std::to_string(whisper.d_model) +
                  ") must be a multiple of the attention heads (" + std::to_string(heads) + ")");
    }
  }
  if (whisper.d_model % 2 != 0 || whisper.d_model < 4) {
    throw Error(where + ": d_model must be even and at least 4 for the sinusoidal positions");
  }
  if (const nlohmann::json* tie = find_key(config, "tie_word_embeddings")) {
    if (!tie->is_boolean()) throw Error(where + ": \"tie_word_embeddings\" must be true or false");
    whisper.tie_word_embeddings = tie->get<bool>();
  }
  if (const nlohmann::json* scale = find_key(config, "scale_embedding");
      scale && !scale->is_boolean()) {
    throw Error(where + ": \"scale_embedding\" must be true or false");
  }
  if (const nlohmann::json* std = find_key(config, "init_std")) {
    if (!std->is_number()) throw Error(where + ": \"init_std\" must be a number");
    whisper.init_std = std->get<double>();
  }
  whisper.decoder_start_token_id = token_id(config, "decoder_start_token_id", 0, where);
  whisper.eos_token_ids = token_ids(config, "eos_token_id", where);
  whisper.pad_token_id = token_id(config, "pad_token_id", -1, where);
  return whisper;
}

WhisperConfig load_whisper_config(const std::filesystem::path& folder) {
  return whisper_config_from_json(read_config_json(folder, "a Whisper folder"),
                                  (folder / "config.json").string());
}

std::vector<std::pair<std::string, Shape>> whisper_parameters(const WhisperConfig& config) {
  const int64_t d = config.d_model;
  std::vector<std::pair<std::string, Shape>> tensors;
  const auto attention = [&](const std::string& prefix) {
    tensors.emplace_back(prefix + "k_proj.weight", Shape{d, d});
    tensors.emplace_back(prefix + "v_proj.weight", Shape{d, d});
    tensors.emplace_back(prefix + "v_proj.bias", Shape{d});
    tensors.emplace_back(prefix + "q_proj.weight", Shape{d, d});
    tensors.emplace_back(prefix + "q_proj.bias", Shape{d});
    tensors.emplace_back(prefix + "out_proj.weight", Shape{d, d});
    tensors.emplace_back(prefix + "out_proj.bias", Shape{d});
  };
  const auto norm = [&](const std::string& prefix) {
    tensors.emplace_back(prefix + ".weight", Shape{d});
    tensors.emplace_back(prefix + ".bias", Shape{d});
  };
  const auto feed_forward = [&](const std::string& prefix, int64_t hidden) {
    tensors.emplace_back(prefix + "fc1.weight", Shape{hidden, d});
    tensors.emplace_back(prefix + "fc1.bias", Shape{hidden});
    tensors.emplace_back(prefix + "fc2.weight", Shape{d, hidden});
    tensors.emplace_back(prefix + "fc2.bias", Shape{d});
  };
  tensors.emplace_back("model.encoder.conv1.weight", Shape{d, config.num_mel_bins, 3});
  tensors.emplace_back("model.encoder.conv1.bias", Shape{d});
  tensors.emplace_back("model.encoder.conv2.weight", Shape{d, d, 3});
  tensors.emplace_back("model.encoder.conv2.bias", Shape{d});
  tensors.emplace_back(kEncoderPositions, Shape{config.max_source_positions, d});
  for (int64_t i = 0; i < config.encoder_layers; ++i) {
    const std::string prefix = "model.encoder.layers." + std::to_string(i) + ".";
    attention(prefix + "self_attn.");
    norm(prefix + "self_attn_layer_norm");
    feed_forward(prefix, config.encoder_ffn_dim);
    norm(prefix + "final_layer_norm");
  }
  norm("model.encoder.layer_norm");
  tensors.emplace_back("model.decoder.embed_tokens.weight", Shape{config.vocab_size, d});
  tensors.emplace_back("model.decoder.embed_positions.weight",
                       Shape{config.max_target_positions, d});
  for (int64_t i = 0; i < config.decoder_layers; ++i) {
    const std::string prefix = "model.decoder.layers." + std::to_string(i) + ".";
    attention(prefix + "self_attn.");
    norm(prefix + "self_attn_layer_norm");
    attention(prefix + "encoder_attn.");
    norm(prefix + "encoder_attn_layer_norm");
    feed_forward(prefix, config.decoder_ffn_dim);
    norm(prefix + "final_layer_norm");
  }
  norm("model.decoder.layer_norm");
  if (!config.tie_word_embeddings)
    tensors.emplace_back("proj_out.weight", Shape{config.vocab_size, d});
  return tensors;
}

bool is_whisper_encoder_tensor(const std::string& name) {
  return name.starts_with("model.encoder.");
}

std::vector<float> whisper_sinusoids(int64_t length, int64_t channels) {
  const int64_t half = channels / 2;
  const double increment = std::log(10000.0) / static_cast<double>(half - 1);
  std::vector<float> table(length * channels);
  for (int64_t p = 0; p < length; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // transformers computes the timescales and their products in f32.
      const float timescale = static_cast<float>(std::exp(-increment * static_cast<double>(i)));
      const float angle = static_cast<float>(p) * timescale;
      table[p * channels + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      table[p * channels + half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    }
  }
  return table;
}

std::string whisper_self_cache_name(int64_t layer, bool values) {
  return "kv_cache.decoder.layers." + std::to_string(layer) + (values ? ".value" : ".key");
}

std::string whisper_cross_cache_name(int64_t layer, bool values) {
  return "cross_kv.decoder.layers." + std::to_string(layer) + (values ? ".value" : ".key");
}

Graph whisper_encoder_graph(const WhisperConfig& config, int64_t batch) {
  check_batch(batch);
  Graph graph;
  const Weights weights = declare_weights(graph, config, true);
  const Tensor features = features_input(graph, config, batch);
  graph.set_output(whisper_io::kEncoderHiddenStates,
                   encoder_hidden_states(config, weights, features).id());
  return graph;
}

Graph whisper_logits_graph(const WhisperConfig& config, int64_t batch, int64_t tokens) {
  check_batch(batch);
  check_tokens(config, tokens, "decoder length");
  Graph graph;
  const Weights weights = declare_weights(graph, config, true);
  const Tensor features = features_input(graph, config, batch);
  const Tensor ids = input(graph, whisper_io::kDecoderInputIds, {batch, tokens}, DType::i32);
  const Tensor encoded = encoder_hidden_states(config, weights, features);
  const Tensor h = decoder_hidden_states(graph, config, weights, ids, encoded);
  graph.set_output(whisper_io::kLogits, linear(h, weights.proj_out).id());
  return graph;
}

Graph whisper_loss_graph(const WhisperConfig& config, int64_t batch, int64_t tokens,
                         bool train_encoder, bool with_logits) {
  check_batch(batch);
  check_tokens(config, tokens, "decoder length");
  Graph graph;
  const Weights weights = declare_weights(graph, config, train_encoder);
  const Tensor features = features_input(graph, config, batch);
  const Tensor ids = input(graph, whisper_io::kDecoderInputIds, {batch, tokens}, DType::i32);
  const Tensor labels = input(graph, whisper_io::kLabels, {batch, tokens}, DType::i32);
  Tensor encoded = encoder_hidden_states(config, weights, features);
  if (!train_encoder) encoded = stop_gradient(encoded);
  const Tensor h = decoder_hidden_states(graph, config, weights, ids, encoded);
  const Tensor logits = linear(h, weights.proj_out);
  const Tensor loss =
      cross_entropy(reshape(logits, {batch * tokens, config.vocab_size}),
                    reshape(labels, {batch * tokens}), 0.0, whisper_io::kIgnoredLabel);
  graph.set_output(whisper_io::kLoss, loss.id());
  if (with_logits) graph.set_output(whisper_io::kLogits, logits.id());
  return graph;
}

Graph whisper_cross_kv_graph(const WhisperConfig& config) {
  Graph graph;
  const Weights weights = declare_weights(graph, config, true);
  const Tensor features = features_input(graph, config, 1);
  const Tensor encoded = encoder_hidden_states(config, weights, features);
  for (int64_t i = 0; i < config.decoder_layers; ++i) {
    const Attention& cross = weights.decoder_layers[i].cross_attn;
    const Tensor computed[2] = {keys(cross, encoded, config.decoder_heads),
                                values(cross, encoded, config.decoder_heads)};
    for (bool value : {false, true}) {
      const ValueId cache = graph.state(whisper_cross_cache_name(i, value), computed[value].type());
      graph.assign(cache, computed[value].id());
    }
  }
  return graph;
}

Graph whisper_decode_graph(const WhisperConfig& config, int64_t cache_length) {
  check_tokens(config, cache_length, "cache length");
  Graph graph;
  const Weights weights = declare_weights(graph, config, true);
  const Tensor ids = input(graph, whisper_io::kDecoderInputIds, {1, 1}, DType::i32);
  const Tensor position = input(graph, whisper_io::kPosition, {1}, DType::i32);
  const int64_t heads = config.decoder_heads;
  const int64_t head_dim = config.d_model / heads;

  // Row r of a self-attention cache is this token's where r == position; attention sees rows
  // 0..position.
  std::vector<double> rows(cache_length);
  for (int64_t r = 0; r < cache_length; ++r) rows[r] = static_cast<double>(r);
  const Tensor row_index(&graph,
                         graph.constant(rows, TensorType{DType::f32, {1, 1, cache_length, 1}}));
  const Tensor key_index(
      &graph, graph.constant(std::move(rows), TensorType{DType::f32, {1, 1, 1, cache_length}}));
  const Tensor where_now = reshape(cast(position, DType::f32), {1, 1, 1, 1});
  const Tensor is_new_row = equal(row_index, where_now);
  AttentionOptions options;
  options.mask = where(less_equal(key_index, where_now), scalar(graph, 0.0), scalar(graph, -1e30));

  const TensorType self_type{DType::f32, {1, heads, cache_length, head_dim}};
  const TensorType cross_type{DType::f32, {1, heads, config.max_source_positions, head_dim}};
  Tensor h = embed(graph, config, weights, ids) +
             reshape(gather(weights.decoder_positions, position), {1, 1, config.d_model});
  for (int64_t i = 0; i < config.decoder_layers; ++i) {
    const DecoderLayer& layer = weights.decoder_layers[i];
    const Tensor y = normalise(h, layer.self_attn_norm);
    const Tensor projected[2] = {keys(layer.self_attn, y, heads),
                                 values(layer.self_attn, y, heads)};
    Tensor caches[2];
    for (bool value : {false, true}) {
      const Tensor cache(&graph, graph.state(whisper_self_cache_name(i, value), self_type));
      caches[value] = where(is_new_row, projected[value], cache);
      graph.assign(cache.id(), caches[value].id());
    }
    h = h + attended_output(layer.self_attn,
                            scaled_dot_product_attention(queries(layer.self_attn, y, heads),
                                                         caches[0], caches[1], options));
    const Tensor cross_keys(&graph, graph.state(whisper_cross_cache_name(i, false), cross_type));
    const Tensor cross_values(&graph, graph.state(whisper_cross_cache_name(i, true), cross_type));
    h = decoder_block_tail(config, layer, h, cross_keys, cross_values);
  }
  const Tensor last = reshape(normalise(h, weights.decoder_norm), {1, config.d_model});
  graph.set_output(whisper_io::kLogits, linear(last, weights.proj_out).id());
  return graph;
}

}  // namespace mg::models
