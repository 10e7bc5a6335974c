// Llama parity with PyTorch (Debian's python3-torch, CPU, float64; tests/parity/llama_twin.py
// follows transformers' modeling_llama): logits, every parameter's gradient and 20 AdamW steps
// of tiny configs, and the prefill + decode programs (over shared weights and KV caches)
// against the twin's logits of the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/llama.hpp"
#include "parity/run_command.hpp"

namespace mg {
namespace {

nlohmann::json tiny_config(bool variant) {
  nlohmann::json config = {{"model_type", "llama"},       {"vocab_size", 96},
                           {"hidden_size", 64},           {"intermediate_size", 128},
                           {"num_hidden_layers", 2},      {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},    {"max_position_embeddings", 64},
                           {"rms_norm_eps", 1e-5},        {"rope_theta", 10000.0},
                           {"tie_word_embeddings", true}, {"hidden_act", "silu"}};
  if (variant) {
    config["tie_word_embeddings"] = false;
    config["attention_bias"] = true;
    config["rope_theta"] = 500000.0;
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 16}};
  }
  return config;
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(static_cast<double>(actual[i]) - expected[i], 2);
    norm += std::pow(static_cast<double>(expected[i]), 2);
  }
  return std::sqrt(difference / std::max(norm, 1e-30));
}

std::vector<float> values_of(const io::TensorRecord& record) {
  std::vector<float> values(record.bytes.size() / 4);
  std::memcpy(values.data(), record.bytes.data(), record.bytes.size());
  return values;
}

struct Scratch {
  std::filesystem::path directory;
  explicit Scratch(const std::string& name)
      : directory(std::filesystem::temp_directory_path() / ("meganeura-llama-" + name)) {
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
  }
  ~Scratch() { std::filesystem::remove_all(directory); }
};

// Writes the parameters of `session`, the config and the token batches, runs the twin and
// returns its outputs.
io::SafetensorsFile run_twin(const Scratch& scratch, const nlohmann::json& config,
                             const models::LlamaConfig& llama, const Session& session,
                             const std::vector<std::vector<int32_t>>& batches, int64_t batch,
                             int64_t seq, int steps, double learning_rate) {
  io::SafetensorsFile weights;
  for (const auto& [name, shape] : models::llama_parameters(llama)) {
    const std::vector<float> values = session.read(name);
    io::TensorRecord record{name, DType::f32, shape, {}};
    record.bytes.resize(values.size() * 4);
    std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
    weights.tensors.push_back(std::move(record));
  }
  io::write_safetensors(scratch.directory / "weights.safetensors", weights);
  std::ofstream(scratch.directory / "config.json") << config.dump();
  std::ofstream ids(scratch.directory / "batches.bin", std::ios::binary);
  for (const std::vector<int32_t>& tokens : batches)
    ids.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  ids.close();
  const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/llama_twin.py";
  const std::filesystem::path out = scratch.directory / "twin.safetensors";
  run_command("/usr/bin/python3 " + script + " " + (scratch.directory / "config.json").string() +
              " " + (scratch.directory / "weights.safetensors").string() + " " +
              (scratch.directory / "batches.bin").string() + " " + std::to_string(batch) + " " +
              std::to_string(seq) + " " + out.string() + " " + std::to_string(steps) + " " +
              std::to_string(learning_rate) + " 2>&1");
  return io::read_safetensors(out, "twin output");
}

std::vector<std::vector<int32_t>> random_batches(int count, int64_t elements, int64_t vocab,
                                                 uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> batches(count, std::vector<int32_t>(elements));
  for (auto& tokens : batches)
    for (int32_t& id : tokens) id = token(generator);
  return batches;
}

// labels[t] = ids[t + 1] within each sequence, the last position ignored.
std::vector<int32_t> next_tokens(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) {
  std::vector<int32_t> labels(ids.size(), static_cast<int32_t>(models::kIgnoredLabel));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t + 1 < seq; ++t) labels[b * seq + t] = ids[b * seq + t + 1];
  return labels;
}

void expect_forward_and_gradients(bool variant) {
  const int64_t batch = 2, seq = 12;
  const nlohmann::json config = tiny_config(variant);
  const models::LlamaConfig llama = models::llama_config_from_json(config, "tiny config");
  Graph graph = models::llama_loss_graph(llama, batch, seq, true);
  std::vector<ValueId> parameters = graph.leaves("parameter");
  const std::map<ValueId, ValueId> grads =
      gradients(graph, graph.output(models::kLoss), parameters);
  for (const auto& [parameter, grad] : grads)
    graph.set_output("grad." + graph.node(parameter).name, grad);
  SessionOptions options;
  options.seed = variant ? 7 : 5;
  Session session(graph, options);
  // Larger weights than the initializer's 0.02 make every layer matter to the logits.
  std::mt19937_64 generator(17);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const auto& [name, shape] : models::llama_parameters(llama)) {
    if (name.ends_with("norm.weight")) continue;
    std::vector<float> values(session.leaf_type(name).elements());
    for (float& value : values) value = normal(generator);
    session.write(name, values);
  }
  const auto batches = random_batches(1, batch * seq, llama.vocab_size, 23);
  session.set_input(models::kInputIds, batches[0]);
  session.set_input(models::kLabels, next_tokens(batches[0], batch, seq));
  session.run();

  Scratch scratch(variant ? "variant" : "tied");
  const io::SafetensorsFile twin =
      run_twin(scratch, config, llama, session, batches, batch, seq, 0, 0.0);
  EXPECT_LT(relative_l2(session.output(models::kLogits), values_of(*twin.find("logits"))), 1e-4);
  EXPECT_NEAR(session.scalar_output(models::kLoss), values_of(*twin.find("loss"))[0], 1e-4);
  for (const auto& [name, shape] : models::llama_parameters(llama)) {
    const io::TensorRecord* expected = twin.find("grad." + name);
    ASSERT_NE(expected, nullptr) << name;
    EXPECT_LT(relative_l2(session.output("grad." + name), values_of(*expected)), 1e-3) << name;
  }
}

TEST(LlamaParity, TiedTinyModelLogitsAndEveryGradient) {
  expect_forward_and_gradients(false);
}

TEST(LlamaParity, Llama3RopeBiasesAndSeparateHeadLogitsAndEveryGradient) {
  expect_forward_and_gradients(true);
}

TEST(LlamaParity, TwentyAdamWStepsFollowPyTorch) {
  const int64_t batch = 2, seq = 16;
  const int steps = 20;
  const nlohmann::json config = tiny_config(false);
  const models::LlamaConfig llama = models::llama_config_from_json(config, "tiny config");
  Graph graph = models::llama_loss_graph(llama, batch, seq);
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 3e-3;
  optimizer.weight_decay = 0.1;
  optimizer.clip_norm = 1.0;
  add_training(graph, graph.output(models::kLoss), optimizer);
  SessionOptions options;
  options.seed = 9;
  Session session(graph, options);
  const auto batches = random_batches(steps + 1, batch * seq, llama.vocab_size, 31);

  Scratch scratch("adamw");
  const io::SafetensorsFile twin = run_twin(scratch, config, llama, session, batches, batch, seq,
                                            steps, optimizer.learning_rate);
  const std::vector<float> expected = values_of(*twin.find("losses"));
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  for (int step = 0; step < steps; ++step) {
    session.set_input(models::kInputIds, batches[step + 1]);
    session.set_input(models::kLabels, next_tokens(batches[step + 1], batch, seq));
    for (const auto& [name, value] : optimizer_inputs(optimizer, step))
      session.set_input(name, std::vector<float>{static_cast<float>(value)});
    session.run();
    EXPECT_NEAR(session.scalar_output(models::kLoss), expected[step], 2e-4 * expected[step])
        << "step " << step;
  }
}

// Prefill of a prompt, then greedy decode steps that read and append to the KV caches, all over
// one copy of the weights: each step's logits must be the twin's logits at that position of the
// whole sequence.
void expect_decode_follows_forward(bool variant) {
  const nlohmann::json config = tiny_config(variant);
  const models::LlamaConfig llama = models::llama_config_from_json(config, "tiny config");
  const int64_t prompt = 5, generated = 9, cache_length = 24;
  std::shared_ptr<SharedDevice> device = open_shared_device();
  SessionOptions options;
  options.shared_device = device;
  options.shared_tensors = make_shared_tensors(device);
  options.seed = 13;
  Session prefill(models::llama_prefill_graph(llama, prompt, cache_length), options);
  Session decode(models::llama_decode_graph(llama, cache_length), options);
  std::mt19937_64 generator(19);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const auto& [name, shape] : models::llama_parameters(llama)) {
    if (name.ends_with("norm.weight")) continue;
    std::vector<float> values(prefill.leaf_type(name).elements());
    for (float& value : values) value = normal(generator);
    prefill.write(name, values);
  }
  std::vector<int32_t> tokens = random_batches(1, prompt, llama.vocab_size, 29)[0];
  prefill.set_input(models::kInputIds, tokens);
  prefill.run();
  std::vector<std::vector<float>> step_logits = {prefill.output(models::kLogits)};
  const auto greedy = [](const std::vector<float>& logits) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  for (int64_t step = 0; step < generated; ++step) {
    tokens.push_back(greedy(step_logits.back()));
    decode.set_input(models::kInputIds, std::vector<int32_t>{tokens.back()});
    decode.set_input(models::kPosition,
                     std::vector<int32_t>{static_cast<int32_t>(tokens.size() - 1)});
    decode.run();
    step_logits.push_back(decode.output(models::kLogits));
  }
  // The twin runs the whole sequence once; step i's logits are its row prompt - 1 + i.
  Scratch scratch(variant ? "decode-variant" : "decode");
  const int64_t seq = static_cast<int64_t>(tokens.size());
  const io::SafetensorsFile twin =
      run_twin(scratch, config, llama, prefill, {tokens}, 1, seq, 0, 0.0);
  const std::vector<float> all = values_of(*twin.find("logits"));
  for (size_t i = 0; i < step_logits.size(); ++i) {
    const int64_t row = prompt - 1 + static_cast<int64_t>(i);
    const std::vector<float> expected(all.begin() + row * llama.vocab_size,
                                      all.begin() + (row + 1) * llama.vocab_size);
    EXPECT_LT(relative_l2(step_logits[i], expected), 1e-4) << "position " << row;
  }
}

TEST(LlamaParity, PrefillAndDecodeOverSharedWeightsFollowTheTwin) {
  expect_decode_follows_forward(false);
}

TEST(LlamaParity, DecodeWithLlama3RopeFollowsTheTwin) {
  expect_decode_follows_forward(true);
}

}  // namespace
}  // namespace mg
