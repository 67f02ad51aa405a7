// slimkv router: the HTTP front. Like serve's, it only translates: check the request as serve would,
// hand it to a RequestRelay, and send back what the relay's sink receives, as SSE chunks or one JSON.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "router/request_relay.h"
#include "router/router_metrics.h"
#include "router/worker_pool.h"
#include "serve/api_error.h"
#include "serve/auth.h"
#include "serve/client_watch.h"
#include "serve/completion_request.h"
#include "serve/http_errors.h"
#include "serve/openai_response.h"
#include "serve/sse.h"
#include "serve/stop_signals.h"
#include "slimkv/router.h"

namespace slimkv {
namespace {

using nlohmann::json;

// The whole response for a client that did not ask for a stream.
class GatheringSink : public RelaySink {
 public:
  explicit GatheringSink(ResponseHeader header) : header_(std::move(header)) {}
  void on_delta(const std::string& text, std::optional<FinishReason> finish) override {
    text_ += text;
    if (finish) finish_ = *finish;
  }
  void on_end(const Usage& usage) override { answer(200, completion_json(header_, text_, finish_, usage)); }
  void on_error(int status, const std::string& body) override { answer(status, body); }
  void answer(int status, std::string body) {
    status_ = status;
    body_ = std::move(body);
  }
  void send(httplib::Response& response) const {
    response.status = status_;
    response.set_content(body_, "application/json");
  }

 private:
  ResponseHeader header_;
  std::string text_;
  FinishReason finish_ = FinishReason::kLength;
  int status_ = 500;
  std::string body_;
};

// A streamed response: the relay's thread queues SSE events, the HTTP thread writes them. The status
// line waits for the first delta (then 200) or an error before it (then the error's status and body).
class StreamingSink : public RelaySink {
 public:
  StreamingSink(ResponseHeader header, bool include_usage) : header_(std::move(header)), include_usage_(include_usage) {}

  void on_delta(const std::string& text, std::optional<FinishReason> finish) override {
    std::string events;
    if (!committed_ && header_.chat) events += sse_event(chunk_json(header_, "", std::nullopt, true, include_usage_));
    events += sse_event(chunk_json(header_, text, finish, false, include_usage_));
    push(std::move(events), /*commit=*/true, /*end=*/false);
  }
  void on_end(const Usage& usage) override {
    push((include_usage_ ? sse_event(usage_chunk_json(header_, usage)) : "") + sse_done(), false, true);
  }
  void on_error(int status, const std::string& body) override {
    std::lock_guard lock(mutex_);
    if (!committed_) {
      error_status_ = status;
      error_body_ = body;
    } else {
      queue_.push_back(sse_event(body) + sse_done());
    }
    ended_ = true;
    ready_.notify_all();
  }

  // Waits until the response is committed or failed; the error's status and body if it failed.
  std::optional<std::pair<int, std::string>> wait_for_start() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return committed_ || ended_; });
    if (committed_) return std::nullopt;
    return std::pair{error_status_, error_body_};
  }
  // The events so far (waits up to `timeout` for one), and whether the stream has ended.
  std::pair<std::string, bool> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !queue_.empty() || ended_; });
    std::string out;
    for (std::string& events : queue_) out += events;
    queue_.clear();
    return {out, ended_};
  }

 private:
  void push(std::string events, bool commit, bool end) {
    std::lock_guard lock(mutex_);
    committed_ = committed_ || commit;
    ended_ = ended_ || end;
    queue_.push_back(std::move(events));
    ready_.notify_all();
  }

  const ResponseHeader header_;
  const bool include_usage_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::string> queue_;
  bool committed_ = false, ended_ = false;
  int error_status_ = 0;
  std::string error_body_;
};

// A streamed request's relay on its own thread, for as long as the HTTP response streams it. Destroyed
// with the response: a relay still running (the client left) is cancelled and joined.
struct StreamingRelay {
  StreamingRelay(RequestRelay::Parts parts, ResponseHeader header, bool include_usage)
      : sink(std::move(header), include_usage), relay(parts) {}
  ~StreamingRelay() {
    relay.cancel();
    if (thread.joinable()) thread.join();
  }
  StreamingSink sink;
  RequestRelay relay;
  std::thread thread;
};

class RouterApi {
 public:
  RouterApi(const RouterConfig& config, WorkerPool& pool) : config_(config), pool_(pool) {
    relay_options_.max_retries = config.max_retries;
    relay_options_.kv_timeout_s = config.kv_timeout_s;
    relay_options_.timeouts = {config.connect_timeout_s, config.read_timeout_s};
  }
  void set_draining() { draining_ = true; }
  void wait_for_answers(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void route(httplib::Server& server) {
    server.Get("/health", [this](const httplib::Request&, httplib::Response& response) { health(response); });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
      response.set_content(metrics_.text(pool_), "text/plain; version=0.0.4; charset=utf-8");
    });
    server.Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
      if (admit(request, response)) forward(request, response);
    });
    for (const char* path : {"/tokenize", "/detokenize"}) {
      server.Post(path, [this](const httplib::Request& request, httplib::Response& response) {
        if (!draining(response)) forward(request, response);
      });
    }
    server.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
      complete(request, response, /*chat=*/false);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
      complete(request, response, /*chat=*/true);
    });
    install_error_handlers(server, config_.max_body_bytes);
  }

 private:
  // 200 while at least one worker of each role is up; 503 naming the missing role's reasons otherwise.
  void health(httplib::Response& response) {
    int up[2] = {0, 0};
    for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
      for (const WorkerState& worker : pool_.workers(role)) up[int(role)] += worker.up;
    }
    if (draining_) return send_error(response, ApiError::unavailable("the router is shutting down"));
    for (WorkerRole role : {WorkerRole::kPrefill, WorkerRole::kDecode}) {
      if (up[int(role)] == 0) {
        return send_error(response, ApiError::unavailable(std::string("no ") + role_name(role) +
                                                          " worker is up: " + pool_.down_reasons(role)));
      }
    }
    response.set_content(json{{"status", "ok"}, {"role", "router"}, {"model", pool_.model_name()},
                              {"prefill_up", up[int(WorkerRole::kPrefill)]}, {"decode_up", up[int(WorkerRole::kDecode)]}}
                             .dump(),
                         "application/json");
  }

  bool draining(httplib::Response& response) {
    if (draining_) send_error(response, ApiError::unavailable("the router is shutting down"));
    return draining_;
  }
  bool admit(const httplib::Request& request, httplib::Response& response) {
    if (!bearer_key_matches(request.get_header_value("Authorization"), config_.api_key)) {
      send_error(response, ApiError::unauthorized());
      return false;
    }
    return !draining(response);
  }

  // The endpoints that need no prefill (the model list, tokenizing): answered by a decode worker.
  void forward(const httplib::Request& request, httplib::Response& response) {
    std::unique_ptr<WorkerLease> worker = pool_.pick(WorkerRole::kDecode, {});
    if (!worker) {
      return send_error(response, ApiError::unavailable("no decode worker is up: " + pool_.down_reasons(WorkerRole::kDecode)));
    }
    UpstreamCall call(worker->worker().address, relay_options_.timeouts);
    httplib::Request upstream;
    upstream.method = request.method;
    upstream.path = request.path;
    upstream.body = request.body;
    upstream.set_header("Content-Type", "application/json");
    if (request.has_header("Authorization")) upstream.set_header("Authorization", request.get_header_value("Authorization"));
    const httplib::Result result = call.send(upstream);
    if (!result) {
      worker->mark_down(describe(result.error()));
      ApiError error = ApiError::unavailable("the decode worker " + worker->worker().address.url + " did not answer: " +
                                             describe(result.error()));
      error.status = 502;
      return send_error(response, error);
    }
    response.status = result->status;
    const std::string type = result->get_header_value("Content-Type");
    response.set_content(result->body, type.empty() ? "application/json" : type);
  }

  void complete(const httplib::Request& http_request, httplib::Response& response, bool chat) {
    if (!admit(http_request, response)) return;
    // Checked as serve checks it, so that a malformed request is answered here with serve's words; what
    // needs the model (the prompt's tokens, its length) is checked by the prefill worker.
    CompletionRequest parsed;
    if (auto error = parse_completion_request(http_request.body, chat, parsed)) {
      metrics_.finished(RequestOutcome::kClientError);
      return send_error(response, *error);
    }
    ++in_flight_;
    auto in_flight = std::shared_ptr<void>(nullptr, [this](void*) { --in_flight_; });
    RequestRelay::Parts parts{pool_, metrics_, relay_options_,
                              ClientRequest{chat ? "/v1/chat/completions" : "/v1/completions", json::parse(http_request.body),
                                            http_request.get_header_value("Authorization")}};
    ResponseHeader header = new_response_header(chat, pool_.model_name());
    if (!parsed.stream) {
      GatheringSink sink(header);
      RequestRelay relay(parts);
      // A client that leaves before the answer is written cuts the workers' requests (they cancel).
      ClientWatch watch(http_request, [&relay] { relay.cancel(); });
      metrics_.finished(relay.run(sink));
      return sink.send(response);
    }

    auto streaming = std::make_shared<StreamingRelay>(parts, header, parsed.include_usage);
    StreamingRelay* raw = streaming.get();
    streaming->thread = std::thread([this, raw] { metrics_.finished(raw->relay.run(raw->sink)); });
    if (auto error = streaming->sink.wait_for_start()) {
      response.status = error->first;
      return response.set_content(error->second, "application/json");
    }
    response.set_header("Cache-Control", "no-cache");
    response.set_header("X-Accel-Buffering", "no");
    response.set_chunked_content_provider(
        "text/event-stream",
        [streaming, in_flight](size_t, httplib::DataSink& sink) -> bool {
          auto [events, ended] = streaming->sink.take(std::chrono::milliseconds(1000));
          // Nothing for a second: an SSE comment, which clients skip, so that a client that left is
          // noticed by the failed write and the workers' requests are cancelled.
          if (events.empty() && !ended) events = ": waiting\n\n";
          if (!events.empty() && !sink.write(events.data(), events.size())) {
            streaming->relay.cancel();
            return false;
          }
          if (ended) sink.done();
          return true;
        });
  }

  const RouterConfig& config_;
  WorkerPool& pool_;
  RouterMetrics metrics_;
  RelayOptions relay_options_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
};

}  // namespace

Status run_router(const RouterConfig& config) {
  std::vector<WorkerAddress> prefill, decode;
  for (auto& [urls, addresses, flag] : {std::tuple{&config.prefill_urls, &prefill, "--prefill"},
                                        std::tuple{&config.decode_urls, &decode, "--decode"}}) {
    if (urls->empty()) return error(flag, " lists no worker: give at least one URL (http://HOST:PORT[,...])");
    for (const std::string& url : *urls) {
      Expected<WorkerAddress> address = parse_worker_url(url);
      if (!address) return error(flag, ": ", address.status().message());
      addresses->push_back(*address);
    }
  }
  const sigset_t stop_signals = block_stop_signals();  // before any thread starts

  const HttpTimeouts probe_timeouts{std::min(config.connect_timeout_s, 1.0), std::min(config.read_timeout_s, 2.0)};
  WorkerPool pool(std::move(prefill), std::move(decode), probe_timeouts);
  pool.probe_all();
  pool.start(config.health_interval_s);

  RouterApi api(config, pool);
  httplib::Server http;
  const size_t threads = size_t(std::max(config.http_threads, 8));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(config.max_body_bytes);
  api.route(http);
  const int port = config.port == 0 ? http.bind_to_any_port(config.host)
                                    : (http.bind_to_port(config.host, config.port) ? config.port : -1);
  if (port < 0) return error("cannot listen on ", config.host, ":", config.port, " (in use, or not an address of this machine)");
  std::thread listener([&http] { http.listen_after_bind(); });
  std::fprintf(stderr, "slimkv router: listening on http://%s:%d (%zu prefill, %zu decode workers)\n", config.host.c_str(),
               port, config.prefill_urls.size(), config.decode_urls.size());

  std::fprintf(stderr, "slimkv router: %s: finishing the requests in flight, then exiting\n",
               wait_for_stop_signal(stop_signals));
  api.set_draining();
  api.wait_for_answers(std::chrono::seconds(30));
  http.stop();
  listener.join();
  pool.stop();
  std::fprintf(stderr, "slimkv router: stopped\n");
  return Status::ok();
}

}  // namespace slimkv
