#include "kv/select/topk_selector.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/vec_ops.h"
#include "kv/stage_options.h"
#include "util/thread_pool.h"

namespace slimkv {

int TopkWindow::topk_tokens(int num_tokens) const {
  return topk <= 1.0 ? int(std::lround(topk * num_tokens)) : int(topk);
}

std::string TopkWindow::describe() const {
  return str_cat("topk=", topk, ",init=", init_tokens, ",local=", local_tokens);
}

TopkWindow read_topk_window(StageOptions& options) {
  TopkWindow window;
  window.topk = options.number("topk", window.topk, 0.0, 1e9);
  window.init_tokens = options.integer("init", window.init_tokens, {});
  window.local_tokens = options.integer("local", window.local_tokens, {});
  return window;
}

TopkSelector::TopkSelector(const TopkWindow& window, double rerank, int num_kv_heads, int k_dim)
    : window_(window), rerank_(rerank), num_kv_heads_(num_kv_heads), k_dim_(k_dim) {}

void TopkSelector::select(int layer, const float* q, int num_heads, int num_tokens, int sealed_tokens,
                          const SealedKeys& sealed_keys, ThreadPool& pool, std::vector<HeadSelection>& selection) {
  selection.resize(size_t(num_kv_heads_));
  const int init_end = std::min(window_.init_tokens, num_tokens);
  const int middle_end = std::max(init_end, std::min(num_tokens - window_.local_tokens, sealed_tokens));
  const int middle = middle_end - init_end;
  const int k = window_.topk_tokens(num_tokens);
  if (k >= middle || !prepare(layer, middle_end, pool)) {
    for (HeadSelection& head : selection) head = {true, {}};
    return;
  }
  const int candidates = std::min(middle, int(std::ceil(double(k) * rerank_)));
  const int group = num_heads / num_kv_heads_;
  pool.run(num_kv_heads_, [&](int64_t g, int) {
    thread_local std::vector<float> summed_q, scores, candidate_keys;
    thread_local std::vector<int> order, candidate_tokens;
    thread_local std::vector<char> is_candidate;
    // One query per group: Σ_h q_h·k = (Σ_h q_h)·k (GQA heads share a selection; see selector.h).
    summed_q.assign(size_t(k_dim_), 0.0f);
    for (int h = 0; h < group; ++h) {
      const float* qh = q + (size_t(g) * group + size_t(h)) * size_t(k_dim_);
      for (int c = 0; c < k_dim_; ++c) summed_q[size_t(c)] += qh[c];
    }
    scores.resize(size_t(middle));
    score(layer, int(g), summed_q.data(), init_end, middle_end, scores.data());
    order.resize(size_t(middle));
    std::iota(order.begin(), order.end(), 0);
    // Highest scores first, ties to the earlier token: the same selection on every run.
    const auto higher = [&](int a, int b) {
      return scores[size_t(a)] != scores[size_t(b)] ? scores[size_t(a)] > scores[size_t(b)] : a < b;
    };
    std::nth_element(order.begin(), order.begin() + candidates, order.end(), higher);
    if (candidates > k) {  // re-rank the candidates by their exact scores
      // In token order (the keys are read block by block): a pass over flags, cheaper than a sort.
      is_candidate.assign(size_t(middle), 0);
      for (int i = 0; i < candidates; ++i) is_candidate[size_t(order[size_t(i)])] = 1;
      candidate_tokens.clear();
      for (int i = 0; i < middle; ++i) {
        if (is_candidate[size_t(i)]) candidate_tokens.push_back(i);
      }
      std::copy(candidate_tokens.begin(), candidate_tokens.end(), order.begin());
      for (int& token : candidate_tokens) token += init_end;
      candidate_keys.resize(size_t(candidates) * size_t(k_dim_));
      sealed_keys.read(layer, int(g), candidate_tokens.data(), candidates, candidate_keys.data());
      for (int i = 0; i < candidates; ++i) {
        scores[size_t(order[size_t(i)])] =
            dot(summed_q.data(), candidate_keys.data() + size_t(i) * size_t(k_dim_), size_t(k_dim_));
      }
      std::nth_element(order.begin(), order.begin() + k, order.begin() + candidates, higher);
    }
    std::sort(order.begin(), order.begin() + k);
    HeadSelection& out = selection[size_t(g)];
    out.all = false;
    out.ranked_first = init_end;
    out.ranked_last = middle_end;
    out.tokens.clear();
    out.tokens.reserve(size_t(init_end + k + num_tokens - middle_end));
    for (int t = 0; t < init_end; ++t) out.tokens.push_back(t);
    for (int i = 0; i < k; ++i) out.tokens.push_back(init_end + order[size_t(i)]);
    for (int t = middle_end; t < num_tokens; ++t) out.tokens.push_back(t);
  });
}

}  // namespace slimkv
