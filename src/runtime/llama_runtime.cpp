#include "runtime/llama_runtime.hpp"

#include <chrono>
#include <set>

#include "meganeura/error.hpp"

namespace mg::models {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void check_llama_weights(const io::ModelFolder& folder, const LlamaConfig& config) {
  std::map<std::string, Shape> expected;
  for (const auto& [name, shape] : llama_parameters(config)) expected[name] = shape;
  // Tied models may still carry lm_head.weight (a copy of the embeddings); older exports carry
  // the rotary inverse frequencies, which the config determines.
  std::set<std::string> optional;
  if (config.tie_word_embeddings) optional.insert("lm_head.weight");
  std::vector<std::string> ignored = {"model.rotary_emb."};
  for (int64_t i = 0; i < config.layers; ++i)
    ignored.push_back("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.");
  io::check_tensors(folder, "LlamaForCausalLM", expected, optional, ignored);
}

void load_llama_weights(Session& session, const io::ModelFolder& folder,
                        const LlamaConfig& config) {
  check_llama_weights(folder, config);
  for (const auto& [name, shape] : llama_parameters(config)) {
    session.write(name, io::tensor_as_f32(folder.at(name)));
  }
}

std::vector<io::SavedTensor> llama_weights(const Session& session, const LlamaConfig& config) {
  std::vector<io::SavedTensor> tensors;
  for (const auto& [name, shape] : llama_parameters(config))
    tensors.push_back({name, shape, session.read(name)});
  return tensors;
}

LlamaGenerator::LlamaGenerator(const LlamaConfig& config, const SessionOptions& options,
                               int64_t cache_length)
    : config_(config),
      options_(options),
      cache_length_(cache_length),
      decode_(llama_decode_graph(config, cache_length), options) {
  if (!options.shared_device || !options.shared_tensors) {
    throw Error("LlamaGenerator needs SessionOptions with shared_device and shared_tensors");
  }
}

Session& LlamaGenerator::prefill_session(int64_t prompt_length) {
  auto it = prefills_.find(prompt_length);
  if (it == prefills_.end()) {
    it = prefills_
             .emplace(prompt_length,
                      std::make_unique<Session>(
                          llama_prefill_graph(config_, prompt_length, cache_length_), options_))
             .first;
  }
  return *it->second;
}

Generation LlamaGenerator::generate(std::span<const int32_t> prompt, int64_t max_new_tokens,
                                    const SamplingOptions& sampling,
                                    const std::function<void(int32_t)>& on_token) {
  check_sampling(sampling);
  const int64_t length = static_cast<int64_t>(prompt.size());
  if (length == 0) throw Error("the prompt has no tokens");
  if (max_new_tokens < 0) throw Error("the number of new tokens cannot be negative");
  if (length + max_new_tokens > cache_length_) {
    throw Error("a prompt of " + std::to_string(length) + " tokens and " +
                std::to_string(max_new_tokens) + " new ones do not fit the KV cache of " +
                std::to_string(cache_length_) + " positions");
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= config_.vocab_size) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(config_.vocab_size));
    }
  }
  Generation result;
  if (max_new_tokens == 0) return result;
  Session& prefill = prefill_session(length);
  std::mt19937_64 generator(sampling.seed);
  const std::set<int32_t> eos(config_.eos_token_ids.begin(), config_.eos_token_ids.end());

  auto start = std::chrono::steady_clock::now();
  prefill.set_input(kInputIds, std::vector<int32_t>(prompt.begin(), prompt.end()));
  prefill.run();
  std::vector<float> logits = prefill.output(kLogits);
  result.prefill_seconds = seconds_since(start);

  start = std::chrono::steady_clock::now();
  while (true) {
    const int32_t token = sample_token(logits, sampling, generator);
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    if (eos.count(token)) {
      result.ended_by_eos = true;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) == max_new_tokens) break;
    decode_.set_input(kInputIds, std::vector<int32_t>{token});
    decode_.set_input(kPosition, std::vector<int32_t>{static_cast<int32_t>(
                                     length + static_cast<int64_t>(result.tokens.size()) - 1)});
    decode_.run();
    ++result.decode_steps;
    logits = decode_.output(kLogits);
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace mg::models
