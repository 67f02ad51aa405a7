// The scheduler's one decision per step, as a pure function of what the requests hold and need: which
// requests run, how many tokens each, which waiting requests are admitted and which running ones are
// preempted. Scheduler (include/slimkv/scheduler.h) carries the plan out; tests assert on it directly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "slimkv/engine.h"
#include "slimkv/scheduler.h"

namespace slimkv {

// What the planner sees of one request.
struct PlannedRequest {
  int64_t held_tokens = 0;  // tokens its KV holds (in the engine, or in host memory when swapped out)
  int64_t tokens_to_run = 0;  // tokens it must run next: the rest of its prompt, or its last sampled token
  // Blocks held for it in the budget (KvBudget::reserved_blocks): its KV, staged as it arrived.
  int64_t reserved_blocks = 0;
};

struct StepPlan {
  struct Item {
    bool from_waiting = false;  // index into waiting (admitted now) or running
    size_t index = 0;
    int64_t tokens = 0;         // the first `tokens` of its tokens_to_run
  };
  std::vector<size_t> preempt;  // indices into running, newest first, to preempt before the step
  std::vector<Item> items;      // what the step runs: running ones in order, then admitted ones
  // Requests that cannot grow even alone (they would need more than the whole budget): they end with
  // kLength, as at a full context. Indices into running, and into waiting (a preempted one).
  std::vector<size_t> out_of_kv;
  std::vector<size_t> waiting_out_of_kv;
};

// Plans one step. `running` and `waiting` are in arrival order (the oldest first; preempted requests
// go back to the front of waiting). Each chosen request runs its next piece: its decode token, or its
// prompt up to the next multiple of `chunk_tokens` of its sequence — a prompt is cut where the engine cuts
// a prompt run alone (Engine::generate), never where the step's tokens happen to end, because with a
// quantizing codec a chunk reads the chunks before it through their codes and its own tokens exactly, so
// a cut elsewhere would change its output with what else runs. A piece that does not fit the step's
// `step_tokens` waits for a later step (a step of max_running - 1 decodes and one whole chunk always fits
// in chunk_tokens + max_running: the oldest prefill never starves). Running requests are served first;
// when one needs a block that is not free, the newest running request not yet served this step is
// preempted (or the request itself, when it is the newest). Waiting requests are then admitted in order
// (no overtaking, so none starves) while fewer than `max_running` run, their piece fits and the blocks
// for their tokens + 1 fit beside what running prefills will still need and the blocks reserved for KV
// transfers on their way (budget.reserved_blocks; a waiting request's own reserved_blocks are among
// them and count for it) — when nothing runs, the "+ 1" is not asked: nobody else could need that block.
StepPlan plan_step(std::span<const PlannedRequest> running, std::span<const PlannedRequest> waiting,
                   const KvBudget& budget, int64_t step_tokens, int64_t chunk_tokens, int max_running);

}  // namespace slimkv
