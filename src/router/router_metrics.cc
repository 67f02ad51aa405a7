#include "router/router_metrics.h"

#include "serve/prometheus_text.h"

namespace slimkv {
namespace {

// vLLM's buckets for time to first token and request latency (seconds).
const std::vector<double> kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                             2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};

}  // namespace

RouterMetrics::RouterMetrics()
    : time_to_first_token_(kLatencyBuckets), e2e_request_latency_(kLatencyBuckets), kv_transfer_(kLatencyBuckets),
      kv_after_prefill_(kLatencyBuckets) {}

void RouterMetrics::finished(RequestOutcome outcome) {
  std::lock_guard lock(mutex_);
  ++outcomes_[int(outcome)];
}

void RouterMetrics::retried(WorkerRole failed_role) {
  std::lock_guard lock(mutex_);
  ++retries_[failed_role == WorkerRole::kPrefill ? 0 : 1];
}

void RouterMetrics::first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void RouterMetrics::request_latency(double seconds) {
  std::lock_guard lock(mutex_);
  e2e_request_latency_.observe(seconds);
}

void RouterMetrics::kv_transfer(double seconds, double bytes, double after_prefill_seconds) {
  std::lock_guard lock(mutex_);
  kv_transfer_.observe(seconds);
  if (after_prefill_seconds >= 0) kv_after_prefill_.observe(after_prefill_seconds);
  kv_bytes_total_ += bytes;
}

std::string RouterMetrics::text(const WorkerPool& pool) const {
  std::lock_guard lock(mutex_);
  PrometheusText out;
  out.header("slimkv_router:requests_total", "counter", "Client requests answered, by outcome.");
  const char* outcomes[] = {"ok", "client_error", "failed", "cancelled"};
  for (int i = 0; i < 4; ++i) {
    out.sample("slimkv_router:requests_total", double(outcomes_[i]), std::string(R"(outcome=")") + outcomes[i] + '"');
  }
  out.header("slimkv_router:retries_total", "counter",
             "Re-dispatches of a request after a worker failed it, by that worker's role.");
  out.sample("slimkv_router:retries_total", double(retries_[0]), R"(role="prefill")");
  out.sample("slimkv_router:retries_total", double(retries_[1]), R"(role="decode")");
  const auto per_worker = [&](const char* name, const char* type, const char* help, auto value) {
    out.header(name, type, help);
    for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
      for (const WorkerState& worker : pool.workers(role)) {
        out.sample(name, value(worker),
                   std::string(R"(role=")") + role_name(role) + R"(",url=")" + prometheus_escaped(worker.address.url) + '"');
      }
    }
  };
  per_worker("slimkv_router:worker_up", "gauge", "1 while the worker answers /health, 0 while it is down.",
             [](const WorkerState& w) { return w.up ? 1.0 : 0.0; });
  per_worker("slimkv_router:worker_in_flight", "gauge", "The router's requests on the worker now.",
             [](const WorkerState& w) { return double(w.in_flight); });
  per_worker("slimkv_router:worker_load", "gauge", "Running + waiting requests of the worker at its last /health.",
             [](const WorkerState& w) { return double(w.running + w.waiting); });
  out.histogram("slimkv_router:time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                time_to_first_token_);
  out.histogram("slimkv_router:e2e_request_latency_seconds", "Time from a request's arrival to its end.",
                e2e_request_latency_);
  out.histogram("slimkv_router:kv_transfer_seconds", "A prompt's KV transfer, prefill to decode, as the prefill worker reports it.",
                kv_transfer_);
  out.histogram("slimkv_router:kv_transfer_after_prefill_seconds",
                "The part of a prompt's KV transfer after its prefill's last step: what the layer-by-layer stream did not hide.",
                kv_after_prefill_);
  out.metric("slimkv_router:kv_transfer_bytes_total", "counter", "KV bytes the prefill workers report sending.", kv_bytes_total_);
  return out.text();
}

}  // namespace slimkv
