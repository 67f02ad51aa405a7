// fidelity: how far each spec's attention output is from the exact one, layer by layer, with every
// other source of difference removed.
//
// The reference model runs the text prefix (context - samples tokens) and then `samples` more tokens
// one at a time. Every layer's K and V are appended, as they are produced, to one KV store per spec
// (that spec's pipeline); at each of the decode steps every spec's store answers the layer's query
// through the spec's own attention kernels, and that output is compared with the reference model's:
// rel_l2 = sqrt(sum |o_spec - o|^2 / sum |o|^2) over the decode steps and heads of the layer. All specs
// see the same q, k, v (the reference's), so the figure isolates the KV encoding's error; the
// reference spec against a store of its own is exactly 0. The overall row is the mean over layers.
#include <cmath>

#include "attention/attention.h"
#include "eval/tasks.h"
#include "model/model_config.h"
#include "model/forward_observer.h"
#include "model/llama.h"

namespace slimkv {
namespace {

class FidelityObserver : public ForwardObserver {
 public:
  FidelityObserver(const EvalContext& context, ThreadPool& pool) {
    const LlamaModel& model = context.subjects[0].engine->model();
    const ModelConfig& config = model.config();
    params_ = AttentionParams{int(config.num_heads), 1.0f / std::sqrt(float(config.head_dim)), &pool};
    out_size_ = size_t(config.num_heads) * size_t(config.head_dim);
    for (const EvalSubject& subject : context.subjects) {
      stores_.push_back(std::make_unique<KvStore>(model.kv_shape(), subject.engine->kv_pipeline()));
    }
    outputs_.assign(stores_.size(), std::vector<float>(out_size_));
    squared_error_.assign(stores_.size(), std::vector<double>(size_t(config.num_layers)));
    squared_norm_.assign(size_t(config.num_layers), 0.0);
  }

  // Only single-token calls (the decode steps) are measured.
  void measure(bool on) { measuring_ = on; }

  void on_qkv(int layer, const float* q, const float* k, const float* v, int n) override {
    for (size_t s = 0; s < stores_.size(); ++s) {
      stores_[s]->append(layer, k, v, n);
      if (measuring_) attend(*stores_[s], layer, q, 1, stores_[s]->num_tokens(layer) - 1, params_, outputs_[s].data());
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

 private:
  AttentionParams params_;
  size_t out_size_ = 0;
  bool measuring_ = false;
  std::vector<std::unique_ptr<KvStore>> stores_;  // one per subject
  std::vector<std::vector<float>> outputs_;       // [subject][num_heads * head_dim] of the current step
  std::vector<std::vector<double>> squared_error_;  // [subject][layer]
  std::vector<double> squared_norm_;                // [layer]
};

}  // namespace

Status run_fidelity_task(EvalContext& context) {
  const Engine& reference = *context.subjects[0].engine;
  const int steps = std::min(context.samples, context.context_tokens - 1);
  const std::vector<int32_t> ids = context.text_prefix(context.context_tokens);
  const int prefix = context.context_tokens - steps;
  context.progress.start(str_cat("fidelity: ", context.subjects.size(), " specs, ", steps, " decode steps after ",
                                 prefix, " tokens"),
                         steps + 1);
  FidelityObserver observer(context, reference.pool());
  auto session = reference.new_session();
  session->set_observer(&observer);
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
    double sum = 0.0;
    for (int layer = 0; layer < layers; ++layer) {
      const double rel_l2 = observer.rel_l2(s, layer);
      context.results.add(context.subjects[s].spec, "fidelity", "rel_l2", rel_l2).layer = layer;
      sum += rel_l2;
    }
    context.results.add(context.subjects[s].spec, "fidelity", "rel_l2", sum / layers);
  }
  return Status::ok();
}

}  // namespace slimkv
