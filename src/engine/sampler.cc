#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/random.h"

namespace slimkv {

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& params, int64_t position) {
  if (params.temperature <= 0.0f) return argmax(logits);
  // Candidates by descending logit, cut by top-k; softmax at the temperature; cut by top-p.
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], int32_t(i));
  size_t keep = candidates_.size();
  if (params.top_k > 0) keep = std::min(keep, size_t(params.top_k));
  std::partial_sort(candidates_.begin(), candidates_.begin() + long(keep), candidates_.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  candidates_.resize(keep);
  const float max_logit = candidates_[0].first;
  double total = 0;
  for (auto& [value, id] : candidates_) total += (value = std::exp((value - max_logit) / params.temperature));
  if (params.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = 0;
    while (cut < candidates_.size() && cumulative < params.top_p * total) cumulative += candidates_[cut++].first;
    candidates_.resize(std::max<size_t>(cut, 1));
    total = cumulative > 0 ? cumulative : candidates_[0].first;
  }
  double r = double(counter_uniform(params.seed, uint64_t(position))) * total;
  for (const auto& [weight, id] : candidates_) {
    if ((r -= weight) <= 0) return id;
  }
  return candidates_.back().second;
}

}  // namespace slimkv
