#include "models/llama.hpp"

#include <cmath>
#include <fstream>
#include <numbers>

#include "meganeura/error.hpp"
#include "meganeura/ops.hpp"
#include "models/config_fields.hpp"

namespace mg::models {
namespace {

// rope_scaling (the Hub's configs) or rope_parameters (transformers 5), which also holds
// rope_theta.
void read_rope(const nlohmann::json& config, const std::string& where, LlamaConfig& llama) {
  llama.rope_theta = number_or(config, "rope_theta", llama.rope_theta, where);
  const nlohmann::json* scaling = find_key(config, "rope_parameters");
  if (!scaling) scaling = find_key(config, "rope_scaling");
  if (!scaling) return;
  if (!scaling->is_object()) throw Error(where + ": rope_scaling must be an object or null");
  llama.rope_theta = number_or(*scaling, "rope_theta", llama.rope_theta, where);
  const nlohmann::json* type = find_key(*scaling, "rope_type");
  if (!type) type = find_key(*scaling, "type");
  RopeScaling& rope = llama.rope_scaling;
  rope.type = type && type->is_string() ? type->get<std::string>() : "default";
  if (rope.type == "dynamic") {
    // Dynamic NTK scaling only departs from the default past max_position_embeddings, which the
    // graphs never reach (their lengths are checked against it).
    rope.type = "default";
  }
  if (rope.type != "default" && rope.type != "linear" && rope.type != "llama3") {
    throw Error(where + ": rope type \"" + rope.type +
                "\" is not supported (default, linear, dynamic and llama3 are)");
  }
  rope.factor = number_or(*scaling, "factor", 1.0, where);
  rope.low_freq_factor = number_or(*scaling, "low_freq_factor", rope.low_freq_factor, where);
  rope.high_freq_factor = number_or(*scaling, "high_freq_factor", rope.high_freq_factor, where);
  rope.original_max_positions =
      static_cast<int64_t>(number_or(*scaling, "original_max_position_embeddings",
                                     static_cast<double>(rope.original_max_positions), where));
  if (rope.factor <= 0) throw Error(where + ": rope scaling factor must be positive");
}

struct LayerWeights {
  Tensor q_proj, k_proj, v_proj, o_proj;
  std::optional<Tensor> q_bias, k_bias, v_bias, o_bias;
  Tensor gate_proj, up_proj, down_proj;
  std::optional<Tensor> gate_bias, up_bias, down_bias;
  Tensor input_norm, post_attention_norm;
};

struct Weights {
  Tensor embed_tokens;
  std::vector<LayerWeights> layers;
  Tensor norm;
  Tensor lm_head;  // embed_tokens when tied
};

Weights declare_weights(Graph& graph, const LlamaConfig& config) {
  const Init normal = Init::normal(0.0, config.initializer_range);
  Weights weights;
  std::map<std::string, Tensor> declared;
  for (const auto& [name, shape] : llama_parameters(config)) {
    const bool norm = name.ends_with("norm.weight");
    const bool bias = name.ends_with(".bias");
    declared[name] =
        parameter(graph, name, shape, norm ? Init::ones() : (bias ? Init::zeros() : normal));
  }
  const auto optional_of = [&](const std::string& name) -> std::optional<Tensor> {
    auto it = declared.find(name);
    return it == declared.end() ? std::nullopt : std::optional<Tensor>(it->second);
  };
  weights.embed_tokens = declared.at("model.embed_tokens.weight");
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    LayerWeights layer;
    layer.q_proj = declared.at(prefix + "self_attn.q_proj.weight");
    layer.k_proj = declared.at(prefix + "self_attn.k_proj.weight");
    layer.v_proj = declared.at(prefix + "self_attn.v_proj.weight");
    layer.o_proj = declared.at(prefix + "self_attn.o_proj.weight");
    layer.q_bias = optional_of(prefix + "self_attn.q_proj.bias");
    layer.k_bias = optional_of(prefix + "self_attn.k_proj.bias");
    layer.v_bias = optional_of(prefix + "self_attn.v_proj.bias");
    layer.o_bias = optional_of(prefix + "self_attn.o_proj.bias");
    layer.gate_proj = declared.at(prefix + "mlp.gate_proj.weight");
    layer.up_proj = declared.at(prefix + "mlp.up_proj.weight");
    layer.down_proj = declared.at(prefix + "mlp.down_proj.weight");
    layer.gate_bias = optional_of(prefix + "mlp.gate_proj.bias");
    layer.up_bias = optional_of(prefix + "mlp.up_proj.bias");
    layer.down_bias = optional_of(prefix + "mlp.down_proj.bias");
    layer.input_norm = declared.at(prefix + "input_layernorm.weight");
    layer.post_attention_norm = declared.at(prefix + "post_attention_layernorm.weight");
    weights.layers.push_back(layer);
  }
  weights.norm = declared.at("model.norm.weight");
  weights.lm_head =
      config.tie_word_embeddings ? weights.embed_tokens : declared.at("lm_head.weight");
  return weights;
}

// Rotary embedding of x [B, H, S, D]: either the rope op (default frequencies at positions
// 0..S-1, or at `positions` [B, S] known only at run time: a decode step's) or, for scaled
// frequencies, tables of cos and sin [S, D] (already broadcastable as [1, 1, S, D]) in
// transformers' rotate-half form.
struct Rotary {
  std::optional<Tensor> positions;
  std::optional<Tensor> cos, sin;
  // rotate_half as a product: x [..., D] times this signed permutation [D, D] gives
  // (-x[D/2:], x[:D/2]) exactly (one term a sum), in one launch instead of slices and a concat.
  std::optional<Tensor> half_turn;
  double theta = 0;
};

Tensor rotate(Tensor x, const Rotary& rotary) {
  if (!rotary.cos)
    return rotary.positions ? rope(x, *rotary.positions, rotary.theta) : rope(x, rotary.theta);
  return x * *rotary.cos + matmul(x, *rotary.half_turn) * *rotary.sin;
}

Tensor half_turn_matrix(Graph& graph, int64_t dim) {
  std::vector<double> values(dim * dim, 0.0);
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    values[(i + half) * dim + i] = -1.0;  // out[i] = -x[i + D/2]
    values[i * dim + i + half] = 1.0;     // out[i + D/2] = x[i]
  }
  return Tensor(&graph, graph.constant(std::move(values), TensorType{DType::f32, {dim, dim}}));
}

// cos and sin of position * frequency for positions 0..length-1, [length, D] (each frequency
// twice, as transformers concatenates them).
std::pair<std::vector<double>, std::vector<double>> rotary_tables(const LlamaConfig& config,
                                                                  int64_t length) {
  const std::vector<double> frequencies = rope_inverse_frequencies(config);
  const int64_t dim = config.head_dim;
  std::vector<double> cos_table(length * dim), sin_table(length * dim);
  for (int64_t p = 0; p < length; ++p) {
    for (int64_t d = 0; d < dim; ++d) {
      // transformers multiplies in f32: the angle of the reference is rounded to float as well.
      const float angle = static_cast<float>(p) * static_cast<float>(frequencies[d % (dim / 2)]);
      cos_table[p * dim + d] = std::cos(static_cast<double>(angle));
      sin_table[p * dim + d] = std::sin(static_cast<double>(angle));
    }
  }
  return {cos_table, sin_table};
}

Rotary rotary_for_sequence(Graph& graph, const LlamaConfig& config, int64_t seq) {
  Rotary rotary;
  rotary.theta = config.rope_theta;
  if (config.rope_scaling.type == "default") return rotary;
  auto [cos_table, sin_table] = rotary_tables(config, seq);
  const TensorType type{DType::f32, {seq, config.head_dim}};
  rotary.cos = Tensor(&graph, graph.constant(std::move(cos_table), type));
  rotary.sin = Tensor(&graph, graph.constant(std::move(sin_table), type));
  rotary.half_turn = half_turn_matrix(graph, config.head_dim);
  return rotary;
}

// Splits the heads of x [B, S, heads * D] into [B, heads, S, D].
Tensor split_heads(Tensor x, int64_t heads, int64_t head_dim) {
  return transpose(reshape(x, {x.dim(0), x.dim(1), heads, head_dim}), {0, 2, 1, 3});
}

Tensor merge_heads(Tensor x) {
  const Tensor moved = transpose(x, {0, 2, 1, 3});
  return reshape(moved, {moved.dim(0), moved.dim(1), moved.dim(2) * moved.dim(3)});
}

struct Projections {
  Tensor q, k, v;  // [B, heads, S, D], rotated
};

Projections project(const LlamaConfig& config, const LayerWeights& layer, Tensor x,
                    const Rotary& rotary) {
  Projections p;
  p.q = rotate(split_heads(linear(x, layer.q_proj, layer.q_bias), config.heads, config.head_dim),
               rotary);
  p.k = rotate(split_heads(linear(x, layer.k_proj, layer.k_bias), config.kv_heads, config.head_dim),
               rotary);
  p.v = split_heads(linear(x, layer.v_proj, layer.v_bias), config.kv_heads, config.head_dim);
  return p;
}

Tensor feed_forward(const LlamaConfig& config, const LayerWeights& layer, Tensor h) {
  const Tensor x = rms_norm(h, layer.post_attention_norm, config.rms_norm_eps);
  const Tensor gated =
      silu(linear(x, layer.gate_proj, layer.gate_bias)) * linear(x, layer.up_proj, layer.up_bias);
  return h + linear(gated, layer.down_proj, layer.down_bias);
}

Tensor attention_output(const LayerWeights& layer, Tensor h, Tensor attended) {
  return h + linear(merge_heads(attended), layer.o_proj, layer.o_bias);
}

void check_length(const LlamaConfig& config, int64_t length, const char* what) {
  if (length <= 0) throw Error(std::string(what) + " must be positive");
  if (length > config.max_positions) {
    throw Error(std::string(what) + " " + std::to_string(length) +
                " exceeds the model's max_position_embeddings (" +
                std::to_string(config.max_positions) + ")");
  }
}

// The final hidden states [B, S, hidden] of input_ids [B, S] (positions 0..S-1); with
// `caches`, each layer's keys and values also go to its KV cache, padded to `cache_length`.
Tensor hidden_states(Graph& graph, const LlamaConfig& config, const Weights& weights, Tensor ids,
                     std::optional<int64_t> cache_length) {
  const int64_t seq = ids.dim(1);
  const Rotary rotary = rotary_for_sequence(graph, config, seq);
  Tensor h = gather(weights.embed_tokens, ids);
  for (int64_t i = 0; i < config.layers; ++i) {
    const LayerWeights& layer = weights.layers[i];
    const Tensor x = rms_norm(h, layer.input_norm, config.rms_norm_eps);
    const Projections p = project(config, layer, x, rotary);
    if (cache_length) {
      const std::vector<std::pair<int64_t, int64_t>> rows = {
          {0, 0}, {0, 0}, {0, *cache_length - seq}, {0, 0}};
      const TensorType cache_type{DType::f32, {1, config.kv_heads, *cache_length, config.head_dim}};
      for (bool values : {false, true}) {
        const ValueId cache = graph.state(kv_cache_name(i, values), cache_type);
        graph.assign(cache, pad(values ? p.v : p.k, rows).id());
      }
    }
    AttentionOptions options;
    options.causal = true;
    h = attention_output(layer, h, scaled_dot_product_attention(p.q, p.k, p.v, options));
    h = feed_forward(config, layer, h);
  }
  return rms_norm(h, weights.norm, config.rms_norm_eps);
}

}  // namespace

LlamaConfig llama_config_from_json(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object()) throw Error(where + " is not a JSON object");
  const nlohmann::json* model_type = find_key(config, "model_type");
  if (!model_type || !model_type->is_string()) {
    throw Error(where + ": no \"model_type\" (expected \"llama\")");
  }
  if (model_type->get<std::string>() != "llama") {
    throw Error(where + ": model_type \"" + model_type->get<std::string>() +
                "\" is not a Llama-family causal LM (expected \"llama\")");
  }
  if (const nlohmann::json* act = find_key(config, "hidden_act");
      act && (!act->is_string() || act->get<std::string>() != "silu")) {
    throw Error(where + ": hidden_act " + act->dump() + " is not supported (Llama uses \"silu\")");
  }
  LlamaConfig llama;
  llama.vocab_size = required_int(config, "vocab_size", where);
  llama.hidden_size = required_int(config, "hidden_size", where);
  llama.intermediate_size = required_int(config, "intermediate_size", where);
  llama.layers = required_int(config, "num_hidden_layers", where);
  llama.heads = required_int(config, "num_attention_heads", where);
  llama.kv_heads = find_key(config, "num_key_value_heads")
                       ? required_int(config, "num_key_value_heads", where)
                       : llama.heads;
  llama.head_dim = find_key(config, "head_dim") ? required_int(config, "head_dim", where)
                                                : llama.hidden_size / llama.heads;
  if (llama.heads % llama.kv_heads != 0) {
    throw Error(where + ": num_attention_heads (" + std::to_string(llama.heads) +
                ") must be a multiple of num_key_value_heads (" + std::to_string(llama.kv_heads) +
                ")");
  }
  if (llama.head_dim % 2 != 0) throw Error(where + ": head_dim must be even for rotary embeddings");
  if (find_key(config, "max_position_embeddings"))
    llama.max_positions = required_int(config, "max_position_embeddings", where);
  llama.rms_norm_eps = number_or(config, "rms_norm_eps", llama.rms_norm_eps, where);
  read_rope(config, where, llama);
  llama.tie_word_embeddings = bool_or(config, "tie_word_embeddings", true, where);
  llama.attention_bias = bool_or(config, "attention_bias", false, where);
  llama.mlp_bias = bool_or(config, "mlp_bias", false, where);
  llama.initializer_range = number_or(config, "initializer_range", 0.02, where);
  const std::vector<int32_t> bos = token_ids(config, "bos_token_id", where);
  if (!bos.empty()) llama.bos_token_id = bos.front();
  llama.eos_token_ids = token_ids(config, "eos_token_id", where);
  return llama;
}

LlamaConfig load_llama_config(const std::filesystem::path& folder) {
  return llama_config_from_json(read_config_json(folder, "a folder"),
                                (folder / "config.json").string());
}

std::vector<double> rope_inverse_frequencies(const LlamaConfig& config) {
  const int64_t dim = config.head_dim;
  std::vector<double> frequencies(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    // As transformers: the exponent and the power in f32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    frequencies[i] =
        static_cast<float>(1.0f / std::pow(static_cast<float>(config.rope_theta), exponent));
  }
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == "linear") {
    for (double& frequency : frequencies) frequency /= scaling.factor;
  } else if (scaling.type == "llama3") {
    const double old_length = static_cast<double>(scaling.original_max_positions);
    const double low_wavelength = old_length / scaling.low_freq_factor;
    const double high_wavelength = old_length / scaling.high_freq_factor;
    for (double& frequency : frequencies) {
      const double wavelength = 2.0 * std::numbers::pi / frequency;
      if (wavelength < high_wavelength) continue;
      if (wavelength > low_wavelength) {
        frequency /= scaling.factor;
        continue;
      }
      const double smooth = (old_length / wavelength - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      frequency = (1.0 - smooth) * frequency / scaling.factor + smooth * frequency;
    }
  }
  return frequencies;
}

std::vector<std::pair<std::string, Shape>> llama_parameters(const LlamaConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = config.heads * config.head_dim;
  const int64_t kv_width = config.kv_heads * config.head_dim;
  std::vector<std::pair<std::string, Shape>> parameters;
  parameters.emplace_back("model.embed_tokens.weight", Shape{config.vocab_size, hidden});
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const auto projection = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
      parameters.emplace_back(prefix + name + ".weight", Shape{out, in});
      if (bias) parameters.emplace_back(prefix + name + ".bias", Shape{out});
    };
    projection("self_attn.q_proj", q_width, hidden, config.attention_bias);
    projection("self_attn.k_proj", kv_width, hidden, config.attention_bias);
    projection("self_attn.v_proj", kv_width, hidden, config.attention_bias);
    projection("self_attn.o_proj", hidden, q_width, config.attention_bias);
    projection("mlp.gate_proj", config.intermediate_size, hidden, config.mlp_bias);
    projection("mlp.up_proj", config.intermediate_size, hidden, config.mlp_bias);
    projection("mlp.down_proj", hidden, config.intermediate_size, config.mlp_bias);
    parameters.emplace_back(prefix + "input_layernorm.weight", Shape{hidden});
    parameters.emplace_back(prefix + "post_attention_layernorm.weight", Shape{hidden});
  }
  parameters.emplace_back("model.norm.weight", Shape{hidden});
  if (!config.tie_word_embeddings)
    parameters.emplace_back("lm_head.weight", Shape{config.vocab_size, hidden});
  return parameters;
}

std::string kv_cache_name(int64_t layer, bool values) {
  return "kv_cache.layers." + std::to_string(layer) + (values ? ".value" : ".key");
}

Graph llama_logits_graph(const LlamaConfig& config, int64_t batch, int64_t seq) {
  check_length(config, seq, "sequence length");
  Graph graph;
  const Weights weights = declare_weights(graph, config);
  const Tensor ids = input(graph, kInputIds, {batch, seq}, DType::i32);
  const Tensor h = hidden_states(graph, config, weights, ids, std::nullopt);
  graph.set_output(kLogits, linear(h, weights.lm_head).id());
  return graph;
}

Graph llama_next_token_graph(const LlamaConfig& config, int64_t batch, int64_t seq) {
  check_length(config, seq, "sequence length");
  Graph graph;
  const Weights weights = declare_weights(graph, config);
  const Tensor ids = input(graph, kInputIds, {batch, seq}, DType::i32);
  const Tensor h = hidden_states(graph, config, weights, ids, std::nullopt);
  graph.set_output(kNextTokens, argmax(linear(h, weights.lm_head), -1).id());
  return graph;
}

Graph llama_loss_graph(const LlamaConfig& config, int64_t batch, int64_t seq, bool with_logits) {
  check_length(config, seq, "sequence length");
  Graph graph;
  const Weights weights = declare_weights(graph, config);
  const Tensor ids = input(graph, kInputIds, {batch, seq}, DType::i32);
  const Tensor labels = input(graph, kLabels, {batch, seq}, DType::i32);
  const Tensor h = hidden_states(graph, config, weights, ids, std::nullopt);
  const Tensor logits = linear(h, weights.lm_head);
  const Tensor loss = cross_entropy(reshape(logits, {batch * seq, config.vocab_size}),
                                    reshape(labels, {batch * seq}), 0.0, kIgnoredLabel);
  graph.set_output(kLoss, loss.id());
  if (with_logits) graph.set_output(kLogits, logits.id());
  return graph;
}

Graph llama_prefill_graph(const LlamaConfig& config, int64_t prompt, int64_t cache_length) {
  check_length(config, cache_length, "cache length");
  if (prompt <= 0 || prompt > cache_length) {
    throw Error("prompt of " + std::to_string(prompt) + " tokens does not fit a cache of " +
                std::to_string(cache_length));
  }
  Graph graph;
  const Weights weights = declare_weights(graph, config);
  const Tensor ids = input(graph, kInputIds, {1, prompt}, DType::i32);
  const Tensor h = hidden_states(graph, config, weights, ids, cache_length);
  const Tensor last = reshape(slice(h, 1, prompt - 1, prompt), {1, config.hidden_size});
  graph.set_output(kLogits, linear(last, weights.lm_head).id());
  return graph;
}

Graph llama_decode_graph(const LlamaConfig& config, int64_t cache_length) {
  check_length(config, cache_length, "cache length");
  Graph graph;
  const Weights weights = declare_weights(graph, config);
  const Tensor ids = input(graph, kInputIds, {1, 1}, DType::i32);
  const Tensor position = input(graph, kPosition, {1}, DType::i32);

  // The rope op at the token's position where the frequencies are the default ones, as the
  // prefill rotates (an index chain, which the attention computes as it loads the query);
  // scaled frequencies from tables gathered at the position.
  Rotary rotary;
  rotary.theta = config.rope_theta;
  if (config.rope_scaling.type == "default") {
    rotary.positions = reshape(position, {1, 1});
  } else {
    auto [cos_table, sin_table] = rotary_tables(config, cache_length);
    const TensorType table_type{DType::f32, {cache_length, config.head_dim}};
    const Tensor cos_all(&graph, graph.constant(std::move(cos_table), table_type));
    const Tensor sin_all(&graph, graph.constant(std::move(sin_table), table_type));
    rotary.cos = reshape(gather(cos_all, position), {1, 1, 1, config.head_dim});
    rotary.sin = reshape(gather(sin_all, position), {1, 1, 1, config.head_dim});
    rotary.half_turn = half_turn_matrix(graph, config.head_dim);
  }

  // Row r of a cache is this token's where r == position; attention sees rows 0..position.
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

  const TensorType cache_type{DType::f32, {1, config.kv_heads, cache_length, config.head_dim}};
  Tensor h = gather(weights.embed_tokens, ids);
  for (int64_t i = 0; i < config.layers; ++i) {
    const LayerWeights& layer = weights.layers[i];
    const Tensor x = rms_norm(h, layer.input_norm, config.rms_norm_eps);
    const Projections p = project(config, layer, x, rotary);
    Tensor caches[2];
    for (bool values : {false, true}) {
      const Tensor cache(&graph, graph.state(kv_cache_name(i, values), cache_type));
      caches[values] = where(is_new_row, values ? p.v : p.k, cache);
      graph.assign(cache.id(), caches[values].id());
    }
    h = attention_output(layer, h,
                         scaled_dot_product_attention(p.q, caches[0], caches[1], options));
    h = feed_forward(config, layer, h);
  }
  const Tensor last =
      reshape(rms_norm(h, weights.norm, config.rms_norm_eps), {1, config.hidden_size});
  graph.set_output(kLogits, linear(last, weights.lm_head).id());
  return graph;
}

}  // namespace mg::models
