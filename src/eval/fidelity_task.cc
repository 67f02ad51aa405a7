// fidelity: how far each spec's attention output is from the exact one, layer by layer, with every
// other source of difference removed; and for selectors (pq, oracle), how well they pick tokens.
//
// The reference model runs the text prefix (context - samples tokens) and then `samples` more tokens
// one at a time. Every layer's K and V are appended, as they are produced, to one KV store per spec
// (that spec's pipeline); at each of the decode steps every spec's store selects (its selector) and
// answers the layer's query through the spec's own attention kernels, and that output is compared with
// the reference model's: rel_l2 = sqrt(sum |o_spec - o|^2 / sum |o|^2) over the decode steps and heads of
// the layer. All specs see the same q, k, v (the reference's), so the figure isolates the KV encoding's
// (and selection's) error; the reference spec against a store of its own is exactly 0. A zack spec gets
// the reference's q, k, v projected into its reduced bases (what its folded weights and q/k projection
// produce) and its output lifted back (what its folded W_O reads), so rank truncation is measured too.
//
// recall (specs with a selector): for each KV head and step, the selector's top-k against the exact
// top-k (PQCache's question: does the approximate search find the tokens the exact one would?): over
// the tokens the selector ranked (HeadSelection::ranked_first/last: the forced initial and local
// tokens are neither), the k it chose against the k with the highest exact scores sum_h q_h . k over
// the head's query group (the score selectors rank by): |chosen ∩ exact| / k, averaged over heads and
// steps. The oracle's is 1 (up to ties). The overall rows are means over layers.
#include <algorithm>
#include <cmath>
#include <optional>

#include "eval/tasks.h"
#include "kv/store_attention.h"
#include "model/forward_observer.h"
#include "model/llama.h"
#include "model/model_config.h"

namespace slimkv {
namespace {

class FidelityObserver : public ForwardObserver {
 public:
  FidelityObserver(const EvalContext& context, ThreadPool& pool) : pool_(pool) {
    const LlamaModel& model = context.subjects[0].engine->model();
    const ModelConfig& config = model.config();
    params_ = AttentionParams{int(config.num_heads), 1.0f / std::sqrt(float(config.head_dim)), &pool};
    head_dim_ = int(config.head_dim);
    num_kv_heads_ = int(config.num_kv_heads);
    out_size_ = size_t(config.num_heads) * size_t(head_dim_);
    for (const EvalSubject& subject : context.subjects) {
      // A zack spec's store holds reduced vectors: its model's shape, and its projection to get there.
      const LlamaModel& subject_model = subject.engine->model();
      stores_.push_back(std::make_unique<KvStore>(subject_model.kv_shape(), subject.engine->kv_pipeline()));
      projections_.push_back(subject_model.zack());
    }
    const size_t layers = size_t(config.num_layers);
    keys_.resize(layers);
    outputs_.assign(stores_.size(), std::vector<float>(out_size_));
    squared_error_.assign(stores_.size(), std::vector<double>(layers));
    recall_sum_.assign(stores_.size(), std::vector<double>(layers));
    recall_count_.assign(stores_.size(), std::vector<int64_t>(layers));
    squared_norm_.assign(layers, 0.0);
  }

  // Only single-token calls (the decode steps) are measured.
  void measure(bool on) { measuring_ = on; }

  void on_qkv(int layer, const float* q, const float* k, const float* v, int n) override {
    std::vector<float>& keys = keys_[size_t(layer)];
    keys.insert(keys.end(), k, k + size_t(n) * size_t(num_kv_heads_) * size_t(head_dim_));
    for (size_t s = 0; s < stores_.size(); ++s) {
      KvStore& store = *stores_[s];
      const ZackProjection* zack = projections_[s];
      if (zack) {  // ZACK: q, k, v into each head's reduced basis, and the output back (Lemma 2)
        reduced_q_.assign(q, q + size_t(n) * out_size_);
        reduced_k_.assign(k, k + size_t(n) * size_t(num_kv_heads_) * size_t(head_dim_));
        reduced_v_.assign(v, v + size_t(n) * size_t(num_kv_heads_) * size_t(head_dim_));
        zack->project_qk(layer, reduced_q_.data(), reduced_k_.data(), n);
        zack->project_v(layer, reduced_v_.data(), n);
        store.append(layer, reduced_k_.data(), reduced_v_.data(), n);
      } else {
        store.append(layer, k, v, n);
      }
      if (!measuring_) continue;
      if (zack) {
        reduced_out_.resize(out_size_);
        attend(store, layer, reduced_q_.data(), 1, store.num_tokens(layer) - 1, params_, reduced_out_.data());
        zack->lift_output(layer, reduced_out_.data(), 1, outputs_[s].data());
        continue;
      }
      const std::vector<HeadSelection>& selection = store.select(layer, q, 1, params_.num_heads, pool_);
      attend(store, layer, q, 1, store.num_tokens(layer) - 1, params_, outputs_[s].data(), &selection);
      for (int g = 0; g < num_kv_heads_; ++g) {
        if (selection[size_t(g)].all) continue;
        recall_sum_[s][size_t(layer)] += recall(layer, g, q, selection[size_t(g)]);
        recall_count_[s][size_t(layer)] += 1;
      }
    }
  }

  void on_attention_output(int layer, const float* out, int /*n*/) override {
    if (!measuring_) return;
    for (size_t i = 0; i < out_size_; ++i) squared_norm_[size_t(layer)] += double(out[i]) * out[i];
    for (size_t s = 0; s < stores_.size(); ++s) {
      for (size_t i = 0; i < out_size_; ++i) {
        const double difference = double(outputs_[s][i]) - out[i];
        squared_error_[s][size_t(layer)] += difference * difference;
      }
    }
  }

  double rel_l2(size_t subject, int layer) const {
    const double norm = squared_norm_[size_t(layer)];
    return norm > 0 ? std::sqrt(squared_error_[subject][size_t(layer)] / norm) : 0.0;
  }
  // The mean recall of a subject's selections in a layer; nullopt when it never selected.
  std::optional<double> recall(size_t subject, int layer) const {
    const int64_t count = recall_count_[subject][size_t(layer)];
    if (count == 0) return std::nullopt;
    return recall_sum_[subject][size_t(layer)] / double(count);
  }

 private:
  // |chosen ∩ exact top-k| / k over the ranked tokens, k = those chosen, scores summed over the group.
  double recall(int layer, int head, const float* q, const HeadSelection& selection) const {
    const int first = selection.ranked_first, last = selection.ranked_last;
    std::vector<int> picked;
    for (int token : selection.tokens) {
      if (token >= first && token < last) picked.push_back(token);
    }
    if (picked.empty()) return 1.0;
    const int group = params_.num_heads / num_kv_heads_;
    const float* keys = keys_[size_t(layer)].data();
    std::vector<std::pair<double, int>> scores;
    for (int t = first; t < last; ++t) {
      const float* k = keys + (size_t(t) * size_t(num_kv_heads_) + size_t(head)) * size_t(head_dim_);
      double score = 0.0;
      for (int h = head * group; h < (head + 1) * group; ++h) {
        const float* qh = q + size_t(h) * size_t(head_dim_);
        for (int c = 0; c < head_dim_; ++c) score += double(qh[c]) * k[c];
      }
      scores.emplace_back(-score, t);  // ascending order = highest score first, ties by position
    }
    std::nth_element(scores.begin(), scores.begin() + ptrdiff_t(picked.size() - 1), scores.end());
    std::vector<char> exact(size_t(last), 0);
    for (size_t i = 0; i < picked.size(); ++i) exact[size_t(scores[i].second)] = 1;
    size_t hits = 0;
    for (int token : picked) hits += exact[size_t(token)];
    return double(hits) / double(picked.size());
  }

  ThreadPool& pool_;
  AttentionParams params_;
  int head_dim_ = 0, num_kv_heads_ = 0;
  size_t out_size_ = 0;
  bool measuring_ = false;
  std::vector<std::unique_ptr<KvStore>> stores_;    // one per subject
  std::vector<const ZackProjection*> projections_;  // per subject: its ZACK projection, or null
  std::vector<float> reduced_q_, reduced_k_, reduced_v_, reduced_out_;  // a zack subject's operands
  std::vector<std::vector<float>> keys_;            // [layer][tokens, num_kv_heads, head_dim], the reference's
  std::vector<std::vector<float>> outputs_;         // [subject][num_heads * head_dim] of the current step
  std::vector<std::vector<double>> squared_error_;  // [subject][layer]
  std::vector<std::vector<double>> recall_sum_;     // [subject][layer]
  std::vector<std::vector<int64_t>> recall_count_;  // [subject][layer]
  std::vector<double> squared_norm_;                // [layer]
};

}  // namespace

Status run_fidelity_task(EvalContext& context) {
  Engine& reference = *context.subjects[0].engine;
  const int steps = std::min(context.samples, context.context_tokens - 1);
  const std::vector<int32_t> ids = context.text_prefix(context.context_tokens);
  const int prefix = context.context_tokens - steps;
  context.progress.start(str_cat("fidelity: ", context.subjects.size(), " specs, ", steps, " decode steps after ",
                                 prefix, " tokens"),
                         steps + 1);
  FidelityObserver observer(context, reference.pool());
  auto session = reference.new_session();
  SLIMKV_RETURN_IF_ERROR(session->set_observer(&observer));
  SLIMKV_RETURN_IF_ERROR(session->prefill(std::span(ids).first(size_t(prefix))).status());
  context.progress.advance();
  observer.measure(true);
  for (int t = prefix; t < context.context_tokens; ++t) {
    SLIMKV_RETURN_IF_ERROR(session->decode(ids[size_t(t)]).status());
    context.progress.advance();
  }
  context.progress.finish();

  const int layers = int(reference.model_config().num_layers);
  for (size_t s = 0; s < context.subjects.size(); ++s) {
    const std::string& spec = context.subjects[s].spec;
    double rel_l2_sum = 0.0, recall_sum = 0.0;
    int recall_layers = 0;
    for (int layer = 0; layer < layers; ++layer) {
      const double rel_l2 = observer.rel_l2(s, layer);
      context.results.add(spec, "fidelity", "rel_l2", rel_l2).layer = layer;
      rel_l2_sum += rel_l2;
      if (const std::optional<double> recall = observer.recall(s, layer)) {
        context.results.add(spec, "fidelity", "recall", *recall).layer = layer;
        recall_sum += *recall;
        recall_layers += 1;
      }
    }
    context.results.add(spec, "fidelity", "rel_l2", rel_l2_sum / layers);
    if (recall_layers > 0) context.results.add(spec, "fidelity", "recall", recall_sum / recall_layers);
  }
  return Status::ok();
}

}  // namespace slimkv
