// slimkv serve: the HTTP layer. It only translates: parse and check a request (completion_request),
// hand it to the Scheduler, and send back what the scheduler's updates say, whole or as SSE chunks.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/auth.h"
#include "serve/chat_prompt.h"
#include "serve/client_watch.h"
#include "serve/completion_request.h"
#include "serve/http_errors.h"
#include "serve/kv_transfer_request.h"
#include "serve/metrics.h"
#include "serve/openai_response.h"
#include "serve/sse.h"
#include "serve/stop_signals.h"
#include "slimkv/server.h"
#include "slimkv/tokenizer.h"
#include "transfer/kv_stream.h"

namespace slimkv {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A request's updates, from the scheduler's thread to the HTTP thread that answers it.
class UpdateQueue {
 public:
  void push(const RequestUpdate& update) {
    std::lock_guard lock(mutex_);
    if (update.finish) finished_at_ = Clock::now();
    updates_.push_back(update);
    ready_.notify_one();
  }
  // When the scheduler pushed the request's last update (its last step over), if it has: a prefill
  // worker's HTTP thread may take it long after, busy sending the KV.
  std::optional<Clock::time_point> finished_at() {
    std::lock_guard lock(mutex_);
    return finished_at_;
  }
  // The updates so far; waits up to `timeout` for one.
  std::deque<RequestUpdate> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !updates_.empty(); });
    return std::exchange(updates_, {});
  }
  // A prefill worker's request also gets its KV's pieces (SubmitOptions::stream_kv), all before the
  // update of its token.
  void push_piece(KvTransferPiece piece) {
    std::lock_guard lock(mutex_);
    if (!first_piece_at_) first_piece_at_ = Clock::now();
    pieces_.push_back(std::move(piece));
    ready_.notify_one();
  }
  // When the scheduler handed out the request's first piece of KV, if it has (timed where the pieces
  // are made: the HTTP thread may take it after the last update, when both come in one step).
  std::optional<Clock::time_point> first_piece_at() {
    std::lock_guard lock(mutex_);
    return first_piece_at_;
  }
  // The pieces and updates so far; waits up to `timeout` for either.
  std::pair<std::deque<KvTransferPiece>, std::deque<RequestUpdate>> take_with_pieces(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !updates_.empty() || !pieces_.empty(); });
    return {std::exchange(pieces_, {}), std::exchange(updates_, {})};
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestUpdate> updates_;
  std::deque<KvTransferPiece> pieces_;
  std::optional<Clock::time_point> finished_at_, first_piece_at_;
};

// Takes a request's updates until its last one; `text` gets every delta's text appended.
RequestUpdate wait_for_finish(UpdateQueue& updates, std::string& text) {
  RequestUpdate last;
  while (!last.finish) {
    for (RequestUpdate& update : updates.take(std::chrono::milliseconds(500))) {
      text += update.text;
      last = std::move(update);
    }
  }
  return last;
}

// What a prefill or decode worker has beyond a colocated one.
struct Disaggregation {
  KvStreamIdentity identity;            // what this worker's KV streams must agree on
  KvStreamReceiver* receiver = nullptr;  // decode: where streams arrive
  std::string kv_address;               // decode: the receiver's host:port, as /health gives it
  std::string cuda_ipc_device;          // this worker's GPU when its KV may move by CUDA IPC; else ""
  int gpu = 0;                          // that GPU's visible index (--device cuda:N)
  bool nccl = false;                    // whether its KV may move by NCCL (to or from another GPU)
  std::shared_ptr<NcclLinks> nccl_links;  // prefill: its links to decode workers on other GPUs
};

// The endpoints, with what they share: the scheduler once loaded, the served model's limits.
class HttpApi {
 public:
  HttpApi(const ServerConfig& config, std::string model_dir) : config_(config), model_dir_(std::move(model_dir)) {}

  // Called once the engine is loaded: the endpoints start answering.
  void set_ready(Scheduler& scheduler, ServedModel served, MetricsLabels labels, Disaggregation disaggregation) {
    disaggregation_ = std::move(disaggregation);
    served_ = std::move(served);
    labels_ = std::move(labels);
    tokenizer_ = scheduler.engine().tokenizer();
    scheduler_.store(&scheduler);
  }
  // Shutdown begins: new requests get 503, accepted ones go on.
  void set_draining() { draining_ = true; }
  // Waits until every accepted completion has written its answer (or `timeout` passed).
  void wait_for_answers(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (in_flight_.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  void route(httplib::Server& server) {
    server.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
      Scheduler* scheduler = scheduler_.load();
      if (!scheduler) return send_error(response, ApiError::unavailable("the model is loading"));
      if (draining_) return send_error(response, ApiError::unavailable("the server is shutting down"));
      // What a router needs to place requests: the role, what KV streams must match, the load.
      const SchedulerStats stats = scheduler->stats();
      json health = {{"status", "ok"}, {"role", config_.role}, {"model", served_.name}, {"kv_spec", labels_.kv_spec},
                     {"running", stats.running}, {"waiting", stats.waiting}};
      if (disaggregation_.receiver) health["kv_address"] = disaggregation_.kv_address;
      response.set_content(health.dump(), "application/json");
    });
    server.Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
      if (!admit(request, response)) return;
      const json model = {{"id", served_.name}, {"object", "model"}, {"created", started_},
                          {"owned_by", "slimkv"}, {"root", model_dir_}, {"parent", nullptr},
                          {"max_model_len", served_.max_model_len}};
      response.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
    });
    server.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
      complete(request, response, /*chat=*/false);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
      complete(request, response, /*chat=*/true);
    });
    server.Post("/internal/v1/prefill", [this](const httplib::Request& request, httplib::Response& response) {
      prefill(request, response);
    });
    server.Post("/tokenize", [this](const httplib::Request& request, httplib::Response& response) {
      if (!ready(response)) return;
      tokenize(request, response);
    });
    server.Post("/detokenize", [this](const httplib::Request& request, httplib::Response& response) {
      if (!ready(response)) return;
      detokenize(request, response);
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
      Scheduler* scheduler = scheduler_.load();
      if (!scheduler) return send_error(response, ApiError::unavailable("the model is loading"));
      std::string text = prometheus_text(scheduler->stats(), labels_);
      if (disaggregation_.receiver) text += prometheus_text(disaggregation_.receiver->stats(), labels_);
      response.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
    });
    install_error_handlers(server, config_.max_body_bytes);
  }

 private:
  // The engine is loaded and the server is not shutting down; else a 503.
  bool ready(httplib::Response& response) {
    if (!scheduler_.load()) {
      send_error(response, ApiError::unavailable("the model is loading; retry when GET /health answers 200"));
      return false;
    }
    if (draining_) {
      send_error(response, ApiError::unavailable("the server is shutting down"));
      return false;
    }
    return true;
  }
  // /v1/ endpoints: the API key, then ready().
  bool admit(const httplib::Request& request, httplib::Response& response) {
    if (!bearer_key_matches(request.get_header_value("Authorization"), config_.api_key)) {
      send_error(response, ApiError::unauthorized());
      return false;
    }
    return ready(response);
  }

  // The prompt's tokens: the ids given, the text encoded, or the chat rendered with its template.
  std::optional<ApiError> prompt_tokens(CompletionRequest& request) {
    std::vector<int32_t> ids;
    std::string field = "prompt";
    if (request.chat) {
      field = "messages";
      Expected<std::string> text = render_chat_prompt(scheduler_.load()->engine(), request.messages, /*add_generation_prompt=*/true);
      if (!text) return ApiError::bad_field("messages", "messages: " + text.status().message());
      // The template writes the special tokens itself (apply_chat_template's tokenize does the same).
      ids = tokenizer_->encode(*text, /*add_special_tokens=*/false);
    } else if (request.prompt_text) {
      ids = tokenizer_->encode(*request.prompt_text);  // as slimkv generate and vLLM: with BOS
    } else {
      ids = request.prompt_ids;
    }
    return finish_completion_request(request, std::move(ids), served_, field);
  }

  void complete(const httplib::Request& http_request, httplib::Response& response, bool chat) {
    if (!admit(http_request, response)) return;
    CompletionRequest request;
    if (auto error = parse_completion_request(http_request.body, chat, request)) return send_error(response, *error);
    if (auto error = check_model_name(request.model, served_)) return send_error(response, *error);
    std::optional<KvTransferField> kv_transfer;
    if (auto error = parse_kv_transfer_field(http_request.body, kv_transfer)) return send_error(response, *error);
    if (auto error = prompt_tokens(request)) return send_error(response, *error);

    auto updates = std::make_shared<UpdateQueue>();
    Scheduler& scheduler = *scheduler_.load();
    // Counted until the answer is written: shutdown waits for it (a stream's count ends in its releaser).
    auto in_flight = std::shared_ptr<void>(nullptr, [this](void*) { --in_flight_; });
    ++in_flight_;
    SubmitOptions options;
    if (kv_transfer) {
      if (auto error = receive_kv(*kv_transfer, request.generation.prompt, options)) return send_error(response, *error);
    }
    Expected<RequestId> id = scheduler.submit(
        request.generation, [updates](const RequestUpdate& update) { updates->push(update); }, std::move(options));
    if (!id) {
      if (draining_) return send_error(response, ApiError::unavailable(id.status().message()));
      return send_error(response, ApiError::bad_field(chat ? "messages" : "prompt", id.status().message()));
    }
    const ResponseHeader header = new_response_header(chat, served_.name);
    if (request.stream) {
      return stream(response, scheduler, *id, updates, header, request.include_usage, kv_transfer.has_value(), in_flight);
    }

    // Whole: wait for the end; a client that leaves meanwhile cancels the request (its KV is freed at
    // the next step).
    std::string text;
    RequestUpdate last;
    {
      ClientWatch watch(http_request, [&scheduler, id = *id] { scheduler.cancel(id); });
      last = wait_for_finish(*updates, text);
      if (watch.client_left()) return;  // nobody reads the answer
    }
    if (*last.finish == FinishReason::kError) return send_error(response, ApiError::internal(last.error));
    if (*last.finish == FinishReason::kCancelled) {
      return send_error(response, ApiError::unavailable("the request was cancelled: the server is shutting down"));
    }
    response.set_content(completion_json(header, text, *last.finish, {last.prompt_tokens, last.completion_tokens}),
                         "application/json");
  }

  // A decode worker's request with kv_transfer: waits for its KV stream, checks it is this request's,
  // and sets `options` to resume from it.
  std::optional<ApiError> receive_kv(const KvTransferField& field, const std::vector<int32_t>& prompt, SubmitOptions& options) {
    if (!disaggregation_.receiver) {
      return ApiError::bad_field("kv_transfer", "kv_transfer: this worker's role is " + config_.role +
                                                    "; only a decode worker (slimkv serve --role decode) receives KV streams");
    }
    Expected<ReceivedKv> received = disaggregation_.receiver->wait_for(field.request_id, field.timeout);
    if (!received) return ApiError::timeout(received.status().message());
    if (received->request.prompt_token_ids != prompt) {
      return ApiError::kv_transfer_failed(str_cat(
          "the KV stream for request ", field.request_id, " holds a prompt of ", received->request.prompt_token_ids.size(),
          " tokens that is not this request's (", prompt.size(), " tokens): the prefill worker was sent another request"));
    }
    std::vector<int32_t> generated = std::move(received->request.resume_token_ids);
    generated.push_back(received->request.next_token);
    options.resume = SubmitOptions::Resume{.kv = std::move(received->transfer), .kv_crc = received->received_crc,
                                           .generated = std::move(generated), .device_kv = std::move(received->device_kv),
                                           .staged_kv = std::move(received->staged_kv),
                                           .kv_reservation = std::move(received->kv_reservation)};
    return std::nullopt;
  }

  // POST /internal/v1/prefill (a prefill worker): the client's request checked as its endpoint checks it,
  // its prompt (+ resume_token_ids) prefilled and its next token sampled, and the KV streamed to the
  // decode worker, handshake first so that a mismatch costs no prefill.
  void prefill(const httplib::Request& http_request, httplib::Response& response) {
    if (!admit(http_request, response)) return;
    if (config_.role != "prefill") {
      return send_error(response, ApiError{.status = 404,
                                           .message = "POST /internal/v1/prefill: this worker's role is " + config_.role +
                                                      "; start it with --role prefill",
                                           .type = "invalid_request_error", .param = "", .code = "not_found"});
    }
    PrefillRequest ask;
    if (auto error = parse_prefill_request(http_request.body, ask)) return send_error(response, *error);
    CompletionRequest request;
    if (auto error = parse_completion_request(ask.request.dump(), ask.chat, request)) return send_error(response, *error);
    if (auto error = check_model_name(request.model, served_)) return send_error(response, *error);
    if (auto error = prompt_tokens(request)) return send_error(response, *error);
    GenerationRequest generation = request.generation;
    const std::vector<int32_t> prompt = generation.prompt;
    std::vector<int32_t> resume;
    for (const int64_t id : ask.resume_token_ids) {
      if (id < 0 || id >= served_.vocab_size) {
        return send_error(response, ApiError::bad_field("resume_token_ids", str_cat("resume_token_ids: ", id,
                                                                                    " is not a token id in [0, ", served_.vocab_size, ")")));
      }
      resume.push_back(int32_t(id));
    }
    if (int64_t(resume.size()) >= int64_t(generation.max_tokens)) {
      return send_error(response, ApiError::bad_field("resume_token_ids", str_cat("resume_token_ids: ", resume.size(),
                                                                                  " tokens already reach the request's max_tokens of ",
                                                                                  generation.max_tokens)));
    }
    generation.max_tokens = 1;  // the next token; the decode worker generates the rest

    bool refused = false;
    // CUDA IPC when the decode worker is on this GPU (it says so in ACCEPT); a capped link is TCP's.
    const std::string ipc_device = config_.kv_bandwidth_gbps > 0 ? "" : disaggregation_.cuda_ipc_device;
    Expected<std::unique_ptr<KvStreamSender>> sender =
        KvStreamSender::open(ask.decode_kv_address, disaggregation_.identity, ask.request_id, ask.attempt,
                             {.bandwidth_gbps = config_.kv_bandwidth_gbps, .cuda_ipc_device = ipc_device,
                              .nccl_links = disaggregation_.nccl_links.get(), .gpu_device = disaggregation_.cuda_ipc_device,
                              .gpu = disaggregation_.gpu, .total_tokens = int64_t(prompt.size() + resume.size())},
                             &refused);
    if (!sender) {
      return send_error(response, refused ? ApiError::kv_refused(sender.status().message())
                                          : ApiError::kv_transfer_failed(sender.status().message()));
    }
    auto updates = std::make_shared<UpdateQueue>();
    auto in_flight = std::shared_ptr<void>(nullptr, [this](void*) { --in_flight_; });
    ++in_flight_;
    const bool on_device = (*sender)->kv_on_device();
    // Over NCCL the blocks go layer by layer as the prefill seals them; over CUDA IPC (one GPU, no wire
    // time to hide) the whole KV is shared after the last step.
    const KvStreamForm form = (*sender)->nccl()       ? KvStreamForm::kDeviceLayers
                              : (*sender)->cuda_ipc() ? KvStreamForm::kDeviceWhole
                                                      : KvStreamForm::kHostBytes;
    SubmitOptions options{.resume = std::nullopt, .forced_tokens = resume,
                          .stream_kv = [updates](KvTransferPiece piece) { updates->push_piece(std::move(piece)); },
                          .stream_kv_form = form};
    const Clock::time_point submitted = Clock::now();
    Expected<RequestId> id = scheduler_.load()->submit(
        generation, [updates](const RequestUpdate& update) { updates->push(update); }, std::move(options));
    if (!id) {
      if (draining_) return send_error(response, ApiError::unavailable(id.status().message()));
      return send_error(response, ApiError::bad_field(ask.chat ? "messages" : "prompt", id.status().message()));
    }
    // Each piece goes out as it comes, while the scheduler computes the next layers (and, for a prompt
    // longer than a step, the next chunks); the token's update comes after the last piece. Over CUDA IPC
    // or NCCL the last piece is the device one (over NCCL after every layer's blocks).
    const int num_layers = disaggregation_.identity.num_layers;
    const int expected_pieces = on_device ? 1 : num_layers + 1;
    int pieces = 0;  // the head and the layers' final pieces
    Status sent;
    RequestUpdate last;
    std::optional<Clock::time_point> start;
    while (!last.finish) {
      auto [new_pieces, new_updates] = updates->take_with_pieces(std::chrono::milliseconds(500));
      for (KvTransferPiece& piece : new_pieces) {
        if (!start) start = Clock::now();
        if (piece.layer < 0 || piece.final) ++pieces;
        if (sent.is_ok()) sent = (*sender)->send_piece(piece);
      }
      for (RequestUpdate& update : new_updates) {
        if (update.finish) last = std::move(update);
      }
    }
    if (*last.finish == FinishReason::kError) return send_error(response, ApiError::internal(last.error));
    if (*last.finish == FinishReason::kCancelled || last.token_ids.empty()) {
      return send_error(response, ApiError::unavailable("the prefill was cancelled: the server is shutting down"));
    }
    if (pieces != expected_pieces) {
      return send_error(response, ApiError::internal(str_cat("the prefill produced ", pieces, " pieces of the KV, expected ",
                                                             expected_pieces, " (", (*sender)->transport(), ")")));
    }
    const KvStreamRequest stream_request{.request_id = ask.request_id, .attempt = ask.attempt, .prompt_token_ids = prompt,
                                         .resume_token_ids = resume, .next_token = last.token_ids.front(),
                                         .endpoint = ask.endpoint, .request = ask.request};
    if (sent.is_ok()) sent = (*sender)->finish(stream_request);
    if (!sent.is_ok()) return send_error(response, ApiError::kv_transfer_failed(sent.message()));
    const Clock::time_point done = Clock::now();
    const Clock::time_point prefilled = updates->finished_at().value_or(done);
    const auto seconds = [](Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double>(to - from).count(); };
    const KvStreamSender::Timing timing = (*sender)->timing();
    json answer = {{"request_id", ask.request_id}, {"prompt_tokens", prompt.size() + resume.size()},
                         {"kv_bytes", (*sender)->bytes_sent()},
                         {"kv_transport", (*sender)->transport()},
                         {"transfer_seconds", std::chrono::duration<double>(Clock::now() - start.value_or(Clock::now())).count()},
                         {"next_token", stream_request.next_token}};
    // Where the time went (docs/disaggregated.md, "Where the overlap went"): what the decode worker waits
    // beyond the prefill is after_prefill_seconds.
    answer["kv_timing"] = {{"first_piece_seconds", seconds(submitted, updates->first_piece_at().value_or(submitted))},
                           {"prefill_seconds", seconds(submitted, prefilled)},
                           {"after_prefill_seconds", seconds(prefilled, done)},
                           {"frames_seconds", timing.frames_seconds},
                           {"paced_seconds", timing.paced_seconds},
                           {"receiver", timing.receiver}};
    response.set_content(answer.dump(), "application/json");
  }

  // SSE: one chunk per update with text, the finish chunk, the usage chunk if asked, then [DONE]. A write
  // that fails (the client left) cancels the request, which frees its sequence at the next step.
  void stream(httplib::Response& response, Scheduler& scheduler, RequestId id, std::shared_ptr<UpdateQueue> updates,
              ResponseHeader header, bool include_usage, bool with_token_ids, std::shared_ptr<void> in_flight) {
    struct StreamState {
      bool started = false, finished = false;
    };
    auto state = std::make_shared<StreamState>();
    response.set_header("Cache-Control", "no-cache");
    response.set_header("X-Accel-Buffering", "no");  // proxies must not buffer the stream
    response.set_chunked_content_provider(
        "text/event-stream",
        [&scheduler, id, updates, header, include_usage, with_token_ids, state](size_t, httplib::DataSink& sink) -> bool {
          std::string out;
          const std::vector<int32_t> no_tokens;
          const auto ids = [&](const std::vector<int32_t>& tokens) { return with_token_ids ? &tokens : nullptr; };
          if (!state->started && header.chat) {
            out += sse_event(chunk_json(header, "", std::nullopt, true, include_usage, ids(no_tokens)));
          }
          state->started = true;
          std::deque<RequestUpdate> batch = updates->take(std::chrono::milliseconds(1000));
          for (const RequestUpdate& update : batch) {
            if (update.finish) {
              state->finished = true;
              if (*update.finish == FinishReason::kError || *update.finish == FinishReason::kCancelled) {
                const ApiError error = *update.finish == FinishReason::kError
                                           ? ApiError::internal(update.error)
                                           : ApiError::unavailable("the request was cancelled: the server is shutting down");
                out += sse_event(error.body());
              } else {
                out += sse_event(chunk_json(header, update.text, update.finish, false, include_usage, ids(update.token_ids)));
                if (include_usage) {
                  out += sse_event(usage_chunk_json(header, {update.prompt_tokens, update.completion_tokens}));
                }
              }
              out += sse_done();
            } else if (!update.text.empty() || (with_token_ids && !update.token_ids.empty())) {
              // With token ids every token is reported, even one whose text is held back for now.
              out += sse_event(chunk_json(header, update.text, std::nullopt, false, include_usage, ids(update.token_ids)));
            }
          }
          // Nothing new for a second (a queue, a long prefill): an SSE comment, which clients skip, so
          // that a client that left is noticed by the failed write.
          if (out.empty()) out = ": waiting\n\n";
          if (!sink.write(out.data(), out.size())) {
            scheduler.cancel(id);
            return false;
          }
          if (state->finished) sink.done();
          return true;
        },
        [&scheduler, id, state, in_flight](bool success) {
          if (!success || !state->finished) scheduler.cancel(id);
        });
  }

  // /tokenize's and /detokenize's body: a JSON object, naming this model if it names one. Otherwise the
  // error is sent and nothing returned.
  std::optional<json> object_body(const httplib::Request& http_request, httplib::Response& response) {
    json body = json::parse(http_request.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      send_error(response, ApiError::bad_field("", "the body must be a JSON object"));
      return std::nullopt;
    }
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) {
        send_error(response, ApiError::bad_field("model", "model: must be a string"));
        return std::nullopt;
      }
      if (auto error = check_model_name(body["model"].get<std::string>(), served_)) {
        send_error(response, *error);
        return std::nullopt;
      }
    }
    return body;
  }

  void tokenize(const httplib::Request& http_request, httplib::Response& response) {
    std::optional<json> parsed = object_body(http_request, response);
    if (!parsed) return;
    json& body = *parsed;
    const auto flag = [&](const char* key, bool fallback) -> std::optional<bool> {
      if (!body.contains(key) || body[key].is_null()) return fallback;
      if (!body[key].is_boolean()) return std::nullopt;
      return body[key].get<bool>();
    };
    const std::optional<bool> return_token_strs = flag("return_token_strs", false);
    if (!return_token_strs) return send_error(response, ApiError::bad_field("return_token_strs", "return_token_strs: must be true or false"));
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      // The chat form: the messages as /v1/chat/completions would prompt the model.
      CompletionRequest request;
      json chat_body = {{"messages", body["messages"]}};
      if (auto error = parse_completion_request(chat_body.dump(), true, request)) return send_error(response, *error);
      const std::optional<bool> generation_prompt = flag("add_generation_prompt", true);
      const std::optional<bool> special = flag("add_special_tokens", false);
      if (!generation_prompt || !special) {
        return send_error(response, ApiError::bad_field(!generation_prompt ? "add_generation_prompt" : "add_special_tokens",
                                                        "add_generation_prompt and add_special_tokens must be true or false"));
      }
      Expected<std::string> text = render_chat_prompt(scheduler_.load()->engine(), request.messages, *generation_prompt);
      if (!text) return send_error(response, ApiError::bad_field("messages", "messages: " + text.status().message()));
      ids = tokenizer_->encode(*text, *special);
    } else if (body.contains("prompt") && body["prompt"].is_string()) {
      const std::optional<bool> special = flag("add_special_tokens", true);
      if (!special) return send_error(response, ApiError::bad_field("add_special_tokens", "add_special_tokens: must be true or false"));
      ids = tokenizer_->encode(body["prompt"].get<std::string>(), *special);
    } else {
      return send_error(response, ApiError::bad_field("prompt", "prompt: is required (a string), or give messages"));
    }
    json out = {{"count", ids.size()}, {"max_model_len", served_.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
    if (*return_token_strs) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(tokenizer_->token_text(id).value_or(""));
      out["token_strs"] = strs;
    }
    response.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void detokenize(const httplib::Request& http_request, httplib::Response& response) {
    std::optional<json> parsed = object_body(http_request, response);
    if (!parsed) return;
    json& body = *parsed;
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return send_error(response, ApiError::bad_field("tokens", "tokens: is required, a list of token ids"));
    }
    std::vector<int32_t> ids;
    for (const json& id : body["tokens"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= served_.vocab_size) {
        return send_error(response, ApiError::bad_field("tokens", "tokens: " + id.dump() + " is not a token id in [0, " +
                                                                      std::to_string(served_.vocab_size) + ")"));
      }
      ids.push_back(id.get<int32_t>());
    }
    response.set_content(json{{"prompt", tokenizer_->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                         "application/json");
  }

  const ServerConfig& config_;
  const std::string model_dir_;
  const int64_t started_ = unix_seconds();
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  // Written once by set_ready before scheduler_ is published, read only after it.
  Disaggregation disaggregation_;
  ServedModel served_;
  MetricsLabels labels_;
  const Tokenizer* tokenizer_ = nullptr;
};

// host:port as other machines reach this one: the host listened on, or this machine's name when that is
// every interface.
std::string advertised_address(const std::string& host, int port) {
  std::string name = host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    char hostname[256] = {};
    name = gethostname(hostname, sizeof(hostname) - 1) == 0 ? hostname : "127.0.0.1";
  }
  if (name.find(':') != std::string::npos) name = "[" + name + "]";
  return name + ":" + std::to_string(port);
}

// How a decode worker imports its KV streams: staged, each layer placed as soon as it arrives (the
// import overlapped with the stream: engine/kv_staging.h), their blocks reserved and the transfer laid out
// from HELLO (when it announces its tokens), where the device can (the CPU; the GPU with dense, hack or
// quant KV); else whole once they arrived (options left as they are). The engine outlives the receiver.
void stage_kv_streams(const Engine& engine, KvStreamReceiverOptions& options) {
  if (!engine.stages_kv()) return;
  options.staging = [&engine](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation> reserved) {
    return engine.new_kv_staging(info, source, std::move(reserved));
  };
  options.reserve = [&engine](int64_t tokens, std::string_view source) { return engine.reserve_kv(tokens, source); };
  options.expected_head = [&engine](int64_t tokens) { return engine.kv_transfer_head(tokens); };
}

std::string default_model_name(const std::string& model_dir) {
  std::filesystem::path path(model_dir);
  if (path.filename().empty()) path = path.parent_path();  // "models/x/"
  return path.filename().string();
}

}  // namespace

Status run_server(const EngineConfig& engine_config, const SchedulerConfig& scheduler_config,
                  const ServerConfig& config) {
  const sigset_t stop_signals = block_stop_signals();  // before any thread starts

  const int max_running = scheduler_config.max_running > 0 ? scheduler_config.max_running : engine_config.max_sequences;
  const int http_threads = config.http_threads > 0 ? config.http_threads : std::max(128, 4 * max_running + 64);
  HttpApi api(config, engine_config.model_dir);
  httplib::Server http;
  http.new_task_queue = [http_threads] { return new httplib::ThreadPool(size_t(http_threads)); };
  http.set_payload_max_length(config.max_body_bytes);
  api.route(http);
  const int port = config.port == 0 ? http.bind_to_any_port(config.host) : (http.bind_to_port(config.host, config.port) ? config.port : -1);
  if (port < 0) return error("cannot listen on ", config.host, ":", config.port, " (in use, or not an address of this machine)");
  std::thread listener([&http] { http.listen_after_bind(); });
  std::fprintf(stderr, "slimkv serve: listening on http://%s:%d (loading %s)\n", config.host.c_str(), port,
               engine_config.model_dir.c_str());
  const auto stop_listening = [&] {
    http.stop();
    listener.join();
  };

  Expected<std::unique_ptr<Engine>> engine = Engine::load(engine_config);
  if (!engine) {
    stop_listening();
    return engine.status();
  }
  if (!(*engine)->tokenizer()) {
    stop_listening();
    return error(engine_config.model_dir, " has no tokenizer.json; slimkv serve needs one");
  }
  ServedModel served;
  served.name = config.served_model_name.empty() ? default_model_name(engine_config.model_dir) : config.served_model_name;
  served.max_model_len = (*engine)->context_tokens();
  if (config.max_model_len > served.max_model_len) {
    stop_listening();
    return error("--max-model-len ", config.max_model_len, " is larger than the model's context of ", served.max_model_len, " tokens");
  }
  if (config.max_model_len > 0) served.max_model_len = config.max_model_len;
  served.vocab_size = (*engine)->vocab_size();  // the ids the model has rows for
  served.defaults = (*engine)->generation_defaults();
  const MetricsLabels labels{.model_name = served.name, .kv_spec = (*engine)->kv_description(), .device = engine_config.device};
  // A prefill or decode worker: what its KV streams must agree on, and a decode worker's receiver.
  Disaggregation disaggregation;
  std::unique_ptr<KvStreamReceiver> receiver;
  if (config.role != "both") {
    Expected<KvStreamIdentity> identity = engine_kv_identity(**engine);
    if (!identity) {
      stop_listening();
      return identity.status();
    }
    disaggregation.identity = *identity;
    if (config.kv_transport == "auto" && (*engine)->exports_kv_to_device()) {
      disaggregation.gpu = (*engine)->device().gpu;
      disaggregation.cuda_ipc_device = cuda_ipc_device_id(disaggregation.gpu);
      const Status nccl = nccl_available();
      disaggregation.nccl = nccl.is_ok();
      if (!disaggregation.nccl) std::fprintf(stderr, "slimkv serve: KV between GPUs goes over TCP: %s\n", nccl.message().c_str());
      if (disaggregation.nccl && config.role == "prefill") disaggregation.nccl_links = std::make_shared<NcclLinks>();
    }
  }
  if (config.role == "decode") {
    const int kv_port = config.kv_port < 0 ? port + 1 : config.kv_port;
    KvStreamReceiverOptions options{.host = config.host, .port = kv_port,
                                    .max_unclaimed_bytes = config.kv_unclaimed_bytes,
                                    .max_tokens = (*engine)->context_tokens(),
                                    .cuda_ipc_device = disaggregation.cuda_ipc_device,
                                    .nccl = disaggregation.nccl,
                                    .gpu = disaggregation.gpu,
                                    .buffers = (*engine)->transfer_buffers()};
    stage_kv_streams(**engine, options);
    Expected<std::unique_ptr<KvStreamReceiver>> started = KvStreamReceiver::start(disaggregation.identity, options);
    if (!started) {
      stop_listening();
      return started.status().with_context("--kv-port");
    }
    receiver = started.take();
    disaggregation.receiver = receiver.get();
    disaggregation.kv_address = advertised_address(config.host, receiver->port());
    std::fprintf(stderr, "slimkv serve: KV stream listening on %s\n", disaggregation.kv_address.c_str());
  }
  Expected<std::unique_ptr<Scheduler>> scheduler = Scheduler::start(engine.take(), scheduler_config);
  if (!scheduler) {
    stop_listening();
    return scheduler.status();
  }
  if (!(*scheduler)->engine().has_chat_template()) {
    const Status chat = (*scheduler)->engine().apply_chat_template(nlohmann::ordered_json::array(), true).status();
    std::fprintf(stderr, "slimkv serve: chat requests will be refused: %s\n", chat.message().c_str());
  }
  api.set_ready(**scheduler, std::move(served), labels, std::move(disaggregation));
  std::fprintf(stderr, "slimkv serve: ready (KV %s on %s, role %s)\n", labels.kv_spec.c_str(), labels.device.c_str(),
               config.role.c_str());

  std::fprintf(stderr, "slimkv serve: %s: finishing the accepted requests, then exiting\n",
               wait_for_stop_signal(stop_signals));
  api.set_draining();
  (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
  api.wait_for_answers(std::chrono::seconds(30));
  if (receiver) receiver->stop();  // requests still waiting for a stream are answered: shutting down
  stop_listening();  // the streams have written their last chunk: their providers are done
  std::fprintf(stderr, "slimkv serve: stopped\n");
  return Status::ok();
}

}  // namespace slimkv
