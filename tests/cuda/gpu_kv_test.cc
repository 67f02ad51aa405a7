// The GPU KV cache behind its one interface (kv/cuda/gpu_kv_cache.h) and the model's step API over it
// (model/cuda/llama_cuda.h run_step): items of mixed lengths each bringing back what it asks (no rows,
// the last row, every row, a token sampled on the GPU), sampled tokens that do not depend on the batch,
// the budget's blocks, and a sequence exported in the transfer format (kv/transfer.h) and imported into
// another GPU model, continuing with identical logits and greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <utility>

#include "cuda_test_util.h"
#include "gguf_fixtures.h"
#include "golden_models.h"
#include "kv/cuda/gpu_kv_plan.h"
#include "kv/cuda/gpu_kv_transfer.h"
#include "kv/kv_factory.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

using GpuKvTest = CudaTest;

struct GpuModel {
  std::unique_ptr<CudaLlamaModel> model;
  KvPipeline pipeline;  // as the GPU runs it
};

GpuModel upload(const LlamaModel& cpu, const std::string& spec, size_t kv_cache_bytes = 0, int max_step_tokens = 512,
                bool grouped_experts = true) {
  const KvPipeline pipeline = take(make_kv_pipeline(spec));
  const GpuKvPlan plan = take(plan_gpu_kv(pipeline, spec, int(cpu.config().hidden_size), int(cpu.config().kv_dim())));
  CudaModelOptions options;
  options.max_sequences = 4;
  options.max_step_tokens = max_step_tokens;
  options.max_context_tokens = 1024;
  options.kv_cache_bytes = kv_cache_bytes;
  options.quantized_kv = plan.options.quantized;
  options.tier = plan.options.tier;
  options.pq = plan.options.pq;
  options.rotate_heads = plan.rotate_heads;
  options.grouped_experts = grouped_experts;
  return {take(CudaLlamaModel::upload(cpu.config(), cpu.weights(), options)), plan.pipeline};
}

// A model whose KV budget is 2 blocks: the import of `bytes` is refused for room, the sequence left empty.
void expect_no_room(GpuModel small, const KvShape& shape, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(small.model->kv().sequences().num_blocks(), 2);
  const int r = take(small.model->add_sequence());
  const Status room = import_transfer(small.model->kv(), r, {shape, small.pipeline, "model"}, bytes, "test");
  ASSERT_FALSE(room.is_ok());
  EXPECT_NE(room.message().find("no room"), std::string::npos) << room.message();
  EXPECT_EQ(small.model->num_tokens(r), 0);
  EXPECT_EQ(small.model->kv().sequences().free_blocks(), 2);
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = id(rng);
  return tokens;
}

int32_t argmax(std::span<const float> row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

// One item's step alone through step(): its logits, all rows or the last.
std::vector<float> alone(CudaLlamaModel& model, const std::vector<int32_t>& tokens, bool all) {
  const int s = take(model.add_sequence());
  std::vector<float> logits;
  EXPECT_TRUE(model.step(std::vector<SequenceTokens>{{s, tokens}}, all, logits).is_ok());
  model.remove_sequence(s);
  return logits;
}

TEST_F(GpuKvTest, RunStepBringsBackWhatEachItemAsks) {
  auto cpu = take(LlamaModel::load(kBundled));
  const int vocab = int(cpu->config().vocab_size);
  for (const char* spec : {"dense", "hack:bits=4,rot=none"}) {
    SCOPED_TRACE(spec);
    GpuModel gpu = upload(*cpu, spec);
    CudaLlamaModel& model = *gpu.model;
    const auto a = random_tokens(70, vocab, 1), b = random_tokens(30, vocab, 2), c = random_tokens(1, vocab, 3),
               d = random_tokens(65, vocab, 4);
    const auto a_alone = alone(model, a, true), c_alone = alone(model, c, false), d_alone = alone(model, d, false);
    std::vector<int> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(take(model.add_sequence()));
    const std::vector<SequenceStep> items = {{ids[0], a, StepRows::kAll, {}},
                                             {ids[1], b, StepRows::kNone, {}},
                                             {ids[2], c, StepRows::kLast, {}},
                                             {ids[3], d, StepRows::kSample, {}}};  // greedy
    StepOutputs out;
    SLIMKV_ASSERT_OK(model.run_step(items, out));
    ASSERT_EQ(out.logits.size(), size_t(71) * size_t(vocab));  // a's 70 rows and c's one: nothing else
    EXPECT_EQ(out.first_row, (std::vector<int64_t>{0, -1, 70, -1}));
    EXPECT_EQ(out.tokens, (std::vector<int32_t>{-1, -1, -1, argmax(d_alone)}));
    const std::vector<float> a_rows(out.logits.begin(), out.logits.begin() + 70 * vocab);
    const std::vector<float> c_row(out.logits.begin() + 70 * vocab, out.logits.end());
    // Each item's rows get the bits they get alone (item_products.h, split_k.cuh).
    EXPECT_EQ(a_rows, a_alone);
    EXPECT_EQ(c_row, c_alone);
    EXPECT_EQ(model.num_tokens(ids[1]), 30);
    // Only sampled items: no logits at all.
    const std::vector<int32_t> next = {5};
    SLIMKV_ASSERT_OK(model.run_step(std::vector<SequenceStep>{{ids[1], next, StepRows::kSample, {}}}, out));
    EXPECT_TRUE(out.logits.empty());
    EXPECT_GE(out.tokens[0], 0);
    // Nothing asked: the step still runs.
    SLIMKV_ASSERT_OK(model.run_step(std::vector<SequenceStep>{{ids[1], next, StepRows::kNone, {}}}, out));
    EXPECT_EQ(model.num_tokens(ids[1]), 32);
  }
}

// A draw is a function of the logits, the sequence's sampling parameters and its position: a sequence
// samples the same tokens alone and beside others.
TEST_F(GpuKvTest, SampledTokensDoNotDependOnTheBatch) {
  auto cpu = take(LlamaModel::load(kBundled));
  const int vocab = int(cpu->config().vocab_size);
  GpuModel gpu = upload(*cpu, "dense");
  CudaLlamaModel& model = *gpu.model;
  const RowSampling sampling{0.9f, 40, 0.95f, 1234, 0};
  const auto prompt = random_tokens(40, vocab, 7);
  const auto run = [&](bool with_others) {
    const int s = take(model.add_sequence());
    std::vector<int> others;
    if (with_others) {
      for (int i = 0; i < 2; ++i) others.push_back(take(model.add_sequence()));
    }
    std::vector<int32_t> drawn;
    std::vector<int32_t> input = prompt;
    for (int step = 0; step < 24; ++step) {
      std::vector<SequenceStep> items;
      std::vector<std::vector<int32_t>> other_inputs;
      for (size_t i = 0; i < others.size(); ++i) other_inputs.push_back(random_tokens(step == 0 ? 17 + int(i) : 1, vocab, 100 + step));
      for (size_t i = 0; i < others.size(); ++i) {
        items.push_back({others[i], other_inputs[i], StepRows::kSample, RowSampling{0.7f, 0, 1.0f, 9, uint64_t(step)}});
      }
      RowSampling mine = sampling;
      mine.counter = uint64_t(model.num_tokens(s)) + input.size();  // the position of the token drawn
      items.insert(items.begin() + (step % 2 ? 0 : ptrdiff_t(items.size())), SequenceStep{s, input, StepRows::kSample, mine});
      StepOutputs out;
      EXPECT_TRUE(model.run_step(items, out).is_ok());
      const size_t at = size_t(std::find_if(items.begin(), items.end(), [&](const SequenceStep& it) { return it.sequence == s; }) - items.begin());
      drawn.push_back(out.tokens[at]);
      input = {drawn.back()};
    }
    model.remove_sequence(s);
    for (int o : others) model.remove_sequence(o);
    return drawn;
  };
  const auto by_itself = run(false), in_a_batch = run(true);
  EXPECT_EQ(by_itself, in_a_batch);
  EXPECT_GT(std::set<int32_t>(by_itself.begin(), by_itself.end()).size(), 1u) << "a sampler that samples";
}

TEST_F(GpuKvTest, BudgetCountsBlocksOfEverySequence) {
  auto cpu = take(LlamaModel::load(kBundled));
  const int vocab = int(cpu->config().vocab_size);
  for (const char* spec : {"dense", "hack:bits=2"}) {
    SCOPED_TRACE(spec);
    GpuModel gpu = upload(*cpu, spec);
    CudaLlamaModel& model = *gpu.model;
    const SequenceBlocks& blocks = model.kv().sequences();
    const int total = blocks.num_blocks(), free_at_start = blocks.free_blocks();
    EXPECT_EQ(total, free_at_start);
    EXPECT_GT(model.kv().bytes_per_block(), 0u);
    const int s = take(model.add_sequence()), t = take(model.add_sequence());
    std::vector<float> logits;
    SLIMKV_ASSERT_OK(model.step(std::vector<SequenceTokens>{{s, random_tokens(130, vocab, 1)}, {t, random_tokens(64, vocab, 2)}},
                                false, logits));
    EXPECT_EQ(blocks.blocks(s).size(), 3u);
    EXPECT_EQ(blocks.blocks(t).size(), 1u);
    EXPECT_EQ(blocks.free_blocks(), free_at_start - 4);
    model.remove_sequence(s);
    model.remove_sequence(t);
    EXPECT_EQ(blocks.free_blocks(), free_at_start);
  }
}

// Export → transfer bytes → import into another GPU model (one of shorter steps): the same bytes
// exported again, and the sequence goes on with bit-identical logits (the same kernels over the same
// blocks) and greedy tokens, each step selecting alike where the cache selects (pq: the same tokens
// read, and found in the GPU cache of selected tokens). Whether some step selected fewer tokens than the
// sequence held is returned.
bool check_export_import(const LlamaModel& cpu, const std::string& spec, int prompt_tokens) {
  const ModelConfig& config = cpu.config();
  const KvShape shape(int(config.num_layers), int(config.num_kv_heads), int(config.head_dim), int(config.head_dim), 1024);
  GpuModel sender = upload(cpu, spec), receiver = upload(cpu, spec, 0, /*max_step_tokens=*/48);
  const int s = take(sender.model->add_sequence());
  std::vector<float> logits;
  EXPECT_TRUE(sender.model->step(std::vector<SequenceTokens>{{s, random_tokens(prompt_tokens, int(config.vocab_size), 5)}},
                                 false, logits).is_ok());
  int32_t next = argmax(logits);

  std::vector<uint8_t> bytes;
  const Status exported_ok = export_transfer(sender.model->kv(), s, {shape, sender.pipeline, "model"}, bytes);
  EXPECT_TRUE(exported_ok.is_ok()) << exported_ok.message();
  KvStore exported(shape, sender.pipeline);  // a valid transfer of the prompt, as the CPU reads it
  const Status read = read_kv_transfer(bytes.data(), bytes.size(), "test", "model", exported);
  EXPECT_TRUE(read.is_ok()) << read.message();
  EXPECT_EQ(exported.num_tokens(0), prompt_tokens);

  const int r = take(receiver.model->add_sequence());
  const Status imported = import_transfer(receiver.model->kv(), r, {shape, receiver.pipeline, "model"}, bytes, "test");
  EXPECT_TRUE(imported.is_ok()) << imported.message();
  EXPECT_EQ(receiver.model->num_tokens(r), prompt_tokens);
  std::vector<uint8_t> bytes_again;
  EXPECT_TRUE(export_transfer(receiver.model->kv(), r, {shape, receiver.pipeline, "model"}, bytes_again).is_ok());
  EXPECT_TRUE(bytes_again == bytes) << "the receiver holds the sender's bytes";

  bool selected_fewer = false;
  for (int step = 0; step < 70; ++step) {  // across a block boundary: sealing goes on alike
    const std::vector<int32_t> token = {next};
    std::vector<float> sent, received;
    const Status sent_ok = sender.model->step(std::vector<SequenceTokens>{{s, token}}, false, sent);
    const Status received_ok = receiver.model->step(std::vector<SequenceTokens>{{r, token}}, false, received);
    EXPECT_TRUE(sent_ok.is_ok() && received_ok.is_ok()) << sent_ok.message() << received_ok.message();
    if (sent != received) {
      ADD_FAILURE() << "step " << step << ": the logits differ";
      break;
    }
    const SelectionReport a = sender.model->kv().selection(), b = receiver.model->kv().selection();
    EXPECT_EQ(a.selected_tokens, b.selected_tokens) << "step " << step;
    EXPECT_EQ(a.held_tokens, b.held_tokens) << "step " << step;
    EXPECT_EQ(a.page_bytes_read, b.page_bytes_read) << "step " << step;
    EXPECT_EQ(a.cache_used_tokens, b.cache_used_tokens) << "step " << step;
    EXPECT_EQ(a.cache_hit_tokens, b.cache_hit_tokens) << "step " << step;
    selected_fewer = selected_fewer || a.selected_tokens < a.held_tokens;
    next = argmax(sent);
  }
  return selected_fewer;
}

TEST_F(GpuKvTest, ExportedSequenceContinuesIdenticallyInAnotherModel) {
  auto cpu = take(LlamaModel::load(kBundled));
  for (const char* spec : {"dense", "hack:bits=2", "quant:bits=4,rot=none", "dense@offload", "hack:bits=2@offload"}) {
    for (const int prompt_tokens : {150, 128, 20}) {
      SCOPED_TRACE(std::string(spec) + ", prompt " + std::to_string(prompt_tokens));
      check_export_import(*cpu, spec, prompt_tokens);
    }
  }
}

// pq (resident; @offload with a GPU cache of selected tokens smaller than a selection): the receiver
// rebuilds the PQ index from the imported keys (segments of 64 tokens: the 150-token prompt has two
// clustered, the 20-token one gets its first while decoding) and selects as the sender does, fewer
// tokens than the sequence holds. A resident budget without room refuses the import, changing nothing.
TEST_F(GpuKvTest, PqSequenceExportedAndImportedSelectsAlike) {
  auto cpu = take(LlamaModel::load(kBundled));
  const std::string pq = "pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64";
  // @offload over the pages (rows=auto) and over their token-major copies, rebuilt on import (rows=on).
  for (const std::string& spec : {pq, pq + ",cache=24,policy=lfu@offload", pq + ",cache=24,rows=on@offload"}) {
    for (const int prompt_tokens : {150, 128, 20}) {
      SCOPED_TRACE(spec + ", prompt " + std::to_string(prompt_tokens));
      EXPECT_TRUE(check_export_import(*cpu, spec, prompt_tokens)) << "no step selected fewer tokens than held";
    }
  }
  const ModelConfig& config = cpu->config();
  const KvShape shape(int(config.num_layers), int(config.num_kv_heads), int(config.head_dim), int(config.head_dim), 1024);
  GpuModel sender = upload(*cpu, pq);
  const int s = take(sender.model->add_sequence());
  std::vector<float> logits;
  SLIMKV_ASSERT_OK(
      sender.model->step(std::vector<SequenceTokens>{{s, random_tokens(150, int(config.vocab_size), 5)}}, false, logits));
  std::vector<uint8_t> bytes;
  SLIMKV_ASSERT_OK(export_transfer(sender.model->kv(), s, {shape, sender.pipeline, "model"}, bytes));
  expect_no_room(upload(*cpu, pq, 2 * sender.model->kv().bytes_per_block()), shape, bytes);
}

// Sequences a, b, c (0, 1, 2) of one model: steps(items) runs the items — (sequence, tokens) — in one
// step and gives each item's last logits row, back to back.
using Item = std::pair<int, std::vector<int32_t>>;
using ThreeSequences = std::function<std::vector<float>(const std::vector<Item>&)>;

ThreeSequences three_sequences(CudaLlamaModel& model) {
  std::vector<int> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(take(model.add_sequence()));
  return [&model, ids](const std::vector<Item>& items) {
    std::vector<SequenceTokens> step;
    for (const auto& [i, tokens] : items) step.push_back({ids[size_t(i)], tokens});
    std::vector<float> logits;
    EXPECT_TRUE(model.step(step, false, logits).is_ok());
    return logits;
  };
}

// Through the engine's step (a zack model's folded weights are the engine's to make).
ThreeSequences three_sequences(Engine& engine) {
  std::vector<SequenceId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(take(engine.add_sequence()));
  return [&engine, ids](const std::vector<Item>& items) {
    std::vector<StepItem> step;
    for (const auto& [i, tokens] : items) step.push_back({ids[size_t(i)], tokens, StepOutput::kLastLogits});
    StepResult result;
    const Status status = engine.step(step, result);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return result.logits;
  };
}

// a and c prefilled with 150 and 230 tokens, each in a step of its own; b empty (its prompt comes in
// chunks beside a's and c's decode tokens).
void prefill_a_and_c(const ThreeSequences& steps, int vocab) {
  steps({{0, random_tokens(150, vocab, 5)}});
  steps({{2, random_tokens(230, vocab, 6)}});
}

// Two uploads of one spec holding the same KV, for a server's step against the same steps one sequence at
// a time: a and c prefilled in both (prefill_a_and_c).
struct BesideAPrompt {
  GpuModel mixed, alone;
  ThreeSequences mixed_steps, alone_steps;
};
BesideAPrompt decode_rows_beside_a_prompt(const LlamaModel& cpu, const std::string& spec, bool grouped_experts = true) {
  BesideAPrompt out{upload(cpu, spec, 0, 512, grouped_experts), upload(cpu, spec, 0, 512, grouped_experts), {}, {}};
  out.mixed_steps = three_sequences(*out.mixed.model);
  out.alone_steps = three_sequences(*out.alone.model);
  for (const ThreeSequences* steps : {&out.mixed_steps, &out.alone_steps}) prefill_a_and_c(*steps, int(cpu.config().vocab_size));
  return out;
}

// A server's step gives each sequence the bits it gets alone (issue 22: a served request's greedy output
// equals the request run alone, whatever else runs): decode rows a, c beside b's prompt chunks of 30
// tokens (its weight products padded with the decode rows') or of 100 (a product of its own), `rounds`
// rounds, against the same steps one sequence at a time (a and c prefilled in both) — the weight products
// (backend/cuda/item_products.h), an MoE layer's experts (each item's own path) and the attention splits
// (attention/split_rule.h) are each sequence's own.
void expect_each_sequence_gets_its_bits_alone(const ThreeSequences& mixed, const ThreeSequences& alone, int vocab,
                                              int rounds = 10) {
  const std::vector<int32_t> prompt = random_tokens(rounds * 130, vocab, 7);
  std::vector<int32_t> next = {11, 12};
  size_t at = 0;
  for (int round = 0; round < rounds; ++round) {
    const size_t length = round % 2 == 0 ? 30 : 100;
    const std::vector<int32_t> chunk(prompt.begin() + ptrdiff_t(at), prompt.begin() + ptrdiff_t(at + length));
    at += length;
    const std::vector<int32_t> a_token = {next[0]}, c_token = {next[1]};
    const std::vector<float> together = mixed({{0, a_token}, {1, chunk}, {2, c_token}});
    const std::vector<float> a_logits = alone({{0, a_token}}), b_logits = alone({{1, chunk}}), c_logits = alone({{2, c_token}});
    ASSERT_EQ(together.size(), 3 * size_t(vocab));
    const auto row = [&](int i) {
      return std::vector<float>(together.begin() + ptrdiff_t(i) * vocab, together.begin() + ptrdiff_t(i + 1) * vocab);
    };
    ASSERT_EQ(row(0), a_logits) << "round " << round << ": decode row a";
    ASSERT_EQ(row(1), b_logits) << "round " << round << ": the chunk of " << length << " tokens";
    ASSERT_EQ(row(2), c_logits) << "round " << round << ": decode row c";
    next = {argmax(a_logits), argmax(c_logits)};
  }
}

TEST_F(GpuKvTest, AStepGivesEachSequenceTheBitsItGetsAlone) {
  auto cpu = take(LlamaModel::load(kBundled));
  for (const char* spec : {"dense", "hack:bits=4", "hack:bits=2,pi=64", "quant:bits=4"}) {
    SCOPED_TRACE(spec);
    const BesideAPrompt models = decode_rows_beside_a_prompt(*cpu, spec);
    expect_each_sequence_gets_its_bits_alone(models.mixed_steps, models.alone_steps, int(cpu->config().vocab_size));
  }
}

// The same for zack (its decode tasks and prefill splits cut by each sequence alone: zack_attention.h) and
// zack followed by a codec (the paged kernels over each head's ranks), through the engine, on the bundled
// model's calibration.
TEST_F(GpuKvTest, AZackStepGivesEachSequenceTheBitsItGetsAlone) {
  for (const char* spec : {"zack:rate=0.5", "zack:rate=0.5,align=4+hack:bits=4", "zack:rate=0.5,align=4+hack:bits=2,pi=64"}) {
    SCOPED_TRACE(spec);
    EngineConfig config;
    config.model_dir = kBundled;
    config.kv_spec = spec;
    config.device = "cuda";
    config.max_sequences = 3;
    auto mixed = take(Engine::load(config)), alone = take(Engine::load(config));
    const ThreeSequences mixed_steps = three_sequences(*mixed), alone_steps = three_sequences(*alone);
    const int vocab = int(mixed->model_config().vocab_size);
    for (const ThreeSequences* steps : {&mixed_steps, &alone_steps}) prefill_a_and_c(*steps, vocab);
    expect_each_sequence_gets_its_bits_alone(mixed_steps, alone_steps, vocab);
  }
}

// The same for Qwen3-MoE's experts, plain (FP32 safetensors) and in Q8_0 blocks: grouped (decode rows
// and the 30-token chunk on the grouped GEMVs, the 100-token chunk through each expert's own products)
// and not (CudaModelOptions::grouped_experts false: every item through each expert's own products, the
// step's items apart within an expert's rows). 6 rounds: the fixtures hold 512 positions.
TEST_F(GpuKvTest, AnMoeStepGivesEachSequenceTheBitsItGetsAlone) {
  for (const std::string& model : {kGoldenModels + "/qwen3_moe", slimkv::test::kGgufDir + "/qwen3moe_tiny-Q8_0.gguf"}) {
    auto cpu = take(LlamaModel::load(model));
    ASSERT_GT(cpu->config().moe.num_experts, 0);
    for (const bool grouped : {true, false}) {
      SCOPED_TRACE(model + (grouped ? ", grouped experts" : ", each expert's own products"));
      const BesideAPrompt models = decode_rows_beside_a_prompt(*cpu, "dense", grouped);
      expect_each_sequence_gets_its_bits_alone(models.mixed_steps, models.alone_steps, int(cpu->config().vocab_size), 6);
    }
  }
}

// pq over sealed hack blocks (resident; @offload with a GPU cache of selected tokens) moves as hack's
// sequences do: device pages, the same bytes exported again by the receiver. The receiver builds its
// index from the blocks' keys dequantized (the sender's saw them before sealing, as on the CPU), so it
// selects by codebooks of its own: fewer tokens than it holds, logits close to the sender's, and a
// second receiver of the same bytes gives the first one's logits bit for bit.
TEST_F(GpuKvTest, PqOverHackSequenceMovesAsSealedBlocks) {
  auto cpu = take(LlamaModel::load(kBundled));
  const ModelConfig& config = cpu->config();
  const KvShape shape(int(config.num_layers), int(config.num_kv_heads), int(config.head_dim), int(config.head_dim), 1024);
  const std::string pq = "pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64";
  for (const std::string& spec : {pq + "+hack:bits=4", pq + ",cache=24+hack:bits=2,rot=none@offload"}) {
    SCOPED_TRACE(spec);
    GpuModel sender = upload(*cpu, spec), first = upload(*cpu, spec, 0, /*max_step_tokens=*/48), second = upload(*cpu, spec);
    const int s = take(sender.model->add_sequence());
    std::vector<float> logits;
    SLIMKV_ASSERT_OK(
        sender.model->step(std::vector<SequenceTokens>{{s, random_tokens(150, int(config.vocab_size), 5)}}, false, logits));
    int32_t next = argmax(logits);
    std::vector<uint8_t> bytes, bytes_again;
    SLIMKV_ASSERT_OK(export_transfer(sender.model->kv(), s, {shape, sender.pipeline, "model"}, bytes));
    KvStore exported(shape, sender.pipeline);  // a valid transfer, as the CPU reads it
    SLIMKV_ASSERT_OK(read_kv_transfer(bytes.data(), bytes.size(), "test", "model", exported));
    const int r1 = take(first.model->add_sequence()), r2 = take(second.model->add_sequence());
    SLIMKV_ASSERT_OK(import_transfer(first.model->kv(), r1, {shape, first.pipeline, "model"}, bytes, "test"));
    SLIMKV_ASSERT_OK(import_transfer(second.model->kv(), r2, {shape, second.pipeline, "model"}, bytes, "test"));
    EXPECT_EQ(first.model->num_tokens(r1), 150);
    SLIMKV_ASSERT_OK(export_transfer(first.model->kv(), r1, {shape, first.pipeline, "model"}, bytes_again));
    EXPECT_TRUE(bytes_again == bytes) << "the receiver holds the sender's bytes";
    double error = 0;
    bool selected_fewer = false;
    for (int step = 0; step < 70; ++step) {  // across a block boundary: sealing goes on alike
      const std::vector<int32_t> token = {next};
      std::vector<float> sent, received, received_again;
      SLIMKV_ASSERT_OK(sender.model->step(std::vector<SequenceTokens>{{s, token}}, false, sent));
      SLIMKV_ASSERT_OK(first.model->step(std::vector<SequenceTokens>{{r1, token}}, false, received));
      SLIMKV_ASSERT_OK(second.model->step(std::vector<SequenceTokens>{{r2, token}}, false, received_again));
      ASSERT_TRUE(received == received_again) << "step " << step;
      const SelectionReport report = first.model->kv().selection();
      selected_fewer = selected_fewer || report.selected_tokens < report.held_tokens;
      error = std::max(error, relative_max_error(received, sent));
      next = argmax(sent);
    }
    std::printf("%s: imported against the sender, max error / max|logit| %.2e\n", spec.c_str(), error);
    EXPECT_TRUE(selected_fewer) << "no step selected fewer tokens than held";
    // Other codebooks select other tokens; over 2-bit codes without the rotation those tokens' values
    // are coarser, so the logits move more (0.29 measured on an H100; 4-bit 0.08).
    EXPECT_LT(error, spec.find("bits=2") != std::string::npos ? 0.5 : 0.25);
  }
}

// A server's step: decode rows of pq beside a prompt chunk (between them, so that the step's attention
// runs in three parts and the decode rows' queries are gathered) select by the rule they select by
// alone — the same number of tokens as the two decode steps run one by one, fewer than they hold — and
// give the logits they give alone, bit for bit; the chunk attends to every token, as alone.
TEST_F(GpuKvTest, PqDecodeRowsSelectBesidePrefillChunks) {
  auto cpu = take(LlamaModel::load(kBundled));
  const int vocab = int(cpu->config().vocab_size);
  const std::string pq = "pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64";
  for (const std::string& spec : {pq, pq + ",cache=24@offload"}) {
    SCOPED_TRACE(spec);
    const BesideAPrompt models = decode_rows_beside_a_prompt(*cpu, spec);
    const std::vector<int32_t> prompt = random_tokens(20 * 30, vocab, 7);
    std::vector<int32_t> next = {11, 12};
    double decode_error = 0, chunk_error = 0;
    for (int round = 0; round < 20; ++round) {
      const std::vector<int32_t> chunk(prompt.begin() + round * 30, prompt.begin() + (round + 1) * 30);
      const std::vector<int32_t> a_token = {next[0]}, c_token = {next[1]};
      const std::vector<float> together = models.mixed_steps({{0, a_token}, {1, chunk}, {2, c_token}});
      const SelectionReport batched = models.mixed.model->kv().selection();
      const std::vector<float> a_logits = models.alone_steps({{0, a_token}});
      const SelectionReport a_report = models.alone.model->kv().selection();
      const std::vector<float> b_logits = models.alone_steps({{1, chunk}}), c_logits = models.alone_steps({{2, c_token}});
      const SelectionReport c_report = models.alone.model->kv().selection();
      EXPECT_EQ(batched.held_tokens, a_report.held_tokens + c_report.held_tokens) << "round " << round << ": the decode rows";
      EXPECT_EQ(batched.selected_tokens, a_report.selected_tokens + c_report.selected_tokens) << "round " << round;
      EXPECT_LT(batched.selected_tokens, batched.held_tokens) << "round " << round;
      const auto row = [&](int i) {
        return std::vector<float>(together.begin() + ptrdiff_t(i) * vocab, together.begin() + ptrdiff_t(i + 1) * vocab);
      };
      decode_error = std::max({decode_error, relative_max_error(row(0), a_logits), relative_max_error(row(2), c_logits)});
      chunk_error = std::max(chunk_error, relative_max_error(row(1), b_logits));
      next = {argmax(a_logits), argmax(c_logits)};  // both models go on with the same tokens
    }
    std::printf("%s: decode rows beside a prompt chunk against alone: max error / max|logit| %.2e (the chunk's %.2e)\n",
                spec.c_str(), decode_error, chunk_error);
    // Each sequence's weight products and attention splits are its own (item_products.h, split_rule.h).
    EXPECT_EQ(decode_error, 0.0);
    EXPECT_EQ(chunk_error, 0.0);
  }
}

TEST_F(GpuKvTest, ImportIsRefusedOnMismatchOrWithoutRoom) {
  auto cpu = take(LlamaModel::load(kBundled));
  const ModelConfig& config = cpu->config();
  const KvShape shape(int(config.num_layers), int(config.num_kv_heads), int(config.head_dim), int(config.head_dim), 1024);
  GpuModel hack = upload(*cpu, "hack:bits=2");
  const int s = take(hack.model->add_sequence());
  std::vector<float> logits;
  SLIMKV_ASSERT_OK(hack.model->step(std::vector<SequenceTokens>{{s, random_tokens(200, int(config.vocab_size), 5)}}, false, logits));
  std::vector<uint8_t> bytes;
  SLIMKV_ASSERT_OK(export_transfer(hack.model->kv(), s, {shape, hack.pipeline, "model"}, bytes));
  // Another spec: the dense GPU store runs dense:dtype=f16 and says so.
  GpuModel dense = upload(*cpu, "dense");
  EXPECT_EQ(dense.pipeline.describe().substr(0, 16), "dense:dtype=f16,");
  KvStore dense_store(shape, dense.pipeline);
  const Status spec = read_kv_transfer(bytes.data(), bytes.size(), "test", "model", dense_store);
  ASSERT_FALSE(spec.is_ok());
  EXPECT_NE(spec.message().find(hack.pipeline.describe()), std::string::npos) << spec.message();
  EXPECT_NE(spec.message().find(dense.pipeline.describe()), std::string::npos) << spec.message();
  // Another model.
  KvStore hack_store(shape, hack.pipeline);
  const Status model = read_kv_transfer(bytes.data(), bytes.size(), "test", "other model", hack_store);
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.message().find("model mismatch"), std::string::npos) << model.message();
  // kvpr exports, but takes no import: it recomputes K/V from X, which a transfer does not carry.
  GpuModel kvpr = upload(*cpu, "hack:bits=2@kvpr:split=0.5");
  const int k = take(kvpr.model->add_sequence());
  SLIMKV_ASSERT_OK(kvpr.model->step(std::vector<SequenceTokens>{{k, random_tokens(200, int(config.vocab_size), 5)}}, false, logits));
  std::vector<uint8_t> kvpr_bytes;
  SLIMKV_ASSERT_OK(export_transfer(kvpr.model->kv(), k, {shape, kvpr.pipeline, "model"}, kvpr_bytes));
  KvStore kvpr_store(shape, kvpr.pipeline);
  SLIMKV_ASSERT_OK(read_kv_transfer(kvpr_bytes.data(), kvpr_bytes.size(), "test", "model", kvpr_store));
  EXPECT_EQ(kvpr_store.num_tokens(0), 200);
  const int k2 = take(kvpr.model->add_sequence());
  const Status recompute = import_transfer(kvpr.model->kv(), k2, {shape, kvpr.pipeline, "model"}, kvpr_bytes, "test");
  ASSERT_FALSE(recompute.is_ok());
  EXPECT_NE(recompute.message().find("kvpr"), std::string::npos) << recompute.message();
  // A budget of 2 blocks cannot hold 200 tokens: refused, the sequence still empty.
  const size_t two_blocks = 2 * hack.model->kv().bytes_per_block() +
                            size_t(512 / 64 + 2 * 4) * size_t(config.num_layers) * 2 * size_t(config.kv_dim()) * 64 * 2;
  expect_no_room(upload(*cpu, "hack:bits=2", two_blocks), shape, bytes);
}

}  // namespace
}  // namespace slimkv::cuda
