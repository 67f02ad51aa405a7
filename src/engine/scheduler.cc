// Continuous batching on one Engine: plan_step (the decision) and the Scheduler thread that carries it
// out (preemption, admission, the engine step, the generation rules, the callbacks).
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "kv/store.h"
#include "util/buffer_pool.h"
#include "util/system_memory.h"

namespace slimkv {

// ---------------------------------------------------------------------------------------------------
// plan_step
// ---------------------------------------------------------------------------------------------------

StepPlan plan_step(std::span<const PlannedRequest> running, std::span<const PlannedRequest> waiting,
                   const KvBudget& budget, int64_t step_tokens, int64_t chunk_tokens, int max_running) {
  StepPlan plan;
  const auto blocks = [&](int64_t tokens) { return budget.blocks_for_tokens(tokens); };
  // A request's next piece: its tokens up to the next multiple of chunk_tokens of its sequence.
  const auto piece = [&](const PlannedRequest& request) {
    return std::min(request.tokens_to_run, chunk_tokens - request.held_tokens % chunk_tokens);
  };
  int64_t free_blocks = budget.free_blocks;
  int64_t tokens_left = step_tokens;
  size_t live = running.size();  // running[0, live) are not preempted; preemption takes from the back

  // Running requests first, oldest first: each runs its next piece if the step has room for it.
  std::vector<int64_t> scheduled_tokens(running.size(), 0);
  for (size_t i = 0; i < live; ++i) {
    const PlannedRequest& request = running[i];
    const int64_t tokens = piece(request);
    if (tokens == 0 || tokens > tokens_left) continue;  // it waits for the next step, keeping its blocks
    const int64_t need = blocks(request.held_tokens + tokens) - blocks(request.held_tokens);
    // Not enough free blocks: preempt the newest request not served yet (vLLM's rule: the newest has
    // the least work to lose); when this request is itself the newest, it is the one to go.
    while (need > free_blocks && live - 1 > i) {
      --live;
      plan.preempt.push_back(live);
      free_blocks += blocks(running[live].held_tokens);
    }
    if (need > free_blocks) {
      if (i == 0) {
        plan.out_of_kv.push_back(i);  // alone and still no room: the KV budget is its context
      } else {
        plan.preempt.push_back(i);
      }
      live = i;
      break;
    }
    free_blocks -= need;
    tokens_left -= tokens;
    scheduled_tokens[i] = tokens;
    plan.items.push_back({.from_waiting = false, .index = i, .tokens = tokens});
  }
  // A preemption means the budget is short: admit nobody now (the preempted one goes first later).
  if (!plan.preempt.empty() || !plan.out_of_kv.empty()) return plan;

  // Blocks running prefills will still need for their prompt + 1: admissions must leave them free, or
  // a new request would preempt an older one as soon as that one's next chunk comes.
  int64_t reserved = 0;
  for (size_t i = 0; i < live; ++i) {
    const PlannedRequest& request = running[i];
    if (request.tokens_to_run <= 1) continue;  // decoding: grows a block at a time, preempting if need be
    const int64_t after_step = blocks(request.held_tokens + scheduled_tokens[i]);
    reserved += std::max<int64_t>(0, blocks(request.held_tokens + request.tokens_to_run) + 1 - after_step);
  }
  int64_t available = free_blocks - reserved - budget.reserved_blocks;
  int running_count = int(live);
  for (size_t j = 0; j < waiting.size(); ++j) {
    if (running_count >= max_running) break;
    const PlannedRequest& request = waiting[j];
    const int64_t tokens = piece(request);
    if (tokens > tokens_left) break;  // in order: it waits for a step with room for its piece
    const int64_t blocks_needed = blocks(request.held_tokens + request.tokens_to_run);
    if (running_count == 0 && blocks_needed > budget.total_blocks) {
      plan.waiting_out_of_kv.push_back(j);  // preempted at the budget's end: it could never run again
      continue;
    }
    // Admitted when its tokens' blocks + 1 fit (the first generated tokens have room).
    const int64_t want = blocks_needed + (running_count == 0 ? 0 : 1) - request.reserved_blocks;
    if (want > available) break;  // in order: a large request is not overtaken forever
    available -= want;
    tokens_left -= tokens;
    ++running_count;
    plan.items.push_back({.from_waiting = true, .index = j, .tokens = tokens});
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------------
// LatencyHistogram
// ---------------------------------------------------------------------------------------------------

LatencyHistogram::LatencyHistogram(std::vector<double> upper_bounds)
    : upper_bounds_s(std::move(upper_bounds)), counts(upper_bounds_s.size() + 1, 0) {}

void LatencyHistogram::observe(double seconds) {
  const size_t bucket =
      size_t(std::lower_bound(upper_bounds_s.begin(), upper_bounds_s.end(), seconds) - upper_bounds_s.begin());
  ++counts[bucket];
  sum_s += seconds;
  ++count;
}

namespace {

// Bucket bounds spanning a fast GPU token (ms) to a long CPU request (minutes).
LatencyHistogram first_token_histogram() {
  return LatencyHistogram({0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120, 300});
}
LatencyHistogram inter_token_histogram() {
  return LatencyHistogram({0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10});
}
LatencyHistogram request_histogram() {
  return LatencyHistogram({0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800});
}
// From a GPU step's milliseconds to a CPU prefill's seconds; the scheduler's own work between steps.
LatencyHistogram step_histogram() {
  return LatencyHistogram({0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10});
}
LatencyHistogram between_steps_histogram() {
  return LatencyHistogram({0.00001, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05});
}

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The scheduler's thread
// ---------------------------------------------------------------------------------------------------

struct Scheduler::Impl {
  // One request's state, owned by the scheduler's thread once it has left the inbox.
  struct Request {
    RequestId id = 0;
    Generation generation;
    UpdateCallback on_update;
    SequenceId sequence = -1;          // the engine's sequence while running, else -1
    int64_t held_tokens = 0;           // tokens its KV holds (in the engine, or in host_kv)
    std::vector<int32_t> tokens_to_run;  // the rest of the prompt, or the last sampled token
    std::vector<uint8_t> host_kv;      // its exported KV while preempted to host memory (or imported)
    std::optional<uint32_t> host_kv_crc;  // an imported host_kv's CRC as its receiver computed it
    std::shared_ptr<const DeviceKvTransfer> device_kv;  // its imported KV in GPU memory (CUDA IPC, NCCL, staged)
    std::shared_ptr<KvStore> staged_kv;  // its imported KV, restored as it arrived (SubmitOptions::Resume)
    std::shared_ptr<KvReservation> kv_reservation;  // the budget's blocks held for it until admitted
    Clock::time_point submitted, last_token;
    bool has_token = false;
    KvPieceCallback stream_kv;  // SubmitOptions::stream_kv, until the first token
    KvStreamForm stream_kv_form = KvStreamForm::kHostBytes;
    std::vector<int32_t> forced;  // SubmitOptions::forced_tokens...
    size_t forced_used = 0;       // ...of which run so far
    std::optional<Generation::Delta> resumed;  // a resumed request's delta for its last token, not sent yet
    // Host memory its KV takes while it waits (host_bytes counts it): a preempted or imported transfer,
    // or a store restored as it arrived.
    size_t host_kv_bytes() const { return host_kv.size() + (staged_kv ? staged_kv->memory().fast_bytes() : 0); }
    bool done = false;  // its last update was sent

    Request(RequestId id_, Generation generation_, UpdateCallback on_update_)
        : id(id_), generation(std::move(generation_)), on_update(std::move(on_update_)) {}
    PlannedRequest planned() const {
      return {.held_tokens = held_tokens, .tokens_to_run = int64_t(tokens_to_run.size()),
              .reserved_blocks = kv_reservation ? kv_reservation->blocks() : 0};
    }
  };
  using RequestPtr = std::unique_ptr<Request>;

  Impl(Engine& engine_, SchedulerConfig config_) : engine(engine_), config(config_) {
    const int free_sequences = engine.config().max_sequences - engine.num_sequences();
    max_running = config.max_running > 0 ? std::min(config.max_running, free_sequences) : free_sequences;
    step_tokens = engine.config().max_step_tokens();
    budget_at_start = engine.kv_budget();
    // The blocks of sequences held before the start are not the scheduler's: to its plans the whole
    // budget is what was free then (what the engine reports as free stays exact).
    budget_at_start.total_blocks = budget_at_start.free_blocks;
    local.kv = budget_at_start;
    local.time_to_first_token = first_token_histogram();
    local.inter_token_latency = inter_token_histogram();
    local.e2e_request_latency = request_histogram();
    local.engine_step = step_histogram();
    local.between_steps = between_steps_histogram();
    shared = local;
  }

  Engine& engine;
  const SchedulerConfig config;
  int max_running = 1;
  int64_t step_tokens = 1;
  KvBudget budget_at_start;  // total_blocks (the scheduler's) and block_tokens never change: submit() checks against them

  // Shared with submitting threads, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::vector<RequestPtr> inbox;
  std::vector<RequestId> cancels;
  bool accepting = true;
  std::optional<ShutdownMode> stopping;
  RequestId next_id = 1;
  SchedulerStats shared;

  // The scheduler thread's own.
  std::vector<RequestPtr> running;  // arrival order
  std::deque<RequestPtr> waiting;   // arrival order, preempted ones put back at the front
  size_t host_bytes = 0;
  SchedulerStats local;
  std::optional<Clock::time_point> last_step_end;  // of the step before, unless the scheduler went idle since
  std::thread thread;

  void run();
  void step_once();
  // Counts a step of `items` that ran from start to end into the stats (SchedulerStats::engine_step...).
  void observe_step(const std::vector<StepItem>& items, Clock::time_point start, Clock::time_point end);
  void take_cancels(const std::vector<RequestId>& ids);
  void preempt(Request& request);
  Status admit(Request& request);
  // Sends the request's last update, frees what it holds; the caller drops it.
  void finish(Request& request, Generation::Delta delta, std::vector<int32_t> tokens = {}, std::string error = {});
  // Ends a request before the generation rules did (cancelled, out of KV, an error).
  // A resumed request's token from the other worker (a prefill worker's first token), held until the
  // request runs or ends: a wait for room here is then its time to first token, as on a colocated
  // server, not a gap inside its stream (which TPOT would count).
  void send_resumed(Request& request) {
    if (request.resumed) send(request, *std::exchange(request.resumed, std::nullopt), {request.tokens_to_run.front()});
  }
  void end_early(Request& request, FinishReason reason, std::string error = {}) {
    send_resumed(request);  // ended before it ran: that token is still the response's
    Generation::Delta delta = request.generation.finish(reason);
    delta.finish = reason;
    finish(request, std::move(delta), {}, std::move(error));
  }
  void send(Request& request, Generation::Delta delta, std::vector<int32_t> tokens, std::string error = {});
  void publish();
};

void Scheduler::Impl::run() {
  // After a second without work the heap's free pages go back to the OS (return_free_heap_to_os: the
  // KV of the busiest moment otherwise stays resident); waiting that long first keeps a client that
  // sends one request after another from paying the page faults again each time.
  constexpr auto kIdleBeforeTrim = std::chrono::seconds(1);
  bool heap_trimmed = true;
  for (;;) {
    if (running.empty() && waiting.empty()) last_step_end.reset();  // idle: waiting for work is not the scheduler's time
    std::vector<RequestPtr> arrived;
    std::vector<RequestId> cancelled;
    std::optional<ShutdownMode> stop;
    {
      std::unique_lock lock(mutex);
      const auto has_work = [&] {
        return !inbox.empty() || !cancels.empty() || stopping || !running.empty() || !waiting.empty();
      };
      if (!heap_trimmed && !wake.wait_for(lock, kIdleBeforeTrim, has_work)) {
        lock.unlock();
        return_free_heap_to_os();
        heap_trimmed = true;
        lock.lock();
      }
      // Idle: KV transfer buffers unused for a while are freed too (BufferPool::release_idle).
      while (!wake.wait_for(lock, std::chrono::seconds(10), has_work)) {
        lock.unlock();
        engine.transfer_buffers()->release_idle();
        lock.lock();
      }
      arrived.swap(inbox);
      cancelled.swap(cancels);
      stop = stopping;
    }
    for (RequestPtr& request : arrived) {
      host_bytes += request->host_kv_bytes();  // an imported KV waits in host memory like a preempted one
      if (request->resumed && request->resumed->finish) {
        // Resumed with its last token (the other worker's): it ends here, that token its news.
        Generation::Delta delta = *std::exchange(request->resumed, std::nullopt);
        finish(*request, std::move(delta), {request->tokens_to_run.front()});
        continue;
      }
      waiting.push_back(std::move(request));
    }
    if (stop == ShutdownMode::kCancelAll) {
      for (const RequestPtr& request : running) cancelled.push_back(request->id);
      for (const RequestPtr& request : waiting) cancelled.push_back(request->id);
    }
    take_cancels(cancelled);
    if (running.empty() && waiting.empty()) {
      publish();
      if (stop) return;
      continue;
    }
    step_once();
    heap_trimmed = false;
    publish();
  }
}

void Scheduler::Impl::take_cancels(const std::vector<RequestId>& ids) {
  for (RequestId id : ids) {
    const auto matches = [id](const RequestPtr& request) { return request->id == id; };
    if (auto it = std::find_if(running.begin(), running.end(), matches); it != running.end()) {
      end_early(**it, FinishReason::kCancelled);
      running.erase(it);
    } else if (auto wit = std::find_if(waiting.begin(), waiting.end(), matches); wit != waiting.end()) {
      end_early(**wit, FinishReason::kCancelled);
      waiting.erase(wit);
    }
  }
}

void Scheduler::Impl::step_once() {
  std::vector<PlannedRequest> running_view, waiting_view;
  for (const RequestPtr& request : running) running_view.push_back(request->planned());
  for (const RequestPtr& request : waiting) waiting_view.push_back(request->planned());
  KvBudget budget = engine.kv_budget();
  budget.total_blocks = budget_at_start.total_blocks;
  const StepPlan plan = plan_step(running_view, waiting_view, budget, step_tokens,
                                  engine.config().prefill_chunk_tokens, max_running);

  // Resolve the plan's indices to requests before anything moves.
  struct Scheduled {
    Request* request;
    int64_t tokens;
  };
  std::vector<Scheduled> scheduled;
  for (const StepPlan::Item& item : plan.items) {
    Request* request = item.from_waiting ? waiting[item.index].get() : running[item.index].get();
    scheduled.push_back({request, item.tokens});
  }
  // Preempt, newest first, so the oldest preempted request ends up at the front of waiting.
  for (size_t index : plan.preempt) {
    preempt(*running[index]);
    waiting.push_front(std::move(running[index]));
  }
  for (size_t index : plan.out_of_kv) {
    // It holds the whole budget and needs more: the KV budget ends it as a full context would.
    end_early(*running[index], FinishReason::kLength);
    running[index].reset();
  }
  std::erase_if(running, [](const RequestPtr& request) { return request == nullptr; });
  for (size_t index : plan.waiting_out_of_kv) end_early(*waiting[index], FinishReason::kLength);
  std::erase_if(waiting, [](const RequestPtr& request) { return request->done; });

  // Admit, in order. One that fails to be admitted is kept alive to the end of the step: `scheduled`
  // still points to it.
  std::vector<RequestPtr> not_admitted;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (!plan.items[i].from_waiting) continue;
    const auto it = std::find_if(waiting.begin(), waiting.end(),
                                 [&](const RequestPtr& request) { return request.get() == scheduled[i].request; });
    RequestPtr request = std::move(*it);
    waiting.erase(it);
    if (Status status = admit(*request); !status.is_ok()) {
      end_early(*request, FinishReason::kError, status.message());
      not_admitted.push_back(std::move(request));
      continue;  // its item is dropped below
    }
    if (request->resumed) {
      send_resumed(*request);
      request->last_token = Clock::now();
    }
    running.push_back(std::move(request));
  }
  // A streamed request's KV goes out as its layers finish: the blocks sealed by every earlier step, then,
  // in the step that samples its first token (its prompt and forced tokens all run), the rest.
  for (const Scheduled& s : scheduled) {
    Request& request = *s.request;
    if (request.done || !request.stream_kv) continue;
    const bool samples = s.tokens == int64_t(request.tokens_to_run.size());
    const bool last = samples && request.forced_used >= request.forced.size();
    if (Status streaming = last ? engine.stream_kv_in_next_step(request.sequence, std::exchange(request.stream_kv, nullptr),
                                                                request.stream_kv_form)
                                : engine.stream_sealed_kv(request.sequence, request.stream_kv, request.stream_kv_form);
        !streaming.is_ok()) {
      end_early(request, FinishReason::kError, "streaming the KV: " + streaming.message());
    }
  }
  std::erase_if(running, [](const RequestPtr& request) { return request->done; });
  std::erase_if(scheduled, [](const Scheduled& s) { return s.request->done; });
  if (scheduled.empty()) return;

  // The step: each request's next chunk; the last chunk of what it has to run samples its next token.
  std::vector<StepItem> items;
  for (const Scheduled& s : scheduled) {
    const bool last = s.tokens == int64_t(s.request->tokens_to_run.size());
    items.push_back({.sequence = s.request->sequence,
                     .tokens = std::span<const int32_t>(s.request->tokens_to_run).first(size_t(s.tokens)),
                     .output = last ? StepOutput::kSample : StepOutput::kNone});
  }
  StepResult result;
  const Clock::time_point step_start = Clock::now();
  const Status status = engine.step(items, result);
  const Clock::time_point now = Clock::now();
  ++local.steps_total;
  observe_step(items, step_start, now);
  if (!status.is_ok()) {
    // A refused step names its item but changes nothing; the requests in it cannot go on reliably.
    for (const Scheduled& s : scheduled) {
      end_early(*s.request, FinishReason::kError, "engine step: " + status.message());
    }
    std::erase_if(running, [](const RequestPtr& request) { return request->done; });
    return;
  }

  for (size_t i = 0; i < scheduled.size(); ++i) {
    Request& request = *scheduled[i].request;
    request.tokens_to_run.erase(request.tokens_to_run.begin(), request.tokens_to_run.begin() + scheduled[i].tokens);
    request.held_tokens += scheduled[i].tokens;
    if (items[i].output != StepOutput::kSample) continue;
    if (request.forced_used < request.forced.size()) {
      // A forced token replaces the sample and runs next, as a generated one would.
      request.tokens_to_run.assign(1, request.forced[request.forced_used++]);
      continue;
    }
    const int32_t token = result.tokens[i];
    if (!request.has_token) {
      local.prompt_tokens_total += request.generation.request().prompt.size();
      local.time_to_first_token.observe(seconds_between(request.submitted, now));
    } else {
      local.inter_token_latency.observe(seconds_between(request.last_token, now));
    }
    request.has_token = true;
    request.last_token = now;
    ++local.generation_tokens_total;
    Generation::Delta delta = request.generation.accept(token);
    if (delta.finish) {
      finish(request, std::move(delta), {token});
    } else {
      request.tokens_to_run.assign(1, token);
      send(request, std::move(delta), {token});
    }
  }
  std::erase_if(running, [](const RequestPtr& request) { return request->done; });
}

void Scheduler::Impl::observe_step(const std::vector<StepItem>& items, Clock::time_point start, Clock::time_point end) {
  if (last_step_end) local.between_steps.observe(seconds_between(*last_step_end, start));
  last_step_end = end;
  const double seconds = seconds_between(start, end);
  local.engine_step.observe(seconds);
  const bool decode = std::all_of(items.begin(), items.end(), [](const StepItem& item) { return item.tokens.size() == 1; });
  if (!decode) return;
  auto& by_sequences = local.decode_steps_by_sequences;
  if (by_sequences.size() <= items.size()) by_sequences.resize(items.size() + 1);
  by_sequences[items.size()].seconds += seconds;
  ++by_sequences[items.size()].count;
}

void Scheduler::Impl::preempt(Request& request) {
  ++local.preemptions_total;
  // To host memory when it fits the limit; else drop the KV and recompute it from the tokens later.
  Expected<std::vector<uint8_t>> exported = engine.export_kv(request.sequence);
  if (exported && host_bytes + exported->size() <= config.host_kv_bytes) {
    request.host_kv = exported.take();
    host_bytes += request.host_kv.size();
  } else {
    ++local.preemptions_recomputed_total;
    request.held_tokens = 0;
    request.forced_used = 0;  // before any generated token: the forced ones run again after the prompt
    request.tokens_to_run = request.generation.tokens_to_resume();
    if (!request.generation.generated().empty()) request.tokens_to_run.push_back(request.generation.generated().back());
  }
  (void)engine.remove_sequence(request.sequence);
  request.sequence = -1;
}

Status Scheduler::Impl::admit(Request& request) {
  SLIMKV_ASSIGN_OR_RETURN(request.sequence, engine.add_sequence(request.generation.request().sampling));
  request.kv_reservation = nullptr;  // admitted: its KV takes the blocks from here on (or is refused)
  if (request.device_kv) {
    const std::shared_ptr<const DeviceKvTransfer> device_kv = std::move(request.device_kv);
    return engine.import_kv_from_device(request.sequence, *device_kv, str_cat("request ", request.id, "'s KV in GPU memory"));
  }
  host_bytes -= request.host_kv_bytes();  // in the engine's budget from here on (or dropped, refused)
  if (request.staged_kv) {
    return engine.adopt_kv(request.sequence, std::exchange(request.staged_kv, nullptr),
                           str_cat("request ", request.id, "'s KV restored as it arrived"));
  }
  if (request.host_kv.empty()) return Status::ok();
  const Status imported = engine.import_kv(request.sequence, request.host_kv, str_cat("preempted request ", request.id),
                                           std::exchange(request.host_kv_crc, std::nullopt));
  engine.transfer_buffers()->give_back(std::exchange(request.host_kv, {}));  // for the next transfer received
  return imported;
}

void Scheduler::Impl::send(Request& request, Generation::Delta delta, std::vector<int32_t> tokens, std::string error) {
  RequestUpdate update;
  update.text = std::move(delta.text);
  update.token_ids = std::move(tokens);
  update.finish = delta.finish;
  update.error = std::move(error);
  update.prompt_tokens = int(request.generation.request().prompt.size());
  update.completion_tokens = int(request.generation.generated().size());
  if (request.on_update) request.on_update(update);
}

void Scheduler::Impl::finish(Request& request, Generation::Delta delta, std::vector<int32_t> tokens, std::string error) {
  const FinishReason reason = delta.finish.value_or(FinishReason::kError);
  delta.finish = reason;
  send(request, std::move(delta), std::move(tokens), std::move(error));
  if (request.sequence >= 0) (void)engine.remove_sequence(request.sequence);
  request.sequence = -1;
  host_bytes -= request.host_kv_bytes();
  request.host_kv = {};
  request.host_kv_crc = std::nullopt;
  request.device_kv = nullptr;
  request.staged_kv = nullptr;
  request.kv_reservation = nullptr;
  request.done = true;
  ++local.requests_finished_total[size_t(reason)];
  local.e2e_request_latency.observe(seconds_between(request.submitted, Clock::now()));
}

void Scheduler::Impl::publish() {
  local.running = int(running.size());
  local.waiting = int(waiting.size());
  local.preempted_in_host = int(std::count_if(waiting.begin(), waiting.end(),
                                              [](const RequestPtr& request) { return !request->host_kv.empty(); }));
  local.host_kv_bytes = host_bytes;
  local.kv = engine.kv_budget();
  std::lock_guard lock(mutex);
  shared = local;
}

// ---------------------------------------------------------------------------------------------------
// Scheduler
// ---------------------------------------------------------------------------------------------------

Scheduler::Scheduler(std::unique_ptr<Engine> owned_engine, Engine& engine)
    : owned_engine_(std::move(owned_engine)), engine_(engine) {}

Expected<std::unique_ptr<Scheduler>> Scheduler::start(std::unique_ptr<Engine> engine, SchedulerConfig config) {
  if (!engine) return error("Scheduler::start: no engine");
  Engine& kept = *engine;
  return launch(std::unique_ptr<Scheduler>(new Scheduler(std::move(engine), kept)), config);
}

Expected<std::unique_ptr<Scheduler>> Scheduler::start(Engine& engine, SchedulerConfig config) {
  return launch(std::unique_ptr<Scheduler>(new Scheduler(nullptr, engine)), config);
}

Expected<std::unique_ptr<Scheduler>> Scheduler::launch(std::unique_ptr<Scheduler> scheduler, SchedulerConfig config) {
  const Engine& engine = scheduler->engine_;
  if (engine.num_sequences() >= engine.config().max_sequences) {
    return error("Scheduler::start: the engine holds all of its max_sequences (", engine.config().max_sequences,
                 ") sequences: none is free to run requests on (close a session, or load it with more)");
  }
  if (engine.kv_budget().free_blocks == 0) {
    return error("Scheduler::start: the sequences the engine holds take all of its ", engine.kv_budget().total_blocks,
                 " KV blocks: none is free to run requests on");
  }
  scheduler->impl_ = std::make_unique<Impl>(scheduler->engine_, config);
  Impl* impl = scheduler->impl_.get();
  impl->thread = std::thread([impl] { impl->run(); });
  return scheduler;
}

Scheduler::~Scheduler() { shutdown(ShutdownMode::kCancelAll); }

Expected<RequestId> Scheduler::submit(GenerationRequest request, UpdateCallback on_update, SubmitOptions options) {
  const int64_t prompt_tokens = int64_t(request.prompt.size());
  SLIMKV_ASSIGN_OR_RETURN(Generation generation, Generation::start(engine_, std::move(request)));
  // A resumed request: its generation state as it was where it began, the last token's delta kept.
  std::optional<Generation::Delta> resumed;
  if (options.resume) {
    const std::vector<int32_t>& generated = options.resume->generated;
    if (generated.empty()) return error("resume: no generated token to go on from");
    for (size_t i = 0; i < generated.size(); ++i) {
      if (generation.finished()) {
        return error("resume: the request already ended at generated token ", i - 1, " of ", generated.size());
      }
      if (generated[i] < 0 || generated[i] >= engine_.vocab_size()) {
        return error("resume: generated token ", i, " is ", generated[i], ", not an id of the vocabulary [0, ",
                     engine_.vocab_size(), ")");
      }
      resumed = generation.accept(generated[i]);
    }
  }
  const int64_t held_tokens = prompt_tokens + (options.resume ? int64_t(options.resume->generated.size()) - 1 : 0) +
                              int64_t(options.forced_tokens.size());
  if (!options.forced_tokens.empty() && held_tokens + 1 > engine_.context_tokens()) {
    return error("prompt: ", prompt_tokens, " tokens and ", options.forced_tokens.size(), " resumed ones leave no room in the ",
                 engine_.context_tokens(), "-token context");
  }
  for (size_t i = 0; i < options.forced_tokens.size(); ++i) {
    if (options.forced_tokens[i] < 0 || options.forced_tokens[i] >= engine_.vocab_size()) {
      return error("forced token ", i, " is ", options.forced_tokens[i], ", not an id of the vocabulary");
    }
  }
  const KvBudget& budget = impl_->budget_at_start;
  const int64_t need = budget.blocks_for_tokens(held_tokens) + 1;
  if (need > budget.total_blocks) {
    return error("prompt: ", held_tokens, " tokens need ", need, " KV blocks of ", budget.block_tokens,
                 " tokens (the prompt's and one more), but the whole KV cache holds ", budget.total_blocks,
                 ": shorten the prompt or give the KV cache more memory (kv_cache_bytes)");
  }
  std::lock_guard lock(impl_->mutex);
  if (!impl_->accepting) return error("the scheduler is shutting down and accepts no new requests");
  const RequestId id = impl_->next_id++;
  auto queued = std::make_unique<Impl::Request>(id, std::move(generation), std::move(on_update));
  queued->tokens_to_run = queued->generation.request().prompt;
  queued->submitted = Clock::now();
  queued->stream_kv = std::move(options.stream_kv);
  queued->stream_kv_form = options.stream_kv_form;
  queued->forced = std::move(options.forced_tokens);
  if (options.resume) {
    queued->host_kv = std::move(options.resume->kv);
    queued->host_kv_crc = options.resume->kv_crc;
    queued->device_kv = std::move(options.resume->device_kv);
    queued->staged_kv = std::move(options.resume->staged_kv);
    queued->kv_reservation = std::move(options.resume->kv_reservation);
    queued->held_tokens = held_tokens;
    queued->tokens_to_run.assign(1, options.resume->generated.back());
    queued->resumed = std::move(resumed);
    queued->has_token = true;  // its first token came from the other worker: no time to first token here
    queued->last_token = queued->submitted;
  }
  impl_->inbox.push_back(std::move(queued));
  impl_->wake.notify_one();
  return id;
}

void Scheduler::cancel(RequestId id) {
  std::lock_guard lock(impl_->mutex);
  impl_->cancels.push_back(id);
  impl_->wake.notify_one();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(impl_->mutex);
  SchedulerStats stats = impl_->shared;
  stats.waiting += int(impl_->inbox.size());  // submitted, not yet seen by the thread
  return stats;
}

void Scheduler::shutdown(ShutdownMode mode) {
  if (!impl_) return;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->accepting = false;
    if (!impl_->stopping || mode == ShutdownMode::kCancelAll) impl_->stopping = mode;
    impl_->wake.notify_one();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace slimkv
