// One client request through the router (docs/disaggregated.md, "One request"): pick a decode worker D
// and a prefill worker P; POST the request to D as a stream that waits for its KV (kv_transfer) while P,
// concurrently, prefills and streams the KV to D; pass D's tokens on to the client. When a worker fails,
// re-dispatch to another pair: a prefill that failed starts over; a decode worker that died mid-stream is
// replaced by one that continues from the tokens the client already has (resume_token_ids), so the
// client sees one response. 4xx answers (the request's fault) are relayed unchanged; a bounded number
// of re-dispatches, then a 502.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/router_metrics.h"
#include "router/upstream.h"
#include "router/worker_pool.h"
#include "serve/openai_response.h"
#include "slimkv/generation.h"

namespace slimkv {

struct RelayOptions {
  int max_retries = 3;
  double kv_timeout_s = 60;
  HttpTimeouts timeouts;
};

struct ClientRequest {
  std::string endpoint;        // "/v1/completions" or "/v1/chat/completions"
  nlohmann::json body;         // as the client sent it (an object)
  std::string authorization;   // the client's Authorization header, passed on to the workers
};

// Where a response goes: the HTTP front streams it or gathers it into one JSON. Called from the
// thread that runs the relay only.
class RelaySink {
 public:
  virtual ~RelaySink() = default;
  // The next piece of text; `finish` on the last. The first call commits the response (status 200).
  virtual void on_delta(const std::string& text, std::optional<FinishReason> finish) = 0;
  // After the last delta: the request's usage. The response is complete.
  virtual void on_end(const Usage& usage) = 0;
  // The request failed: before the first delta, `status` and `body` are the answer (a worker's 4xx
  // body unchanged, or the router's error); after it, the stream ends with `body` as an error event.
  virtual void on_error(int status, const std::string& body) = 0;
};

class RequestRelay {
 public:
  // What a relay works with: the router's pool, metrics and options, and the client's request.
  struct Parts {
    WorkerPool& pool;
    RouterMetrics& metrics;
    const RelayOptions& options;
    ClientRequest request;
  };
  explicit RequestRelay(const Parts& parts);
  // Runs the request to its end (bounded by the retries and the timeouts).
  RequestOutcome run(RelaySink& sink);
  // Thread-safe: the client left. Upstream calls are cut (the workers cancel), run() returns soon.
  void cancel();

 private:
  enum class AttemptEnd { kDone, kRelayed, kCancelled, kPrefillFailed, kDecodeFailed };
  struct AttemptResult {
    AttemptEnd end = AttemptEnd::kDecodeFailed;
    int status = 0;           // kRelayed: the answer
    std::string body;
    bool worker_down = false;  // k*Failed: the worker failed at the connection level
    std::string reason;        // k*Failed: what happened, for logs and the final 502
  };
  struct PrefillResult;
  AttemptResult attempt(WorkerLease& decode, WorkerLease& prefill, RelaySink& sink);
  // POST /internal/v1/prefill (on P's thread). `first_attempt`: no resume ids, P's prompt_tokens is the usage's.
  PrefillResult prefill(UpstreamCall& call, const std::string& body, bool first_attempt);
  httplib::Headers headers() const;

  WorkerPool& pool_;
  RouterMetrics& metrics_;
  const RelayOptions options_;
  const ClientRequest request_;
  const double started_s_;

  // What the client has: the ids of the tokens whose text was passed on (resume_token_ids on a
  // re-dispatch), whether anything was (then the response is committed), how it ended.
  std::vector<int32_t> token_ids_;
  bool committed_ = false;
  std::optional<FinishReason> finish_;
  std::optional<Usage> usage_;
  int prompt_tokens_ = 0;  // P's count for the first attempt (usage when D's usage chunk is lost); P's thread
                           // writes it, this one reads it after joining

  std::atomic<bool> cancelled_{false};
  std::mutex calls_mutex_;  // the calls of the running attempt, for cancel()
  UpstreamCall* decode_call_ = nullptr;
  UpstreamCall* prefill_call_ = nullptr;
};

}  // namespace slimkv
