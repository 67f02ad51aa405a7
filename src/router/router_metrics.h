// GET /metrics of the router, in Prometheus text: requests by outcome, re-dispatches by the role of the
// worker that failed, each worker's up/down, load and in-flight gauges, and latency histograms as the
// client sees them (first token, whole request) plus the KV transfers the prefill workers report.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "router/worker_pool.h"
#include "slimkv/scheduler.h"

namespace slimkv {

enum class RequestOutcome { kOk, kClientError, kFailed, kCancelled };

class RouterMetrics {
 public:
  RouterMetrics();
  void finished(RequestOutcome outcome);
  void retried(WorkerRole failed_role);
  void first_token(double seconds);    // from the request's arrival
  void request_latency(double seconds);  // arrival to the last byte, successful requests
  // A prefill worker's report of one transfer: its seconds from the first piece to the decode worker's
  // DONE, its bytes, and (when reported: a negative value is not) the seconds of it after the prefill's
  // last step, which the transfer did not hide behind the prefill.
  void kv_transfer(double seconds, double bytes, double after_prefill_seconds);
  std::string text(const WorkerPool& pool) const;

 private:
  mutable std::mutex mutex_;
  uint64_t outcomes_[4] = {};
  uint64_t retries_[2] = {};  // prefill, decode
  double kv_bytes_total_ = 0;
  LatencyHistogram time_to_first_token_, e2e_request_latency_, kv_transfer_, kv_after_prefill_;
};

}  // namespace slimkv
