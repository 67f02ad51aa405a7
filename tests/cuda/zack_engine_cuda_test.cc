// `zack` on device "cuda" end to end (engine → model with folded W_V / W_O → kv/cuda/gpu_zack_kv.cc), on
// the bundled model and its committed calibration: zack:r=0 (every dim kept, the rotations alone) equals
// dense within the GPU's rounding; at 50% KV compression the GPU follows the CPU's zack (closer to it than
// to dense), and its blocks take the ranks' bytes. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::unique_ptr<Engine> load(const std::string& device, const std::string& kv) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  config.max_sequences = 2;
  return take(Engine::load(config));
}

// Every logits row of a 150-token prompt (one prefill step) and of 20 decode steps fed fixed tokens
// (prefill and decode kernels both), back to back.
std::vector<float> logits_of(Engine& engine) {
  std::vector<int32_t> prompt(150);
  for (int i = 0; i < 150; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  const SequenceId s = take(engine.add_sequence());
  StepResult out;
  EXPECT_TRUE(engine.step(std::vector<StepItem>{{s, prompt, StepOutput::kAllLogits}}, out).is_ok());
  std::vector<float> all = out.logits;
  for (int i = 0; i < 20; ++i) {
    const std::vector<int32_t> next = {int32_t((i * 104729 + 7) % 4000)};
    const Status status = engine.step(std::vector<StepItem>{{s, next, StepOutput::kLastLogits}}, out);
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

TEST_F(ZackCudaEngineTest, CombinationsNotBuiltAreRefused) {
  EngineConfig config;
  config.model_dir = kBundled;
  config.device = "cuda";
  for (const char* spec : {"zack:r=0.05,align=4+hack:bits=4", "zack:r=0.05@kvpr"}) {
    config.kv_spec = spec;
    const auto engine = Engine::load(config);
    ASSERT_FALSE(engine.has_value()) << spec;
    EXPECT_NE(engine.status().message().find("zack"), std::string::npos) << engine.status().message();
  }
}

}  // namespace
}  // namespace slimkv::cuda
