#include "kv/select/top_k.h"

#include <algorithm>
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
  float low = scores[0], high = scores[0];
  for (int i = 1; i < n; ++i) {
    low = std::min(low, scores[i]);
    high = std::max(high, scores[i]);
  }
  // Equal scores (or a range too wide for a float scale) put everything in bin 0: still exact, by comparison.
  const float range = high - low;
  const Binning bin{low, range > 0.0f && range < 1e30f ? float(kBins) / range : 0.0f};
  thread_local std::vector<int> count;
  count.assign(kBins, 0);
  for (int i = 0; i < n; ++i) ++count[size_t(bin(scores[i]))];
  int boundary = kBins - 1, above = 0;  // the bin of the k-th highest, and how many rank above that bin
  for (; above + count[size_t(boundary)] < k; --boundary) above += count[size_t(boundary)];
  // Rank the boundary bin's scores: the (k - above)-th of them is the last one kept.
  thread_local std::vector<std::pair<float, int>> tied;
  tied.clear();
  for (int i = 0; i < n; ++i) {
    if (bin(scores[i]) == boundary) tied.emplace_back(scores[i], i);
  }
  const auto ranks_higher = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  const auto last = tied.begin() + (k - above - 1);
  std::nth_element(tied.begin(), last, tied.end(), ranks_higher);
  const std::pair<float, int> last_kept = *last;
  int written = 0;
  for (int i = 0; i < n; ++i) {
    const int b = bin(scores[i]);
    if (b > boundary || (b == boundary && !ranks_higher(last_kept, {scores[i], i}))) out[written++] = i;
  }
}

void top_k_indices_reference(const float* scores, int n, int k, int* out) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a < b; });
  order.resize(size_t(std::max(0, std::min(k, n))));
  std::sort(order.begin(), order.end());
  std::copy(order.begin(), order.end(), out);
}

}  // namespace slimkv
