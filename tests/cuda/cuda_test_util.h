// What the CUDA tests share: a fixture that skips without a usable GPU, FP16-rounded random data and
// unwrapping Expected values.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "slimkv/status.h"
#include "util/half.h"

namespace slimkv::cuda {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status usable = device_usable();
    if (!usable) GTEST_SKIP() << "CUDA tests skipped: " << usable.message();
  }
};

// A batch of sequences run through an attention kernel as the engine steps them: a first step of
// prefill_tokens per sequence, then steps of later_tokens (1: decode) until each holds its length.
struct AttentionStepCase {
  std::vector<int> lengths;  // tokens of each sequence
  int prefill_tokens;        // the first step's tokens per sequence
  int num_heads, num_kv_heads, head_dim;
  int later_tokens = 1;      // each later step's tokens per sequence (1: decode)
  std::string name(std::string_view kernel) const {
    std::string lens;
    for (int n : lengths) lens += (lens.empty() ? "" : ",") + std::to_string(n);
    return str_cat(kernel, "(lengths=", lens, ",prefill=", prefill_tokens, ",later=", later_tokens,
                   ",heads=", num_heads, "/", num_kv_heads, ",d=", head_dim, ")");
  }
};

// FP16-rounded normal values: both sides see exactly what the GPU stores.
inline std::vector<uint16_t> random_halves(size_t n, float stddev, std::mt19937& rng, std::vector<float>& as_float) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<uint16_t> halves(n);
  as_float.resize(n);
  for (size_t i = 0; i < n; ++i) {
    halves[i] = float_to_fp16(normal(rng));
    as_float[i] = fp16_to_float(halves[i]);
  }
  return halves;
}

// Asserts that a Status is ok, showing its message when not.
#define SLIMKV_ASSERT_OK(expr)                          \
  do {                                                  \
    const ::slimkv::Status slimkv_status_ = (expr);     \
    ASSERT_TRUE(slimkv_status_.is_ok()) << slimkv_status_.message(); \
  } while (0)

template <typename T>
T take(Expected<T> value) {
  EXPECT_TRUE(value.has_value()) << value.status().message();
  return value.take();
}

// A device copy of `host` (the test fails if it cannot be made).
template <typename T>
DeviceArray<T> on_device(const std::vector<T>& host) {
  auto array = take(DeviceArray<T>::allocate(host.size(), "test"));
  EXPECT_TRUE(array.upload(host.data(), host.size()).is_ok());
  return array;
}

// The device array's values, after the kernels launched so far have finished.
template <typename T>
std::vector<T> on_host(const DeviceArray<T>& device) {
  std::vector<T> host(device.size());
  EXPECT_TRUE(device_synchronize("test kernels").is_ok());
  EXPECT_TRUE(device.download(host.data(), host.size()).is_ok());
  return host;
}

}  // namespace slimkv::cuda
