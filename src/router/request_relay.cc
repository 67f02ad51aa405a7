#include "router/request_relay.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "router/sse_reader.h"
#include "serve/api_error.h"

namespace slimkv {
namespace {

using nlohmann::json;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A worker's 4xx means the request itself is wrong (relayed to the client as it is), except those that
// say "not now": 408 and 429 are retried like a 5xx.
bool is_client_fault(int status) { return status >= 400 && status < 500 && status != 408 && status != 429; }

std::optional<FinishReason> parse_finish(const json& value) {
  if (!value.is_string()) return std::nullopt;
  if (value == "stop") return FinishReason::kStop;
  if (value == "length") return FinishReason::kLength;
  return std::nullopt;
}

std::string error_message(const std::string& body) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object() &&
      parsed["error"].contains("message") && parsed["error"]["message"].is_string()) {
    return parsed["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

ApiError upstream_failed(std::string message) {
  ApiError error;
  error.status = 502;
  error.message = std::move(message);
  error.type = "server_error";
  error.code = "upstream_failed";
  return error;
}

// One event of D's stream, as the router needs it.
struct StreamEvent {
  std::string text;               // the choice's text (completions) or delta content (chat)
  std::vector<int32_t> token_ids;  // the ids whose text `text` is
  std::optional<FinishReason> finish;
  std::optional<Usage> usage;     // the usage chunk
  std::string error;              // an error event (the worker failed the request), or not JSON
  bool done = false;              // [DONE]
  bool carries_tokens() const { return !text.empty() || !token_ids.empty() || finish; }
};

StreamEvent parse_stream_event(const std::string& data) {
  StreamEvent event;
  if (data == "[DONE]") {
    event.done = true;
    return event;
  }
  const json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object() || chunk.contains("error")) {
    event.error = chunk.is_object() ? data : "an event that is not a JSON object: " + data.substr(0, 200);
    return event;
  }
  if (chunk.contains("usage") && chunk["usage"].is_object()) {
    const json& usage = chunk["usage"];
    event.usage = Usage{usage.value("prompt_tokens", 0), usage.value("completion_tokens", 0)};
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return event;
  const json& choice = chunk["choices"][0];
  if (choice.contains("text") && choice["text"].is_string()) event.text = choice["text"].get<std::string>();
  if (choice.contains("delta") && choice["delta"].is_object() && choice["delta"].contains("content") &&
      choice["delta"]["content"].is_string()) {
    event.text = choice["delta"]["content"].get<std::string>();
  }
  if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
    for (const json& id : choice["token_ids"]) {
      if (id.is_number_integer()) event.token_ids.push_back(id.get<int32_t>());
    }
  }
  event.finish = parse_finish(choice.value("finish_reason", json()));
  return event;
}

constexpr size_t kMaxErrorBodyBytes = 64 << 10;  // a worker's error answer is kept up to this

}  // namespace

// P's answer to /internal/v1/prefill.
struct RequestRelay::PrefillResult {
  bool ok = false;
  bool cancelled = false;
  AttemptResult failure;  // when !ok
};

RequestRelay::RequestRelay(const Parts& parts)
    : pool_(parts.pool), metrics_(parts.metrics), options_(parts.options), request_(parts.request), started_s_(now_s()) {}

void RequestRelay::cancel() {
  cancelled_ = true;
  std::lock_guard lock(calls_mutex_);
  if (decode_call_) decode_call_->cancel();
  if (prefill_call_) prefill_call_->cancel();
}

httplib::Headers RequestRelay::headers() const {
  httplib::Headers headers;
  if (!request_.authorization.empty()) headers.emplace("Authorization", request_.authorization);
  return headers;
}

RequestOutcome RequestRelay::run(RelaySink& sink) {
  std::vector<size_t> failed_prefill, failed_decode;  // workers that failed this request: picked last
  std::string failures;
  const auto fail = [&](const ApiError& error) {
    sink.on_error(error.status, error.body());
    return RequestOutcome::kFailed;
  };
  for (int attempt = 0;; ++attempt) {
    if (cancelled_) return RequestOutcome::kCancelled;
    std::unique_ptr<WorkerLease> decode = pool_.pick(WorkerRole::kDecode, failed_decode);
    if (!decode) return fail(ApiError::unavailable("no decode worker is up: " + pool_.down_reasons(WorkerRole::kDecode)));
    std::unique_ptr<WorkerLease> prefill = pool_.pick(WorkerRole::kPrefill, failed_prefill);
    if (!prefill) return fail(ApiError::unavailable("no prefill worker is up: " + pool_.down_reasons(WorkerRole::kPrefill)));

    const AttemptResult result = this->attempt(*decode, *prefill, sink);
    switch (result.end) {
      case AttemptEnd::kDone:
        sink.on_end(usage_.value_or(Usage{prompt_tokens_, int(token_ids_.size())}));
        metrics_.request_latency(now_s() - started_s_);
        return RequestOutcome::kOk;
      case AttemptEnd::kRelayed:
        sink.on_error(result.status, result.body);
        return is_client_fault(result.status) ? RequestOutcome::kClientError : RequestOutcome::kFailed;
      case AttemptEnd::kCancelled:
        return RequestOutcome::kCancelled;
      case AttemptEnd::kPrefillFailed:
      case AttemptEnd::kDecodeFailed: {
        const bool on_prefill = result.end == AttemptEnd::kPrefillFailed;
        WorkerLease& failed = on_prefill ? *prefill : *decode;
        if (result.worker_down) failed.mark_down(result.reason);
        (on_prefill ? failed_prefill : failed_decode).push_back(failed.index());
        failures += std::string(failures.empty() ? "" : "; ") + role_name(on_prefill ? WorkerRole::kPrefill : WorkerRole::kDecode) +
                    " worker " + failed.worker().address.url + ": " + result.reason;
        if (attempt >= options_.max_retries) {
          return fail(upstream_failed("the request failed on " + std::to_string(attempt + 1) + " attempts (" + failures + ")"));
        }
        metrics_.retried(on_prefill ? WorkerRole::kPrefill : WorkerRole::kDecode);
        std::fprintf(stderr, "slimkv router: re-dispatching a request (%zu tokens sent already): %s worker %s: %s\n",
                     token_ids_.size(), on_prefill ? "prefill" : "decode", failed.worker().address.url.c_str(),
                     result.reason.c_str());
        break;
      }
    }
  }
}

// One dispatch: D's stream on this thread, P's prefill on another. P's failure before D has sent a
// token cuts D's stream (D would wait for KV that never comes); after that, D has the KV and P's answer
// no longer matters.
RequestRelay::AttemptResult RequestRelay::attempt(WorkerLease& decode, WorkerLease& prefill_worker, RelaySink& sink) {
  const std::string request_id = random_hex(32);
  HttpTimeouts decode_timeouts = options_.timeouts;
  // D is silent while it waits for the KV: it must not time out before D's own wait does.
  decode_timeouts.read_s = std::max(decode_timeouts.read_s, options_.kv_timeout_s + options_.timeouts.connect_s + 5);
  UpstreamCall decode_call(decode.worker().address, decode_timeouts);
  UpstreamCall prefill_call(prefill_worker.worker().address, options_.timeouts);
  {
    std::lock_guard lock(calls_mutex_);
    decode_call_ = &decode_call;
    prefill_call_ = &prefill_call;
  }
  if (cancelled_) cancel();

  std::mutex mutex;  // d_started and the prefill result, between this thread and P's
  bool d_started = false;
  std::optional<PrefillResult> prefill_result;
  bool cut_for_prefill = false;  // P failed before D sent a token: D was cut
  // P's body is made here: the thread must not read token_ids_, which this one appends to.
  const std::string prefill_body = json{{"request_id", request_id},
                                        {"endpoint", request_.endpoint},
                                        {"request", request_.body},
                                        {"decode_kv_address", decode.worker().kv_address},
                                        {"resume_token_ids", token_ids_}}
                                       .dump();
  const bool first_attempt = token_ids_.empty();
  std::thread prefill_thread([&] {
    PrefillResult result = prefill(prefill_call, prefill_body, first_attempt);
    bool cut = false;
    {
      std::lock_guard lock(mutex);
      cut = !result.ok && !result.cancelled && !d_started;  // (cancelled: by this thread, D is done)
      cut_for_prefill = cut;
      prefill_result = std::move(result);
    }
    if (cut) decode_call.cancel();
  });

  json body = request_.body;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["kv_transfer"] = {{"request_id", request_id}, {"timeout_s", options_.kv_timeout_s}};
  httplib::Request request;
  request.method = "POST";
  request.path = request_.endpoint;
  request.headers = headers();
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  int status = 0;
  std::string error_body, stream_error;
  SseReader reader;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, std::min(size, kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, error_body.size())));
      return true;
    }
    for (const std::string& data_text : reader.feed(std::string_view(data, size))) {
      StreamEvent event = parse_stream_event(data_text);
      if (!event.error.empty()) {
        stream_error = std::move(event.error);
        return false;
      }
      if (event.usage) usage_ = event.usage;
      // A chat stream's first chunk (the role, no content) is the router's to send, once.
      if (!event.carries_tokens()) continue;
      if (!committed_) {
        // D sends tokens only once it holds the whole KV: from here on P's answer cannot cut it.
        std::lock_guard lock(mutex);
        if (cut_for_prefill) return false;
        d_started = true;
        metrics_.first_token(now_s() - started_s_);
        committed_ = true;
      }
      token_ids_.insert(token_ids_.end(), event.token_ids.begin(), event.token_ids.end());
      finish_ = event.finish;
      if (!event.text.empty() || event.finish) sink.on_delta(event.text, event.finish);
    }
    return !cancelled_.load();
  };
  const httplib::Result result = decode_call.send(request);

  // P answers once D has acknowledged the whole KV, which can come after a short response's end: wait
  // a little for its report then; a D that failed leaves P nothing to say.
  const auto prefill_answered = [&] {
    std::lock_guard lock(mutex);
    return prefill_result.has_value();
  };
  for (int i = 0; finish_ && i < 200 && !prefill_answered(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!prefill_answered()) prefill_call.cancel();
  prefill_thread.join();
  {
    std::lock_guard lock(calls_mutex_);
    decode_call_ = prefill_call_ = nullptr;
  }

  AttemptResult end;
  if (finish_) {
    end.end = AttemptEnd::kDone;  // D ended the response (its usage chunk or [DONE] may be lost: it is complete)
  } else if (cancelled_) {
    end.end = AttemptEnd::kCancelled;
  } else if (cut_for_prefill && !committed_) {
    end = prefill_result->failure;
  } else if (status != 0 && status != 200) {
    end.reason = "answered " + std::to_string(status) + ": " + error_message(error_body);
    if (is_client_fault(status)) {
      end.end = AttemptEnd::kRelayed;
      end.status = status;
      end.body = error_body;
    } else {
      end.end = AttemptEnd::kDecodeFailed;
      end.worker_down = status == 503;  // loading or shutting down: back when /health says so
    }
  } else if (!stream_error.empty()) {
    end.reason = "the stream ended with an error: " + error_message(stream_error);
  } else {
    end.worker_down = true;  // refused, reset, timed out, or the stream ended before its last chunk
    end.reason = result ? "the stream ended before its last chunk" : describe(result.error());
  }
  return end;
}

RequestRelay::PrefillResult RequestRelay::prefill(UpstreamCall& call, const std::string& body, bool first_attempt) {
  httplib::Request request;
  request.method = "POST";
  request.path = "/internal/v1/prefill";
  request.headers = headers();
  request.body = body;
  request.set_header("Content-Type", "application/json");
  const httplib::Result result = call.send(request);
  PrefillResult out;
  AttemptResult& failure = out.failure;
  failure.end = AttemptEnd::kPrefillFailed;
  if (!result) {
    out.cancelled = call.cancelled();
    failure.worker_down = !out.cancelled;
    failure.reason = describe(result.error());
    return out;
  }
  const int status = result->status;
  if (status == 200) {
    out.ok = true;
    const json answer = json::parse(result->body, nullptr, /*allow_exceptions=*/false);
    if (answer.is_object()) {
      if (first_attempt && answer.contains("prompt_tokens") && answer["prompt_tokens"].is_number_integer()) {
        prompt_tokens_ = answer["prompt_tokens"].get<int>();
      }
      if (answer.contains("transfer_seconds") && answer["transfer_seconds"].is_number() && answer.contains("kv_bytes") &&
          answer["kv_bytes"].is_number()) {
        const json timing = answer.value("kv_timing", json::object());
        const double after_prefill =
            timing.is_object() && timing.contains("after_prefill_seconds") && timing["after_prefill_seconds"].is_number()
                ? timing["after_prefill_seconds"].get<double>()
                : -1;
        metrics_.kv_transfer(answer["transfer_seconds"].get<double>(), answer["kv_bytes"].get<double>(), after_prefill);
      }
    }
    return out;
  }
  failure.reason = "answered " + std::to_string(status) + ": " + error_message(result->body);
  if (status == 409) {
    // The two workers disagree on the model, KV spec or format: no other pair is likely to do better,
    // and retrying would hide a deployment error.
    failure.end = AttemptEnd::kRelayed;
    failure.status = 502;
    failure.body = upstream_failed("the prefill worker refused to send the KV to the decode worker: " +
                                   error_message(result->body)).body();
  } else if (is_client_fault(status)) {
    failure.end = AttemptEnd::kRelayed;
    failure.status = status;
    failure.body = result->body;
  } else {
    failure.worker_down = status == 503;
  }
  return out;
}

}  // namespace slimkv
