#include "kv/select/topk_selector.h"

#include <algorithm>
#include <cmath>

#include "kv/select/top_k.h"
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
    // queries [1 + group, k_dim]: the group's summed query, then its heads' own (for the re-rank's scores).
    thread_local std::vector<float> queries, scores, exact_scores, summed_exact;
    thread_local std::vector<int> candidate_tokens, kept;
    const float* group_q = q + size_t(g) * size_t(group) * size_t(k_dim_);
    queries.assign(size_t(k_dim_), 0.0f);
    queries.insert(queries.end(), group_q, group_q + size_t(group) * size_t(k_dim_));
    // One query per group: Σ_h q_h·k = (Σ_h q_h)·k (GQA heads share a selection; see selector.h).
    for (int h = 0; h < group; ++h) {
      for (int c = 0; c < k_dim_; ++c) queries[size_t(c)] += group_q[size_t(h) * size_t(k_dim_) + size_t(c)];
    }
    scores.resize(size_t(middle));
    score(layer, int(g), queries.data(), init_end, middle_end, scores.data());
    // The candidates, highest scores first and ties to the earlier token (the same selection on every
    // run), as ascending tokens: the order the keys are read in, block by block, and attention's.
    candidate_tokens.resize(size_t(candidates));
    top_k_indices(scores.data(), middle, candidates, candidate_tokens.data());
    for (int& token : candidate_tokens) token += init_end;
    HeadSelection& out = selection[size_t(g)];
    out.all = false;
    out.ranked_first = init_end;
    out.ranked_last = middle_end;
    out.tokens.clear();
    out.tokens.reserve(size_t(init_end + k + num_tokens - middle_end));
    for (int t = 0; t < init_end; ++t) out.tokens.push_back(t);
    out.scores.clear();
    if (candidates > k) {  // re-rank the candidates by their exact scores (ties again to the earlier token)
      const int rows = 1 + group;
      exact_scores.resize(size_t(candidates) * size_t(rows));  // [candidates, summed query + group heads]
      sealed_keys.score(layer, int(g), queries.data(), rows, candidate_tokens.data(), candidates, exact_scores.data());
      summed_exact.resize(size_t(candidates));
      for (int i = 0; i < candidates; ++i) summed_exact[size_t(i)] = exact_scores[size_t(i) * size_t(rows)];
      kept.resize(size_t(k));
      top_k_indices(summed_exact.data(), candidates, k, kept.data());
      out.scores.reserve(size_t(k) * size_t(group));
      for (int i : kept) {  // the kept tokens, and their heads' scores for attention (selector.h)
        out.tokens.push_back(candidate_tokens[size_t(i)]);
        const float* head_scores = exact_scores.data() + size_t(i) * size_t(rows) + 1;
        out.scores.insert(out.scores.end(), head_scores, head_scores + group);
      }
    } else {
      out.tokens.insert(out.tokens.end(), candidate_tokens.begin(), candidate_tokens.end());
    }
    for (int t = middle_end; t < num_tokens; ++t) out.tokens.push_back(t);
  });
}

}  // namespace slimkv
