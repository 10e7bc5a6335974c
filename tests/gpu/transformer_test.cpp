// A small Llama-style transformer trains on the GPU with the same losses as the f64 reference
// interpreter, step by step; and the CNN gives bit-identical results with memory reuse on/off.
#include <random>

#include "harness.hpp"
#include "meganeura/nn.hpp"
#include "meganeura/train.hpp"
#include "models/classifier.hpp"

namespace mg {
namespace {

constexpr int64_t kBatch = 2, kSequence = 8, kVocab = 17, kDim = 16;

Graph tiny_transformer(const OptimizerConfig& optimizer) {
  Graph graph;
  const Tensor tokens = input(graph, "tokens", {kBatch, kSequence}, DType::i32);
  const Tensor targets = input(graph, "targets", {kBatch * kSequence}, DType::i32);
  const nn::Embedding embed(graph, "model.embed_tokens", kVocab, kDim);
  const nn::RMSNorm attention_norm(graph, "model.layers.0.input_layernorm", kDim);
  nn::MultiHeadAttentionOptions attention_options;
  attention_options.kv_heads = 2;
  attention_options.causal = true;
  attention_options.rope_theta = 10000.0;
  const nn::MultiHeadAttention attention(graph, "model.layers.0.self_attn", kDim, 4,
                                         attention_options);
  const nn::RMSNorm mlp_norm(graph, "model.layers.0.post_attention_layernorm", kDim);
  const nn::MLP mlp(graph, "model.layers.0.mlp", kDim, 32);
  const nn::RMSNorm final_norm(graph, "model.norm", kDim);
  const nn::Linear head(graph, "lm_head", kDim, kVocab, false);

  Tensor x = embed(tokens);
  x = x + attention(attention_norm(x));
  x = x + mlp(mlp_norm(x));
  const Tensor logits = reshape(head(final_norm(x)), {kBatch * kSequence, kVocab});
  add_training(graph, cross_entropy(logits, targets).id(), optimizer);
  return graph;
}

TEST(GpuTransformer, TrainingMatchesReferenceOverTwentySteps) {
  OptimizerConfig optimizer;
  optimizer.kind = OptimizerConfig::Kind::adamw;
  optimizer.learning_rate = 3e-3;
  optimizer.weight_decay = 0.01;
  optimizer.clip_norm = 1.0;
  const Graph graph = tiny_transformer(optimizer);
  SessionOptions options;
  options.validation = true;
  Session session(graph, options);
  Environment environment;
  initialise_leaves(graph, environment, options.seed);

  std::mt19937_64 generator(21);
  double worst = 0;
  for (int step = 0; step < 20; ++step) {
    std::vector<int32_t> tokens(kBatch * kSequence), targets(kBatch * kSequence);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(generator() % kVocab);
      targets[i] = (tokens[i] + 1) % kVocab;  // learnable: predict the next token id
    }
    session.set_input("tokens", tokens);
    session.set_input("targets", targets);
    environment.leaves["tokens"] = HostTensor({kBatch, kSequence}, {tokens.begin(), tokens.end()});
    environment.leaves["targets"] =
        HostTensor({kBatch * kSequence}, {targets.begin(), targets.end()});
    for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
      session.set_input(name, std::vector<float>{static_cast<float>(value)});
      environment.leaves[name] = HostTensor({}, value);
    }
    session.run();
    const double reference = mg::step(graph, environment)[graph.output("loss")].data[0];
    const double gpu = session.scalar_output("loss");
    worst = std::max(worst, std::abs(gpu - reference) / std::abs(reference));
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(session.validation_messages(), 0u);
}

// Memory reuse off, and launches in the lowering's order instead of scheduled into epochs
// (plan::PlanOptions::schedule_epochs), change where values live and when launches run, not
// what they compute.
TEST(GpuTransformer, CnnPlannerReuseAndSchedulingGiveBitIdenticalResults) {
  const OptimizerConfig optimizer;
  const Graph graph = models::build_classifier_training(models::ClassifierConfig{}, 4, optimizer);
  std::mt19937_64 generator(8);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(4 * 28 * 28);
  for (float& value : images) value = pixel(generator);
  const std::vector<int32_t> labels{3, 1, 4, 1};
  std::vector<std::vector<float>> results;
  for (const auto& [reuse, schedule] : {std::pair{true, true}, {false, true}, {true, false}}) {
    const testing::ScopedSwitch scheduling("MEGANEURA_SCHEDULE_EPOCHS", schedule ? "1" : "0");
    SessionOptions options = testing::session_options();
    options.reuse_memory = reuse;
    options.validation = true;
    Session session(graph, options);
    std::vector<float> trajectory;
    for (int step = 0; step < 2; ++step) {
      session.set_input(models::kImagesInput, images);
      session.set_input(models::kLabelsInput, labels);
      for (const auto& [name, value] : optimizer_inputs(optimizer, step)) {
        session.set_input(name, std::vector<float>{static_cast<float>(value)});
      }
      session.run();
      trajectory.push_back(session.scalar_output("loss"));
    }
    const std::vector<float> weights = session.read("model.conv2.weight");
    trajectory.insert(trajectory.end(), weights.begin(), weights.end());
    results.push_back(trajectory);
    EXPECT_EQ(session.validation_messages(), 0u);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace mg
