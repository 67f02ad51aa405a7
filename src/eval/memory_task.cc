// memory: what the KV store allocates per token, after the text prefix of the full context has run
// through the model, per layer, split by tier: the fast tier holds the open blocks' buffers (allocated
// in full) and the sealed blocks as their codec encodes them, or, with offloading, the block cache; the
// slow tier holds offloaded sealed blocks. A selector's keys and index (pq, oracle) count in the fast
// tier, and alone as selector_bytes_per_token. kv_bytes_per_token is the total of both tiers (what the
// sequence's KV takes anywhere); ratio_fp16 compares it with an FP16 cache (2 bytes per K and V element).
// A model with sliding-window layers (Gemma 3) reports both kinds apart: full_layer_kv_bytes_per_token
// (sealed bytes of the full-attention layers, per such layer and token: what grows with the context) and
// sliding_layers_kv_bytes (the sealed bytes all sliding layers hold: their windows, whatever the length).
#include "eval/tasks.h"
#include "kv/store.h"
#include "model/model_config.h"

namespace slimkv {

Status run_memory_task(EvalContext& context) {
  const ModelConfig& config = context.subjects[0].engine->model_config();
  const std::vector<int32_t> ids = context.text_prefix(context.context_tokens);
  context.progress.start(str_cat("memory: ", context.subjects.size(), " specs at ", ids.size(), " tokens"),
                         int64_t(context.subjects.size()));
  for (const EvalSubject& subject : context.subjects) {
    auto session = subject.engine->new_session();
    SLIMKV_RETURN_IF_ERROR(session->prefill(ids).status());
    const KvStore& kv = session->kv();
    const KvShape& shape = kv.shape();
    const KvMemory memory = kv.memory();
    const double per_layer_token = double(shape.num_layers) * double(ids.size());
    const double fast_bytes = double(memory.fast_bytes()) / per_layer_token;
    const double slow_bytes = double(memory.slow_bytes()) / per_layer_token;
    const double total_bytes = double(memory.sealed_bytes + memory.open_bytes + memory.selector_bytes) / per_layer_token;
    const double fp16_bytes = 2.0 * 2.0 * double(config.num_kv_heads) * double(config.head_dim);  // the model's K and V
    context.results.add(subject.spec, "memory", "kv_bytes_per_token", fast_bytes).tier = "fast";
    if (memory.sealed_in_slow_tier) context.results.add(subject.spec, "memory", "kv_bytes_per_token", slow_bytes).tier = "slow";
    context.results.add(subject.spec, "memory", "kv_bytes_per_token", total_bytes);
    context.results.add(subject.spec, "memory", "ratio_fp16", total_bytes / fp16_bytes);
    if (shape.any_window()) {
      int full_layers = 0;
      for (int l = 0; l < shape.num_layers; ++l) full_layers += shape.window_of(l) == 0;
      const double full_bytes = double(memory.sealed_bytes - memory.window_sealed_bytes);
      context.results.add(subject.spec, "memory", "full_layer_kv_bytes_per_token",
                          full_layers > 0 ? full_bytes / (double(full_layers) * double(ids.size())) : 0.0);
      context.results.add(subject.spec, "memory", "sliding_layers_kv_bytes", double(memory.window_sealed_bytes));
    }
    if (memory.selector_bytes > 0) {
      context.results.add(subject.spec, "memory", "selector_bytes_per_token", double(memory.selector_bytes) / per_layer_token);
    }
    context.progress.advance();
  }
  context.progress.finish();
  return Status::ok();
}

}  // namespace slimkv
