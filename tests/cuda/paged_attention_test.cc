// The GPU's paged FP16 attention (attention/cuda/paged_attention.h over kv/cuda/paged_kv_cache.h)
// against the FP64 reference (attention/reference.h) on the same FP16-rounded inputs: one token,
// partial blocks, many blocks and splits, GQA ratios 1..8, head dims 64/128, batches of sequences of
// unequal lengths stepping together (a prefill chunk, then decode steps or further chunks). Every case
// runs twice: on the CUDA-core kernel alone, and with every multi-query step on the tensor-core prefill
// kernel (attention/cuda/prefill_attention.cuh). Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/reference.h"
#include "kv/cuda/paged_kv_cache.h"
#include "cuda_test_util.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

using PagedCase = AttentionStepCase;

// tensor_core_min_queries: 0 keeps every step on the CUDA-core kernel, 2 takes every multi-query step
// to the tensor-core one (where head_dim allows). window_tokens > 0: a sliding-window layer's attention.
void check(const PagedCase& c, int tensor_core_min_queries, int window_tokens = 0) {
  SCOPED_TRACE(str_cat("tensor_core_min_queries ", tensor_core_min_queries, ", window ", window_tokens));
  SCOPED_TRACE(c.name("paged_attention"));
  const unsigned seed = 20261123u + unsigned(c.lengths.size() * 131 + c.lengths[0] * 7 + c.head_dim + c.num_heads);
  SCOPED_TRACE(str_cat("seed ", seed));
  std::mt19937 rng(seed);
  const int batch = int(c.lengths.size()), d = c.head_dim, kv_width = c.num_kv_heads * d, q_width = c.num_heads * d;
  int max_len = 0, total_len = 0;
  for (int n : c.lengths) max_len = std::max(max_len, n), total_len += n;
  const int max_step = std::max(c.prefill_tokens, c.later_tokens) * batch;

  // Two layers: the test writes and reads layer 1 (the pool's offset per layer is exercised).
  const int blocks_per_sequence = (max_len + kCudaBlockTokens - 1) / kCudaBlockTokens;
  auto cache = take(CudaPagedKvCache::create({2, c.num_kv_heads, d, batch * blocks_per_sequence + 3, batch + 1,
                                              blocks_per_sequence, max_step}));
  auto attention = take(CudaPagedAttention::create({c.num_heads, c.num_kv_heads, d, batch, max_step, tensor_core_min_queries}));
  ASSERT_TRUE(cache && attention);
  // A sequence added and removed first: the real ones get recycled, non-contiguous blocks.
  const int scratch = take(cache->sequences().add_sequence());
  ASSERT_TRUE(cache->begin_step({scratch}, {1}).is_ok());
  std::vector<int> ids;
  for (int b = 0; b < batch; ++b) ids.push_back(take(cache->sequences().add_sequence()));
  cache->sequences().remove_sequence(scratch);

  // Every sequence's whole K/V (as floats, for the reference) and the step buffers on the device.
  std::vector<std::vector<float>> k_all(static_cast<size_t>(batch)), v_all(static_cast<size_t>(batch));
  auto k_step = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * kv_width, "test"));
  auto v_step = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * kv_width, "test"));
  auto q_step = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * q_width, "test"));
  auto out_step = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * q_width, "test"));
  const float scale = 1.0f / std::sqrt(float(d));

  double error_sq = 0, reference_sq = 0;
  int checked_steps = 0;
  for (bool first_step = true;; first_step = false) {
    PagedAttentionBatch step;
    std::vector<uint16_t> k_new, v_new, q_new;
    std::vector<float> q_float, k_float, v_float;
    for (int b = 0; b < batch; ++b) {
      const int have = int(k_all[size_t(b)].size()) / kv_width;
      const int n = std::min(first_step ? c.prefill_tokens : c.later_tokens, c.lengths[size_t(b)] - have);
      if (n == 0) continue;
      step.sequence_ids.push_back(ids[size_t(b)]);
      step.kv_lens.push_back(have + n);
      step.query_counts.push_back(n);
      auto k = random_halves(size_t(n) * kv_width, 1.5f, rng, k_float);  // peaky softmax: max handling shows
      auto v = random_halves(size_t(n) * kv_width, 1.0f, rng, v_float);
      auto q = random_halves(size_t(n) * q_width, 1.0f, rng, q_float);
      k_new.insert(k_new.end(), k.begin(), k.end());
      v_new.insert(v_new.end(), v.begin(), v.end());
      q_new.insert(q_new.end(), q.begin(), q.end());
      k_all[size_t(b)].insert(k_all[size_t(b)].end(), k_float.begin(), k_float.end());
      v_all[size_t(b)].insert(v_all[size_t(b)].end(), v_float.begin(), v_float.end());
    }
    if (step.sequence_ids.empty()) break;
    std::vector<int> new_tokens(step.query_counts);
    ASSERT_TRUE(cache->begin_step(step.sequence_ids, new_tokens).is_ok());
    ASSERT_TRUE(k_step.upload(k_new.data(), k_new.size()).is_ok());
    ASSERT_TRUE(v_step.upload(v_new.data(), v_new.size()).is_ok());
    ASSERT_TRUE(q_step.upload(q_new.data(), q_new.size()).is_ok());
    ASSERT_TRUE(cache->append(1, k_step.data(), v_step.data()).is_ok());
    ASSERT_TRUE(attention->plan(step).is_ok());
    const int most_queries = *std::max_element(step.query_counts.begin(), step.query_counts.end());
    EXPECT_EQ(attention->tensor_cores(), tensor_core_min_queries > 0 && most_queries > 1 && (d == 64 || d == 128));
    ASSERT_TRUE(device_fill_bytes(out_step.data(), 0xff, out_step.bytes()).is_ok());  // NaN: unwritten shows
    const Status ran = attention->run(cache->view(1), q_step.data(), scale, out_step.data(), window_tokens);
    ASSERT_TRUE(ran.is_ok()) << ran.message();
    ASSERT_TRUE(device_synchronize("paged attention").is_ok());
    std::vector<uint16_t> out(q_new.size());
    ASSERT_TRUE(out_step.download(out.data(), out.size()).is_ok());

    // The reference over each sequence's tokens so far, for at most 16 of its new queries (first and
    // last ones: long prefill chunks stay fast to check).
    int query_row = 0;
    for (size_t i = 0; i < step.sequence_ids.size(); ++i) {
      const int b = int(std::find(ids.begin(), ids.end(), step.sequence_ids[i]) - ids.begin());
      const int n = step.query_counts[i], kv_len = step.kv_lens[i];
      std::vector<int> rows;
      for (int j = 0; j < n; ++j) {
        if (j < 8 || j >= n - 8) rows.push_back(j);
      }
      std::vector<float> q_rows, reference(rows.size() * size_t(q_width));
      std::vector<int> positions;
      for (int j : rows) {
        for (int x = 0; x < q_width; ++x) q_rows.push_back(fp16_to_float(q_new[size_t(query_row + j) * q_width + size_t(x)]));
        positions.push_back(kv_len - n + j);
      }
      attention_reference(q_rows.data(), int(rows.size()), positions.data(), k_all[size_t(b)].data(),
                          v_all[size_t(b)].data(), kv_len, c.num_heads, c.num_kv_heads, d, d, scale, reference.data(),
                          window_tokens);
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int x = 0; x < q_width; ++x) {
          const float got = fp16_to_float(out[size_t(query_row + rows[r]) * q_width + size_t(x)]);
          const float want = reference[r * size_t(q_width) + size_t(x)];
          ASSERT_TRUE(std::isfinite(got)) << "query " << rows[r] << " of sequence " << b << ", element " << x;
          error_sq += double(got - want) * double(got - want);
          reference_sq += double(want) * double(want);
        }
      }
      query_row += n;
    }
    ++checked_steps;
  }
  // FP16 output rounding alone is ~3e-4 relative; FP32 accumulation adds little.
  const double relative = std::sqrt(error_sq / reference_sq);
  EXPECT_LT(relative, 2e-3) << "over " << checked_steps << " steps";
}

TEST_F(CudaTest, PagedAttentionMatchesReference) {
  const std::vector<PagedCase> cases = {
      {{1}, 1, 4, 4, 64},                        // one token
      {{64}, 64, 8, 2, 128},                     // exactly one block, prefill
      {{65}, 65, 32, 8, 128},                    // one block and one token
      {{70}, 60, 8, 8, 64},                      // decode across a block boundary, GQA 1
      {{130, 1, 77, 200}, 64, 32, 8, 128},       // unequal batch: prefill chunk, then decode steps
      {{97, 33}, 40, 16, 2, 128},                // GQA 8 (8 query rows per tile)
      {{100, 3}, 50, 12, 4, 64},                 // GQA 3 (rows not a power of two)
      {{90}, 90, 24, 4, 128},                    // GQA 6
      {{50, 20}, 7, 8, 4, 64},                   // GQA 2, short prefill then many decode steps
      {{3000}, 2995, 8, 2, 128},                 // many blocks: several splits in prefill and decode
      {{2100, 1500, 9}, 2048, 32, 8, 128},       // the benchmark's heads, unequal lengths
      {{150, 70}, 80, 4, 2, 32},                 // head_dim 32 (small models)
      {{150, 5}, 70, 4, 2, 16},                  // head_dim 16: 16 tokens per warp load
      {{700}, 100, 32, 8, 128, 150},             // prefill chunks starting mid-block, at a long context
      {{333, 260, 90}, 37, 24, 4, 64, 101},      // GQA 6, unequal chunked batch, d 64
      {{500, 190}, 130, 12, 4, 128, 70},         // GQA 3: 21 positions of a 64-row tile
      {{260}, 260, 16, 16, 64, 1},               // GQA 1: 64 positions per tile, d 64
      {{4100}, 512, 8, 2, 128, 512},             // long chunks, few tiles: split-K on the tensor-core kernel
      {{2049, 3000}, 2048, 32, 8, 128, 512},     // a long decode row beside a chunk: each on its kernel
      {{300, 70}, 100, 8, 2, 256},               // head_dim 256 (Gemma 3 1B-12B): 32 lanes per token, CUDA cores
      {{130}, 130, 4, 1, 256},                   // head_dim 256, GQA 4 (Gemma 3 1B's heads)
  };
  for (const PagedCase& c : cases) {
    check(c, 0);
    check(c, 2);
  }
}

// Sliding-window layers (Gemma 3): each query sees only its last window_tokens tokens. Windows shorter
// and longer than a block, ending mid-block and on a boundary; prefill chunks whose queries' windows
// start in different blocks (a tile's rows mask each its own); decode past several windows; both kernels.
TEST_F(CudaTest, PagedAttentionWithSlidingWindowMatchesReference) {
  const std::vector<std::pair<PagedCase, int>> cases = {
      {{{300}, 300, 8, 2, 128}, 40},            // one prefill, a window under a block
      {{{300}, 200, 8, 2, 64}, 64},             // a window of exactly one block, then decode
      {{{500, 90}, 130, 12, 4, 128, 70}, 100},  // GQA 3, chunks of 70 at unequal lengths
      {{{700, 33}, 64, 4, 2, 32}, 130},         // head_dim 32 (the Gemma 3 fixture's), decode past the window
      {{{260}, 260, 16, 16, 64, 1}, 7},         // GQA 1, a tiny window
      {{{4100}, 512, 8, 2, 128, 512}, 1024},    // long chunks, split-K, a window of 16 blocks
      {{{90}, 90, 4, 4, 16}, 200},              // a window longer than the sequence: all of it
      {{{600}, 64, 4, 1, 256, 64}, 512},        // head_dim 256, Gemma 3 1B's heads and window (512)
  };
  for (const auto& [c, window] : cases) {
    check(c, 0, window);
    check(c, 2, window);
  }
}

TEST_F(CudaTest, UnsupportedShapesAreErrors) {
  auto too_many = CudaPagedAttention::create({32, 2, 128, 1, 1});
  ASSERT_FALSE(too_many.has_value());
  EXPECT_NE(too_many.status().message().find("GQA group 16"), std::string::npos) << too_many.status().message();
  auto odd_dim = CudaPagedAttention::create({8, 8, 96, 1, 1});
  ASSERT_FALSE(odd_dim.has_value());
  EXPECT_NE(odd_dim.status().message().find("head_dim 96"), std::string::npos);
  // A model's other head dims are stored padded to the next size the kernels have.
  EXPECT_EQ(attention_head_dim_for(48), 64);
  EXPECT_EQ(attention_head_dim_for(96), 128);
  EXPECT_EQ(attention_head_dim_for(16), 16);
  EXPECT_EQ(attention_head_dim_for(8), 16);
  EXPECT_EQ(attention_head_dim_for(200), 256);
  EXPECT_EQ(attention_head_dim_for(257), 0);
}

TEST_F(CudaTest, FullPoolIsAnError) {
  auto cache = take(CudaPagedKvCache::create({1, 2, 64, 2, 2, 4, 256}));
  ASSERT_TRUE(cache);
  const int a = take(cache->sequences().add_sequence());
  EXPECT_TRUE(cache->begin_step({a}, {128}).is_ok());
  const Status full = cache->begin_step({a}, {1});
  ASSERT_FALSE(full.is_ok());
  EXPECT_NE(full.message().find("2 blocks are all in use"), std::string::npos) << full.message();
  cache->sequences().remove_sequence(a);
  EXPECT_EQ(cache->sequences().free_blocks(), 2);
}

}  // namespace
}  // namespace slimkv::cuda
