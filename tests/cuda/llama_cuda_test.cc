// The whole forward pass on the GPU (model/cuda/llama_cuda.h, `--device cuda`) against Hugging Face
// transformers' golden logits (tests/data/models, scripts/golden/make_golden.py) and against the CPU
// backend; greedy generation on the bundled model against the CPU's; batches of unequal sequences
// against the same sequences run alone (Qwen3-MoE's too: each row's experts whatever rows run beside
// it); and bad input refused with the state kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "slimkv/tokenizer.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "slimkv/npy.h"
#include "golden_models.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kSource = slimkv::test::source_dir();
const std::string kBundled = kSource + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load(const std::string& dir, const std::string& device, int chunk = 512,
                             const std::string& kv = "dense") {
  EngineConfig config;
  config.model_dir = dir;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  config.prefill_chunk_tokens = chunk;
  config.max_sequences = 8;
  return take(Engine::load(config));
}

using CudaModelTest = CudaTest;

// The bundled model's held-out text, its first `chars` characters, as the engine tokenizes a prompt.
std::vector<int32_t> heldout_prompt(const Engine& engine, size_t chars) {
  std::ifstream in(kBundled + "/heldout.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(chars);
  return engine.tokenizer()->encode(text, true);
}

// BF16 tolerance (the bar for half-precision weights on the GPU: 2e-2 of max |logit|): the GPU
// rounds activations to the weights' half dtype before every GEMM, the CPU keeps them in FP32. Every
// family the GPU runs: Llama, Mistral, Qwen2, Qwen3 (q/k norms, head_dim 48 stored padded to 64, tied
// embeddings), Qwen3-MoE (routed experts; dense layers among sparse ones, top k renormalised or not)
// and Gemma 3 (150 tokens over its 40-token sliding window; the chunks of 7 start windows mid-chunk).
TEST_F(CudaModelTest, LogitsMatchTransformersAndTheCpuInPrefillDecodeAndChunks) {
  const auto dirs = golden_models();
  ASSERT_GE(dirs.size(), 7u);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto golden = take(read_npy_f32(dir + "/golden_logits.npy"));
    const auto tokens = golden_tokens(dir);
    auto gpu = load(dir, "cuda"), cpu = load(dir, "cpu");
    const auto cpu_logits = take(cpu->new_session()->prefill(tokens, true));
    const auto prefill = take(gpu->new_session()->prefill(tokens, true));
    auto session = gpu->new_session();
    std::vector<float> incremental;
    for (int32_t id : tokens) {
      const auto row = take(session->decode(id));
      incremental.insert(incremental.end(), row.begin(), row.end());
    }
    const auto chunked = take(load(dir, "cuda", 7)->new_session()->prefill(tokens, true));
    const double prefill_error = relative_max_error(prefill, golden.values);
    EXPECT_LT(prefill_error, 2e-2) << "prefill vs transformers";
    EXPECT_LT(relative_max_error(incremental, golden.values), 2e-2) << "decode vs transformers";
    EXPECT_LT(relative_max_error(chunked, golden.values), 2e-2) << "chunked prefill vs transformers";
    EXPECT_LT(relative_max_error(prefill, cpu_logits), 2e-2) << "prefill vs the CPU";
    std::printf("%s: max error / max|logit| vs transformers: prefill %.2e, decode %.2e, chunks of 7 %.2e\n",
                std::filesystem::path(dir).filename().c_str(), prefill_error,
                relative_max_error(incremental, golden.values), relative_max_error(chunked, golden.values));
  }
}

TEST_F(CudaModelTest, GreedyContinuationMatchesTransformers) {
  for (const std::string& dir : golden_models()) {
    SCOPED_TRACE(dir);
    const GoldenGreedy golden = golden_greedy(dir);
    auto engine = load(dir, "cuda");
    EXPECT_EQ(take(greedy_continuation(*engine->new_session(), golden.prompt, golden.generated.size())), golden.generated);
  }
}

// The bundled model (BF16 weights, head_dim 128) generates the CPU's greedy tokens over 64 steps from
// the held-out text, or the first divergence is a near-tie: the CPU's top two logits within what BF16
// rounding of the activations moves them.
TEST_F(CudaModelTest, BundledModelGreedyMatchesTheCpu) {
  auto gpu = load(kBundled, "cuda"), cpu = load(kBundled, "cpu");
  std::ifstream in(kBundled + "/heldout.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(2000);
  const auto prompt = cpu->tokenizer()->encode(text, true);
  auto gpu_session = gpu->new_session(), cpu_session = cpu->new_session();
  auto gpu_logits = take(gpu_session->prefill(prompt)), cpu_logits = take(cpu_session->prefill(prompt));
  for (int step = 0; step < 64; ++step) {
    const int32_t gpu_next = argmax(gpu_logits), cpu_next = argmax(cpu_logits);
    if (gpu_next != cpu_next) {
      std::vector<float> sorted = cpu_logits;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const float margin = sorted[0] - sorted[1];
      std::printf("first divergence at step %d: CPU top-2 margin %.4f\n", step, margin);
      EXPECT_LT(margin, 0.05f * std::fabs(sorted[0]) + 0.05f) << "a divergence that is not a near-tie, step " << step;
      return;
    }
    gpu_logits = take(gpu_session->decode(gpu_next));
    cpu_logits = take(cpu_session->decode(cpu_next));
  }
  std::printf("64 greedy tokens identical on the GPU and the CPU\n");
}

// Sequences of different lengths in one step (prefill chunks and decode tokens mixed) give the logits
// each gives alone, bit for bit; a sequence's blocks come back to the pool when it is removed. The bundled
// model, and Qwen3-MoE's (safetensors in FP32 and FP16, a Q8_0 GGUF file): a row's experts and their
// products do not depend on the rows beside it.
TEST_F(CudaModelTest, BatchOfUnequalSequencesMatchesEachAlone) {
  const std::string golden = kSource + "/tests/data/models/";
  for (const std::string& dir : {kBundled, golden + "qwen3_moe", golden + "qwen3_moe_step2",
                                 kSource + "/tests/data/gguf/qwen3moe_tiny-Q8_0.gguf"}) {
    SCOPED_TRACE(dir);
    auto cpu_model = take(LlamaModel::load(dir));
    CudaModelOptions options;
    options.max_sequences = 4;
    options.max_step_tokens = 512;
    options.max_context_tokens = 1024;
    auto model = take(CudaLlamaModel::upload(cpu_model->config(), cpu_model->weights(), options));
    const int free_at_start = model->free_kv_blocks();
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> id(0, int32_t(cpu_model->config().vocab_size) - 1);
    const std::vector<int> prompt_lengths = {1, 63, 64, 130};
    std::vector<std::vector<int32_t>> prompts;
    for (int n : prompt_lengths) {
      prompts.emplace_back(size_t(n));
      for (int32_t& t : prompts.back()) t = id(rng);
    }
    // Alone: each prompt, then one more token.
    std::vector<std::vector<float>> alone;
    for (const auto& prompt : prompts) {
      const int s = take(model->add_sequence());
      std::vector<float> logits;
      SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{s, prompt}}, false, logits));
      const std::vector<int32_t> next = {7};
      SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{s, next}}, false, logits));
      alone.push_back(logits);
      model->remove_sequence(s);
    }
    EXPECT_EQ(model->free_kv_blocks(), free_at_start);
    // Together: the prompts in one step, then every sequence's next token in one decode step.
    std::vector<int> ids;
    std::vector<SequenceTokens> prefill;
    for (const auto& prompt : prompts) {
      ids.push_back(take(model->add_sequence()));
      prefill.push_back({ids.back(), prompt});
    }
    std::vector<float> logits;
    SLIMKV_ASSERT_OK(model->step(prefill, false, logits));
    const std::vector<int32_t> next = {7};
    std::vector<SequenceTokens> decode;
    for (int s : ids) decode.push_back({s, next});
    SLIMKV_ASSERT_OK(model->step(decode, false, logits));
    const size_t vocab = size_t(cpu_model->config().vocab_size);
    // Every sequence's rows get the bits they get alone (item_products.h, split_rule.h), an MoE layer's
    // too: each sequence's rows take the experts' path they take alone (llama_cuda.cc add_routed_experts).
    for (size_t b = 0; b < prompts.size(); ++b) {
      const std::vector<float> row(logits.begin() + ptrdiff_t(b * vocab), logits.begin() + ptrdiff_t((b + 1) * vocab));
      EXPECT_EQ(row, alone[b]) << "sequence of " << prompt_lengths[b] << " tokens";
    }
    std::vector<int32_t> greedy;
    SLIMKV_ASSERT_OK(model->step_greedy(decode, greedy));
    ASSERT_EQ(greedy.size(), prompts.size());
  }
}

// Session::decode_batch on the GPU: one batched step of sessions of different lengths gives each
// session's own decode logits.
TEST_F(CudaModelTest, EngineDecodeBatchMatchesEachSessionAlone) {
  auto engine = load(kBundled, "cuda");
  std::vector<std::unique_ptr<Session>> batched, alone;
  for (size_t length : {size_t(1), size_t(64), size_t(130)}) {
    const std::vector<int32_t> prompt(length, 42);
    for (auto* sessions : {&batched, &alone}) {
      sessions->push_back(engine->new_session());
      take(sessions->back()->prefill(prompt));
    }
  }
  const std::vector<Session*> step = {batched[0].get(), batched[1].get(), batched[2].get()};
  const std::vector<int32_t> next = {5, 6, 7};
  const auto logits = take(Session::decode_batch(step, next));
  const size_t vocab = size_t(engine->model_config().vocab_size);
  for (size_t i = 0; i < step.size(); ++i) {
    const std::vector<float> row(logits.begin() + ptrdiff_t(i * vocab), logits.begin() + ptrdiff_t((i + 1) * vocab));
    EXPECT_LT(relative_max_error(row, take(alone[i]->decode(next[i]))), 1e-3) << "session " << i;
  }
}

TEST_F(CudaModelTest, BadStepsAreRefusedAndChangeNothing) {
  auto cpu_model = take(LlamaModel::load(kBundled));
  CudaModelOptions options;
  options.max_sequences = 2;
  options.max_step_tokens = 80;
  options.max_context_tokens = 128;
  const ModelConfig& config = cpu_model->config();
  // 3 blocks of the bundled model: layers · KV heads · (K + V) · block tokens · head_dim · FP16.
  options.kv_cache_bytes = size_t(3 * config.num_layers * config.num_kv_heads * 2 * 64 * config.head_dim * 2);
  auto model = take(CudaLlamaModel::upload(cpu_model->config(), cpu_model->weights(), options));
  ASSERT_EQ(model->kv_cache_blocks(), 3);
  const int a = take(model->add_sequence()), b = take(model->add_sequence());
  EXPECT_FALSE(model->add_sequence().has_value());
  std::vector<float> logits;
  const std::vector<int32_t> ok(40, 5), too_long(81, 5), bad_id = {5, 8192};
  const auto refused = [&](std::vector<SequenceTokens> batch, const char* expected) {
    const Status status = model->step(batch, false, logits);
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find(expected), std::string::npos) << status.message();
  };
  refused({{a, bad_id}}, "outside the vocabulary");
  refused({{a, too_long}}, "max_step_tokens");
  refused({{a, ok}, {a, ok}}, "twice in one step");
  refused({{5, ok}}, "not a sequence");
  SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{a, ok}, {b, ok}}, false, logits));  // 2 blocks
  SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{a, ok}}, false, logits));           // a: 80 tokens, 3rd block
  refused({{b, ok}}, "KV cache is full");
  refused({{a, std::vector<int32_t>(49, 5)}}, "more than the context");
  EXPECT_EQ(model->num_tokens(a), 80);
  EXPECT_EQ(model->num_tokens(b), 40);
  // The sequences still run after the refusals: b's tokens fill its block exactly.
  SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{b, std::vector<int32_t>(24, 5)}}, false, logits));
  EXPECT_EQ(model->num_tokens(b), 64);
}

TEST_F(CudaModelTest, EngineRefusesWhatTheGpuDoesNotRun) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.device = "cuda";
  for (const auto& [spec, named] : std::vector<std::pair<std::string, std::string>>{
           {"zack:r=0.1,align=4+hack:bits=4,klayout=channel,vlayout=token", "zack followed by a codec with klayout=channel"},
           {"hack:kbits=4,vbits=2,rot=none", "kbits != vbits"},
           {"hack:bits=4,rot=none,prefill=quantized", "prefill=quantized"},
           {"oracle:topk=0.2", "selector"},
           {"quant:bits=2,klayout=channel,vlayout=token,rot=none", "quant with klayout=channel"},
           {"dense@offload:cache=128", "do not apply"},
           {"dense:dtype=bf16", "bf16"}}) {
    config.kv_spec = spec;
    const auto engine = Engine::load(config);
    ASSERT_FALSE(engine.has_value()) << spec;
    EXPECT_NE(engine.status().message().find(named), std::string::npos) << engine.status().message();
  }
  config.kv_spec = "dense";
  config.device = "tpu";
  EXPECT_FALSE(Engine::load(config).has_value());
}

// hack / quant on the GPU: decode through the sealed blocks (bytes as the CPU codec seals them, the
// kernels held to the CPU references in quantized_attention_test). End to end the GPU's K/V differ
// from the CPU's by FP16 rounding, which flips some codes, so logits are compared by distance: the
// GPU codec's must be much closer to the CPU codec's than dense logits are (the quantization itself).
TEST_F(CudaModelTest, QuantizedKvDecodesLikeTheCpuCodec) {
  auto dense = load(kBundled, "cpu");
  const auto prompt = heldout_prompt(*dense, 1500);
  for (const char* spec : {"hack:bits=4,rot=none", "quant:bits=4,rot=none", "hack:bits=2,rot=none,round=nearest",
                           "hack:bits=2",  // the default: rot=hadamard, round=nearest
                           "hack:bits=2,klayout=channel,vlayout=token",  // KIVI's layouts (issue 28)
                           "hack:bits=2,klayout=channel,kgroup=32,vlayout=token,vgroup=32,range=sym,rot=none"}) {
    SCOPED_TRACE(spec);
    auto gpu = load(kBundled, "cuda", 512, spec), cpu = load(kBundled, "cpu", 512, spec);
    auto gpu_session = gpu->new_session(), cpu_session = cpu->new_session(), dense_session = dense->new_session();
    // One token at a time, so both sessions seal the same blocks at the same steps; mean over tokens
    // of max |a − b| / max |b|.
    double gpu_vs_cpu = 0, dense_vs_cpu = 0;
    for (int32_t id : prompt) {
      const auto c = take(cpu_session->decode(id));
      gpu_vs_cpu += relative_max_error(take(gpu_session->decode(id)), c) / double(prompt.size());
      dense_vs_cpu += relative_max_error(take(dense_session->decode(id)), c) / double(prompt.size());
    }
    std::printf("%s over %zu tokens, mean max error / max|logit| against the CPU codec: GPU codec %.2e, dense %.2e\n",
                spec, prompt.size(), gpu_vs_cpu, dense_vs_cpu);
    EXPECT_LT(gpu_vs_cpu, 0.5 * dense_vs_cpu);
  }
}

// Prefill in chunks over quantized KV: each chunk reads the sealed blocks before it (hack over HACK's
// layout: on INT8 tensor cores; quant, and hack over KIVI's: dequantized in the FP16 kernel) and its own tokens exactly, as the CPU codec's
// prefill=exact does. Chunks of 64 start at block boundaries, and every token's logits must be much
// closer to the CPU codec's than dense logits are. Chunks of 100 do not: the GPU then also reads the
// block a chunk starts in exactly (it is still in the FP16 window), where the CPU reads it sealed once
// the chunk fills it; the GPU's logits must then lie closer to the CPU codec's than dense ones do, and
// closer to dense than the CPU codec's do (fewer tokens read quantized).
TEST_F(CudaModelTest, QuantizedKvPrefillsInChunksLikeTheCpuCodec) {
  auto dense = load(kBundled, "cpu");
  const auto prompt = heldout_prompt(*dense, 2500);
  const auto dense_logits = take(dense->new_session()->prefill(prompt, true));
  const size_t vocab = dense_logits.size() / prompt.size();
  const auto row = [&](const std::vector<float>& all, size_t t) {
    return std::vector<float>(all.begin() + ptrdiff_t(t * vocab), all.begin() + ptrdiff_t((t + 1) * vocab));
  };
  for (const char* spec : {"hack:bits=4,rot=none", "quant:bits=4,rot=none", "hack:bits=2", "quant:bits=2,rot=none",
                           "hack:bits=2,klayout=channel,vlayout=token"}) {
    for (const int chunk : {64, 100}) {
      SCOPED_TRACE(str_cat(spec, ", chunks of ", chunk));
      auto gpu = load(kBundled, "cuda", chunk, spec), cpu = load(kBundled, "cpu", chunk, spec);
      const auto g = take(gpu->new_session()->prefill(prompt, true));
      const auto c = take(cpu->new_session()->prefill(prompt, true));
      ASSERT_EQ(g.size(), dense_logits.size());
      double gpu_vs_cpu = 0, dense_vs_cpu = 0, gpu_vs_dense = 0, cpu_vs_dense = 0;
      for (size_t t = 0; t < prompt.size(); ++t) {
        const auto d = row(dense_logits, t);
        gpu_vs_cpu += relative_max_error(row(g, t), row(c, t)) / double(prompt.size());
        dense_vs_cpu += relative_max_error(d, row(c, t)) / double(prompt.size());
        gpu_vs_dense += relative_max_error(row(g, t), d) / double(prompt.size());
        cpu_vs_dense += relative_max_error(row(c, t), d) / double(prompt.size());
      }
      std::printf("%s, chunks of %d, %zu tokens: mean max error / max|logit| against the CPU codec: GPU codec %.2e, "
                  "dense %.2e; against dense: GPU codec %.2e, CPU codec %.2e\n", spec, chunk, prompt.size(), gpu_vs_cpu,
                  dense_vs_cpu, gpu_vs_dense, cpu_vs_dense);
      if (chunk % kCudaBlockTokens == 0) {
        EXPECT_LT(gpu_vs_cpu, 0.5 * dense_vs_cpu);
      } else {
        EXPECT_LT(gpu_vs_cpu, dense_vs_cpu);
        EXPECT_LT(gpu_vs_dense, cpu_vs_dense);
      }
    }
  }
}

}  // namespace
}  // namespace slimkv::cuda
