#include "router/worker_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace slimkv {
namespace {

// P must reach D's KV transport, and the one name of D known to work is the host of D's URL (the router
// reaches D by it): a worker's own idea of its address (its hostname, 0.0.0.0, 127.0.0.1) may not
// resolve elsewhere, e.g. a pod's short hostname in Kubernetes. So the KV address is D's URL host with
// the port D's /health reports; the transport must listen where the HTTP server is reached.
std::string reachable_kv_address(const std::string& reported, const WorkerAddress& worker) {
  const size_t colon = reported.rfind(':');
  if (colon == std::string::npos) return reported;
  const bool ipv6 = worker.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + worker.host + "]" : worker.host) + reported.substr(colon);
}

}  // namespace

const char* role_name(WorkerRole role) { return role == WorkerRole::kPrefill ? "prefill" : "decode"; }

WorkerLease::~WorkerLease() { pool_->release(role_, index_); }

void WorkerLease::mark_down(const std::string& reason) { pool_->set_down(role_, index_, reason); }

WorkerPool::WorkerPool(std::vector<WorkerAddress> prefill, std::vector<WorkerAddress> decode, HttpTimeouts probe_timeouts)
    : probe_timeouts_(probe_timeouts) {
  for (auto& [addresses, role] : {std::pair{&prefill, WorkerRole::kPrefill}, std::pair{&decode, WorkerRole::kDecode}}) {
    for (WorkerAddress& address : *addresses) {
      WorkerState state;
      state.address = std::move(address);
      state.role = role;
      state.down_reason = "not probed yet";
      list(role).push_back(std::move(state));
    }
  }
}

WorkerPool::~WorkerPool() { stop(); }

void WorkerPool::start(double interval_s) {
  prober_ = std::thread([this, interval_s] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      probe_all();
      lock.lock();
      stop_signal_.wait_for(lock, std::chrono::duration<double>(interval_s), [this] { return stopping_; });
    }
  });
}

void WorkerPool::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_signal_.notify_all();
  if (prober_.joinable()) prober_.join();
}

void WorkerPool::probe_all() {
  for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
    for (size_t i = 0; i < list(role).size(); ++i) probe(role, i);
  }
}

// GET /health: 200 with the worker's role, load and (decode) KV address is up; anything else is down.
void WorkerPool::probe(WorkerRole role, size_t index) {
  WorkerAddress address;
  {
    std::lock_guard lock(mutex_);
    address = list(role)[index].address;
  }
  UpstreamCall call(address, probe_timeouts_);
  httplib::Request request;
  request.method = "GET";
  request.path = "/health";
  const httplib::Result result = call.send(request);
  std::string reason;
  nlohmann::json health;
  if (!result) {
    reason = describe(result.error());
  } else if (result->status != 200) {
    reason = "/health answered " + std::to_string(result->status);
  } else {
    health = nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
    if (!health.is_object()) {
      reason = "/health did not answer a JSON object";
    } else if (health.value("role", "") != role_name(role)) {
      reason = std::string("its role is '") + health.value("role", "") + "', listed as a " + role_name(role) +
               " worker (start it with --role " + role_name(role) + ")";
    } else if (role == WorkerRole::kDecode && !health.value("kv_address", "").size()) {
      reason = "its /health names no kv_address";
    }
  }
  std::lock_guard lock(mutex_);
  WorkerState& worker = list(role)[index];
  if (!reason.empty()) {
    if (worker.up || worker.down_reason != reason) {
      std::fprintf(stderr, "slimkv router: %s worker %s is down: %s\n", role_name(role), address.url.c_str(), reason.c_str());
    }
    worker.up = false;
    worker.down_reason = reason;
    return;
  }
  if (!worker.up) std::fprintf(stderr, "slimkv router: %s worker %s is up\n", role_name(role), address.url.c_str());
  worker.up = true;
  worker.down_reason.clear();
  const auto count = [&](const char* key) { return health.contains(key) && health[key].is_number_integer() ? health[key].get<int>() : 0; };
  worker.running = count("running");
  worker.waiting = count("waiting");
  worker.model = health.value("model", "");
  if (role == WorkerRole::kDecode) worker.kv_address = reachable_kv_address(health.value("kv_address", ""), address);
}

std::unique_ptr<WorkerLease> WorkerPool::pick(WorkerRole role, const std::vector<size_t>& avoid) {
  std::lock_guard lock(mutex_);
  std::vector<WorkerState>& workers = list(role);
  const auto load = [&](const WorkerState& worker) {
    return role == WorkerRole::kDecode ? worker.running + worker.waiting + worker.in_flight : worker.in_flight;
  };
  std::optional<size_t> best;
  bool best_avoided = true;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (!workers[i].up) continue;
    const bool avoided = std::find(avoid.begin(), avoid.end(), i) != avoid.end();
    if (!best || (best_avoided && !avoided) || (best_avoided == avoided && load(workers[i]) < load(workers[*best]))) {
      best = i;
      best_avoided = avoided;
    }
  }
  if (!best) return nullptr;
  ++workers[*best].in_flight;
  return std::make_unique<WorkerLease>(this, role, *best, workers[*best]);
}

std::vector<WorkerState> WorkerPool::workers(WorkerRole role) const {
  std::lock_guard lock(mutex_);
  return list(role);
}

std::string WorkerPool::model_name() const {
  std::lock_guard lock(mutex_);
  for (const WorkerState& worker : decode_) {
    if (worker.up) return worker.model;
  }
  return "";
}

std::string WorkerPool::down_reasons(WorkerRole role) const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const WorkerState& worker : list(role)) {
    if (!worker.up) out += (out.empty() ? "" : "; ") + worker.address.url + ": " + worker.down_reason;
  }
  return out;
}

void WorkerPool::release(WorkerRole role, size_t index) {
  std::lock_guard lock(mutex_);
  --list(role)[index].in_flight;
}

void WorkerPool::set_down(WorkerRole role, size_t index, const std::string& reason) {
  std::lock_guard lock(mutex_);
  WorkerState& worker = list(role)[index];
  if (worker.up) {
    std::fprintf(stderr, "slimkv router: %s worker %s is down: %s (probing it every interval)\n", role_name(role),
                 worker.address.url.c_str(), reason.c_str());
  }
  worker.up = false;
  worker.down_reason = reason;
}

}  // namespace slimkv
