// ppl: perplexity of held-out text, scored on the decode path, with the distribution damage that
// perplexity alone hides (KL divergence from the reference, top-1 agreement).
//
// The text is cut into windows of context - 1 tokens after BOS (the model card's protocol: consecutive
// windows, remainder dropped); `samples` windows, spread evenly over the text, are scored (all of them
// when samples >= their number). Decode path: every subject feeds the window one token at a time through
// its KV cache, in lockstep with the reference, so compression of earlier tokens affects every later
// prediction, and the per-token KL divergence KL(reference || spec) is exact. Prefill path
// (ppl_prefill): the whole window in one call.
#include <algorithm>
#include <cmath>

#include "eval/tasks.h"
#include "model/model_config.h"

namespace slimkv {
namespace {

// Natural-log probabilities of one row of logits, in double.
void log_softmax(const float* logits, size_t vocab, std::vector<double>& out) {
  out.resize(vocab);
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max);
  const double log_sum = max + std::log(sum);
  for (size_t i = 0; i < vocab; ++i) out[i] = double(logits[i]) - log_sum;
}

struct PplTotals {
  double nll_decode = 0.0, nll_prefill = 0.0;
  int64_t tokens = 0;
  std::vector<double> kld;  // per scored token (non-reference subjects)
  int64_t top1_agree = 0;
};

}  // namespace

Status run_ppl_task(EvalContext& context) {
  const int window_text = context.context_tokens - (context.bos ? 1 : 0);
  const int available = int(context.text.size()) / window_text;
  const int windows = std::min(context.samples, available);
  const size_t n_subjects = context.subjects.size();
  std::vector<PplTotals> totals(n_subjects);
  context.progress.start(str_cat("ppl: ", windows, " of ", available, " windows of ", context.context_tokens,
                                 " tokens, ", n_subjects, " specs"),
                         int64_t(windows) * int64_t(n_subjects) * 2);

  std::vector<double> reference_logp, logp;
  for (int w = 0; w < windows; ++w) {
    const int first = int(int64_t(w) * available / windows) * window_text;  // spread over the text
    std::vector<int32_t> ids;
    if (context.bos) ids.push_back(*context.bos);
    ids.insert(ids.end(), context.text.begin() + first, context.text.begin() + first + window_text);
    const size_t scored = ids.size() - 1;  // every token predicts the next; the last predicts nothing

    for (size_t s = 0; s < n_subjects; ++s) {  // prefill path
      Engine& engine = *context.subjects[s].engine;
      const size_t vocab = size_t(engine.model_config().vocab_size);
      SLIMKV_ASSIGN_OR_RETURN(std::vector<float> logits, engine.new_session()->prefill(ids, /*all_logits=*/true));
      for (size_t t = 0; t < scored; ++t) {
        log_softmax(logits.data() + t * vocab, vocab, logp);
        totals[s].nll_prefill -= logp[size_t(ids[t + 1])];
      }
      context.progress.advance();
    }

    std::vector<std::unique_ptr<Session>> sessions;  // decode path, every subject in lockstep
    for (const EvalSubject& subject : context.subjects) sessions.push_back(subject.engine->new_session());
    for (size_t t = 0; t < scored; ++t) {
      int32_t reference_top = -1;
      for (size_t s = 0; s < n_subjects; ++s) {
        SLIMKV_ASSIGN_OR_RETURN(std::vector<float> logits, sessions[s]->decode(ids[t]));
        std::vector<double>& row = s == 0 ? reference_logp : logp;
        log_softmax(logits.data(), logits.size(), row);
        totals[s].nll_decode -= row[size_t(ids[t + 1])];
        const int32_t top = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        if (s == 0) {
          reference_top = top;
          continue;
        }
        double kld = 0.0;
        for (size_t i = 0; i < row.size(); ++i) kld += std::exp(reference_logp[i]) * (reference_logp[i] - row[i]);
        totals[s].kld.push_back(std::max(kld, 0.0));  // >= 0 in exact arithmetic
        totals[s].top1_agree += top == reference_top;
      }
    }
    for (size_t s = 0; s < n_subjects; ++s) {
      totals[s].tokens += int64_t(scored);
      context.progress.advance();
    }
  }
  context.progress.finish();

  for (size_t s = 0; s < n_subjects; ++s) {
    PplTotals& total = totals[s];
    const std::string& spec = context.subjects[s].spec;
    const double tokens = double(total.tokens);
    context.results.add(spec, "ppl", "ppl", std::exp(total.nll_decode / tokens));
    context.results.add(spec, "ppl", "ppl_prefill", std::exp(total.nll_prefill / tokens));
    if (s == 0) continue;
    double kld_sum = 0.0;
    for (double kld : total.kld) kld_sum += kld;
    const size_t p99 = std::min(total.kld.size() - 1, size_t(std::ceil(0.99 * double(total.kld.size()))) - 1);
    std::nth_element(total.kld.begin(), total.kld.begin() + ptrdiff_t(p99), total.kld.end());
    context.results.add(spec, "ppl", "kld", kld_sum / tokens);
    context.results.add(spec, "ppl", "kld_p99", total.kld[p99]);
    context.results.add(spec, "ppl", "top1", double(total.top1_agree) / tokens);
  }
  return Status::ok();
}

}  // namespace slimkv
