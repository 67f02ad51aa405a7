// The router's workers: which are up, how loaded, where a decode worker takes KV. A prober thread asks
// every worker's /health each interval (load for the picks; down workers come back this way); a request
// that fails on a worker marks it down at once.
//
// Picks: a decode worker by load = running + waiting (its last /health) + the router's own requests on
// it since; a prefill worker by the router's requests in flight on it. Ties go to the first listed.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "router/upstream.h"

namespace slimkv {

enum class WorkerRole { kPrefill, kDecode };
const char* role_name(WorkerRole role);  // "prefill", "decode" (as their /health says)

// A worker as the pool last saw it.
struct WorkerState {
  WorkerAddress address;
  WorkerRole role = WorkerRole::kDecode;
  bool up = false;
  std::string down_reason;  // why it is down ("" while up)
  int running = 0, waiting = 0;  // its last /health
  int in_flight = 0;             // the router's requests on it now
  std::string kv_address;        // decode: HOST:PORT of its KV transport, as reachable from the router
  std::string model;             // its served model name
};

class WorkerPool;

// A picked worker, counted in its in-flight requests until this is destroyed.
class WorkerLease {
 public:
  WorkerLease(WorkerPool* pool, WorkerRole role, size_t index, WorkerState state)
      : pool_(pool), role_(role), index_(index), state_(std::move(state)) {}
  WorkerLease(const WorkerLease&) = delete;
  WorkerLease& operator=(const WorkerLease&) = delete;
  ~WorkerLease();
  const WorkerState& worker() const { return state_; }  // as it was when picked
  size_t index() const { return index_; }
  // The worker failed a request at the connection level (refused, reset, timed out): it is down until
  // its /health answers again.
  void mark_down(const std::string& reason);

 private:
  WorkerPool* pool_;
  WorkerRole role_;
  size_t index_;
  WorkerState state_;
};

class WorkerPool {
 public:
  WorkerPool(std::vector<WorkerAddress> prefill, std::vector<WorkerAddress> decode, HttpTimeouts probe_timeouts);
  ~WorkerPool();  // stops the prober

  // Probes every worker once, now (the prober does it each interval after start()).
  void probe_all();
  void start(double interval_s);
  void stop();

  // The least loaded up worker of `role`, preferring those not in `avoid` (indices of workers that
  // failed this request already); nullptr when none is up.
  std::unique_ptr<WorkerLease> pick(WorkerRole role, const std::vector<size_t>& avoid);
  std::vector<WorkerState> workers(WorkerRole role) const;
  // The served model name the first up decode worker reports ("" when none is up).
  std::string model_name() const;
  // "http://a: connection refused; http://b: ..." of the down workers of `role`.
  std::string down_reasons(WorkerRole role) const;

 private:
  friend class WorkerLease;
  std::vector<WorkerState>& list(WorkerRole role) { return role == WorkerRole::kPrefill ? prefill_ : decode_; }
  const std::vector<WorkerState>& list(WorkerRole role) const { return role == WorkerRole::kPrefill ? prefill_ : decode_; }
  void release(WorkerRole role, size_t index);
  void set_down(WorkerRole role, size_t index, const std::string& reason);
  void probe(WorkerRole role, size_t index);

  HttpTimeouts probe_timeouts_;
  mutable std::mutex mutex_;
  std::vector<WorkerState> prefill_, decode_;
  std::condition_variable stop_signal_;
  bool stopping_ = false;
  std::thread prober_;
};

}  // namespace slimkv
