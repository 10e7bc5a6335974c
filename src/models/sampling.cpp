#include "models/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "meganeura/error.hpp"

namespace mg::models {

void check_sampling(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    throw Error("--temperature must be 0 (greedy) or positive, not " +
                std::to_string(options.temperature));
  }
  if (options.top_k < 0) throw Error("--top-k must be 0 (no limit) or positive");
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    throw Error("--top-p must be in (0, 1], not " + std::to_string(options.top_p));
  }
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& options,
                     std::mt19937_64& generator) {
  if (logits.empty()) throw Error("sample_token: no logits");
  if (options.temperature == 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates by descending logit; the filters keep a prefix of them.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t kept = order.size();
  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < kept) {
    kept = static_cast<size_t>(options.top_k);
    std::partial_sort(order.begin(), order.begin() + kept, order.end(), by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  const double top = logits[order[0]] / options.temperature;
  std::vector<double> weights(kept);
  double total = 0;
  for (size_t i = 0; i < kept; ++i) {
    weights[i] = std::exp(logits[order[i]] / options.temperature - top);
    total += weights[i];
  }
  if (options.top_p < 1) {
    // The smallest prefix whose probability reaches top_p (at least one token).
    double cumulative = 0;
    size_t prefix = 0;
    while (prefix < kept) {
      cumulative += weights[prefix] / total;
      ++prefix;
      if (cumulative >= options.top_p) break;
    }
    kept = prefix;
    weights.resize(kept);
  }
  std::discrete_distribution<size_t> draw(weights.begin(), weights.end());
  return order[draw(generator)];
}

}  // namespace mg::models
