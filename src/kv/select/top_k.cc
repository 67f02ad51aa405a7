#include "kv/select/top_k.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace slimkv {
namespace {

// Bins of the histogram: with scores spread over their range, the boundary bin holds about n / 2048 of
// them (a few dozen of 50K), the only ones ranked by comparison.
constexpr int kBins = 2048;

// Which bin a score falls in: monotone in the score (a higher score never lands in a lower bin), so every
// score in a higher bin than the boundary's ranks above every score in it. Out-of-range values clamp.
struct Binning {
  float low = 0.0f, scale = 0.0f;
  int operator()(float score) const {
    const float x = (score - low) * scale;
    return x >= float(kBins - 1) ? kBins - 1 : x > 0.0f ? int(x) : 0;
  }
};

}  // namespace

void top_k_indices(const float* scores, int n, int k, int* out) {
  if (k <= 0) return;
  if (k >= n) {
    std::iota(out, out + n, 0);
    return;
  }
  float low[4] = {scores[0], scores[0], scores[0], scores[0]}, high[4] = {low[0], low[0], low[0], low[0]};
  int i = 0;
  for (; i + 4 <= n; i += 4) {  // four independent chains: a min/max chain is latency-bound
    for (int j = 0; j < 4; ++j) {
      low[j] = std::min(low[j], scores[i + j]);
      high[j] = std::max(high[j], scores[i + j]);
    }
  }
  for (; i < n; ++i) low[0] = std::min(low[0], scores[i]), high[0] = std::max(high[0], scores[i]);
  const float lowest = std::min(std::min(low[0], low[1]), std::min(low[2], low[3]));
  const float range = std::max(std::max(high[0], high[1]), std::max(high[2], high[3])) - lowest;
  // Equal scores (or a range too wide for a float scale) put everything in bin 0: still exact, by comparison.
  const Binning bin{lowest, range > 0.0f && range < 1e30f ? float(kBins) / range : 0.0f};
  thread_local std::vector<uint16_t> bins;  // [n]: each score's bin, computed once
  thread_local std::vector<int> count, chosen;
  bins.resize(size_t(n));
  count.assign(kBins, 0);
  uint16_t* bin_of = bins.data();
  int* counts = count.data();
  for (i = 0; i < n; ++i) {
    bin_of[i] = uint16_t(bin(scores[i]));
    ++counts[bin_of[i]];
  }
  int boundary = kBins - 1, above = 0;  // the bin of the k-th highest, and how many rank above that bin
  for (; above + counts[boundary] < k; --boundary) above += counts[boundary];
  // Every index from the boundary bin up, ascending (a branch-free pass: most land in the lower bins).
  chosen.resize(size_t(n));
  int* candidate = chosen.data();
  int candidates = 0;
  for (i = 0; i < n; ++i) {
    candidate[candidates] = i;
    candidates += bin_of[i] >= boundary;
  }
  // Rank the boundary bin's scores: the (k - above)-th of them is the last one kept.
  thread_local std::vector<std::pair<float, int>> tied;
  tied.clear();
  for (int c = 0; c < candidates; ++c) {
    if (bin_of[candidate[c]] == boundary) tied.emplace_back(scores[candidate[c]], candidate[c]);
  }
  const auto ranks_higher = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  const auto last = tied.begin() + (k - above - 1);
  std::nth_element(tied.begin(), last, tied.end(), ranks_higher);
  const std::pair<float, int> last_kept = *last;
  int written = 0;
  for (int c = 0; c < candidates; ++c) {
    const int index = candidate[c];
    if (bin_of[index] > boundary || !ranks_higher(last_kept, {scores[index], index})) out[written++] = index;
  }
}

void top_k_indices_reference(const float* scores, int n, int k, int* out) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a < b; });
  order.resize(size_t(std::max(0, std::min(k, n))));
  std::sort(order.begin(), order.end());
  std::copy(order.begin(), order.end(), out);
}

}  // namespace slimkv
