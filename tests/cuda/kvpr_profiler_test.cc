// KVPR's profiler (kv/cuda/kvpr_profiler.h): its two rates against the same work timed here with
// the host's clock (a synchronous cudaMemcpy; cuBLAS called directly, not through CublasGemm), and its
// cache file: reused without measuring, one entry per device/shape/dtype, re-measured on demand, and
// a broken file reported by name and left as it was (those cases need no GPU: the file is read first).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kv/cuda/kvpr_profiler.h"
#include "backend/cuda/random_fill.h"
#include "cuda_test_util.h"
#include "util/mapped_file.h"

namespace slimkv::cuda {
namespace {

using Json = nlohmann::json;
using KvprProfilerTest = CudaTest;

// Llama-3-8B's recompute GEMM: hidden 4096; K and V of 8 KV heads × 128 are 2 · 1024 rows of W_kv.
constexpr int kHidden = 4096, kKvRows = 2048;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// The rates, against timings taken here
// ---------------------------------------------------------------------------------------------

TEST_F(KvprProfilerTest, LinkBandwidthMatchesAPlainTimedMemcpy) {
  const KvprProfile profile = take(measure_kvpr_profile(kHidden, kKvRows, DType::kF16));

  // A synchronous copy of 256 MiB of pinned memory on the host's clock, the best of three after a warm-up.
  const size_t bytes = size_t(256) << 20;
  void* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> host_owner(host, cudaFreeHost);
  auto device = take(DeviceArray<uint8_t>::allocate(bytes, "test"));
  ASSERT_EQ(cudaMemcpy(device.data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  double best_seconds = 1e30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(cudaMemcpy(device.data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    best_seconds = std::min(best_seconds, seconds_since(start));
  }
  const double timed_bytes_per_s = double(bytes) / best_seconds;

  std::printf("%s: link %.2f GB/s (plain cudaMemcpy %.2f GB/s), GEMM %.1f TFLOP/s\n", profile.device.c_str(),
              profile.link_bytes_per_s * 1e-9, timed_bytes_per_s * 1e-9, profile.gemm_flops_per_s * 1e-12);
  EXPECT_GT(profile.link_bytes_per_s, 1e9);
  EXPECT_GE(profile.link_bytes_per_s, 0.5 * timed_bytes_per_s);
  EXPECT_LE(profile.link_bytes_per_s, 2.0 * timed_bytes_per_s);
}

TEST_F(KvprProfilerTest, GemmRateMatchesATimedCublasCall) {
  const KvprProfile profile = take(measure_kvpr_profile(kHidden, kKvRows, DType::kF16));

  // y[rows, kv_rows] = x[rows, hidden] · wᵀ in column-major terms (yᵀ = w · xᵀ), 20 calls on the host's
  // clock after a warm-up.
  const int rows = 16384, calls = 20;
  auto x = take(DeviceArray<uint16_t>::allocate(size_t(rows) * kHidden, "test x"));
  auto w = take(DeviceArray<uint16_t>::allocate(size_t(kKvRows) * kHidden, "test w"));
  auto y = take(DeviceArray<float>::allocate(size_t(rows) * kKvRows, "test y"));
  SLIMKV_ASSERT_OK(fill_random_fp16(x.data(), x.size(), 7, 1.0f));
  SLIMKV_ASSERT_OK(fill_random_fp16(w.data(), w.size(), 8, 0.05f));
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  const std::unique_ptr<cublasContext, cublasStatus_t (*)(cublasHandle_t)> handle_owner(handle, cublasDestroy);
  const float one = 1.0f, zero = 0.0f;
  const auto multiply = [&] {
    return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, kKvRows, rows, kHidden, &one, w.data(), CUDA_R_16F, kHidden,
                        x.data(), CUDA_R_16F, kHidden, &zero, y.data(), CUDA_R_32F, kKvRows, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  };
  for (int call = 0; call < 3; ++call) ASSERT_EQ(multiply(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  for (int call = 0; call < calls; ++call) ASSERT_EQ(multiply(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double timed_flops_per_s = 2.0 * rows * kHidden * kKvRows * calls / seconds_since(start);

  std::printf("GEMM [%d x %d] · [%d x %d]ᵀ: profile %.1f TFLOP/s, timed cuBLAS %.1f TFLOP/s\n", rows, kHidden,
              kKvRows, kHidden, profile.gemm_flops_per_s * 1e-12, timed_flops_per_s * 1e-12);
  EXPECT_GT(profile.gemm_flops_per_s, 1e12);
  EXPECT_GE(profile.gemm_flops_per_s, 0.3 * timed_flops_per_s);
  EXPECT_LE(profile.gemm_flops_per_s, 3.0 * timed_flops_per_s);
}

// ---------------------------------------------------------------------------------------------
// The cache file
// ---------------------------------------------------------------------------------------------

// An empty directory of this test's own (removed first, in case an earlier run left it).
std::filesystem::path fresh_directory(const std::string& name) {
  const std::filesystem::path directory =
      std::filesystem::path(::testing::TempDir()) / ("slimkv_kvpr_profiler_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  return directory;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

Json read_json(const std::string& path) { return Json::parse(take(read_text_file(path))); }

// The file's entry for this shape and dtype (nullopt when it has none).
std::optional<Json> entry_for(const std::string& path, int hidden, int kv_rows, const std::string& dtype) {
  const Json file = read_json(path);  // named: a temporary's member would dangle in the loop (C++20)
  for (const Json& entry : file["profiles"]) {
    if (entry["hidden"] == hidden && entry["kv_rows"] == kv_rows && entry["dtype"] == dtype) return entry;
  }
  return std::nullopt;
}

TEST_F(KvprProfilerTest, CacheIsReusedExtendedAndRemeasured) {
  const std::filesystem::path directory = fresh_directory("cache");
  const std::string path = (directory / "nested" / "kvpr_profile.json").string();  // its directory is made

  // Measured and written.
  const KvprProfile first = take(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF16, false));
  EXPECT_NE(first.device.find(", "), std::string::npos) << first.device;  // name, PCI bus id
  EXPECT_EQ(first.dtype, "f16");
  Json file = read_json(path);
  ASSERT_EQ(file["profiles"].size(), 1u);
  EXPECT_EQ(file["profiles"][0]["device"], first.device);
  EXPECT_EQ(file["profiles"][0]["link_bytes_per_s"], first.link_bytes_per_s);
  EXPECT_EQ(file["profiles"][0]["gemm_flops_per_s"], first.gemm_flops_per_s);

  // Loaded, not measured: a figure edited in the file comes back.
  file["profiles"][0]["link_bytes_per_s"] = 12345.0;
  write_text(path, file.dump(2));
  const KvprProfile cached = take(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF16, false));
  EXPECT_EQ(cached.link_bytes_per_s, 12345.0);
  EXPECT_EQ(cached.gemm_flops_per_s, first.gemm_flops_per_s);

  // Another shape, then another dtype: entries of their own, the first kept.
  const KvprProfile other_shape = take(load_or_measure_kvpr_profile(path, 2048, 512, DType::kF16, false));
  EXPECT_EQ(other_shape.hidden, 2048);
  EXPECT_EQ(other_shape.kv_rows, 512);
  EXPECT_GT(other_shape.link_bytes_per_s, 1e9);
  const KvprProfile other_dtype = take(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kBF16, false));
  EXPECT_EQ(other_dtype.dtype, "bf16");
  EXPECT_GT(other_dtype.gemm_flops_per_s, 1e12);
  EXPECT_EQ(read_json(path)["profiles"].size(), 3u);
  ASSERT_TRUE(entry_for(path, 2048, 512, "f16").has_value());
  ASSERT_TRUE(entry_for(path, kHidden, kKvRows, "bf16").has_value());
  EXPECT_EQ(take(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF16, false)).link_bytes_per_s, 12345.0);

  // Re-measured on demand: the entry is replaced, the others kept.
  const KvprProfile remeasured = take(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF16, true));
  EXPECT_GT(remeasured.link_bytes_per_s, 1e9);
  EXPECT_EQ(read_json(path)["profiles"].size(), 3u);
  const std::optional<Json> replaced = entry_for(path, kHidden, kKvRows, "f16");
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ((*replaced)["link_bytes_per_s"], remeasured.link_bytes_per_s);
  EXPECT_EQ((*entry_for(path, 2048, 512, "f16"))["link_bytes_per_s"], other_shape.link_bytes_per_s);

  std::filesystem::remove_all(directory);
}

TEST(KvprProfileCacheFileTest, ABrokenFileIsAnErrorNamingItAndIsLeftAsItWas) {
  const std::filesystem::path directory = fresh_directory("broken");
  const std::string path = (directory / "kvpr_profile.json").string();
  const std::string good_entry =
      R"({"device": "GPU, 0000:01:00.0", "hidden": 4096, "kv_rows": 2048, "dtype": "f16", )"
      R"("link_bytes_per_s": 5e10, "gemm_flops_per_s": 6e14})";
  struct Case {
    const char* what;
    std::string text;
    const char* expected_in_message;
  };
  const Case cases[] = {
      {"truncated", R"({"profiles": [{"device": "GPU", "hidden": 40)", "not valid JSON"},
      {"empty", "", "not valid JSON"},
      {"no list", R"({"profile": []})", "a list \"profiles\""},
      {"missing field", R"({"profiles": [{"device": "GPU", "hidden": 4096, "kv_rows": 2048, "dtype": "f16", )"
                        R"("link_bytes_per_s": 5e10}]})",
       "profiles[0]: field \"gemm_flops_per_s\" is missing, expected a positive number"},
      {"second entry bad", R"({"profiles": [)" + good_entry + R"(, {"device": "GPU", "hidden": "4096"}]})",
       "profiles[1]: field \"hidden\" is \"4096\", expected a positive integer"},
      {"bad dtype", R"({"profiles": [{"device": "GPU", "hidden": 1, "kv_rows": 1, "dtype": "f32"}]})",
       "field \"dtype\" is \"f32\""},
      {"zero rate", R"({"profiles": [{"device": "GPU", "hidden": 1, "kv_rows": 1, "dtype": "f16", )"
                    R"("link_bytes_per_s": 0, "gemm_flops_per_s": 1}]})",
       "field \"link_bytes_per_s\" is 0, expected a positive number"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    write_text(path, c.text);
    for (const bool remeasure : {false, true}) {
      const Expected<KvprProfile> loaded = load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF16, remeasure);
      ASSERT_FALSE(loaded.has_value());
      const std::string message = loaded.status().message();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(c.expected_in_message), std::string::npos) << message;
      EXPECT_EQ(take(read_text_file(path)), c.text);  // never replaced
    }
  }
  std::filesystem::remove_all(directory);
}

TEST(KvprProfileCacheFileTest, BadArgumentsAreErrors) {
  const std::string path = (fresh_directory("arguments") / "kvpr_profile.json").string();
  EXPECT_NE(load_or_measure_kvpr_profile(path, 0, kKvRows, DType::kF16, false).status().message().find("hidden=0"),
            std::string::npos);
  EXPECT_NE(load_or_measure_kvpr_profile(path, kHidden, kKvRows, DType::kF32, false).status().message().find("F32"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(KvprProfileCacheFileTest, DefaultPathFollowsTheEnvironment) {
  // Each variable as it was, restored at the end.
  const char* const names[] = {"SLIMKV_KVPR_PROFILE", "XDG_CACHE_HOME", "HOME"};
  std::optional<std::string> saved[3];
  for (int i = 0; i < 3; ++i) {
    if (const char* value = std::getenv(names[i])) saved[i] = value;
  }
  ::setenv("SLIMKV_KVPR_PROFILE", "/profiles/mine.json", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(default_kvpr_profile_path(), "/profiles/mine.json");
  ::unsetenv("SLIMKV_KVPR_PROFILE");
  EXPECT_EQ(default_kvpr_profile_path(), "/xdg/slimkv/kvpr_profile.json");
  ::setenv("XDG_CACHE_HOME", "", 1);  // empty counts as unset
  EXPECT_EQ(default_kvpr_profile_path(), "/home/someone/.cache/slimkv/kvpr_profile.json");
  for (int i = 0; i < 3; ++i) {
    if (saved[i]) {
      ::setenv(names[i], saved[i]->c_str(), 1);
    } else {
      ::unsetenv(names[i]);
    }
  }
}

}  // namespace
}  // namespace slimkv::cuda
