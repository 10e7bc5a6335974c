#pragma once
// Choosing the next token from a language model's logits, as transformers' generate does with
// do_sample: temperature, then top-k, then top-p (nucleus) filtering, then a draw; temperature
// 0 is greedy (the first highest logit).
#include <cstdint>
#include <random>
#include <span>

namespace mg::models {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // 1: no limit
  uint64_t seed = 0;
};

// Throws mg::Error naming the option when one is out of range (negative or non-finite
// temperature, negative top_k, top_p outside (0, 1]).
void check_sampling(const SamplingOptions& options);

int32_t sample_token(std::span<const float> logits, const SamplingOptions& options,
                     std::mt19937_64& generator);

}  // namespace mg::models
