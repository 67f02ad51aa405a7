#include "serve/metrics.h"

#include "serve/prometheus_text.h"

namespace slimkv {

std::string prometheus_text(const SchedulerStats& stats, const MetricsLabels& labels) {
  PrometheusText out(R"(model_name=")" + prometheus_escaped(labels.model_name) + '"');
  out.metric("slimkv:num_requests_running", "gauge", "Requests holding a sequence in the engine.", stats.running);
  out.metric("slimkv:num_requests_waiting", "gauge", "Requests waiting to run, preempted ones included.", stats.waiting);
  out.metric("slimkv:kv_cache_usage_perc", "gauge", "Fraction of the KV block budget in use (1 = full).", stats.kv.usage());
  out.metric("slimkv:prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(stats.prompt_tokens_total));
  out.metric("slimkv:generation_tokens_total", "counter", "Tokens generated.", double(stats.generation_tokens_total));
  out.metric("slimkv:num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.", double(stats.preemptions_total));
  out.header("slimkv:request_success_total", "counter", "Requests finished, by finish reason.");
  const char* reasons[] = {"stop", "length", "abort", "error"};  // vLLM's words; abort = cancelled
  for (size_t i = 0; i < 4; ++i) {
    out.sample("slimkv:request_success_total", double(stats.requests_finished_total[i]),
               std::string(R"(finished_reason=")") + reasons[i] + '"');
  }
  out.histogram("slimkv:time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                stats.time_to_first_token);
  out.histogram("slimkv:inter_token_latency_seconds", "Time between two tokens of a request.", stats.inter_token_latency);
  out.histogram("slimkv:e2e_request_latency_seconds", "Time from a request's arrival to its end.", stats.e2e_request_latency);
  out.histogram("slimkv:engine_step_seconds", "Wall time of each engine step.", stats.engine_step);
  out.histogram("slimkv:scheduler_between_steps_seconds",
                "The scheduler's time between one engine step and the next (not time idle without requests).",
                stats.between_steps);
  out.header("slimkv:decode_step_seconds", "summary",
             "Wall time of the steps that ran one token of every sequence, by their number of sequences.");
  for (size_t n = 1; n < stats.decode_steps_by_sequences.size(); ++n) {
    const SchedulerStats::StepTimes& steps = stats.decode_steps_by_sequences[n];
    if (steps.count == 0) continue;
    const std::string sequences = R"(sequences=")" + std::to_string(n) + '"';
    out.sample("slimkv:decode_step_seconds_sum", steps.seconds, sequences);
    out.sample("slimkv:decode_step_seconds_count", double(steps.count), sequences);
  }

  // slimkv's own: where the KV lives and how compact it is.
  const double block_bytes = double(stats.kv.bytes_per_block);
  out.header("slimkv:kv_cache_capacity_bytes", "gauge", "Memory for KV blocks, per tier.");
  out.sample("slimkv:kv_cache_capacity_bytes", double(stats.kv.total_blocks) * block_bytes, R"(tier=")" + labels.device + '"');
  out.header("slimkv:kv_cache_used_bytes", "gauge",
             "KV memory in use, per tier (host_preempted: the KV of requests preempted to host memory, or received and "
             "waiting for admission).");
  out.sample("slimkv:kv_cache_used_bytes", double(stats.kv.total_blocks - stats.kv.free_blocks) * block_bytes,
             R"(tier=")" + labels.device + '"');
  out.sample("slimkv:kv_cache_used_bytes", double(stats.host_kv_bytes), R"(tier="host_preempted")");
  out.metric("slimkv:kv_cache_bytes_per_token", "gauge", "KV memory one token takes, every layer and head (the codec's sealed size).",
             stats.kv.block_tokens ? block_bytes / stats.kv.block_tokens : 0.0);
  out.metric("slimkv:kv_cache_info", "gauge", "The KV spec the engine runs (value 1).", 1.0,
             R"(kv_spec=")" + prometheus_escaped(labels.kv_spec) + R"(",device=")" + prometheus_escaped(labels.device) + '"');
  out.metric("slimkv:num_preemptions_recomputed_total", "counter",
             "Preemptions whose KV did not fit host memory and was recomputed.", double(stats.preemptions_recomputed_total));
  out.metric("slimkv:num_requests_preempted_in_host", "gauge", "Waiting requests whose KV is in host memory.",
             stats.preempted_in_host);
  return out.text();
}

std::string prometheus_text(const KvStreamReceiver::Stats& stats, const MetricsLabels& labels) {
  PrometheusText out(R"(model_name=")" + prometheus_escaped(labels.model_name) + '"');
  out.metric("slimkv:kv_streams_unclaimed", "gauge", "KV streams received whole, waiting for their decode request.",
             stats.unclaimed_streams);
  out.metric("slimkv:kv_streams_unclaimed_bytes", "gauge", "Bytes of the KV streams waiting for their decode request.",
             double(stats.unclaimed_bytes));
  out.metric("slimkv:kv_streams_in_progress", "gauge", "KV streams connected and not yet received whole or failed.",
             stats.streams_in_progress);
  out.header("slimkv:kv_streams_dropped_total", "counter",
             "KV streams received whole and dropped unclaimed: too old (age), or the oldest over the byte bound (bytes).");
  out.sample("slimkv:kv_streams_dropped_total", double(stats.dropped_age_total), R"(reason="age")");
  out.sample("slimkv:kv_streams_dropped_total", double(stats.dropped_bytes_total), R"(reason="bytes")");
  return out.text();
}

}  // namespace slimkv
