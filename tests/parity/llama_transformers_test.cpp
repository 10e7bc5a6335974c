// A LlamaForCausalLM folder written by transformers' save_pretrained (random weights; made by
// tests/fixtures/make_hf_fixtures.py with transformers 5.17 on the H200 machine), with the
// logits, loss, gradient norms and greedy tokens that transformers computed: the same folder
// through Meganeura's loss, prefill and decode programs must give the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "models/llama.hpp"

namespace mg {
namespace {

const std::filesystem::path kFolder =
    std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests/fixtures/model_folders/llama_tiny_f32";

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  return nlohmann::json::parse(file);
}

void write_weights(Session& session, const models::LlamaConfig& config) {
  const io::SafetensorsFile file = io::read_safetensors(kFolder / "model.safetensors");
  for (const auto& [name, shape] : models::llama_parameters(config)) {
    const io::TensorRecord* record = file.find(name);
    ASSERT_NE(record, nullptr) << name;
    ASSERT_EQ(record->shape, shape) << name;
    std::vector<float> values(record->bytes.size() / 4);
    std::memcpy(values.data(), record->bytes.data(), record->bytes.size());
    session.write(name, values);
  }
}

TEST(LlamaTransformers, LogitsLossAndGradientNormsOfASavePretrainedFolder) {
  const models::LlamaConfig config =
      models::llama_config_from_json(read_json(kFolder / "config.json"), "config.json");
  const nlohmann::json reference = read_json(kFolder / "reference.json");
  const std::vector<int32_t> ids = reference["input_ids"].get<std::vector<int32_t>>();
  const int64_t seq = static_cast<int64_t>(ids.size());
  Graph graph = models::llama_loss_graph(config, 1, seq, true);
  const std::map<ValueId, ValueId> grads =
      gradients(graph, graph.output(models::kLoss), graph.leaves("parameter"));
  for (const auto& [parameter, grad] : grads)
    graph.set_output("grad." + graph.node(parameter).name, grad);
  Session session(graph);
  write_weights(session, config);
  std::vector<int32_t> labels(ids.begin() + 1, ids.end());
  labels.push_back(static_cast<int32_t>(models::kIgnoredLabel));
  session.set_input(models::kInputIds, ids);
  session.set_input(models::kLabels, labels);
  session.run();

  const std::vector<float> logits = session.output(models::kLogits);
  const std::vector<double> expected = reference["logits"].get<std::vector<double>>();
  ASSERT_EQ(logits.size(), expected.size());
  double difference = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(logits[i] - expected[i], 2);
    norm += expected[i] * expected[i];
  }
  EXPECT_LT(std::sqrt(difference / norm), 1e-4);
  const double loss = reference["loss"].get<double>();
  EXPECT_NEAR(session.scalar_output(models::kLoss), loss, 1e-5 * loss);
  for (const auto& [name, expected_norm] : reference["gradient_norms"].items()) {
    const std::vector<float> grad = session.output("grad." + name);
    double squares = 0;
    for (float value : grad) squares += static_cast<double>(value) * value;
    EXPECT_NEAR(std::sqrt(squares), expected_norm.get<double>(), 1e-3 * expected_norm.get<double>())
        << name;
  }
}

TEST(LlamaTransformers, NextTokensAreTheArgmaxOfTransformersLogits) {
  const models::LlamaConfig config =
      models::llama_config_from_json(read_json(kFolder / "config.json"), "config.json");
  const nlohmann::json reference = read_json(kFolder / "reference.json");
  const std::vector<int32_t> ids = reference["input_ids"].get<std::vector<int32_t>>();
  const std::vector<double> logits = reference["logits"].get<std::vector<double>>();
  const int64_t seq = static_cast<int64_t>(ids.size());
  Session session(models::llama_next_token_graph(config, 1, seq));
  write_weights(session, config);
  session.set_input(models::kInputIds, ids);
  session.run();
  const std::vector<float> next = session.output(models::kNextTokens);
  ASSERT_EQ(next.size(), ids.size());
  for (int64_t t = 0; t < seq; ++t) {
    const auto row = logits.begin() + t * config.vocab_size;
    EXPECT_EQ(static_cast<int64_t>(next[t]), std::max_element(row, row + config.vocab_size) - row)
        << "position " << t;
  }
}

TEST(LlamaTransformers, GreedyTokensOfTransformersGenerate) {
  const models::LlamaConfig config =
      models::llama_config_from_json(read_json(kFolder / "config.json"), "config.json");
  const nlohmann::json reference = read_json(kFolder / "reference.json");
  std::vector<int32_t> tokens = reference["greedy_prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> expected = reference["greedy_tokens"].get<std::vector<int32_t>>();
  const int64_t prompt = static_cast<int64_t>(tokens.size());
  const int64_t cache_length = prompt + static_cast<int64_t>(expected.size());
  std::shared_ptr<SharedDevice> device = open_shared_device();
  SessionOptions options;
  options.shared_device = device;
  options.shared_tensors = make_shared_tensors(device);
  Session prefill(models::llama_prefill_graph(config, prompt, cache_length), options);
  Session decode(models::llama_decode_graph(config, cache_length), options);
  write_weights(prefill, config);
  prefill.set_input(models::kInputIds, tokens);
  prefill.run();
  std::vector<float> logits = prefill.output(models::kLogits);
  std::vector<int32_t> generated;
  while (generated.size() < expected.size()) {
    generated.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (generated.size() == expected.size()) break;
    decode.set_input(models::kInputIds, std::vector<int32_t>{generated.back()});
    decode.set_input(models::kPosition,
                     std::vector<int32_t>{static_cast<int32_t>(prompt + generated.size() - 1)});
    decode.run();
    logits = decode.output(models::kLogits);
  }
  EXPECT_EQ(generated, expected);
}

}  // namespace
}  // namespace mg
