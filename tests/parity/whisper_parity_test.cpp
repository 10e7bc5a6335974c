// Whisper parity with PyTorch (Debian's python3-torch, CPU, float64; tests/parity/whisper_twin.py
// follows transformers' modeling_whisper): the encoder's output, the decoder's logits, the loss
// and every trained tensor's gradient of a tiny config (all of it, and the decoder alone), 20
// AdamW steps, and generation's programs (cross kv once, then one-token decode steps over the
// KV cache, all over shared weights) against the twin's logits of the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/error.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/whisper.hpp"
#include "parity/run_command.hpp"

namespace mg {
namespace {

namespace wio = models::whisper_io;

constexpr int32_t kPad = 95;
constexpr int32_t kStart = 94;

nlohmann::json tiny_config() {
  return {{"model_type", "whisper"},
          {"vocab_size", 96},
          {"d_model", 64},
          {"encoder_layers", 2},
          {"encoder_attention_heads", 4},
          {"encoder_ffn_dim", 128},
          {"decoder_layers", 2},
          {"decoder_attention_heads", 4},
          {"decoder_ffn_dim", 128},
          {"num_mel_bins", 80},
          {"max_source_positions", 64},
          {"max_target_positions", 32},
          {"activation_function", "gelu"},
          {"scale_embedding", false},
          {"tie_word_embeddings", true},
          {"decoder_start_token_id", kStart},
          {"pad_token_id", kPad},
          {"eos_token_id", kPad}};
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

template <typename T>
io::TensorRecord record_of(const std::string& name, DType dtype, Shape shape,
                           const std::vector<T>& values) {
  io::TensorRecord record{name, dtype, std::move(shape), {}};
  record.bytes.resize(values.size() * sizeof(T));
  std::memcpy(record.bytes.data(), values.data(), record.bytes.size());
  return record;
}

struct Scratch {
  std::filesystem::path directory;
  explicit Scratch(const std::string& name)
      : directory(std::filesystem::temp_directory_path() / ("meganeura-whisper-" + name)) {
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
  }
  ~Scratch() { std::filesystem::remove_all(directory); }
};

// Seeded batches: features in [-1, 1]; decoder inputs start with the start token, the second
// row ends in padding (pad inputs, ignored labels); labels are the next inputs.
struct Batches {
  int64_t count = 0, batch = 0, tokens = 0;
  std::vector<float> features;
  std::vector<int32_t> ids, labels;

  std::vector<float> features_of(int64_t i, int64_t per_batch) const {
    return {features.begin() + i * per_batch, features.begin() + (i + 1) * per_batch};
  }
  std::vector<int32_t> ids_of(int64_t i) const {
    return {ids.begin() + i * batch * tokens, ids.begin() + (i + 1) * batch * tokens};
  }
  std::vector<int32_t> labels_of(int64_t i) const {
    return {labels.begin() + i * batch * tokens, labels.begin() + (i + 1) * batch * tokens};
  }
};

Batches random_batches(const models::WhisperConfig& config, int64_t count, int64_t batch,
                       int64_t tokens, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, kStart - 1);
  Batches b{count, batch, tokens, {}, {}, {}};
  b.features.resize(count * batch * config.num_mel_bins * config.input_frames());
  for (float& value : b.features) value = uniform(generator);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t text = row == 1 ? tokens - 3 : tokens;  // the second row pads its last 3
      std::vector<int32_t> sequence = {kStart};
      for (int64_t t = 1; t <= tokens; ++t) sequence.push_back(token(generator));
      for (int64_t t = 0; t < tokens; ++t) {
        b.ids.push_back(t < text ? sequence[t] : kPad);
        b.labels.push_back(t < text ? sequence[t + 1] : wio::kIgnoredLabel);
      }
    }
  }
  return b;
}

Session* holder_of(const std::vector<Session*>& sessions, const std::string& name) {
  for (Session* session : sessions) {
    const std::vector<std::string> names = session->persistent_names();
    if (std::find(names.begin(), names.end(), name) != names.end()) return session;
  }
  throw Error("no program holds " + name);
}

// Larger weights than the initializer's 0.02 make every layer matter; the encoder's positions
// are transformers' sinusoids. Each tensor goes through the first session whose program uses it.
void write_random_weights(const std::vector<Session*>& sessions,
                          const models::WhisperConfig& config, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (const auto& [name, shape] : models::whisper_parameters(config)) {
    Session& session = *holder_of(sessions, name);
    std::vector<float> values(element_count(shape));
    if (name == models::kEncoderPositions) {
      values = models::whisper_sinusoids(config.max_source_positions, config.d_model);
    } else if (name.find("layer_norm.weight") != std::string::npos) {
      for (float& value : values) value = 1.0f + normal(generator);
    } else {
      for (float& value : values) value = normal(generator);
    }
    session.write(name, values);
  }
}

io::SafetensorsFile run_twin(const Scratch& scratch, const models::WhisperConfig& config,
                             const std::vector<Session*>& sessions, const Batches& batches,
                             int steps, double learning_rate, bool train_encoder) {
  io::SafetensorsFile weights;
  for (const auto& [name, shape] : models::whisper_parameters(config))
    weights.tensors.push_back(
        record_of(name, DType::f32, shape, holder_of(sessions, name)->read(name)));
  io::write_safetensors(scratch.directory / "weights.safetensors", weights);
  io::SafetensorsFile inputs;
  inputs.tensors.push_back(
      record_of(wio::kInputFeatures, DType::f32,
                {batches.count, batches.batch, config.num_mel_bins, config.input_frames()},
                batches.features));
  inputs.tensors.push_back(record_of(wio::kDecoderInputIds, DType::i32,
                                     {batches.count, batches.batch, batches.tokens}, batches.ids));
  inputs.tensors.push_back(record_of(
      wio::kLabels, DType::i32, {batches.count, batches.batch, batches.tokens}, batches.labels));
  io::write_safetensors(scratch.directory / "inputs.safetensors", inputs);
  std::ofstream(scratch.directory / "config.json") << tiny_config().dump();
  const std::string script = std::string(MEGANEURA_SOURCE_DIR) + "/tests/parity/whisper_twin.py";
  const std::filesystem::path out = scratch.directory / "twin.safetensors";
  run_command("/usr/bin/python3 " + script + " " + (scratch.directory / "config.json").string() +
              " " + (scratch.directory / "weights.safetensors").string() + " " +
              (scratch.directory / "inputs.safetensors").string() + " " + out.string() + " " +
              std::to_string(steps) + " " + std::to_string(learning_rate) + " " +
              (train_encoder ? "1" : "0") + " 2>&1");
  return io::read_safetensors(out, "twin output");
}

SessionOptions shared_options(uint64_t seed) {
  SessionOptions options;
  options.shared_device = open_shared_device();
  options.shared_tensors = make_shared_tensors(options.shared_device);
  options.seed = seed;
  return options;
}

void expect_forward_and_gradients(bool train_encoder) {
  const models::WhisperConfig config =
      models::whisper_config_from_json(tiny_config(), "tiny config");
  const int64_t batch = 2, tokens = 10;
  Graph graph = models::whisper_loss_graph(config, batch, tokens, train_encoder, true);
  const std::vector<ValueId> trained = graph.leaves("parameter");
  for (const auto& [parameter, grad] : gradients(graph, graph.output(wio::kLoss), trained))
    graph.set_output("grad." + graph.node(parameter).name, grad);
  const SessionOptions options = shared_options(train_encoder ? 3 : 4);
  Session session(graph, options);
  Session encoder(models::whisper_encoder_graph(config, batch), options);
  write_random_weights({&session}, config, train_encoder ? 41 : 43);
  const Batches batches = random_batches(config, 1, batch, tokens, 47);
  const std::vector<float> features = batches.features_of(0, batches.features.size());
  session.set_input(wio::kInputFeatures, features);
  session.set_input(wio::kDecoderInputIds, batches.ids);
  session.set_input(wio::kLabels, batches.labels);
  session.run();
  encoder.set_input(wio::kInputFeatures, features);
  encoder.run();

  Scratch scratch(train_encoder ? "all" : "decoder");
  const io::SafetensorsFile twin =
      run_twin(scratch, config, {&session}, batches, 0, 0, train_encoder);
  EXPECT_LT(relative_l2(encoder.output(wio::kEncoderHiddenStates),
                        values_of(*twin.find(wio::kEncoderHiddenStates))),
            1e-4);
  EXPECT_LT(relative_l2(session.output(wio::kLogits), values_of(*twin.find(wio::kLogits))), 1e-4);
  EXPECT_NEAR(session.scalar_output(wio::kLoss), values_of(*twin.find(wio::kLoss))[0], 1e-4);
  size_t compared = 0;
  for (const auto& [name, shape] : models::whisper_parameters(config)) {
    const bool is_trained = name != models::kEncoderPositions &&
                            (train_encoder || !models::is_whisper_encoder_tensor(name));
    const io::TensorRecord* expected = twin.find("grad." + name);
    ASSERT_EQ(expected != nullptr, is_trained) << name;
    if (!is_trained) continue;
    EXPECT_LT(relative_l2(session.output("grad." + name), values_of(*expected)), 1e-3) << name;
    ++compared;
  }
  EXPECT_EQ(compared, trained.size());
}

TEST(WhisperParity, EncoderLogitsLossAndEveryGradient) {
  expect_forward_and_gradients(true);
}

TEST(WhisperParity, DecoderAloneGradients) {
  expect_forward_and_gradients(false);
}

TEST(WhisperParity, TwentyAdamWStepsFollowPyTorch) {
  const models::WhisperConfig config =
      models::whisper_config_from_json(tiny_config(), "tiny config");
  const int64_t batch = 2, tokens = 8;
  const int steps = 20;
  Graph graph = models::whisper_loss_graph(config, batch, tokens);
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 2e-3;
  optimizer.weight_decay = 0.1;
  optimizer.clip_norm = 1.0;
  add_training(graph, graph.output(wio::kLoss), optimizer);
  SessionOptions options;
  options.seed = 9;
  Session session(graph, options);
  session.write(models::kEncoderPositions,
                models::whisper_sinusoids(config.max_source_positions, config.d_model));
  const Batches batches = random_batches(config, steps + 1, batch, tokens, 53);

  Scratch scratch("adamw");
  const io::SafetensorsFile twin =
      run_twin(scratch, config, {&session}, batches, steps, optimizer.learning_rate, true);
  const std::vector<float> expected = values_of(*twin.find("losses"));
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  const int64_t per_batch = batch * config.num_mel_bins * config.input_frames();
  for (int step = 0; step < steps; ++step) {
    session.set_input(wio::kInputFeatures, batches.features_of(step + 1, per_batch));
    session.set_input(wio::kDecoderInputIds, batches.ids_of(step + 1));
    session.set_input(wio::kLabels, batches.labels_of(step + 1));
    for (const auto& [name, value] : optimizer_inputs(optimizer, step))
      session.set_input(name, std::vector<float>{static_cast<float>(value)});
    session.run();
    EXPECT_NEAR(session.scalar_output(wio::kLoss), expected[step], 2e-4 * expected[step])
        << "step " << step;
  }
}

// The cross kv program once, then greedy decode steps reading and appending to the KV cache:
// each step's logits must be the twin's logits at that position of the whole sequence.
TEST(WhisperParity, CrossKvAndDecodeStepsFollowTheTwin) {
  const models::WhisperConfig config =
      models::whisper_config_from_json(tiny_config(), "tiny config");
  const int64_t steps = 9, cache_length = 16;
  const SessionOptions options = shared_options(5);
  Session cross(models::whisper_cross_kv_graph(config), options);
  Session decode(models::whisper_decode_graph(config, cache_length), options);
  write_random_weights({&cross, &decode}, config, 59);
  Batches batches = random_batches(config, 1, 1, 1, 61);
  cross.set_input(wio::kInputFeatures, batches.features);
  cross.run();

  std::vector<int32_t> tokens = {kStart};
  std::vector<std::vector<float>> step_logits;
  for (int64_t step = 0; step < steps; ++step) {
    decode.set_input(wio::kDecoderInputIds, std::vector<int32_t>{tokens.back()});
    decode.set_input(wio::kPosition, std::vector<int32_t>{static_cast<int32_t>(step)});
    decode.run();
    step_logits.push_back(decode.output(wio::kLogits));
    const auto& logits = step_logits.back();
    tokens.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  tokens.pop_back();
  batches.tokens = steps;
  batches.ids = tokens;
  batches.labels = tokens;
  Scratch scratch("decode");
  const io::SafetensorsFile twin =
      run_twin(scratch, config, {&cross, &decode}, batches, 0, 0, true);
  const std::vector<float> all = values_of(*twin.find(wio::kLogits));
  for (int64_t step = 0; step < steps; ++step) {
    const std::vector<float> expected(all.begin() + step * config.vocab_size,
                                      all.begin() + (step + 1) * config.vocab_size);
    EXPECT_LT(relative_l2(step_logits[step], expected), 1e-4) << "position " << step;
  }
}

}  // namespace
}  // namespace mg
