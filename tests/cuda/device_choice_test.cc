// `--device cuda:N` (slimkv/device_name.h): an engine on cuda:1 keeps its weights and KV on the second
// visible GPU and leaves the first alone, also when its steps come from a thread that never chose a
// device (a server's threads); it computes what an engine on cuda:0 computes. A GPU index beyond the
// visible ones is refused before the model loads, naming how many there are. The two-GPU test skips,
// saying so, where one GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "cuda_test_util.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
constexpr size_t kKvCacheBytes = size_t(256) << 20;

using DeviceChoiceTest = CudaTest;

TEST_F(DeviceChoiceTest, RefusesAGpuBeyondTheVisibleOnesBeforeLoading) {
  const int count = device_count();
  // The model directory does not exist: the refusal comes first.
  const auto engine = Engine::load({.model_dir = "/nonexistent/model", .device = str_cat("cuda:", count)});
  ASSERT_FALSE(engine);
  const std::string message = engine.status().message();  // a copy: status() is a temporary
  EXPECT_NE(message.find(str_cat("device 'cuda:", count, "': this process sees ", count)), std::string::npos) << message;
  EXPECT_NE(message.find("expected cuda:0"), std::string::npos) << message;
}

// Free memory of visible GPU `gpu`, in bytes (asked on the calling thread, which then is on that GPU).
size_t free_bytes(int gpu) {
  const Status chosen = use_gpu(gpu);
  EXPECT_TRUE(chosen.is_ok()) << chosen.message();
  return take(device_free_memory());
}

// `steps` greedy tokens after `prompt`, every engine call made on a new thread that never chose a device.
std::vector<int32_t> greedy_on_fresh_thread(Engine& engine, const std::vector<int32_t>& prompt, int steps) {
  std::vector<int32_t> tokens;
  std::thread([&] {
    const SequenceId sequence = take(engine.add_sequence());
    std::vector<int32_t> next = prompt;
    for (int s = 0; s < steps; ++s) {
      StepResult out;
      const Status stepped = engine.step(std::vector<StepItem>{{sequence, next, StepOutput::kLastLogits}}, out);
      ASSERT_TRUE(stepped.is_ok()) << stepped.message();
      const std::span<const float> row = out.logits_of(0);
      next = {int32_t(std::max_element(row.begin(), row.end()) - row.begin())};
      tokens.push_back(next[0]);
    }
    engine.remove_sequence(sequence);
  }).join();
  return tokens;
}

TEST_F(DeviceChoiceTest, Cuda1RunsOnTheSecondGpuAndLeavesTheFirstAlone) {
  if (device_count() < 2) {
    GTEST_SKIP() << "cuda:1 needs two visible GPUs; this process sees " << device_count();
  }
  const size_t first_before = free_bytes(0), second_before = free_bytes(1);
  std::unique_ptr<Engine> on_second = take(Engine::load(
      {.model_dir = kBundled, .kv_spec = "dense", .device = "cuda:1", .threads = 2, .max_sequences = 2, .kv_cache_bytes = kKvCacheBytes}));
  EXPECT_EQ(on_second->device().gpu, 1);
  const std::vector<int32_t> prompt = {0, 450, 4996, 1735, 1701, 432, 7204, 975, 278, 7366, 1203};  // ids of the 8192-token vocabulary
  const std::vector<int32_t> second_tokens = greedy_on_fresh_thread(*on_second, prompt, 8);
  const size_t first_after = free_bytes(0), second_after = free_bytes(1);
  // The KV pool alone is kKvCacheBytes on GPU 1; GPU 0 may move by an allocator's rounding, never by
  // a context (~300 MB) or the weights.
  EXPECT_GE(second_before - std::min(second_before, second_after), kKvCacheBytes) << "GPU 1's free memory barely moved";
  EXPECT_LT(first_before - std::min(first_before, first_after), size_t(32) << 20) << "the engine on cuda:1 took GPU 0 memory";

  std::unique_ptr<Engine> on_first = take(Engine::load(
      {.model_dir = kBundled, .kv_spec = "dense", .device = "cuda:0", .threads = 2, .max_sequences = 2, .kv_cache_bytes = kKvCacheBytes}));
  EXPECT_EQ(greedy_on_fresh_thread(*on_first, prompt, 8), second_tokens);
  // Freed on GPU 1 when the engine goes, whichever thread lets it go.
  std::thread([&] { on_second.reset(); }).join();
  EXPECT_GE(free_bytes(1) + (size_t(16) << 20), second_before);
}

}  // namespace
}  // namespace slimkv::cuda
