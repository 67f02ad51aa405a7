// `zack` on device "cuda" end to end (engine → model with folded W_V / W_O → kv/cuda/gpu_zack_kv.cc), on
// the bundled model and its committed calibration: zack:r=0 (every dim kept, the rotations alone) equals
// dense within the GPU's rounding; at 50% KV compression the GPU follows the CPU's zack (closer to it than
// to dense), and its blocks take the ranks' bytes. zack followed by hack / quant (gpu_zack_quantized_kv.cc):
// the GPU follows the CPU's logits of the same spec, as the hack-on-GPU tests bound it (much closer to
// them than what the codec itself changes), in one prefill and in prefill chunks over sealed blocks.
// Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load(const std::string& device, const std::string& kv, int prefill_chunk_tokens = 512) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  config.max_sequences = 2;
  config.prefill_chunk_tokens = prefill_chunk_tokens;
  return take(Engine::load(config));
}

// Every logits row of a 150-token prompt (prefill steps of at most `chunk` tokens: the engine's
// prefill_chunk_tokens) and of 20 decode steps fed fixed tokens (prefill and decode kernels both), back to back.
std::vector<float> logits_of(Engine& engine, int chunk = 512) {
  std::vector<int32_t> prompt(150);
  for (int i = 0; i < 150; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  const SequenceId s = take(engine.add_sequence());
  StepResult out;
  std::vector<float> all;
  for (size_t first = 0; first < prompt.size(); first += size_t(chunk)) {
    const std::span<const int32_t> piece(prompt.data() + first, std::min(prompt.size() - first, size_t(chunk)));
    const Status status = engine.step(std::vector<StepItem>{{s, piece, StepOutput::kAllLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  for (int i = 0; i < 20; ++i) {
    const std::vector<int32_t> next = {int32_t((i * 104729 + 7) % 4000)};
    const Status status = engine.step(std::vector<StepItem>{{s, next, StepOutput::kLastLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// Two sequences stepping together: a's 150-token prompt, then a's decode token beside b's 100-token
// prompt in one step (the decode and prefill kernels in one step), then 10 steps decoding both; every
// logits row of the steps after the first, back to back.
std::vector<float> mixed_logits_of(Engine& engine) {
  std::vector<int32_t> prompt(150), other(100);
  for (int i = 0; i < 150; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  for (int i = 0; i < 100; ++i) other[size_t(i)] = int32_t((i * 6007 + 5) % 4000);
  const SequenceId a = take(engine.add_sequence()), b = take(engine.add_sequence());
  StepResult out;
  EXPECT_TRUE(engine.step(std::vector<StepItem>{{a, prompt, StepOutput::kNone}}, out).is_ok());
  std::vector<float> all;
  const std::vector<int32_t> first = {17};
  const Status mixed = engine.step(std::vector<StepItem>{{a, first, StepOutput::kLastLogits}, {b, other, StepOutput::kAllLogits}}, out);
  EXPECT_TRUE(mixed.is_ok()) << mixed.message();
  all.insert(all.end(), out.logits.begin(), out.logits.end());
  for (int i = 0; i < 10; ++i) {
    const std::vector<int32_t> next_a = {int32_t((i * 104729 + 7) % 4000)}, next_b = {int32_t((i * 1299709 + 3) % 4000)};
    const Status status = engine.step(std::vector<StepItem>{{a, next_a, StepOutput::kLastLogits}, {b, next_b, StepOutput::kLastLogits}}, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// Max |a − b| over max |b|.
double relative_max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    difference = std::max(difference, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return difference / scale;
}

class ZackCudaEngineTest : public CudaTest {};

TEST_F(ZackCudaEngineTest, EveryDimKeptEqualsDense) {
  auto dense = load("cuda", "dense"), zack = load("cuda", "zack:r=0");
  ASSERT_TRUE(dense && zack);
  const std::vector<float> want = logits_of(*dense), got = logits_of(*zack);
  ASSERT_EQ(got.size(), want.size());
  const double difference = relative_max_difference(got, want);
  std::printf("zack:r=0 vs dense on the GPU: max |difference| %.2e of max |logit|\n", difference);
  // The rotations are orthonormal: what differs is FP16 rounding of rotated q, k and of the folded weights.
  EXPECT_LT(difference, 1e-2);
}

TEST_F(ZackCudaEngineTest, HalfTheKvFollowsTheCpu) {
  const std::string spec = "zack:rate=0.5";
  auto gpu = load("cuda", spec), cpu = load("cpu", spec), dense = load("cuda", "dense");
  ASSERT_TRUE(gpu && cpu && dense);
  EXPECT_NE(gpu->kv_description().find("zack:"), std::string::npos) << gpu->kv_description();
  const std::vector<float> on_gpu = logits_of(*gpu), on_cpu = logits_of(*cpu), full = logits_of(*dense);
  const double to_cpu = relative_max_difference(on_gpu, on_cpu), to_dense = relative_max_difference(on_gpu, full);
  std::printf("zack:rate=0.5 on the GPU: %.2e from the CPU's zack, %.2e from dense\n", to_cpu, to_dense);
  EXPECT_LT(to_cpu, 2e-2);
  EXPECT_LT(to_cpu, to_dense / 2);
  // The GPU's blocks hold the ranks' dims: about half of dense FP16's bytes.
  const double ratio = double(gpu->kv_budget().bytes_per_block) / double(dense->kv_budget().bytes_per_block);
  EXPECT_GT(ratio, 0.40);
  EXPECT_LT(ratio, 0.56);
}

// zack then a quantizing codec: the reduced K'/V' sealed at each head's ranks. Each spec's GPU logits
// against the CPU's (prompts of one prefill step, and of chunks of 64 whose later chunks read the sealed
// blocks before them, dequantized on the GPU, on the integers on the CPU), bounded as the hack-on-GPU
// tests bound them (llama_cuda_test's QuantizedKvDecodesLikeTheCpuCodec): at most half of what the codec
// itself changes, here the distance of the GPU's zack over FP16 blocks from the CPU's zack+codec.
TEST_F(ZackCudaEngineTest, QuantizedReducedKvFollowsTheCpu) {
  const std::string ranks = "zack:rate=0.5,align=4";
  auto unquantized = load("cuda", ranks);
  ASSERT_TRUE(unquantized);
  const std::vector<float> fp16 = logits_of(*unquantized);
  for (const std::string codec : {"hack:bits=4", "hack:bits=2,pi=64", "hack:bits=4,rot=none", "quant:bits=4,rot=none"}) {
    for (const int chunk : {512, 64}) {
      const std::string spec = ranks + "+" + codec;
      SCOPED_TRACE(str_cat(spec, ", prefill chunks of ", chunk));
      auto gpu = load("cuda", spec, chunk), cpu = load("cpu", spec, chunk);
      ASSERT_TRUE(gpu && cpu);
      const std::vector<float> on_gpu = logits_of(*gpu, chunk), on_cpu = logits_of(*cpu, chunk);
      const double to_cpu = relative_max_difference(on_gpu, on_cpu), codec_effect = relative_max_difference(fp16, on_cpu);
      std::printf("%s, prefill chunks of %d: GPU %.2e from the CPU's; the GPU's zack over FP16 %.2e from it\n", spec.c_str(),
                  chunk, to_cpu, codec_effect);
      EXPECT_LT(to_cpu, 0.5 * codec_effect);
    }
  }
  // A decode row and a prefill chunk in one step, then two sequences decoding together, on hack:bits=4.
  {
    const std::string spec = ranks + "+hack:bits=4";
    auto gpu = load("cuda", spec), cpu = load("cpu", spec), fp16_two = load("cuda", ranks);
    ASSERT_TRUE(gpu && cpu && fp16_two);
    const std::vector<float> on_gpu = mixed_logits_of(*gpu), on_cpu = mixed_logits_of(*cpu), fp16_mixed = mixed_logits_of(*fp16_two);
    ASSERT_EQ(on_gpu.size(), on_cpu.size());
    const double to_cpu = relative_max_difference(on_gpu, on_cpu), codec_effect = relative_max_difference(fp16_mixed, on_cpu);
    std::printf("%s, two sequences, mixed steps: GPU %.2e from the CPU's; the GPU's zack over FP16 %.2e from it\n", spec.c_str(),
                to_cpu, codec_effect);
    EXPECT_LT(to_cpu, 0.5 * codec_effect);
  }
  // The sealed blocks hold each head's ranks: the bytes of hack's blocks at the ranks' dims, about half of
  // hack's at head_dim (rate=0.5), with no padding past a head's rank beyond the layout's 64-byte sections.
  auto reduced = load("cuda", ranks + "+hack:bits=4"), full = load("cuda", "hack:bits=4");
  ASSERT_TRUE(reduced && full);
  const double ratio = double(reduced->kv_budget().bytes_per_block) / double(full->kv_budget().bytes_per_block);
  std::printf("zack:rate=0.5+hack:bits=4 on the GPU: %.3f of hack:bits=4's bytes per block\n", ratio);
  EXPECT_GT(ratio, 0.40);
  EXPECT_LT(ratio, 0.60);
}

// Every dim kept (r=0): zack+hack quantizes q', k', v' in each head's ZACK basis instead of the model's, so
// its codes differ from hack's and the two agree only to the quantization's own size: their distance is
// bounded by twice hack's distance from dense, and each follows the CPU's spec.
TEST_F(ZackCudaEngineTest, EveryDimKeptWithHackIsLikeHack) {
  auto zack = load("cuda", "zack:r=0,align=4+hack:bits=4"), hack = load("cuda", "hack:bits=4"), dense = load("cuda", "dense");
  ASSERT_TRUE(zack && hack && dense);
  const std::vector<float> with_zack = logits_of(*zack), alone = logits_of(*hack), full = logits_of(*dense);
  const double difference = relative_max_difference(with_zack, alone), hack_effect = relative_max_difference(alone, full);
  std::printf("zack:r=0+hack:bits=4 vs hack:bits=4 on the GPU: %.2e; hack:bits=4 vs dense %.2e, zack:r=0+hack vs dense %.2e\n",
              difference, hack_effect, relative_max_difference(with_zack, full));
  EXPECT_LT(difference, 2 * hack_effect);
  EXPECT_LT(relative_max_difference(with_zack, full), 2 * hack_effect);
}

TEST_F(ZackCudaEngineTest, CombinationsNotBuiltAreRefused) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.device = "cuda";
  for (const auto& [spec, named] : std::vector<std::pair<std::string, std::string>>{
           {"zack:r=0.05,align=4+hack:bits=4,klayout=channel,vlayout=token", "zack followed by a codec with klayout=channel"},
           {"zack:r=0.05,align=1+hack:bits=4", "align=4"},  // ranks the codec's blocks cannot hold (the CPU refuses them too)
           {"zack:r=0.05,align=4+hack:bits=4@offload", "zack followed by a quantizing codec with @offload"},
           {"zack:r=0.05@kvpr", "zack"}}) {
    config.kv_spec = spec;
    const auto engine = Engine::load(config);
    ASSERT_FALSE(engine.has_value()) << spec;
    EXPECT_NE(engine.status().message().find(named), std::string::npos) << engine.status().message();
  }
}

}  // namespace
}  // namespace slimkv::cuda
