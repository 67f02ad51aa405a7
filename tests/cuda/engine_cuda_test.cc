// The engine's step API on device "cuda" (include/slimkv/engine.h over engine/cuda/cuda_device_model.cc):
// steps of mixed items, the KV budget, the spec the GPU runs, and KV export/import between engines —
// GPU to GPU continuing with identical greedy tokens (pq@offload too: its index rebuilt on import), GPU
// to CPU (same spec) continuing within the two devices' arithmetic — and refusals naming both sides.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda_test_util.h"
#include "golden_models.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

using CudaEngineTest = CudaTest;

std::unique_ptr<Engine> load(const std::string& device, const std::string& kv, int max_sequences = 4) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  config.max_sequences = max_sequences;
  return take(Engine::load(config));
}

std::vector<int32_t> prompt_of(int n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  return tokens;
}

int32_t argmax(std::span<const float> row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

// Runs `steps` greedy decode steps of a sequence whose next input is `next`; returns the tokens and
// each step's logits.
std::vector<int32_t> greedy(Engine& engine, SequenceId s, int32_t next, int steps, std::vector<std::vector<float>>* logits) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < steps; ++i) {
    const std::vector<int32_t> input = {next};
    StepResult out;
    const Status status = engine.step(std::vector<StepItem>{{s, input, StepOutput::kLastLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    if (!status.is_ok()) break;
    const auto row = out.logits_of(0);
    if (logits) logits->emplace_back(row.begin(), row.end());
    next = argmax(row);
    tokens.push_back(next);
  }
  return tokens;
}

TEST_F(CudaEngineTest, TheGpuSaysWhatItRuns) {
  EXPECT_TRUE(load("cuda", "dense")->kv_description().starts_with("dense:dtype=f16,")) << load("cuda", "dense")->kv_description();
  EXPECT_EQ(load("cuda", "hack:bits=2")->kv_description(), load("cpu", "hack:bits=2")->kv_description());
}

TEST_F(CudaEngineTest, StepOfMixedItemsAndTheBudget) {
  auto engine = load("cuda", "hack:bits=2");
  const KvBudget start = engine->kv_budget();
  EXPECT_EQ(start.block_tokens, 64);
  EXPECT_EQ(start.free_blocks, start.total_blocks);
  EXPECT_GT(start.bytes_per_block, 0u);
  const SequenceId a = take(engine->add_sequence()), b = take(engine->add_sequence({0.8f, 40, 0.9f, 3}));
  const SequenceId c = take(engine->add_sequence());
  const auto pa = prompt_of(100), pb = prompt_of(70), pc = prompt_of(3);
  StepResult out;
  SLIMKV_ASSERT_OK(engine->step(std::vector<StepItem>{{a, pa, StepOutput::kAllLogits},
                                                      {b, pb, StepOutput::kSample},
                                                      {c, pc, StepOutput::kNone}},
                                out));
  const size_t vocab = size_t(out.vocab);
  EXPECT_EQ(out.logits.size(), 100 * vocab);
  EXPECT_EQ(out.first_row[0], 0);
  EXPECT_EQ(out.first_row[1], -1);
  EXPECT_EQ(out.first_row[2], -1);
  EXPECT_GE(out.tokens[1], 0);
  EXPECT_EQ(out.tokens[0], -1);
  EXPECT_EQ(take(engine->sequence_blocks(a)), 2);
  EXPECT_EQ(take(engine->sequence_blocks(b)), 2);
  EXPECT_EQ(take(engine->sequence_blocks(c)), 1);
  EXPECT_EQ(engine->kv_budget().free_blocks, start.free_blocks - 5);
  SLIMKV_ASSERT_OK(engine->remove_sequence(a));
  EXPECT_EQ(engine->kv_budget().free_blocks, start.free_blocks - 3);
}

TEST_F(CudaEngineTest, ExportImportOnTheGpuContinuesWithIdenticalGreedyTokens) {
  for (const char* spec :
       {"dense", "hack:bits=2", "quant:bits=4,rot=none", "pq:m=2,b=4,topk=0.25,local=16,init=4,segment=64@offload"}) {
    SCOPED_TRACE(spec);
    auto sender = load("cuda", spec), receiver = load("cuda", spec);
    const SequenceId s = take(sender->add_sequence());
    StepResult out;
    SLIMKV_ASSERT_OK(sender->step(std::vector<StepItem>{{s, prompt_of(150), StepOutput::kLastLogits}}, out));
    const int32_t next = argmax(out.logits_of(0));
    const std::vector<uint8_t> transfer = take(sender->export_kv(s));
    const SequenceId r = take(receiver->add_sequence());
    SLIMKV_ASSERT_OK(receiver->import_kv(r, transfer, "sender"));
    EXPECT_EQ(take(receiver->num_tokens(r)), 150);
    EXPECT_EQ(take(receiver->export_kv(r)), transfer);
    std::vector<std::vector<float>> sent, received;
    EXPECT_EQ(greedy(*sender, s, next, 40, &sent), greedy(*receiver, r, next, 40, &received));
    EXPECT_TRUE(sent == received) << "bit-identical logits";
  }
}

// The KV moves verbatim: the CPU, continuing over the GPU's blocks, is as close to the GPU as the two
// devices' arithmetic (BF16 activations on the GPU) allows, closer than to its own prefill's KV.
TEST_F(CudaEngineTest, GpuKvImportedIntoTheCpuContinues) {
  const std::string spec = "hack:bits=4,rot=none";
  auto gpu = load("cuda", spec), cpu = load("cpu", spec);
  const auto prompt = prompt_of(150);
  const SequenceId g = take(gpu->add_sequence());
  StepResult out;
  SLIMKV_ASSERT_OK(gpu->step(std::vector<StepItem>{{g, prompt, StepOutput::kLastLogits}}, out));
  const int32_t next = argmax(out.logits_of(0));
  const SequenceId imported = take(cpu->add_sequence()), own = take(cpu->add_sequence());
  SLIMKV_ASSERT_OK(cpu->import_kv(imported, take(gpu->export_kv(g)), "gpu"));
  SLIMKV_ASSERT_OK(cpu->step(std::vector<StepItem>{{own, prompt, StepOutput::kNone}}, out));
  std::vector<std::vector<float>> on_gpu, on_cpu, cpu_own;
  const auto gpu_tokens = greedy(*gpu, g, next, 8, &on_gpu);
  greedy(*cpu, imported, next, 8, &on_cpu);
  greedy(*cpu, own, next, 8, &cpu_own);
  double imported_error = 0, own_error = 0;
  for (size_t i = 0; i < on_gpu.size(); ++i) {
    // The same inputs on all three (the GPU's greedy tokens would differ only at near-ties).
    imported_error = std::max(imported_error, relative_max_error(on_cpu[i], on_gpu[i]));
    own_error = std::max(own_error, relative_max_error(cpu_own[i], on_gpu[i]));
  }
  std::printf("%s, GPU KV imported into the CPU: max error / max|logit| against the GPU %.2e (the CPU's own KV: %.2e)\n",
              spec.c_str(), imported_error, own_error);
  EXPECT_LT(imported_error, 2e-2);
  EXPECT_LE(imported_error, own_error);
}

TEST_F(CudaEngineTest, ImportsAreRefusedNamingBothSides) {
  auto gpu = load("cuda", "dense"), cpu = load("cpu", "dense"), hack = load("cuda", "hack:bits=2");
  const SequenceId g = take(gpu->add_sequence());
  StepResult out;
  SLIMKV_ASSERT_OK(gpu->step(std::vector<StepItem>{{g, prompt_of(70), StepOutput::kNone}}, out));
  const auto transfer = take(gpu->export_kv(g));
  for (Engine* receiver : {cpu.get(), hack.get()}) {
    const SequenceId r = take(receiver->add_sequence());
    const Status status = receiver->import_kv(r, transfer, "gpu dense");
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find(gpu->kv_description()), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(receiver->kv_description()), std::string::npos) << status.message();
    EXPECT_EQ(take(receiver->num_tokens(r)), 0);
  }
}

}  // namespace
}  // namespace slimkv::cuda
