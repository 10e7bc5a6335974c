// SmolVLA parity with tests/parity/smolvla_twin.py (Debian's python3-torch, CPU, float64), a twin
// that follows LeRobot's VLAFlowMatching and SmolVLMWithExpertModel: on tiny configs, the
// backbone's hidden states, the expert's velocity, the flow-matching loss and every weight's
// gradient of the training graph, and the action chunk of the one-program sampler against the
// twin's cached Euler loop. Language padding in one sample exercises LeRobot's masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/safetensors.hpp"
#include "meganeura/autodiff.hpp"
#include "meganeura/session.hpp"
#include "meganeura/train.hpp"
#include "models/smolvla.hpp"
#include "parity/run_command.hpp"
#include "runtime/loss_scaled_run.hpp"

namespace mg {
namespace {

nlohmann::json tiny_vlm() {
  return {{"model_type", "smolvlm"},
          {"scale_factor", 2},
          {"vision_config",
           {{"hidden_size", 32},
            {"intermediate_size", 64},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 2},
            {"patch_size", 8},
            {"image_size", 32},
            {"layer_norm_eps", 1e-6},
            {"hidden_act", "gelu_pytorch_tanh"}}},
          {"text_config",
           {{"model_type", "llama"},
            {"vocab_size", 96},
            {"hidden_size", 64},
            {"intermediate_size", 128},
            {"num_hidden_layers", 5},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 16},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 100000.0},
            {"hidden_act", "silu"}}}};
}

nlohmann::ordered_json tiny_policy(bool cross) {
  nlohmann::ordered_json policy = {{"type", "smolvla"},
                                   {"chunk_size", 6},
                                   {"max_state_dim", 8},
                                   {"max_action_dim", 6},
                                   {"num_steps", 3},
                                   {"resize_imgs_with_padding", {32, 32}},
                                   {"attention_mode", cross ? "cross_attn" : "self_attn"},
                                   {"num_vlm_layers", 4},
                                   {"num_expert_layers", cross ? -1 : 2},
                                   {"self_attn_every_n_layers", 2},
                                   {"expert_width_multiplier", 0.75},
                                   {"freeze_vision_encoder", false},
                                   {"train_expert_only", false}};
  policy["input_features"] = nlohmann::ordered_json::object();
  policy["input_features"]["observation.images.top"] = {{"type", "VISUAL"}, {"shape", {3, 32, 32}}};
  policy["input_features"]["observation.images.wrist"] = {{"type", "VISUAL"},
                                                          {"shape", {3, 32, 32}}};
  policy["input_features"]["observation.state"] = {{"type", "STATE"}, {"shape", {5}}};
  policy["output_features"] = {{"action", {{"type", "ACTION"}, {"shape", {4}}}}};
  return policy;
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference += std::pow(static_cast<double>(actual[i]) - expected[i], 2);
    norm += std::pow(static_cast<double>(expected[i]), 2);
  }
  return std::sqrt(difference / std::max(norm, 1e-30));
}

double l2_norm(const std::vector<float>& values) {
  double sum = 0;
  for (float value : values) sum += static_cast<double>(value) * value;
  return std::sqrt(sum);
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

std::vector<float> random_values(size_t count, std::mt19937_64& generator, float low, float high) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(generator);
  return values;
}

struct Scratch {
  std::filesystem::path directory;
  explicit Scratch(const std::string& name)
      : directory(std::filesystem::temp_directory_path() / ("meganeura-smolvla-" + name)) {
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
  }
  ~Scratch() { std::filesystem::remove_all(directory); }
};

void expect_parity(bool cross) {
  const nlohmann::json vlm = tiny_vlm();
  const nlohmann::ordered_json policy = tiny_policy(cross);
  const models::SmolVLAConfig config = models::smolvla_config_from_json(policy, vlm, "tiny");
  const int64_t batch = 2, language = 5;
  const int64_t side = config.vision.image_size;

  models::SmolVLALossOptions loss_options;
  loss_options.train_backbone = true;
  loss_options.with_prefix_hidden = true;
  Graph graph = models::smolvla_loss_graph(config, batch, language, loss_options);
  for (const auto& [parameter, grad] :
       gradients(graph, graph.output(models::kLoss), graph.leaves("parameter")))
    graph.set_output("grad." + graph.node(parameter).name, grad);
  SessionOptions options;
  options.seed = cross ? 3 : 4;
  Session session(graph, options);
  std::mt19937_64 generator(cross ? 11 : 12);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<io::TensorRecord> weights;
  const std::vector<std::string> leaves = session.persistent_names();
  for (const models::SmolVLAParameter& parameter : models::smolvla_parameters(config)) {
    int64_t count = 1;
    for (int64_t extent : parameter.shape) count *= extent;
    std::vector<float> values(count, 1.0f);
    // Larger weights than the initializer's 0.02 make every layer matter; norms perturbed.
    for (float& value : values)
      value = parameter.name.ends_with("norm.weight") ||
                      parameter.name.find("layer_norm") != std::string::npos
                  ? value + 0.1f * normal(generator)
                  : normal(generator);
    if (std::find(leaves.begin(), leaves.end(), parameter.name) != leaves.end())
      session.write(parameter.name, values);
    weights.push_back(record_of(parameter.name, DType::f32, parameter.shape, values));
  }

  const std::vector<float> pixels =
      random_values(batch * config.cameras() * 3 * side * side, generator, -1.0f, 1.0f);
  std::vector<int32_t> ids(batch * language);
  std::uniform_int_distribution<int32_t> token(1, static_cast<int32_t>(config.text.vocab_size - 1));
  for (int32_t& id : ids) id = token(generator);
  // The second sample's last two language tokens are padding.
  std::vector<bool> valid(batch * language, true);
  valid[2 * language - 1] = valid[2 * language - 2] = false;
  std::vector<int32_t> valid_ints(valid.begin(), valid.end());
  std::vector<float> state = random_values(batch * config.max_state_dim, generator, -1.0f, 1.0f);
  const size_t chunk = batch * config.chunk_size * config.max_action_dim;
  const std::vector<float> actions = random_values(chunk, generator, -1.0f, 1.0f);
  std::vector<float> noise(chunk);
  std::normal_distribution<float> standard(0.0f, 1.0f);
  for (float& value : noise) value = standard(generator);
  const std::vector<float> times = {0.73f, 0.21f};

  const models::SmolVLAMasks masks = models::smolvla_masks(config, batch, language, valid);
  session.set_input(models::kPixelValues, pixels);
  session.set_input(models::kLanguageIds, ids);
  session.set_input(models::kState, state);
  session.set_input(models::kAttentionMask, masks.attention_mask);
  session.set_input(models::kPositionIds, masks.position_ids);
  session.set_input(models::kActions, actions);
  session.set_input(models::kNoise, noise);
  session.set_input(models::kFlowTime, times);
  session.set_input(models::kTimeEmbedding, models::smolvla_time_embedding(config, times));
  session.run();

  Graph chunk_graph = models::smolvla_chunk_graph(config, batch, language, config.num_steps);
  Session sampler(chunk_graph, options);
  // Weights the sampler never reads (VLM layers past the expert's last) have no place in it.
  const std::vector<std::string> sampler_leaves = sampler.persistent_names();
  for (const io::TensorRecord& record : weights)
    if (std::find(sampler_leaves.begin(), sampler_leaves.end(), record.name) !=
        sampler_leaves.end())
      sampler.write(record.name, values_of(record));
  sampler.set_input(models::kPixelValues, pixels);
  sampler.set_input(models::kLanguageIds, ids);
  sampler.set_input(models::kState, state);
  sampler.set_input(models::kAttentionMask, masks.attention_mask);
  sampler.set_input(models::kPositionIds, masks.position_ids);
  sampler.set_input(models::kNoise, noise);
  sampler.run();

  Scratch scratch(cross ? "cross" : "self");
  io::SafetensorsFile weight_file;
  weight_file.tensors = weights;
  io::write_safetensors(scratch.directory / "weights.safetensors", weight_file);
  io::SafetensorsFile inputs;
  inputs.tensors.push_back(record_of(models::kPixelValues, DType::f32,
                                     {batch, config.cameras(), 3, side, side}, pixels));
  inputs.tensors.push_back(record_of(models::kLanguageIds, DType::i32, {batch, language}, ids));
  inputs.tensors.push_back(record_of("language_valid", DType::i32, {batch, language}, valid_ints));
  inputs.tensors.push_back(
      record_of(models::kState, DType::f32, {batch, config.max_state_dim}, state));
  const Shape chunk_shape{batch, config.chunk_size, config.max_action_dim};
  inputs.tensors.push_back(record_of(models::kActions, DType::f32, chunk_shape, actions));
  inputs.tensors.push_back(record_of(models::kNoise, DType::f32, chunk_shape, noise));
  inputs.tensors.push_back(record_of(models::kFlowTime, DType::f32, {batch}, times));
  io::write_safetensors(scratch.directory / "inputs.safetensors", inputs);
  std::ofstream(scratch.directory / "config.json")
      << nlohmann::ordered_json{{"policy", policy}, {"vlm", vlm}}.dump();
  run_command("/usr/bin/python3 " + std::string(MEGANEURA_SOURCE_DIR) +
              "/tests/parity/smolvla_twin.py " + scratch.directory.string() + " 2>&1");
  const io::SafetensorsFile twin =
      io::read_safetensors(scratch.directory / "twin.safetensors", "twin output");

  // The backbone's hidden states of padded tokens are LeRobot's artefacts (they attend
  // uniformly to nothing); compare valid tokens only.
  const std::vector<float> expected_hidden = values_of(*twin.find("prefix_hidden"));
  std::vector<float> hidden = session.output(models::kPrefixHidden);
  const int64_t prefix = models::smolvla_prefix_length(config, language);
  const int64_t images = config.cameras() * config.image_tokens();
  std::vector<float> kept, kept_expected;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < prefix; ++t) {
      if (t >= images && t < images + language && !valid[b * language + t - images]) continue;
      for (int64_t d = 0; d < config.text.hidden_size; ++d) {
        const size_t at = (b * prefix + t) * config.text.hidden_size + d;
        kept.push_back(hidden[at]);
        kept_expected.push_back(expected_hidden[at]);
      }
    }
  EXPECT_LT(relative_l2(kept, kept_expected), 1e-4);
  EXPECT_LT(relative_l2(session.output(models::kVelocity), values_of(*twin.find("velocity"))),
            1e-4);
  EXPECT_NEAR(session.scalar_output(models::kLoss), values_of(*twin.find("loss"))[0], 1e-4);
  int checked = 0;
  for (const models::SmolVLAParameter& parameter : models::smolvla_parameters(config)) {
    const io::TensorRecord* expected = twin.find("grad." + parameter.name);
    ASSERT_NE(expected, nullptr) << parameter.name;
    const std::vector<float> expected_grad = values_of(*expected);
    if (graph.find_leaf(parameter.name) != kNoValue &&
        graph.node(graph.find_leaf(parameter.name)).op == "parameter") {
      const std::vector<float> grad = session.output("grad." + parameter.name);
      if (l2_norm(expected_grad) < 1e-7) {
        // Attention keys' biases shift every score of a query alike: their gradient is zero
        // but for rounding.
        EXPECT_LT(l2_norm(grad), 1e-5) << parameter.name;
      } else {
        EXPECT_LT(relative_l2(grad, expected_grad), 1e-3) << parameter.name;
      }
      ++checked;
    } else {
      // Frozen because the loss does not reach it: the twin's gradient must be zero too.
      double norm = 0;
      for (float value : expected_grad) norm += std::abs(value);
      EXPECT_EQ(norm, 0.0) << parameter.name;
    }
  }
  EXPECT_GT(checked, 50);
  EXPECT_LT(
      relative_l2(sampler.output(models::kActionChunk), values_of(*twin.find("action_chunk"))),
      1e-4);
}

TEST(SmolVLAParity, CrossAttentionExpertBackboneVelocityGradientsAndChunk) {
  expect_parity(true);
}

TEST(SmolVLAParity, SelfAttentionHalfDepthExpertBackboneVelocityGradientsAndChunk) {
  expect_parity(false);
}

}  // namespace
}  // namespace mg

namespace mg {
namespace {

// The H200 check (bench/smolvla_parity_h200.py writes the folder): SmolVLA's real backbone
// config with transformers' random weights, against the twin run over transformers' vision tower.
// MEGANEURA_SMOLVLA_PARITY_DIR names the folder (config.json {"policy", "vlm"},
// weights.safetensors, inputs.safetensors, twin.safetensors); MEGANEURA_SMOLVLA_PARITY_PRECISION
// is strict (outputs within 1e-4, gradient norms within 1e-3) or fast (1e-2, 5e-2).
TEST(SmolVLAParity, FolderFromTransformers) {
  const char* folder = std::getenv("MEGANEURA_SMOLVLA_PARITY_DIR");
  if (!folder) GTEST_SKIP() << "set MEGANEURA_SMOLVLA_PARITY_DIR (bench/smolvla_parity_h200.py)";
  const std::filesystem::path dir = folder;
  const char* precision_text = std::getenv("MEGANEURA_SMOLVLA_PARITY_PRECISION");
  const Precision precision = parse_precision(precision_text ? precision_text : "strict");
  const double output_bound = precision == Precision::strict ? 1e-4 : 1e-2;
  const double grad_bound = precision == Precision::strict ? 1e-3 : 5e-2;
  std::ifstream config_file(dir / "config.json");
  const nlohmann::ordered_json both = nlohmann::ordered_json::parse(config_file);
  const nlohmann::json vlm = nlohmann::json::parse(both["vlm"].dump());
  const models::SmolVLAConfig config =
      models::smolvla_config_from_json(both["policy"], vlm, "parity");
  const io::SafetensorsFile weights = io::read_safetensors(dir / "weights.safetensors", "weights");
  const io::SafetensorsFile inputs = io::read_safetensors(dir / "inputs.safetensors", "inputs");
  const io::SafetensorsFile twin = io::read_safetensors(dir / "twin.safetensors", "twin output");
  const io::TensorRecord& ids_record = *inputs.find(models::kLanguageIds);
  const int64_t batch = ids_record.shape[0], language = ids_record.shape[1];
  std::vector<int32_t> ids(batch * language), valid_ints(batch * language);
  std::memcpy(ids.data(), ids_record.bytes.data(), ids.size() * 4);
  std::memcpy(valid_ints.data(), inputs.find("language_valid")->bytes.data(),
              valid_ints.size() * 4);
  const std::vector<bool> valid(valid_ints.begin(), valid_ints.end());
  const models::SmolVLAMasks masks = models::smolvla_masks(config, batch, language, valid);
  const std::vector<float> times = values_of(*inputs.find(models::kFlowTime));

  models::SmolVLALossOptions loss_options;
  loss_options.train_backbone = true;
  Graph graph = models::smolvla_loss_graph(config, batch, language, loss_options);
  // Fast precision's f16 operands need the loss scaled for small gradients to survive.
  const bool scaled = precision == Precision::fast;
  const std::vector<std::string> gradient_outputs =
      add_parameter_gradient_outputs(graph, graph.output(models::kLoss), scaled);
  SessionOptions options;
  options.precision = precision;
  options.initialise_parameters = false;
  Session session(graph, options);
  Session sampler(models::smolvla_chunk_graph(config, batch, language, config.num_steps), options);
  for (Session* program : {&session, &sampler}) {
    const std::vector<std::string> held = program->persistent_names();
    for (const io::TensorRecord& record : weights.tensors)
      if (std::find(held.begin(), held.end(), record.name) != held.end())
        program->write(record.name, values_of(record));
    program->set_input(models::kPixelValues, values_of(*inputs.find(models::kPixelValues)));
    program->set_input(models::kLanguageIds, ids);
    program->set_input(models::kState, values_of(*inputs.find(models::kState)));
    program->set_input(models::kAttentionMask, masks.attention_mask);
    program->set_input(models::kPositionIds, masks.position_ids);
    program->set_input(models::kNoise, values_of(*inputs.find(models::kNoise)));
  }
  session.set_input(models::kActions, values_of(*inputs.find(models::kActions)));
  session.set_input(models::kFlowTime, times);
  session.set_input(models::kTimeEmbedding, models::smolvla_time_embedding(config, times));
  const double loss_scale = run_gradients(session, gradient_outputs, scaled);
  sampler.run();
  EXPECT_LT(relative_l2(session.output(models::kVelocity), values_of(*twin.find("velocity"))),
            output_bound);
  EXPECT_LT(
      relative_l2(sampler.output(models::kActionChunk), values_of(*twin.find("action_chunk"))),
      output_bound);
  for (ValueId leaf : graph.leaves("parameter")) {
    const std::string& name = graph.node(leaf).name;
    const double expected = l2_norm(values_of(*twin.find("grad." + name)));
    const double actual = l2_norm(session.output("grad." + name)) / loss_scale;
    if (expected < 1e-7) continue;  // attention keys' biases: zero but for rounding
    EXPECT_LT(std::abs(actual - expected) / expected, grad_bound) << name;
  }
}

}  // namespace
}  // namespace mg
