// The scheduler: continuous batching of many generation requests on one Engine.
//
// A Scheduler owns an Engine and a thread that drives it by Engine::step. Requests are submitted from
// any thread with a callback for their updates (text deltas, token ids, the finish reason, usage
// counts); they join and leave the running batch at step boundaries. Each step holds at most
// EngineConfig::max_step_tokens() rows: the running requests first (a decode token each, or the next
// chunk of their prompt, cut where a prompt run alone is cut: at multiples of prefill_chunk_tokens), then
// waiting requests in arrival order while the step's rows and the KV budget last. When the KV budget runs out mid-decode the newest running request is preempted: its KV
// is exported to host memory (within SchedulerConfig::host_kv_bytes) or, when that is full, dropped
// and recomputed from its tokens later. Either way its output does not change (sampling is
// counter-based per position). Requests queue, never fail, for lack of KV.
//
//   auto scheduler = Scheduler::start(std::move(engine), {});
//   auto id = (*scheduler)->submit(request, [](const RequestUpdate& update) { ... });
//   (*scheduler)->cancel(*id);          // a client that left: its sequence is freed at the next step
//   (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
//
// Threads: submit, cancel, stats and shutdown are safe from any thread. Callbacks run on the
// scheduler's thread, in order per request, with no lock held: they must be quick (queue the update,
// never wait on a client) and may call cancel() but not shutdown().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slimkv/engine.h"
#include "slimkv/generation.h"
#include "slimkv/status.h"

namespace slimkv {

struct SchedulerConfig {
  int max_running = 0;  // requests running at once (0: EngineConfig::max_sequences; never more)
  // Host memory for the KV of preempted requests, all together; a request whose export does not fit is
  // recomputed instead.
  size_t host_kv_bytes = size_t(4) << 30;
};

using RequestId = uint64_t;

// How a request starts, beyond its GenerationRequest (disaggregated serving, docs/disaggregated.md).
struct SubmitOptions {
  // A request another worker began: the KV of its prompt and of every generated token but the last
  // (the transfer format, as Engine::export_kv writes it), and the tokens generated so far (at least
  // one). The scheduler imports the KV instead of running the prompt and goes on from the last token;
  // the updates report only tokens after those already generated, except the last one, which no update
  // has carried yet; completion_tokens counts them all.
  struct Resume {
    std::vector<uint8_t> kv;
    // kv's CRC32C before its trailer as the KV stream's receiver computed it while the bytes arrived
    // (ReceivedKv::received_crc): the import reads them once (Engine::import_kv); absent: checked there.
    std::optional<uint32_t> kv_crc = std::nullopt;
    std::vector<int32_t> generated;
    // Instead of kv: the KV in this GPU's memory (CUDA IPC, NCCL, or staged as it arrived on the GPU:
    // engine/kv_staging.h; Engine::import_kv_from_device).
    std::shared_ptr<const DeviceKvTransfer> device_kv = nullptr;
    // Instead of kv: the KV already restored into a store of this engine's (Engine::new_kv_store) as it
    // arrived, checked; the scheduler gives it to the request's sequence (Engine::adopt_kv).
    std::shared_ptr<KvStore> staged_kv = nullptr;
    // The blocks a staged import (staged_kv, or device_kv staged on the GPU) holds in the engine's KV
    // budget (ReceivedKv::kv_reservation): its admission counts them as its own, then lets them go.
    std::shared_ptr<KvReservation> kv_reservation = nullptr;
  };
  std::optional<Resume> resume;
  // Tokens run after the prompt one decode step each, as if the request had generated them, and not
  // reported: a prefill worker rebuilding the KV of a request resumed elsewhere leaves the KV (and then
  // samples the token) that decoding them left, bit for bit, where one prefill of them could differ.
  std::vector<int32_t> forced_tokens;
  // The request's KV as of its first sampled token, piece by piece while the step that samples it runs
  // (Engine::stream_kv_in_next_step: each layer as soon as it is final); a prefill worker sends them on.
  // Called on the scheduler's thread, before the update carrying that token: it must be quick.
  KvPieceCallback stream_kv;
  // How stream_kv's KV leaves (Engine::stream_kv_in_next_step's form).
  KvStreamForm stream_kv_form = KvStreamForm::kHostBytes;
};

// What a request produced since its last update.
struct RequestUpdate {
  std::string text;                    // newly visible text (stop strings held back and cut)
  std::vector<int32_t> token_ids;      // tokens generated since the last update
  std::optional<FinishReason> finish;  // set in the last update of the request
  std::string error;                   // why, when finish is kError
  int prompt_tokens = 0;
  int completion_tokens = 0;           // tokens generated so far
};
using UpdateCallback = std::function<void(const RequestUpdate&)>;

// A latency histogram in Prometheus's shape: counts per upper bound (cumulative when exported).
struct LatencyHistogram {
  std::vector<double> upper_bounds_s;  // ascending; an implicit +Inf bucket follows
  std::vector<uint64_t> counts;        // per bucket, upper_bounds_s.size() + 1 (not cumulative)
  double sum_s = 0.0;
  uint64_t count = 0;

  LatencyHistogram() : counts(1, 0) {}  // the +Inf bucket only
  explicit LatencyHistogram(std::vector<double> upper_bounds);
  void observe(double seconds);
};

struct SchedulerStats {
  int running = 0;  // requests holding a sequence in the engine
  int waiting = 0;  // queued, preempted ones included
  int preempted_in_host = 0;           // waiting with their KV in host memory
  size_t host_kv_bytes = 0;            // host memory their KV takes
  KvBudget kv;                         // the engine's budget after the last step
  uint64_t preemptions_total = 0;      // to host memory and to recompute together
  uint64_t preemptions_recomputed_total = 0;  // of which dropped and recomputed
  uint64_t prompt_tokens_total = 0;    // prompt tokens prefilled (a recomputed prompt counts once)
  uint64_t generation_tokens_total = 0;
  uint64_t steps_total = 0;
  uint64_t requests_finished_total[4] = {};  // per FinishReason: stop, length, cancelled, error
  LatencyHistogram time_to_first_token, inter_token_latency, e2e_request_latency;
  // Where a running server's time goes: each engine step's wall time, and the scheduler's own between one
  // step and the next (planning, admissions, updates to the clients; not time idle without requests).
  LatencyHistogram engine_step, between_steps;
  // Steps whose every sequence ran one token (decode steps), by their number of sequences: entry n holds
  // the steps of n sequences (seconds summed, count). The step time a batch costs, as the server ran it.
  struct StepTimes {
    double seconds = 0.0;
    uint64_t count = 0;
  };
  std::vector<StepTimes> decode_steps_by_sequences;
};

enum class ShutdownMode {
  kFinishAccepted,  // run every accepted request to its end, then stop
  kCancelAll,       // cancel everything at the next step boundary
};

class Scheduler {
 public:
  // Starts the thread on an engine of its own.
  static Expected<std::unique_ptr<Scheduler>> start(std::unique_ptr<Engine> engine, SchedulerConfig config = {});
  // Starts the thread on an engine the caller keeps (a library's batched generate() beside its open
  // sessions): the engine must outlive the scheduler, and nobody else may drive it meanwhile. Either way
  // the scheduler runs on what the engine has free at its start — sequences (max_sequences minus those
  // held) and KV blocks — and leaves the sequences already held as they are. Errors: none is free.
  static Expected<std::unique_ptr<Scheduler>> start(Engine& engine, SchedulerConfig config = {});
  ~Scheduler();  // shutdown(kCancelAll) unless already shut down

  // Checks the request (Generation::start: errors name the field), and that its prompt can ever fit the
  // KV budget (blocks for the prompt + 1), then queues it. `on_update` receives every update; its last
  // one has `finish`. Errors: the request's, a resume whose generated tokens already end the request,
  // or the scheduler is shutting down.
  Expected<RequestId> submit(GenerationRequest request, UpdateCallback on_update, SubmitOptions options = {});
  // Ends the request with kCancelled at the next step boundary and frees its sequence. Unknown or
  // finished ids are ignored (a client may leave after the end).
  void cancel(RequestId id);

  SchedulerStats stats() const;
  // The loaded engine, for what is safe from any thread (tokenizer, model_config, config, ...).
  const Engine& engine() const { return engine_; }

  // Stops accepting, then finishes or cancels what was accepted and joins the thread. Idempotent.
  void shutdown(ShutdownMode mode);

 private:
  struct Impl;  // the thread, the queues and the requests (src/engine/scheduler.cc)
  Scheduler(std::unique_ptr<Engine> owned_engine, Engine& engine);
  static Expected<std::unique_ptr<Scheduler>> launch(std::unique_ptr<Scheduler> scheduler, SchedulerConfig config);
  std::unique_ptr<Engine> owned_engine_;  // nullptr: the caller keeps it
  Engine& engine_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slimkv
