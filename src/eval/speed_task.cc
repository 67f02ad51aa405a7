// speed: prefill and decode throughput at the context length. Each repetition (`samples`; the median
// is reported) prefills the text prefix of context - 64 tokens in one call and then decodes the next
// 64 tokens of the text one at a time (teacher-forced, so every spec decodes the same tokens), timing
// each phase. A short prefill first warms the weights into memory.
#include <algorithm>
#include <chrono>

#include "eval/tasks.h"

namespace slimkv {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Status run_speed_task(EvalContext& context) {
  const std::vector<int32_t> ids = context.text_prefix(context.context_tokens);
  const int decode_tokens = std::min(64, context.context_tokens / 4);
  const int prefill_tokens = context.context_tokens - decode_tokens;
  context.progress.start(str_cat("speed: ", context.subjects.size(), " specs, prefill ", prefill_tokens, " + decode ",
                                 decode_tokens, " tokens, ", context.samples, " repetitions"),
                         int64_t(context.subjects.size()) * context.samples);
  for (const EvalSubject& subject : context.subjects) {
    SLIMKV_RETURN_IF_ERROR(subject.engine->new_session()->prefill(std::span(ids).first(std::min<size_t>(ids.size(), 64))).status());
    std::vector<double> prefill_rates, decode_rates;
    for (int repetition = 0; repetition < context.samples; ++repetition) {
      auto session = subject.engine->new_session();
      auto start = std::chrono::steady_clock::now();
      SLIMKV_RETURN_IF_ERROR(session->prefill(std::span(ids).first(size_t(prefill_tokens))).status());
      prefill_rates.push_back(prefill_tokens / seconds_since(start));
      start = std::chrono::steady_clock::now();
      for (int t = prefill_tokens; t < context.context_tokens; ++t) {
        SLIMKV_RETURN_IF_ERROR(session->decode(ids[size_t(t)]).status());
      }
      decode_rates.push_back(decode_tokens / seconds_since(start));
      context.progress.advance();
    }
    context.results.add(subject.spec, "speed", "prefill_tok_s", median(prefill_rates));
    context.results.add(subject.spec, "speed", "decode_tok_s", median(decode_rates));
  }
  context.progress.finish();
  return Status::ok();
}

}  // namespace slimkv
