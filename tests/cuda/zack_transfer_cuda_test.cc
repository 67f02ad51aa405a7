// A `zack` sequence moved out of and into the GPU's cache (kv/cuda/gpu_zack_kv.cc export_sequence /
// import_sequence) in the host store form of the CPU's zack stage over `dense:dtype=f16`: per (layer,
// KV head) blocks of K' [64, k_rank] then V' [64, v_rank] and open rows at the head's ranks. At the
// cache: random ranks 4..d (odd too), a store that holds the host's projection of the K/V filled in
// (k' within the FP16 rounding of the GPU's FP32 projection, v' exact), imported into another sequence
// it exports the same values and a decode step over each gives identical outputs; a store of other
// dims is refused by name; zack@offload likewise, and it refuses steps beyond its staging buffer.
// Through the engine (transfer format version 2: each head's dims): GPU → GPU continues with identical
// logits; GPU and CPU exports of one spec are interchangeable (each device continues from the other's
// within the bounds zack_engine_cuda_test.cc holds the GPU to the CPU); zack@offload gives resident
// zack's logits; the scheduler preempts zack sequences to host memory and every greedy output is the
// request's alone. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>

#include "cuda_test_util.h"
#include "golden_models.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/kv_factory.h"
#include "kv/store.h"
#include "slimkv/engine.h"
#include "slimkv/scheduler.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

// ---------------------------------------------------------------------------------------------------
// The cache
// ---------------------------------------------------------------------------------------------------

constexpr int kLayers = 2, kHeads = 8, kKvHeads = 2, kHeadDim = 64, kMaxStep = 256, kContext = 512;

// A zack cache at random ranks, with the host's copy of its bases.
struct ZackCache {
  std::unique_ptr<GpuKvCache> kv;
  ZackKvOptions options;
  std::vector<size_t> basis_at;  // [layers · KV heads]: the first float of each basis in options.qk_bases
  int k_rank(int l, int g) const { return options.k_ranks[size_t(l * kKvHeads + g)]; }
  int v_rank(int l, int g) const { return options.v_ranks[size_t(l * kKvHeads + g)]; }
  const float* basis(int l, int g) const { return options.qk_bases.data() + basis_at[size_t(l * kKvHeads + g)]; }
  // A host store of one of its sequences: each head at its ranks, FP16 dense blocks (the GPU's pipeline).
  KvStore store() const {
    KvShape shape(kLayers, kKvHeads, kHeadDim, kHeadDim, kContext);
    shape.head_k_dims = options.k_ranks;
    shape.head_v_dims = options.v_ranks;
    return KvStore(shape, take(make_kv_pipeline("dense:dtype=f16")));
  }
};

// host: zack@offload's cache (the pool in pinned host memory; staging_bytes of GPU staging, 0: room for
// every sequence's full context).
ZackCache make_cache(std::mt19937& rng, bool host = false, size_t staging_bytes = 0) {
  ZackCache cache;
  std::uniform_int_distribution<int> rank_of(4, kHeadDim);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(kHeadDim)));
  for (int i = 0; i < kLayers * kKvHeads; ++i) {
    cache.basis_at.push_back(cache.options.qk_bases.size());
    cache.options.k_ranks.push_back(rank_of(rng));
    cache.options.v_ranks.push_back(rank_of(rng));
    for (int e = 0; e < cache.options.k_ranks.back() * kHeadDim; ++e) cache.options.qk_bases.push_back(normal(rng));
  }
  const GpuKvShape shape{.num_layers = kLayers, .num_heads = kHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim,
                         .hidden = kHeads * kHeadDim, .max_sequences = 4, .max_step_tokens = kMaxStep,
                         .context_tokens = kContext};
  cache.kv = host ? take(make_gpu_zack_host_kv(shape, cache.options, KvTierOptions{}, staging_bytes))
                  : take(make_gpu_zack_kv(shape, cache.options, 4 * kContext / kCudaBlockTokens));
  return cache;
}

// FP16-rounded B · x for one head: basis [rank, d] row-major (as zack_attention_test.cc's reference).
std::vector<float> project(const float* basis, int rank, const float* x) {
  std::vector<float> out(static_cast<size_t>(rank));
  for (int r = 0; r < rank; ++r) {
    float sum = 0.0f;
    for (int c = 0; c < kHeadDim; ++c) sum += basis[size_t(r) * kHeadDim + c] * x[c];
    out[size_t(r)] = fp16_to_float(float_to_fp16(sum));
  }
  return out;
}

// Per layer and KV head, token-major rows at the head's ranks: [tokens, rank].
using HeadRows = std::vector<std::vector<std::vector<float>>>;  // [layer][KV head]

// Fills `tokens` random tokens into the empty sequence (begin_fill / fill, as benchmarks build contexts):
// k FP16 [tokens, KV heads, d], v the folded W_V's (first v_rank dims, zeros after); returns what the
// store should hold: k' = B k rounded to FP16, v' = v[:v_rank].
void fill_random(const ZackCache& cache, int sequence, int tokens, std::mt19937& rng, HeadRows& keys, HeadRows& values) {
  keys.assign(kLayers, std::vector<std::vector<float>>(kKvHeads));
  values = keys;
  if (tokens == 0) return;
  auto k_dev = take(DeviceArray<uint16_t>::allocate(size_t(tokens) * kKvHeads * kHeadDim, "k"));
  auto v_dev = take(DeviceArray<uint16_t>::allocate(size_t(tokens) * kKvHeads * kHeadDim, "v"));
  ASSERT_TRUE(cache.kv->begin_fill(sequence, tokens).is_ok());
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> k, v;
    const auto k_halves = random_halves(size_t(tokens) * kKvHeads * kHeadDim, 1.0f, rng, k);
    auto v_halves = random_halves(size_t(tokens) * kKvHeads * kHeadDim, 1.0f, rng, v);
    for (int t = 0; t < tokens; ++t) {
      for (int g = 0; g < kKvHeads; ++g) {
        const size_t row = (size_t(t) * kKvHeads + size_t(g)) * kHeadDim;
        for (int j = cache.v_rank(l, g); j < kHeadDim; ++j) v_halves[row + size_t(j)] = 0;
        const auto kp = project(cache.basis(l, g), cache.k_rank(l, g), k.data() + row);
        keys[size_t(l)][size_t(g)].insert(keys[size_t(l)][size_t(g)].end(), kp.begin(), kp.end());
        values[size_t(l)][size_t(g)].insert(values[size_t(l)][size_t(g)].end(), v.data() + row,
                                            v.data() + row + cache.v_rank(l, g));
      }
    }
    ASSERT_TRUE(k_dev.upload(k_halves.data(), k_halves.size()).is_ok());
    ASSERT_TRUE(v_dev.upload(v_halves.data(), v_halves.size()).is_ok());
    ASSERT_TRUE(cache.kv->fill(l, k_dev.data(), v_dev.data(), nullptr).is_ok());
  }
}

// Every token of (layer, head) of a store as rows [tokens, rank]: its FP16 dense blocks, then its open rows.
void store_rows(const KvStore& store, int l, int g, std::vector<float>& k, std::vector<float>& v) {
  const int kr = store.shape().k_dim_of(l, g), vr = store.shape().v_dim_of(l, g);
  k.clear();
  v.clear();
  for (int b = 0; b < store.num_sealed_blocks(l); ++b) {
    const auto* block = reinterpret_cast<const uint16_t*>(store.sealed_block(l, g, b));
    for (int i = 0; i < kCudaBlockTokens * kr; ++i) k.push_back(fp16_to_float(block[i]));
    for (int i = 0; i < kCudaBlockTokens * vr; ++i) v.push_back(fp16_to_float(block[kCudaBlockTokens * kr + i]));
  }
  const int open = store.open_tokens(l);
  std::vector<float> open_k(size_t(open) * size_t(kr)), open_v(size_t(open) * size_t(vr));
  store.widen_open(l, g, open, open_k.data(), open_v.data());
  k.insert(k.end(), open_k.begin(), open_k.end());
  v.insert(v.end(), open_v.begin(), open_v.end());
}

// One decode step of the sequences, the same new token (q, k, v, drawn from rng) for each; each
// sequence's output rows of every layer [layers][sequence][heads · d] as FP16 bits.
std::vector<std::vector<std::vector<uint16_t>>> decode_step(GpuKvCache& kv, const std::vector<int>& sequences,
                                                            std::mt19937& rng) {
  const size_t n = sequences.size(), q_row = size_t(kHeads) * kHeadDim, kv_row = size_t(kKvHeads) * kHeadDim;
  PagedAttentionBatch batch;
  for (int s : sequences) {
    batch.sequence_ids.push_back(s);
    batch.kv_lens.push_back(kv.sequences().num_tokens(s) + 1);
    batch.query_counts.push_back(1);
  }
  EXPECT_TRUE(kv.begin_step(batch).is_ok());
  std::vector<float> unused;
  const auto q1 = random_halves(q_row, 1.0f, rng, unused), k1 = random_halves(kv_row, 1.0f, rng, unused);
  const auto v1 = random_halves(kv_row, 1.0f, rng, unused);
  std::vector<uint16_t> q, k, v;
  for (size_t i = 0; i < n; ++i) {
    q.insert(q.end(), q1.begin(), q1.end());
    k.insert(k.end(), k1.begin(), k1.end());
    v.insert(v.end(), v1.begin(), v1.end());
  }
  const auto q_dev = on_device(q), k_dev = on_device(k), v_dev = on_device(v);
  auto out_dev = take(DeviceArray<uint16_t>::allocate(n * q_row, "out"));
  std::vector<std::vector<std::vector<uint16_t>>> outputs(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(kv.attend(l, q_dev.data(), k_dev.data(), v_dev.data(), 1.0f / std::sqrt(float(kHeadDim)), out_dev.data()).is_ok());
    const std::vector<uint16_t> out = on_host(out_dev);
    for (size_t i = 0; i < n; ++i) outputs[size_t(l)].emplace_back(out.begin() + long(i * q_row), out.begin() + long((i + 1) * q_row));
  }
  return outputs;
}

using ZackCudaTransferTest = CudaTest;

TEST_F(ZackCudaTransferTest, ExportHoldsTheProjectedKvAndImportContinuesIdentically) {
  for (const bool host : {false, true})
  for (const int tokens : {150, 128, 5, 0}) {  // an open block, whole blocks only, no sealed block, nothing
    const unsigned seed = 20261127u + unsigned(tokens);
    SCOPED_TRACE(str_cat("zack", host ? "@offload" : "", " export/import (tokens=", tokens, ", seed ", seed, ")"));
    std::mt19937 rng(seed);
    const ZackCache cache = make_cache(rng, host);
    ASSERT_TRUE(cache.kv);
    const int scratch = take(cache.kv->add_sequence());  // blocks taken then freed: the sequences' are not in order
    SLIMKV_ASSERT_OK(cache.kv->begin_fill(scratch, 70));
    const int a = take(cache.kv->add_sequence());
    cache.kv->remove_sequence(scratch);
    HeadRows keys, values;
    fill_random(cache, a, tokens, rng, keys, values);

    KvStore exported = cache.store();
    SLIMKV_ASSERT_OK(cache.kv->export_sequence(a, exported));
    std::vector<float> k, v;
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_EQ(exported.num_tokens(l), tokens);
      ASSERT_EQ(exported.num_sealed_blocks(l), tokens / kCudaBlockTokens);
      for (int g = 0; g < kKvHeads; ++g) {
        SCOPED_TRACE(str_cat("layer ", l, " KV head ", g, " ranks ", cache.k_rank(l, g), "/", cache.v_rank(l, g)));
        store_rows(exported, l, g, k, v);
        const std::vector<float>& want_k = keys[size_t(l)][size_t(g)];
        ASSERT_EQ(k.size(), want_k.size());
        ASSERT_EQ(v, values[size_t(l)][size_t(g)]);
        // The GPU's FP32 projection may round a k' to the FP16 neighbour of the host's.
        for (size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(k[i], want_k[i], 2e-3 * std::fabs(want_k[i]) + 1e-4) << "k' " << i;
      }
    }

    const int b = take(cache.kv->add_sequence());
    SLIMKV_ASSERT_OK(cache.kv->import_sequence(b, exported));
    EXPECT_EQ(cache.kv->sequences().num_tokens(b), tokens);
    KvStore again = cache.store();
    SLIMKV_ASSERT_OK(cache.kv->export_sequence(b, again));
    std::vector<float> k_again, v_again;
    for (int l = 0; l < kLayers; ++l) {
      for (int g = 0; g < kKvHeads; ++g) {
        store_rows(exported, l, g, k, v);
        store_rows(again, l, g, k_again, v_again);
        EXPECT_EQ(k, k_again) << "layer " << l << " KV head " << g;
        EXPECT_EQ(v, v_again) << "layer " << l << " KV head " << g;
      }
    }
    // Each alone (one plan for both: the same lengths and ranks), the same new token.
    std::mt19937 rng_a(seed), rng_b(seed);
    const auto out_a = decode_step(*cache.kv, {a}, rng_a), out_b = decode_step(*cache.kv, {b}, rng_b);
    for (int l = 0; l < kLayers; ++l) EXPECT_EQ(out_a[size_t(l)][0], out_b[size_t(l)][0]) << "layer " << l << ": bit-identical";
  }
}

TEST_F(ZackCudaTransferTest, StoresOfOtherDimsAreRefusedByName) {
  std::mt19937 rng(7);
  const ZackCache cache = make_cache(rng);
  ASSERT_TRUE(cache.kv);
  const int a = take(cache.kv->add_sequence());
  KvStore full_width(KvShape(kLayers, kKvHeads, kHeadDim, kHeadDim, kContext), take(make_kv_pipeline("dense:dtype=f16")));
  for (const Status& status : {cache.kv->export_sequence(a, full_width), cache.kv->import_sequence(a, full_width)}) {
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find("ranks"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("KV head"), std::string::npos) << status.message();
  }
  EXPECT_EQ(cache.kv->sequences().num_tokens(a), 0);
}

// zack@offload: a step whose sequences hold more blocks than the GPU staging buffer is refused by
// check_step, naming it, and changes nothing; within it the step runs.
TEST_F(ZackCudaTransferTest, OffloadRefusesStepsBeyondItsStagingBuffer) {
  std::mt19937 rng(11);
  const ZackCache probe = make_cache(rng, /*host=*/true);
  ASSERT_TRUE(probe.kv);
  // Two blocks of staging: the widest layer's block bytes, twice.
  size_t widest = 0;
  for (int l = 0; l < kLayers; ++l) {
    size_t layer_bytes = 0;
    for (int g = 0; g < kKvHeads; ++g) layer_bytes += size_t(probe.k_rank(l, g) + probe.v_rank(l, g)) * kCudaBlockTokens * 2;
    widest = std::max(widest, layer_bytes);
  }
  std::mt19937 same(11);
  const ZackCache cache = make_cache(same, /*host=*/true, 2 * widest);
  ASSERT_TRUE(cache.kv);
  EXPECT_GT(cache.kv->host_bytes(), 0u);
  const int a = take(cache.kv->add_sequence());
  const PagedAttentionBatch too_long{{a}, {150}, {150}};
  const Status refused = cache.kv->check_step(too_long);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("staging buffer"), std::string::npos) << refused.message();
  EXPECT_FALSE(cache.kv->begin_step(too_long).is_ok());
  EXPECT_EQ(cache.kv->sequences().num_tokens(a), 0);
  SLIMKV_ASSERT_OK(cache.kv->check_step({{a}, {128}, {128}}));
}

// ---------------------------------------------------------------------------------------------------
// The engine and the scheduler
// ---------------------------------------------------------------------------------------------------

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load(const std::string& device, const std::string& kv, size_t kv_cache_bytes = 0) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  config.max_sequences = 8;
  config.kv_cache_bytes = kv_cache_bytes;
  return take(Engine::load(config));
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13 + salt * 101) % 4000);
  return tokens;
}

// Every row of a 150-token prompt (one prefill step) and of 20 decode steps fed fixed tokens, for two
// sequences stepping together (the second prompt 70 tokens): zack_engine_cuda_test.cc's run, batched.
std::vector<float> logits_of(Engine& engine) {
  const SequenceId a = take(engine.add_sequence()), b = take(engine.add_sequence());
  const std::vector<int32_t> prompt_a = prompt_of(150, 0), prompt_b = prompt_of(70, 1);
  StepResult out;
  EXPECT_TRUE(engine.step(std::vector<StepItem>{{a, prompt_a, StepOutput::kAllLogits}, {b, prompt_b, StepOutput::kAllLogits}},
                          out).is_ok());
  std::vector<float> all = out.logits;
  for (int i = 0; i < 20; ++i) {
    const std::vector<int32_t> next = {int32_t((i * 104729 + 7) % 4000)};
    const Status status = engine.step(std::vector<StepItem>{{a, next, StepOutput::kLastLogits}, {b, next, StepOutput::kLastLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// zack@offload attends over the same blocks as resident zack, copied from host memory into the staging
// buffer layer by layer: the same logits, bit for bit, prefill and decode; its pool is in host memory.
TEST_F(ZackCudaTransferTest, OffloadGivesTheLogitsOfResidentZack) {
  auto resident = load("cuda", "zack:rate=0.5"), offloaded = load("cuda", "zack:rate=0.5@offload");
  ASSERT_TRUE(resident && offloaded);
  EXPECT_NE(offloaded->kv_description().find("@offload"), std::string::npos) << offloaded->kv_description();
  EXPECT_EQ(offloaded->kv_budget().bytes_per_block, resident->kv_budget().bytes_per_block);
  const std::vector<float> want = logits_of(*resident), got = logits_of(*offloaded);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "bit-identical logits";
}

// The next `steps` decode steps of a sequence fed fixed tokens (the same inputs on every engine
// compared): each step's logits.
std::vector<std::vector<float>> decode_logits(Engine& engine, SequenceId s, int steps) {
  std::vector<std::vector<float>> logits;
  for (int i = 0; i < steps; ++i) {
    const std::vector<int32_t> input = {int32_t((i * 104729 + 7) % 4000)};
    StepResult out;
    const Status status = engine.step(std::vector<StepItem>{{s, input, StepOutput::kLastLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    if (!status.is_ok()) break;
    const auto row = out.logits_of(0);
    logits.emplace_back(row.begin(), row.end());
  }
  return logits;
}

double max_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double error = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) error = std::max(error, relative_max_error(a[i], b[i]));
  return error;
}

// A new sequence holding a prefill of `tokens` prompt tokens.
SequenceId prefilled(Engine& engine, int tokens) {
  const SequenceId s = take(engine.add_sequence());
  StepResult out;
  EXPECT_TRUE(engine.step(std::vector<StepItem>{{s, prompt_of(tokens, 0), StepOutput::kNone}}, out).is_ok());
  return s;
}

TEST_F(ZackCudaTransferTest, ExportImportOnTheGpuContinuesWithIdenticalLogits) {
  for (const char* spec : {"zack:rate=0.5", "zack:rate=0.5@offload"}) {
    for (const int tokens : {150, 128, 5}) {  // an open block, none, no sealed block
      SCOPED_TRACE(str_cat(spec, ", ", tokens, " tokens"));
      auto sender = load("cuda", spec), receiver = load("cuda", spec);
      ASSERT_TRUE(sender && receiver);
      const SequenceId s = prefilled(*sender, tokens);
      const std::vector<uint8_t> transfer = take(sender->export_kv(s));
      const SequenceId r = take(receiver->add_sequence());
      SLIMKV_ASSERT_OK(receiver->import_kv(r, transfer, "sender"));
      EXPECT_EQ(take(receiver->num_tokens(r)), tokens);
      EXPECT_EQ(take(receiver->export_kv(r)), transfer);
      EXPECT_TRUE(decode_logits(*sender, s, 20) == decode_logits(*receiver, r, 20)) << "bit-identical logits";
    }
  }
}

// Each device continues from the other's export of the same prompt as from its own, within the GPU's
// distance to the CPU (zack_engine_cuda_test.cc HalfTheKvFollowsTheCpu: 2e-2 of the largest logit).
TEST_F(ZackCudaTransferTest, GpuAndCpuExportsAreInterchangeable) {
  const std::string spec = "zack:rate=0.5+dense:dtype=f16";  // the pipeline the GPU runs `zack:rate=0.5` as
  auto gpu = load("cuda", spec), cpu = load("cpu", spec);
  ASSERT_TRUE(gpu && cpu);
  ASSERT_EQ(gpu->kv_description(), cpu->kv_description());
  const SequenceId g = prefilled(*gpu, 150), c = prefilled(*cpu, 150);
  const std::vector<uint8_t> from_gpu = take(gpu->export_kv(g)), from_cpu = take(cpu->export_kv(c));
  EXPECT_EQ(from_gpu.size(), from_cpu.size()) << "the same blocks at the same ranks";
  const SequenceId cpu_from_gpu = take(cpu->add_sequence()), gpu_from_cpu = take(gpu->add_sequence());
  SLIMKV_ASSERT_OK(cpu->import_kv(cpu_from_gpu, from_gpu, "gpu"));
  SLIMKV_ASSERT_OK(gpu->import_kv(gpu_from_cpu, from_cpu, "cpu"));
  const auto on_gpu = decode_logits(*gpu, g, 8), on_cpu = decode_logits(*cpu, c, 8);
  const auto cpu_over_gpu_kv = decode_logits(*cpu, cpu_from_gpu, 8), gpu_over_cpu_kv = decode_logits(*gpu, gpu_from_cpu, 8);
  const double cpu_side = max_error(cpu_over_gpu_kv, on_cpu), gpu_side = max_error(gpu_over_cpu_kv, on_gpu);
  std::printf("%s: the CPU over the GPU's KV %.2e from the CPU over its own; the GPU over the CPU's %.2e from the GPU "
              "over its own (the devices apart: %.2e)\n",
              spec.c_str(), cpu_side, gpu_side, max_error(on_gpu, on_cpu));
  EXPECT_LT(cpu_side, 2e-2);
  EXPECT_LT(gpu_side, 2e-2);
}

// Collects each request's tokens; wait() returns once all have finished.
class Outputs {
 public:
  explicit Outputs(size_t count) : tokens_(count), finish_(count) {}
  UpdateCallback callback(size_t index) {
    return [this, index](const RequestUpdate& update) {
      std::lock_guard lock(mutex_);
      tokens_[index].insert(tokens_[index].end(), update.token_ids.begin(), update.token_ids.end());
      if (update.finish) {
        finish_[index] = update.finish;
        ++finished_;
        done_.notify_all();
      }
    };
  }
  std::vector<std::vector<int32_t>> wait() {
    std::unique_lock lock(mutex_);
    done_.wait_for(lock, std::chrono::minutes(3), [&] { return finished_ == tokens_.size(); });
    EXPECT_EQ(finished_, tokens_.size()) << "requests did not finish in time";
    for (const auto& finish : finish_) EXPECT_EQ(finish, FinishReason::kLength);
    return tokens_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<std::optional<FinishReason>> finish_;
  size_t finished_ = 0;
};

// Eight greedy requests in a budget of six blocks: the newest running ones are preempted to host memory
// (zack exports) and resumed (imports), every output as the same request run alone through the same
// scheduler. A mismatch here, with the tests above passing, would be the GPU's arithmetic differing
// between batch compositions at a near-tie, not the KV's move.
TEST_F(ZackCudaTransferTest, PreemptedZackRequestsKeepTheirGreedyOutputs) {
  const size_t block_bytes = load("cuda", "zack:rate=0.5", size_t(1) << 30)->kv_budget().bytes_per_block;
  std::unique_ptr<Engine> engine = load("cuda", "zack:rate=0.5", 6 * block_bytes);
  ASSERT_TRUE(engine);
  ASSERT_EQ(engine->kv_budget().total_blocks, 6);
  std::vector<GenerationRequest> batch;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest request;
    request.prompt = prompt_of(3 + i * 29 % 190, i);
    request.max_tokens = 72;
    request.ignore_eos = true;
    request.sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = uint64_t(i)};
    batch.push_back(std::move(request));
  }
  auto scheduler = take(Scheduler::start(std::move(engine), {}));
  ASSERT_TRUE(scheduler);
  std::vector<std::vector<int32_t>> alone;
  for (const GenerationRequest& request : batch) {
    Outputs one(1);
    ASSERT_TRUE(scheduler->submit(request, one.callback(0)).has_value());
    alone.push_back(one.wait()[0]);
  }
  EXPECT_EQ(scheduler->stats().preemptions_total, 0u) << "one request at a time fits the budget";
  Outputs together(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) ASSERT_TRUE(scheduler->submit(batch[i], together.callback(i)).has_value());
  const std::vector<std::vector<int32_t>> tokens = together.wait();
  for (size_t i = 0; i < batch.size(); ++i) EXPECT_EQ(tokens[i], alone[i]) << "request " << i;
  scheduler->shutdown(ShutdownMode::kFinishAccepted);
  const SchedulerStats stats = scheduler->stats();
  std::printf("zack on the GPU, 8 requests in 6 blocks: %llu preemptions, %llu of them recomputed\n",
              static_cast<unsigned long long>(stats.preemptions_total),
              static_cast<unsigned long long>(stats.preemptions_recomputed_total));
  EXPECT_GT(stats.preemptions_total, 0u) << "the budget must force preemption";
  EXPECT_EQ(stats.preemptions_recomputed_total, 0u) << "every preempted zack sequence went to host memory";
  EXPECT_EQ(stats.kv.free_blocks, stats.kv.total_blocks);
  EXPECT_EQ(stats.host_kv_bytes, 0u);
}

}  // namespace
}  // namespace slimkv::cuda
