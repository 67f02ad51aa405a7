// HACK prefill attention on INT8 tensor cores (attention/cuda/hack_prefill_attention.cuh) against the
// FP64 HACK reference (attend_hack_block_reference over each sealed block, merged: attention/partial.h),
// for batches of unequal sequences (0–40 sealed blocks before the step, 1–300 queries each, open tokens
// between the last sealed block and the step), GQA 2/4/8, 2/4/8 bits, head dims 64/128, one and many
// splits. Blocks are quantized on the CPU (quantize_block) and uploaded in a shuffled order. Skips
// without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/hack_prefill_attention.cuh"
#include "attention/hack_reference.h"
#include "cuda_test_util.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

constexpr int T = kCudaBlockTokens;

struct PrefillCase {
  std::vector<int> sealed_blocks;  // per sequence: blocks wholly before the step
  std::vector<int> queries;        // per sequence: the step's new tokens
  int num_heads, num_kv_heads, head_dim, bits;
  std::string name() const {
    std::string shape;
    for (size_t b = 0; b < queries.size(); ++b) shape += str_cat(b ? "," : "", sealed_blocks[b], "x", queries[b]);
    return str_cat("hack prefill (blocks x queries=", shape, ", heads=", num_heads, "/", num_kv_heads, ", d=", head_dim,
                   ", bits=", bits, ")");
  }
};

void check_prefill(const PrefillCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(unsigned(1000 * c.bits + c.head_dim + 7 * c.num_heads + c.queries[0]));
  const int batch = int(c.queries.size()), d = c.head_dim, kv_heads = c.num_kv_heads, group = c.num_heads / kv_heads;
  QuantizationConfig config;
  config.k_bits = config.v_bits = c.bits;
  const QuantizedBlockLayout layout(config, BlockShape{T, d, d});
  const size_t block_bytes = layout.block_bytes;

  // The pool: every sequence's sealed blocks at shuffled indices (plus one never read).
  const int total_blocks = std::accumulate(c.sealed_blocks.begin(), c.sealed_blocks.end(), 0) + 1;
  std::vector<int> order(static_cast<size_t>(total_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const int max_sealed = *std::max_element(c.sealed_blocks.begin(), c.sealed_blocks.end());
  const int table_stride = max_sealed + 2;
  std::vector<int> tables(size_t(batch) * table_stride, total_blocks - 1);
  std::vector<uint8_t> pool(size_t(total_blocks) * kv_heads * block_bytes, 0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(size_t(T) * d), v(size_t(T) * d);
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    for (int ordinal = 0; ordinal < c.sealed_blocks[size_t(b)]; ++ordinal) {
      const int index = order[size_t(next++)];
      tables[size_t(b) * table_stride + ordinal] = index;
      for (int h = 0; h < kv_heads; ++h) {
        for (float& x : k) x = 1.5f * normal(rng);
        for (float& x : v) x = normal(rng);
        quantize_block(layout, k.data(), v.data(), rng(), &pool[(size_t(index) * kv_heads + h) * block_bytes]);
      }
    }
  }
  // Sequence b: its sealed blocks, then 0..63 open tokens, then the step's queries.
  std::vector<int> ids(static_cast<size_t>(batch)), kv_lens(static_cast<size_t>(batch));
  int total_queries = 0;
  for (int b = 0; b < batch; ++b) {
    ids[size_t(b)] = b;
    kv_lens[size_t(b)] = c.sealed_blocks[size_t(b)] * T + int(rng() % T) + c.queries[size_t(b)];
    total_queries += c.queries[size_t(b)];
  }
  std::vector<float> q_float;
  const auto q = random_halves(size_t(total_queries) * c.num_heads * d, 1.0f, rng, q_float);

  auto attention = take(CudaHackPrefillAttention::create({c.num_heads, kv_heads, d, batch, total_queries}, c.bits));
  ASSERT_TRUE(attention);
  auto pool_device = on_device(pool);
  auto tables_device = on_device(tables);
  auto q_device = on_device(q);
  auto out_device = take(DeviceArray<uint16_t>::allocate(q.size(), "test"));
  SLIMKV_ASSERT_OK(device_fill_bytes(out_device.data(), 0xff, out_device.bytes()));  // NaN: unwritten shows
  SLIMKV_ASSERT_OK(attention->plan({ids, kv_lens, c.queries}));
  PagedKvView kv;
  kv.block_tables = tables_device.data();
  kv.block_table_stride = table_stride;
  kv.num_kv_heads = kv_heads;
  kv.head_dim = d;
  QuantizedKvView sealed;
  sealed.blocks = pool_device.data();
  sealed.block_tables = tables_device.data();
  sealed.k_bits = sealed.v_bits = c.bits;
  sealed.offsets = {int(layout.block_bytes), int(layout.k_mins),   int(layout.k_scales), int(layout.k_sums),
                    int(layout.v_codes),     int(layout.v_mins), int(layout.v_scales), int(layout.v_sums)};
  const float scale = 1.0f / std::sqrt(float(d));
  SLIMKV_ASSERT_OK(attention->run(kv, sealed, q_device.data(), scale, out_device.data()));
  SLIMKV_ASSERT_OK(device_synchronize("HACK prefill attention"));
  const std::vector<uint16_t> out = on_host(out_device);

  // The reference: per sequence and KV head, all its queries' group rows as one tile, block by block.
  double error_sq = 0, reference_sq = 0, max_error = 0, max_reference = 0;
  std::vector<int> visible;
  for (int b = 0, query_begin = 0; b < batch; query_begin += c.queries[size_t(b)], ++b) {
    const int n = c.queries[size_t(b)];
    for (int h = 0; h < kv_heads; ++h) {
      std::vector<float> rows(size_t(n) * group * d);  // row i·group + r: query i, head h·group + r, times scale
      for (int i = 0; i < n; ++i) {
        for (int r = 0; r < group; ++r) {
          for (int x = 0; x < d; ++x) {
            rows[(size_t(i) * group + r) * d + x] = q_float[((size_t(query_begin) + i) * c.num_heads + h * group + r) * d + x] * scale;
          }
        }
      }
      visible.assign(size_t(n) * group, T);
      AttentionPartials partials(n * group, d);
      const QueryTile tile{rows.data(), n * group, visible.data(), nullptr};
      for (int ordinal = 0; ordinal < c.sealed_blocks[size_t(b)]; ++ordinal) {
        const int index = tables[size_t(b) * table_stride + ordinal];
        attend_hack_block_reference(layout, &pool[(size_t(index) * kv_heads + h) * block_bytes], tile, partials, 0);
      }
      std::vector<float> want(static_cast<size_t>(d));
      for (int i = 0; i < n; ++i) {
        for (int r = 0; r < group; ++r) {
          partials.write_output(i * group + r, want.data());
          const uint16_t* got = &out[((size_t(query_begin) + i) * c.num_heads + h * group + r) * d];
          for (int x = 0; x < d; ++x) {
            const float g = fp16_to_float(got[x]);
            ASSERT_TRUE(std::isfinite(g)) << "sequence " << b << ", query " << i << ", head " << h * group + r;
            const double e = double(g) - double(want[size_t(x)]);
            error_sq += e * e;
            reference_sq += double(want[size_t(x)]) * double(want[size_t(x)]);
            max_error = std::max(max_error, std::fabs(e));
            max_reference = std::max(max_reference, std::fabs(double(want[size_t(x)])));
          }
        }
      }
    }
  }
  // Q' is bit-identical on both sides (the same IEEE operations on the same FP32 queries), so the two
  // differ by float rounding only: FP32 Eq. 4 against FP64, the FP16 output (2^-11 relative), and the
  // odd P' code that rounds the other way (the P values differ in their last bits — exp2 in FP32
  // against exp in FP64, another running max with several splits, and the kernel's fast 255 / (hi - lo)
  // — and a code that flips moves one token's weight by 1/255 of the block's range; the FP16-mma
  // corrections carry 22-bit factors). Measured on H100: 2.5e-4 to 2.8e-4 RMS (the FP16 output rounding
  // alone is ~2.4e-4), max error under 2.5e-3 of max |out|.
  const double relative = std::sqrt(error_sq / std::max(reference_sq, 1e-30));
  std::printf("  %s: %d splits, relative RMS error %.2e, max error %.2e (max |out| %.2f)\n", c.name().c_str(),
              attention->num_splits(), relative, max_error, max_reference);
  EXPECT_LT(relative, 2e-3);
  EXPECT_LT(max_error, 1e-2 * std::max(max_reference, 1e-3));
}

TEST_F(CudaTest, HackPrefillAttentionMatchesReference) {
  const std::vector<PrefillCase> cases = {
      {{0, 1, 3, 17, 40}, {5, 1, 300, 40, 129}, 8, 2, 128, 2},  // GQA 4, unequal batch, many splits
      {{12}, {64}, 32, 8, 128, 2},                               // the benchmark's heads
      {{2, 40, 9}, {77, 17, 250}, 8, 1, 128, 4},                 // GQA 8, 4 bits
      {{6, 1}, {300, 200}, 32, 8, 128, 2},                       // many tiles, few splits
      {{5, 1}, {33, 200}, 4, 2, 64, 8},                          // d 64, GQA 2, 8 bits
      {{7, 30}, {64, 3}, 16, 2, 64, 2},                          // d 64, GQA 8
  };
  for (const PrefillCase& c : cases) check_prefill(c);
}

TEST_F(CudaTest, HackPrefillAttentionRejectsWhatItCannotRun) {
  EXPECT_FALSE(CudaHackPrefillAttention::create({8, 2, 96, 1, 4}, 2).has_value());   // head dim
  EXPECT_FALSE(CudaHackPrefillAttention::create({32, 2, 128, 1, 4}, 2).has_value());  // GQA 16
  EXPECT_FALSE(CudaHackPrefillAttention::create({8, 2, 128, 1, 4}, 3).has_value());   // bits
  auto attention = take(CudaHackPrefillAttention::create({8, 2, 128, 2, 8}, 2));
  ASSERT_TRUE(attention);
  EXPECT_FALSE(attention->plan({{0}, {3}, {4}}).is_ok());  // more queries than tokens
  SLIMKV_ASSERT_OK(attention->plan({{0}, {300}, {8}}));
  PagedKvView kv;
  kv.num_kv_heads = 2;
  kv.head_dim = 128;
  QuantizedKvView sealed;
  sealed.k_bits = sealed.v_bits = 4;  // planned for 2
  const Status wrong_bits = attention->run(kv, sealed, nullptr, 1.0f, nullptr);
  ASSERT_FALSE(wrong_bits.is_ok());
  EXPECT_NE(wrong_bits.message().find("2 bits"), std::string::npos) << wrong_bits.message();
}

}  // namespace
}  // namespace slimkv::cuda
