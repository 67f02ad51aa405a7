// The scheduler: plan_step's decisions on plain numbers, then the Scheduler on the bundled model (CPU),
// whose outputs must equal the same requests run one at a time, whatever batching and preemption did.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine/scheduler.h"
#include "kv/transfer.h"
#include "slimkv/generation.h"
#include "slimkv/scheduler.h"
#include "slimkv/tokenizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

// ---------------------------------------------------------------------------------------------------
// plan_step
// ---------------------------------------------------------------------------------------------------

KvBudget budget_of(int64_t total_blocks, int64_t free_blocks, int block_tokens = 16) {
  KvBudget budget;
  budget.block_tokens = block_tokens;
  budget.total_blocks = total_blocks;
  budget.free_blocks = free_blocks;
  return budget;
}

TEST(PlanStep, RunningDecodesFirstThenAWaitingPromptRunsItsFirstChunk) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 20, .tokens_to_run = 1},
                                               {.held_tokens = 40, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 100},
                                               {.held_tokens = 0, .tokens_to_run = 5}};
  const StepPlan plan = plan_step(running, waiting, budget_of(100, 90), 66, 64, 8);
  ASSERT_EQ(plan.items.size(), 3u);  // the second waiting request finds no tokens left
  EXPECT_FALSE(plan.items[0].from_waiting);
  EXPECT_EQ(plan.items[0].tokens, 1);
  EXPECT_EQ(plan.items[1].tokens, 1);
  EXPECT_TRUE(plan.items[2].from_waiting);
  EXPECT_EQ(plan.items[2].index, 0u);
  EXPECT_EQ(plan.items[2].tokens, 64);
  EXPECT_TRUE(plan.preempt.empty());
}

TEST(PlanStep, APrefillGoesOnInChunksBesideDecodesAndAStepNeverExceedsItsTokens) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 10, .tokens_to_run = 1},
                                               {.held_tokens = 64, .tokens_to_run = 138},
                                               {.held_tokens = 12, .tokens_to_run = 1}};
  const StepPlan plan = plan_step(running, {}, budget_of(100, 90), 33, 32, 8);
  // The oldest decodes, the prefill takes its next chunk (tokens 64..95), the newest waits for the next step.
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[0].tokens, 1);
  EXPECT_EQ(plan.items[1].index, 1u);
  EXPECT_EQ(plan.items[1].tokens, 32);
  EXPECT_TRUE(plan.preempt.empty());
}

TEST(PlanStep, APromptIsCutOnlyAtMultiplesOfTheChunk) {
  // Prefilled up to 62 (a chunk of 32 and 30 tokens of the next, e.g. a resumed prompt): the piece ends at 64.
  const std::vector<PlannedRequest> mid_chunk = {{.held_tokens = 62, .tokens_to_run = 138}};
  const StepPlan aligned = plan_step(mid_chunk, {}, budget_of(100, 90), 64, 32, 8);
  ASSERT_EQ(aligned.items.size(), 1u);
  EXPECT_EQ(aligned.items[0].tokens, 2);
  // A chunk that does not fit beside the decodes waits whole rather than being cut where the step
  // ends (its output would then depend on what else runs); the decodes after it still run.
  const std::vector<PlannedRequest> running = {{.held_tokens = 10, .tokens_to_run = 1},
                                               {.held_tokens = 0, .tokens_to_run = 100},
                                               {.held_tokens = 12, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 40}};
  const StepPlan plan = plan_step(running, waiting, budget_of(100, 90), 32, 32, 8);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[0].index, 0u);
  EXPECT_EQ(plan.items[1].index, 2u);
  EXPECT_FALSE(plan.items[1].from_waiting);
}

TEST(PlanStep, NoFreeBlockPreemptsTheNewestRunningRequest) {
  // Each decoding request is at a block boundary: its next token needs a new block; none is free.
  const std::vector<PlannedRequest> running = {{.held_tokens = 32, .tokens_to_run = 1},
                                               {.held_tokens = 16, .tokens_to_run = 1},
                                               {.held_tokens = 48, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 4}};
  const StepPlan plan = plan_step(running, waiting, budget_of(6, 0), 64, 64, 8);
  // The oldest takes one of the newest's three blocks, the middle one another.
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], 2u);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[0].index, 0u);
  EXPECT_EQ(plan.items[1].index, 1u);
  EXPECT_TRUE(plan.out_of_kv.empty());
}

TEST(PlanStep, TheNewestPreemptsItselfWhenTheOlderOnesTookTheBlocks) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 32, .tokens_to_run = 1},
                                               {.held_tokens = 16, .tokens_to_run = 1}};
  const StepPlan plan = plan_step(running, {}, budget_of(4, 1), 64, 64, 8);
  // The oldest takes the one free block; the newest needs one too and has nobody newer to preempt.
  ASSERT_EQ(plan.preempt.size(), 1u);
  EXPECT_EQ(plan.preempt[0], 1u);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].index, 0u);
  EXPECT_TRUE(plan.out_of_kv.empty());
}

TEST(PlanStep, ALoneRequestThatHoldsTheWholeBudgetRunsOutOfKv) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 64, .tokens_to_run = 1}};
  const StepPlan plan = plan_step(running, {}, budget_of(4, 0), 64, 64, 8);
  EXPECT_TRUE(plan.items.empty());
  ASSERT_EQ(plan.out_of_kv.size(), 1u);
  EXPECT_EQ(plan.out_of_kv[0], 0u);
}

TEST(PlanStep, AdmissionNeedsThePromptsBlocksPlusOneAndKeepsArrivalOrder) {
  // Beside a running request, 4 free blocks of 16: the head (64 tokens: 4 + 1 blocks) does not fit,
  // and the small one behind it does not overtake it.
  const std::vector<PlannedRequest> running = {{.held_tokens = 5, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 64},
                                               {.held_tokens = 0, .tokens_to_run = 3}};
  EXPECT_EQ(plan_step(running, waiting, budget_of(10, 4), 512, 512, 8).items.size(), 1u);
  // With 5 free blocks the head is admitted and takes them all: the next one waits.
  const StepPlan plan = plan_step(running, waiting, budget_of(10, 5), 512, 512, 8);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[1].tokens, 64);
}

TEST(PlanStep, AdmissionLeavesTheBlockARunningPrefillStillNeeds) {
  // The running request's last 30 prompt tokens take it from 4 to 5 blocks, and its prompt's "+ 1"
  // block stays reserved; the waiting one wants 2 + 1 blocks.
  const std::vector<PlannedRequest> running = {{.held_tokens = 50, .tokens_to_run = 30}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 20}};
  EXPECT_EQ(plan_step(running, waiting, budget_of(20, 4), 64, 128, 8).items.size(), 1u);
  const StepPlan plan = plan_step(running, waiting, budget_of(20, 5), 64, 128, 8);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_TRUE(plan.items[1].from_waiting);
  EXPECT_EQ(plan.items[1].tokens, 20);
}

// Blocks reserved for KV transfers on their way (Engine::new_kv_staging) are left free by admissions,
// except to the request whose KV they hold; a running request still grows into them (its next token
// is not held up for KV that has not arrived).
TEST(PlanStep, BlocksReservedForArrivingKvCountOnlyForTheirOwnRequest) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 5, .tokens_to_run = 1}};
  // 8 of the 10 free blocks are reserved: 5 for the staged request's 80 tokens, 3 for a stream still arriving.
  KvBudget budget = budget_of(20, 10);
  budget.reserved_blocks = 8;
  const std::vector<PlannedRequest> plain = {{.held_tokens = 0, .tokens_to_run = 20}};  // 2 + 1 blocks
  EXPECT_EQ(plan_step(running, plain, budget, 512, 512, 8).items.size(), 1u);
  budget.reserved_blocks = 0;
  EXPECT_EQ(plan_step(running, plain, budget, 512, 512, 8).items.size(), 2u);
  budget.reserved_blocks = 8;
  // The staged request needs 6 blocks + 1, of which its 5 are reserved: the 2 unreserved ones hold the rest.
  const std::vector<PlannedRequest> staged = {{.held_tokens = 80, .tokens_to_run = 1, .reserved_blocks = 5}};
  const StepPlan plan = plan_step(running, staged, budget, 512, 512, 8);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_TRUE(plan.items[1].from_waiting);
  // A running request's next block may be a reserved one: no preemption.
  KvBudget full = budget_of(20, 1);
  full.reserved_blocks = 1;
  const std::vector<PlannedRequest> growing = {{.held_tokens = 16, .tokens_to_run = 1}};
  const StepPlan grown = plan_step(growing, {}, full, 512, 512, 8);
  EXPECT_TRUE(grown.preempt.empty());
  EXPECT_EQ(grown.items.size(), 1u);
}

TEST(PlanStep, APreemptedRequestThatCanNeverFitAgainRunsOutOfKv) {
  // Preempted when it held all 4 blocks and needed a fifth: alone, it still cannot run.
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 64, .tokens_to_run = 1},
                                               {.held_tokens = 0, .tokens_to_run = 20}};
  const StepPlan plan = plan_step({}, waiting, budget_of(4, 4), 64, 64, 8);
  ASSERT_EQ(plan.waiting_out_of_kv.size(), 1u);
  EXPECT_EQ(plan.waiting_out_of_kv[0], 0u);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].index, 1u);
}

TEST(PlanStep, AloneARequestMayTakeTheWholeBudget) {
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 64}};
  EXPECT_EQ(plan_step({}, waiting, budget_of(4, 4), 64, 64, 8).items.size(), 1u);
}

TEST(PlanStep, AtMostMaxRunningRun) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 5, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting(3, PlannedRequest{.held_tokens = 0, .tokens_to_run = 2});
  EXPECT_EQ(plan_step(running, waiting, budget_of(100, 100), 512, 512, 2).items.size(), 2u);
}

TEST(PlanStep, APreemptionAdmitsNobodyThatStep) {
  const std::vector<PlannedRequest> running = {{.held_tokens = 16, .tokens_to_run = 1},
                                               {.held_tokens = 64, .tokens_to_run = 1}};
  const std::vector<PlannedRequest> waiting = {{.held_tokens = 0, .tokens_to_run = 1}};
  const StepPlan plan = plan_step(running, waiting, budget_of(5, 0), 64, 64, 8);
  EXPECT_EQ(plan.preempt.size(), 1u);
  for (const StepPlan::Item& item : plan.items) EXPECT_FALSE(item.from_waiting);
}

// ---------------------------------------------------------------------------------------------------
// The Scheduler on the bundled model
// ---------------------------------------------------------------------------------------------------

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load_engine(size_t kv_cache_bytes = 0, int max_sequences = 16, const std::string& kv_spec = "dense") {
  EngineConfig config;
  config.model_dir = kModel;
  config.kv_spec = kv_spec;
  config.threads = 2;
  config.max_sequences = max_sequences;
  config.kv_cache_bytes = kv_cache_bytes;
  config.prefill_chunk_tokens = 128;  // small, so that prompts run in several chunks beside decodes
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  return engine ? engine.take() : nullptr;
}

// The ASan+UBSan build runs the model ~3.5x slower than release (16x when it was GCC -O0): there the model-running tests take
// fewer and shorter requests through the same paths (batching, preemption to host memory and by
// recomputation), so that `make test` stays within CI's time.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kConcurrentRequests = 8, kPreemptedRequestTokens = 40, kTokensPerStep = 3;
#else
constexpr int kConcurrentRequests = 32, kPreemptedRequestTokens = 72, kTokensPerStep = 4;
#endif

// Prompts of different lengths: slices of the held-out text.
std::vector<std::vector<int32_t>> prompts(const Engine& engine, int count) {
  std::ifstream in(kModel + "/heldout.txt");
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> ids = engine.tokenizer()->encode(text.str());
  std::vector<std::vector<int32_t>> result;
  for (int i = 0; i < count; ++i) {
    const size_t begin = size_t(i) * 37 % 2000, length = 3 + size_t(i) * 29 % 190;
    result.emplace_back(ids.begin() + long(begin), ids.begin() + long(begin + length));
  }
  return result;
}

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<FinishReason> finish;
  std::string error;
  int updates = 0;
};

// Runs one request by itself through Engine::step: the reference the scheduler must equal.
Output run_alone(Engine& engine, const GenerationRequest& request) {
  Output output;
  auto generation = Generation::start(engine, request);
  EXPECT_TRUE(generation) << generation.status().message();
  auto sequence = engine.add_sequence(request.sampling);
  EXPECT_TRUE(sequence) << sequence.status().message();
  std::vector<int32_t> to_run = request.prompt;
  while (!output.finish) {
    StepResult result;
    int32_t token = -1;
    for (size_t begin = 0; begin < to_run.size(); begin += size_t(engine.config().prefill_chunk_tokens)) {
      const size_t n = std::min(to_run.size() - begin, size_t(engine.config().prefill_chunk_tokens));
      const bool last = begin + n == to_run.size();
      const StepItem item{*sequence, std::span<const int32_t>(to_run).subspan(begin, n),
                          last ? StepOutput::kSample : StepOutput::kNone};
      const Status status = engine.step(std::span<const StepItem>(&item, 1), result);
      EXPECT_TRUE(status.is_ok()) << status.message();
      if (!status.is_ok()) return output;
      if (last) token = result.tokens[0];
    }
    output.tokens.push_back(token);
    Generation::Delta delta = generation->accept(token);
    output.text += delta.text;
    output.finish = delta.finish;
    to_run = {token};
  }
  EXPECT_TRUE(engine.remove_sequence(*sequence).is_ok());
  return output;
}

// Collects every request's updates; wait() returns when all have finished.
class Outputs {
 public:
  explicit Outputs(size_t count) : outputs_(count) {}
  UpdateCallback callback(size_t index) {
    return [this, index](const RequestUpdate& update) {
      std::lock_guard lock(mutex_);
      Output& output = outputs_[index];
      output.tokens.insert(output.tokens.end(), update.token_ids.begin(), update.token_ids.end());
      output.text += update.text;
      ++output.updates;
      if (update.finish) {
        output.finish = update.finish;
        output.error = update.error;
        ++finished_;
        done_.notify_all();
      }
    };
  }
  size_t updates(size_t index) {
    std::lock_guard lock(mutex_);
    return outputs_[index].updates;
  }
  const std::vector<Output>& wait() {
    std::unique_lock lock(mutex_);
    done_.wait_for(lock, std::chrono::minutes(5), [&] { return finished_ == outputs_.size(); });
    EXPECT_EQ(finished_, outputs_.size()) << "requests did not finish in time";
    return outputs_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<Output> outputs_;
  size_t finished_ = 0;
};

std::vector<GenerationRequest> requests(const Engine& engine, int count, float temperature = 0.0f) {
  std::vector<GenerationRequest> result;
  int i = 0;
  for (std::vector<int32_t>& prompt : prompts(engine, count)) {
    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.max_tokens = 4 + i * 7 % 45;
    request.ignore_eos = i % 2 == 0;  // half run their full length, half may stop early
    request.sampling = {.temperature = temperature, .top_k = 0, .top_p = 0.9f, .seed = uint64_t(i)};
    result.push_back(std::move(request));
    ++i;
  }
  return result;
}

// Submits every request at once and checks each output against the request run alone.
SchedulerStats expect_same_as_alone(std::unique_ptr<Engine> engine, const std::vector<GenerationRequest>& batch,
                                    SchedulerConfig config = {}) {
  std::vector<Output> alone;
  for (const GenerationRequest& request : batch) alone.push_back(run_alone(*engine, request));
  auto scheduler = Scheduler::start(std::move(engine), config);
  EXPECT_TRUE(scheduler) << scheduler.status().message();
  if (!scheduler) return {};
  Outputs outputs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto id = (*scheduler)->submit(batch[i], outputs.callback(i));
    EXPECT_TRUE(id) << id.status().message();
  }
  const std::vector<Output>& together = outputs.wait();
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(together[i].finish, alone[i].finish) << "request " << i << ": " << together[i].error;
  }
  (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
  const SchedulerStats stats = (*scheduler)->stats();
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_EQ(stats.kv.free_blocks, stats.kv.total_blocks) << "a finished request kept KV blocks";
  EXPECT_EQ(stats.host_kv_bytes, 0u);
  return stats;
}

TEST(Scheduler, ThirtyTwoConcurrentGreedyRequestsEqualTheSameRunOneByOne) {
  std::unique_ptr<Engine> engine = load_engine();
  ASSERT_TRUE(engine);
  const std::vector<GenerationRequest> batch = requests(*engine, kConcurrentRequests);
  const SchedulerStats stats = expect_same_as_alone(std::move(engine), batch);
  EXPECT_EQ(stats.requests_finished_total[size_t(FinishReason::kStop)] +
                stats.requests_finished_total[size_t(FinishReason::kLength)],
            size_t(kConcurrentRequests));
  EXPECT_EQ(stats.time_to_first_token.count, size_t(kConcurrentRequests));
  // Batched: far fewer steps than tokens generated (one after another, a step per token and more).
  EXPECT_LT(stats.steps_total * kTokensPerStep, stats.generation_tokens_total) << stats.steps_total << " steps";
  // Every step timed; the time between steps counted from the second on (one busy stretch here, but a
  // request can end the scheduler's work before the rest arrive); decode steps of many sequences seen.
  EXPECT_EQ(stats.engine_step.count, stats.steps_total);
  EXPECT_GT(stats.between_steps.count, 0u);
  EXPECT_LT(stats.between_steps.count, stats.steps_total);
  uint64_t decode_steps = 0;
  size_t most_sequences = 0;
  for (size_t n = 0; n < stats.decode_steps_by_sequences.size(); ++n) {
    decode_steps += stats.decode_steps_by_sequences[n].count;
    if (stats.decode_steps_by_sequences[n].count > 0) most_sequences = n;
    EXPECT_GE(stats.decode_steps_by_sequences[n].seconds, 0.0);
  }
  EXPECT_GT(decode_steps, 0u);
  EXPECT_LE(decode_steps, stats.steps_total);
  EXPECT_GT(most_sequences, 1u) << "no decode step of several sequences";
  EXPECT_EQ(stats.decode_steps_by_sequences.empty() ? 0u : stats.decode_steps_by_sequences[0].count, 0u);
}

// With a quantizing codec a prompt chunk reads the chunks before it through their codes: a prompt cut at
// other places than alone would change its output (it did, before prompts were cut only at multiples
// of the chunk: 4 of 8 served requests differed from alone with hack:bits=2,pi=64).
TEST(Scheduler, ConcurrentGreedyRequestsOfA2BitSpecEqualTheSameRunOneByOne) {
  std::unique_ptr<Engine> engine = load_engine(0, 16, "hack:bits=2,pi=64");
  ASSERT_TRUE(engine);
  const std::vector<GenerationRequest> batch = requests(*engine, kConcurrentRequests / 2);
  expect_same_as_alone(std::move(engine), batch);
}

// kv_cache_bytes for a budget of `blocks` blocks: the engine first sets aside every sequence's open block
// (a size the public API does not show), so probe it with a large budget and take whole blocks off.
size_t small_kv_bytes(int blocks, const std::string& kv_spec = "dense") {
  constexpr size_t kProbeBytes = size_t(1) << 30;
  std::unique_ptr<Engine> probe = load_engine(kProbeBytes, 16, kv_spec);
  if (!probe) return 0;
  const KvBudget budget = probe->kv_budget();
  return kProbeBytes - size_t(budget.total_blocks - blocks) * budget.bytes_per_block;
}

// Preempted requests go to host memory and resume where they were, greedy and sampled, nothing
// recomputed: with dense KV, with FP16 sink tokens and a recent window (KV transfer version 3), and with
// blocks of per-head bit widths (version 2).
TEST(Scheduler, PreemptionToHostMemoryKeepsGreedyAndSampledOutputs) {
  for (const std::string spec : {"dense", "hack:bits=2,pi=64,sinks=4,window=64", "hack:bits=2,pi=64,hibits=4,hiheads=3.1/6.1"}) {
    SCOPED_TRACE(spec);
    std::unique_ptr<Engine> engine = load_engine(small_kv_bytes(6, spec), 16, spec);
    ASSERT_TRUE(engine);
    ASSERT_EQ(engine->kv_budget().total_blocks, 6);
    std::vector<GenerationRequest> batch = requests(*engine, 8, 0.8f);
    for (GenerationRequest& request : batch) request.max_tokens = kPreemptedRequestTokens, request.ignore_eos = true;
    const SchedulerStats stats = expect_same_as_alone(std::move(engine), batch);
    EXPECT_GT(stats.preemptions_total, 0u) << "the test's KV budget must force preemption";
    EXPECT_EQ(stats.preemptions_recomputed_total, 0u);
  }
}

TEST(Scheduler, PreemptionWithoutHostMemoryRecomputesTheSameOutputs) {
  std::unique_ptr<Engine> engine = load_engine(small_kv_bytes(6));
  ASSERT_TRUE(engine);
  std::vector<GenerationRequest> batch = requests(*engine, 8);
  for (GenerationRequest& request : batch) request.max_tokens = kPreemptedRequestTokens, request.ignore_eos = true;
  const SchedulerStats stats = expect_same_as_alone(std::move(engine), batch, {.host_kv_bytes = 0});
  EXPECT_GT(stats.preemptions_recomputed_total, 0u);
}

TEST(Scheduler, CancellationFreesTheSequence) {
  auto scheduler = Scheduler::start(load_engine());
  ASSERT_TRUE(scheduler) << scheduler.status().message();
  GenerationRequest request;
  request.prompt = prompts((*scheduler)->engine(), 2)[1];
  request.max_tokens = 3000;
  request.ignore_eos = true;
  std::mutex mutex;
  std::condition_variable changed;
  int updates = 0;
  std::optional<FinishReason> finish;
  auto id = (*scheduler)->submit(request, [&](const RequestUpdate& update) {
    std::lock_guard lock(mutex);
    ++updates;
    if (update.finish) finish = update.finish;
    changed.notify_all();
  });
  ASSERT_TRUE(id) << id.status().message();
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(60), [&] { return updates >= 3; }));
  }
  EXPECT_EQ((*scheduler)->stats().running, 1);
  (*scheduler)->cancel(*id);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(60), [&] { return finish.has_value(); }));
    EXPECT_EQ(*finish, FinishReason::kCancelled);
    EXPECT_LT(updates, 1000);
  }
  // The stats are published after the step that ended it.
  SchedulerStats stats;
  for (int i = 0; i < 100; ++i) {
    stats = (*scheduler)->stats();
    if (stats.running == 0 && stats.kv.free_blocks == stats.kv.total_blocks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.kv.free_blocks, stats.kv.total_blocks);
  EXPECT_EQ(stats.requests_finished_total[size_t(FinishReason::kCancelled)], 1u);
  (*scheduler)->cancel(*id);  // again, after the end: ignored
}

// A resumed request whose KV was restored as it arrived (a CPU decode worker's staged store) waits in
// host memory as a preempted one does: host_kv_bytes counts the store until the request runs, and
// nothing after. Its token from the other worker goes out when it runs, first in its stream, not while
// it waits (the wait is its time to first token, not a gap in its stream).
TEST(Scheduler, AStagedKvCountsAsHostKvWhileItsRequestWaits) {
  std::unique_ptr<Engine> engine = load_engine();
  ASSERT_TRUE(engine);
  // The KV of a prompt, restored into a store of the engine's as a KV stream receiver restores it.
  const std::vector<int32_t> prompt = prompts(*engine, 3)[2];
  std::vector<uint8_t> transfer;
  {
    auto session = engine->new_session();
    ASSERT_TRUE(session->prefill(prompt));
    transfer = *engine->export_kv(session->sequence());
  }
  Expected<std::shared_ptr<KvStore>> staged = engine->new_kv_store();
  ASSERT_TRUE(staged) << staged.status().message();
  ASSERT_TRUE(read_kv_transfer(transfer.data(), transfer.size(), "test", engine->model_identity(), **staged));
  const size_t staged_bytes = (*staged)->memory().fast_bytes();
  ASSERT_GT(staged_bytes, 0u);

  // One long request runs; the resumed one waits behind it (max_running 1).
  auto scheduler = Scheduler::start(std::move(engine), {.max_running = 1});
  ASSERT_TRUE(scheduler) << scheduler.status().message();
  GenerationRequest running;
  running.prompt = prompt;
  running.max_tokens = 3000;
  running.ignore_eos = true;
  Outputs outputs(2);
  const auto first = (*scheduler)->submit(running, outputs.callback(0));
  ASSERT_TRUE(first) << first.status().message();
  GenerationRequest resumed;
  resumed.prompt = prompt;
  resumed.max_tokens = 4;
  resumed.ignore_eos = true;
  SubmitOptions options;
  options.resume = SubmitOptions::Resume{};
  options.resume->generated = {7};
  options.resume->staged_kv = std::move(*staged);
  ASSERT_TRUE((*scheduler)->submit(resumed, outputs.callback(1), std::move(options)));
  SchedulerStats stats;
  for (int i = 0; i < 500; ++i) {
    stats = (*scheduler)->stats();
    if (stats.running == 1 && stats.waiting == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(stats.running, 1);
  EXPECT_EQ(stats.waiting, 1);
  EXPECT_EQ(stats.host_kv_bytes, staged_bytes);
  EXPECT_EQ(outputs.updates(1), 0u) << "the resumed request's first token went out while it waited";
  (*scheduler)->cancel(*first);
  const std::vector<Output>& done = outputs.wait();
  EXPECT_EQ(done[1].finish, FinishReason::kLength) << done[1].error;
  ASSERT_EQ(done[1].tokens.size(), 4u);
  EXPECT_EQ(done[1].tokens.front(), 7);
  (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
  EXPECT_EQ((*scheduler)->stats().host_kv_bytes, 0u);
}

TEST(Scheduler, APromptThatCanNeverFitIsRefusedWithAClearError) {
  auto scheduler = Scheduler::start(load_engine(small_kv_bytes(4)));
  ASSERT_TRUE(scheduler) << scheduler.status().message();
  const KvBudget budget = (*scheduler)->stats().kv;
  GenerationRequest request;
  request.prompt.assign(size_t(budget.total_blocks * budget.block_tokens), 5);
  const auto id = (*scheduler)->submit(request, nullptr);
  ASSERT_FALSE(id);
  EXPECT_NE(id.status().message().find("prompt"), std::string::npos) << id.status().message();
  EXPECT_NE(id.status().message().find("KV cache"), std::string::npos) << id.status().message();
  // A prompt that fits is still served.
  request.prompt.resize(5);
  request.max_tokens = 3;
  Outputs outputs(1);
  ASSERT_TRUE((*scheduler)->submit(request, outputs.callback(0)));
  EXPECT_EQ(outputs.wait()[0].tokens.size(), 3u);
}

TEST(Scheduler, OnAKeptEngineItRunsBesideTheSequencesHeldAndLeavesThemAsTheyWere) {
  std::unique_ptr<Engine> engine = load_engine(small_kv_bytes(8), /*max_sequences=*/3);
  ASSERT_TRUE(engine);
  // A sequence held before the scheduler starts (a Python session), with a prompt of 119 tokens.
  const auto held = engine->add_sequence();
  ASSERT_TRUE(held) << held.status().message();
  const std::vector<int32_t> prompt = prompts(*engine, 5)[4];
  const StepItem item{*held, prompt, StepOutput::kLastLogits};
  StepResult result;
  ASSERT_TRUE(engine->step(std::span(&item, 1), result).is_ok());
  const auto kv_before = engine->export_kv(*held);
  ASSERT_TRUE(kv_before) << kv_before.status().message();
  const int64_t free_before = engine->kv_budget().free_blocks;

  const std::vector<GenerationRequest> batch = requests(*engine, 4);
  std::vector<Output> alone;
  for (const GenerationRequest& request : batch) alone.push_back(run_alone(*engine, request));
  {
    auto scheduler = Scheduler::start(*engine);
    ASSERT_TRUE(scheduler) << scheduler.status().message();
    Outputs outputs(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) ASSERT_TRUE((*scheduler)->submit(batch[i], outputs.callback(i)));
    (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
    const std::vector<Output>& together = outputs.wait();
    for (size_t i = 0; i < batch.size(); ++i) {
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i << ": " << together[i].error;
      EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    }
    EXPECT_GT((*scheduler)->stats().steps_total, 0u);
  }
  EXPECT_EQ(engine->num_sequences(), 1);
  EXPECT_EQ(engine->kv_budget().free_blocks, free_before);
  const auto kv_after = engine->export_kv(*held);
  ASSERT_TRUE(kv_after) << kv_after.status().message();
  EXPECT_EQ(*kv_after, *kv_before) << "the held sequence's KV changed";

  // Every sequence held: nothing is free to run requests on.
  ASSERT_TRUE(engine->add_sequence());
  ASSERT_TRUE(engine->add_sequence());
  const auto full = Scheduler::start(*engine);
  ASSERT_FALSE(full);
  EXPECT_NE(full.status().message().find("max_sequences (3)"), std::string::npos) << full.status().message();
}

TEST(Scheduler, ShutdownFinishesAcceptedRequestsAndRefusesNewOnes) {
  auto scheduler = Scheduler::start(load_engine());
  ASSERT_TRUE(scheduler) << scheduler.status().message();
  std::vector<GenerationRequest> batch = requests((*scheduler)->engine(), 4);
  Outputs outputs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) ASSERT_TRUE((*scheduler)->submit(batch[i], outputs.callback(i)));
  (*scheduler)->shutdown(ShutdownMode::kFinishAccepted);
  for (const Output& output : outputs.wait()) {
    ASSERT_TRUE(output.finish);
    EXPECT_NE(*output.finish, FinishReason::kCancelled);
  }
  const auto refused = (*scheduler)->submit(batch[0], nullptr);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace slimkv
