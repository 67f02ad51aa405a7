// `hack` and `quant` KV on the GPU (backend/cuda/quantized_kv_pool.h, attention/cuda/quantized_attention.cu):
//   sealing: byte-identical to the CPU codec (quantize_block) for the same seeds: stochastic and nearest
//     rounding, 2/4/8 bits, head dims 64/128, blocks filled over several steps;
//   decode attention: hack against the FP64 HACK reference (attend_hack_block_reference over the sealed
//     blocks, exact attention over the open FP16 block), quant against FP64 attention over the
//     dequantized blocks; one token, whole and partial blocks, GQA 1..8, batches of unequal lengths,
//     many splits. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/hack_reference.h"
#include "attention/reference.h"
#include "backend/cuda/paged_kv_cache.h"
#include "backend/cuda/quantized_kv_pool.h"
#include "cuda_test_util.h"
#include "util/half.h"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr uint64_t kStoreSeed = 0x5eed5eedull;
constexpr int kLayer = 1;  // of two: the per-layer offsets are exercised

// A cache and a sealed pool filled with random FP16 K/V: sequence b holds lengths[b] tokens, written
// in steps of at most `step_tokens` per sequence, sealing after each step.
struct Filled {
  std::unique_ptr<CudaPagedKvCache> cache;
  std::unique_ptr<CudaQuantizedKvPool> pool;
  std::vector<int> ids;
  std::vector<std::vector<float>> k, v;  // per sequence [tokens, kv_heads, d], as stored (FP16-rounded)
};

Filled fill(const std::vector<int>& lengths, int step_tokens, int num_kv_heads, int d, const QuantizationConfig& config,
            bool hack, std::mt19937& rng) {
  Filled f;
  const int batch = int(lengths.size()), width = num_kv_heads * d;
  const int max_len = *std::max_element(lengths.begin(), lengths.end());
  const int blocks_per_sequence = (max_len + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const CudaKvShape shape{2, num_kv_heads, d, batch * blocks_per_sequence + 3, batch + 1, blocks_per_sequence,
                          step_tokens * batch};
  f.cache = take(CudaPagedKvCache::create(shape));
  f.pool = take(CudaQuantizedKvPool::create(shape, config, hack, kStoreSeed));
  if (!f.cache || !f.pool) return f;
  const int scratch = take(f.cache->sequences().add_sequence());  // recycled, non-contiguous blocks for the real ones
  EXPECT_TRUE(f.cache->begin_step({scratch}, {1}).is_ok());
  for (int b = 0; b < batch; ++b) f.ids.push_back(take(f.cache->sequences().add_sequence()));
  f.cache->sequences().remove_sequence(scratch);
  f.k.resize(size_t(batch));
  f.v.resize(size_t(batch));
  auto k_step = take(DeviceArray<uint16_t>::allocate(size_t(shape.max_step_tokens) * width, "test"));
  auto v_step = take(DeviceArray<uint16_t>::allocate(size_t(shape.max_step_tokens) * width, "test"));
  for (;;) {
    std::vector<int> sequences, counts;
    std::vector<uint16_t> k_new, v_new;
    std::vector<float> k_float, v_float;
    for (int b = 0; b < batch; ++b) {
      const int have = int(f.k[size_t(b)].size()) / width;
      const int n = std::min(step_tokens, lengths[size_t(b)] - have);
      if (n == 0) continue;
      sequences.push_back(f.ids[size_t(b)]);
      counts.push_back(n);
      auto k = random_halves(size_t(n) * width, 1.5f, rng, k_float);
      auto v = random_halves(size_t(n) * width, 1.0f, rng, v_float);
      k_new.insert(k_new.end(), k.begin(), k.end());
      v_new.insert(v_new.end(), v.begin(), v.end());
      f.k[size_t(b)].insert(f.k[size_t(b)].end(), k_float.begin(), k_float.end());
      f.v[size_t(b)].insert(f.v[size_t(b)].end(), v_float.begin(), v_float.end());
    }
    if (sequences.empty()) break;
    EXPECT_TRUE(f.cache->begin_step(sequences, counts).is_ok());
    EXPECT_TRUE(k_step.upload(k_new.data(), k_new.size()).is_ok());
    EXPECT_TRUE(v_step.upload(v_new.data(), v_new.size()).is_ok());
    EXPECT_TRUE(f.cache->append(kLayer, k_step.data(), v_step.data()).is_ok());
    const Status sealed = f.pool->seal_filled_blocks(kLayer, *f.cache, sequences, counts);
    EXPECT_TRUE(sealed.is_ok()) << sealed.message();
  }
  EXPECT_TRUE(device_synchronize("fill").is_ok());
  return f;
}

// Block `ordinal` of sequence b, head h, as the GPU sealed it.
std::vector<uint8_t> download_block(const Filled& f, int b, int h, int ordinal) {
  const QuantizedKvView view = f.pool->view(kLayer, f.cache->view(kLayer).block_tables);
  const int index = f.cache->sequences().blocks(f.ids[size_t(b)])[size_t(ordinal)];
  std::vector<uint8_t> block(size_t(view.offsets.block_bytes));
  const size_t offset = (size_t(index) * f.cache->shape().num_kv_heads + h) * view.offsets.block_bytes;
  EXPECT_TRUE(copy_to_host(block.data(), view.blocks + offset, block.size()).is_ok());
  return block;
}

// Rows [first, first + n) of head h of a sequence's [tokens, kv_heads, d] array.
std::vector<float> head_rows(const std::vector<float>& all, int kv_heads, int d, int h, int first, int n) {
  std::vector<float> rows(size_t(n) * d);
  for (int t = 0; t < n; ++t) {
    std::memcpy(&rows[size_t(t) * d], &all[(size_t(first + t) * kv_heads + h) * d], size_t(d) * sizeof(float));
  }
  return rows;
}

struct SealCase {
  int k_bits, v_bits, head_dim;
  Rounding rounding;
};

TEST_F(CudaTest, SealingMatchesTheCpuCodecByteForByte) {
  const std::vector<SealCase> cases = {{2, 2, 128, Rounding::kStochastic}, {4, 4, 128, Rounding::kStochastic},
                                       {8, 8, 128, Rounding::kStochastic}, {2, 2, 64, Rounding::kStochastic},
                                       {4, 8, 64, Rounding::kNearest},     {2, 2, 128, Rounding::kNearest}};
  for (const SealCase& c : cases) {
    SCOPED_TRACE(str_cat("kbits ", c.k_bits, " vbits ", c.v_bits, " d ", c.head_dim,
                         c.rounding == Rounding::kStochastic ? " stochastic" : " nearest"));
    std::mt19937 rng(unsigned(c.k_bits * 1000 + c.v_bits * 100 + c.head_dim));
    QuantizationConfig config;
    config.k_bits = c.k_bits;
    config.v_bits = c.v_bits;
    config.rounding = c.rounding;
    const int kv_heads = 3;
    const std::vector<int> lengths = {200, 64, 131};
    Filled f = fill(lengths, 50, kv_heads, c.head_dim, config, true, rng);
    ASSERT_TRUE(f.cache && f.pool);
    const QuantizedBlockLayout& layout = f.pool->layout();
    std::vector<uint8_t> expected(layout.block_bytes);
    int compared = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      for (int ordinal = 0; ordinal < lengths[b] / kCudaBlockTokens; ++ordinal) {
        for (int h = 0; h < kv_heads; ++h) {
          const auto k = head_rows(f.k[b], kv_heads, c.head_dim, h, ordinal * kCudaBlockTokens, kCudaBlockTokens);
          const auto v = head_rows(f.v[b], kv_heads, c.head_dim, h, ordinal * kCudaBlockTokens, kCudaBlockTokens);
          quantize_block(layout, k.data(), v.data(), block_seal_seed(kStoreSeed, kLayer, h, ordinal), expected.data());
          const std::vector<uint8_t> got = download_block(f, int(b), h, ordinal);
          size_t first_difference = 0;
          while (first_difference < got.size() && got[first_difference] == expected[first_difference]) ++first_difference;
          ASSERT_EQ(first_difference, got.size()) << "sequence " << b << " block " << ordinal << " head " << h
                                                  << ": first differing byte " << first_difference << " of " << got.size();
          ++compared;
        }
      }
    }
    EXPECT_EQ(compared, (3 + 1 + 2) * kv_heads);
  }
}

struct DecodeCase {
  std::vector<int> lengths;
  int num_heads, num_kv_heads, head_dim, bits;
  bool hack;
  std::string name() const {
    std::string lens;
    for (int n : lengths) lens += (lens.empty() ? "" : ",") + std::to_string(n);
    return str_cat(hack ? "hack" : "quant", "(lengths=", lens, ",heads=", num_heads, "/", num_kv_heads, ",d=", head_dim,
                   ",bits=", bits, ")");
  }
};

// The FP64 reference of one sequence's decode query (all heads) over its sealed blocks and open tokens.
std::vector<float> reference_output(const DecodeCase& c, const Filled& f, int b, const std::vector<float>& q,
                                    float scale) {
  const int d = c.head_dim, group = c.num_heads / c.num_kv_heads, kv_len = c.lengths[size_t(b)];
  const int sealed = kv_len / kCudaBlockTokens, open_first = sealed * kCudaBlockTokens;
  const QuantizedBlockLayout& layout = f.pool->layout();
  std::vector<float> out(size_t(c.num_heads) * d);
  if (!c.hack) {  // quant: plain attention over the dequantized blocks and the open tokens
    std::vector<float> k = f.k[size_t(b)], v = f.v[size_t(b)], k_block(size_t(kCudaBlockTokens) * d), v_block(k_block.size());
    for (int ordinal = 0; ordinal < sealed; ++ordinal) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const auto block = download_block(f, b, h, ordinal);
        dequantize_block(layout, block.data(), k_block.data(), v_block.data());
        for (int t = 0; t < kCudaBlockTokens; ++t) {
          const size_t at = (size_t(ordinal * kCudaBlockTokens + t) * c.num_kv_heads + h) * d;
          std::memcpy(&k[at], &k_block[size_t(t) * d], size_t(d) * sizeof(float));
          std::memcpy(&v[at], &v_block[size_t(t) * d], size_t(d) * sizeof(float));
        }
      }
    }
    const int position = kv_len - 1;
    attention_reference(q.data(), 1, &position, k.data(), v.data(), kv_len, c.num_heads, c.num_kv_heads, d, d, scale,
                        out.data());
    return out;
  }
  for (int h = 0; h < c.num_kv_heads; ++h) {  // hack: the reference per sealed block, exact over the open block
    std::vector<float> q_rows(size_t(group) * d);
    for (int i = 0; i < group * d; ++i) q_rows[size_t(i)] = q[size_t(h) * group * d + size_t(i)] * scale;
    const std::vector<int> visible(size_t(group), kCudaBlockTokens);
    AttentionPartials partials(group, d);
    for (int ordinal = 0; ordinal < sealed; ++ordinal) {
      const auto block = download_block(f, b, h, ordinal);
      const QueryTile tile{q_rows.data(), group, visible.data(), nullptr};
      attend_hack_block_reference(layout, block.data(), tile, partials, 0);
    }
    const int n_open = kv_len - open_first;
    if (n_open > 0) {
      AttentionPartials open(group, d);
      const auto k = head_rows(f.k[size_t(b)], c.num_kv_heads, d, h, open_first, n_open);
      const auto v = head_rows(f.v[size_t(b)], c.num_kv_heads, d, h, open_first, n_open);
      for (int r = 0; r < group; ++r) {
        std::vector<double> scores(static_cast<size_t>(n_open));
        double max_score = -std::numeric_limits<double>::infinity();
        for (int t = 0; t < n_open; ++t) {
          double dot = 0;
          for (int x = 0; x < d; ++x) dot += double(q_rows[size_t(r) * d + x]) * double(k[size_t(t) * d + x]);
          scores[size_t(t)] = dot;
          max_score = std::max(max_score, dot);
        }
        double sum = 0;
        std::vector<double> acc(size_t(d), 0.0);
        for (int t = 0; t < n_open; ++t) {
          const double weight = std::exp(scores[size_t(t)] - max_score);
          sum += weight;
          for (int x = 0; x < d; ++x) acc[size_t(x)] += weight * double(v[size_t(t) * d + x]);
        }
        open.max(r) = float(max_score);
        open.sum(r) = float(sum);
        for (int x = 0; x < d; ++x) open.acc(r)[x] = float(acc[size_t(x)]);
        partials.merge(r, open, r);
      }
    }
    for (int r = 0; r < group; ++r) partials.write_output(r, &out[(size_t(h) * group + r) * d]);
  }
  return out;
}

void check_decode(const DecodeCase& c) {
  SCOPED_TRACE(c.name());
  const unsigned seed = 777u + unsigned(c.lengths.size() * 131 + c.lengths[0] * 7 + c.head_dim + c.num_heads + c.bits);
  std::mt19937 rng(seed);
  QuantizationConfig config;
  config.k_bits = config.v_bits = c.bits;
  const int batch = int(c.lengths.size()), d = c.head_dim, q_width = c.num_heads * d;
  Filled f = fill(c.lengths, 512, c.num_kv_heads, d, config, c.hack, rng);
  auto attention = take(CudaPagedAttention::create({c.num_heads, c.num_kv_heads, d, batch, batch}));
  ASSERT_TRUE(f.cache && f.pool && attention);
  std::vector<float> q_float;
  const auto q = random_halves(size_t(batch) * q_width, 1.0f, rng, q_float);
  auto q_device = take(DeviceArray<uint16_t>::allocate(q.size(), "test"));
  auto out_device = take(DeviceArray<uint16_t>::allocate(q.size(), "test"));
  ASSERT_TRUE(q_device.upload(q.data(), q.size()).is_ok());
  ASSERT_TRUE(attention->plan({f.ids, c.lengths, std::vector<int>(size_t(batch), 1)}).is_ok());
  ASSERT_TRUE(device_fill_bytes(out_device.data(), 0xff, out_device.bytes()).is_ok());  // NaN: unwritten shows
  const float scale = 1.0f / std::sqrt(float(d));
  const Status ran = attention->run_quantized(f.cache->view(kLayer), f.pool->view(kLayer, f.cache->view(kLayer).block_tables), q_device.data(), scale,
                                              out_device.data());
  ASSERT_TRUE(ran.is_ok()) << ran.message();
  ASSERT_TRUE(device_synchronize("quantized attention").is_ok());
  std::vector<uint16_t> out(q.size());
  ASSERT_TRUE(out_device.download(out.data(), out.size()).is_ok());

  double error_sq = 0, reference_sq = 0;
  for (int b = 0; b < batch; ++b) {
    const std::vector<float> q_b(q_float.begin() + size_t(b) * q_width, q_float.begin() + size_t(b + 1) * q_width);
    const std::vector<float> want = reference_output(c, f, b, q_b, scale);
    for (int x = 0; x < q_width; ++x) {
      const float got = fp16_to_float(out[size_t(b) * q_width + size_t(x)]);
      ASSERT_TRUE(std::isfinite(got)) << "sequence " << b << ", element " << x;
      error_sq += double(got - want[size_t(x)]) * double(got - want[size_t(x)]);
      reference_sq += double(want[size_t(x)]) * double(want[size_t(x)]);
    }
  }
  // FP16 output rounding is ~3e-4 relative; FP32 arithmetic and the odd 8-bit P' code that rounds the
  // other way (the running max differs from the reference's) add little.
  const double relative = std::sqrt(error_sq / reference_sq);
  std::printf("  %s: relative error %.2e\n", c.name().c_str(), relative);
  EXPECT_LT(relative, 2e-3);
}

TEST_F(CudaTest, QuantizedDecodeAttentionMatchesReference) {
  const std::vector<DecodeCase> cases = {
      {{1}, 4, 4, 64, 2, true},                     // one token: only the open block
      {{64}, 8, 2, 128, 2, true},                   // exactly one sealed block, nothing open
      {{65}, 32, 8, 128, 2, true},                  // one block and one token
      {{130, 1, 77, 200, 64}, 32, 8, 128, 2, true},  // unequal batch
      {{97, 33}, 16, 2, 128, 2, true},              // GQA 8
      {{100, 3}, 12, 4, 64, 2, true},               // GQA 3
      {{300, 129}, 8, 8, 64, 4, true},              // GQA 1, 4 bits
      {{3000}, 8, 2, 128, 2, true},                 // many blocks: several splits
      {{2100, 1500, 9}, 32, 8, 128, 8, true},       // the benchmark's heads, 8 bits
      {{1}, 4, 4, 64, 2, false},
      {{65}, 32, 8, 128, 2, false},
      {{130, 1, 77, 200, 64}, 32, 8, 128, 2, false},
      {{97, 33}, 16, 2, 128, 4, false},
      {{100, 3}, 12, 4, 64, 8, false},
      {{3000}, 8, 2, 128, 2, false},
  };
  for (const DecodeCase& c : cases) check_decode(c);
}

TEST_F(CudaTest, QuantizedAttentionRejectsWhatItCannotRun) {
  const CudaKvShape shape{1, 2, 128, 4, 2, 2, 128};
  QuantizationConfig ablation;
  ablation.store_sums = false;
  auto no_sums = CudaQuantizedKvPool::create(shape, ablation, true, 1);
  ASSERT_FALSE(no_sums.has_value());
  EXPECT_NE(no_sums.status().message().find("ablations"), std::string::npos) << no_sums.status().message();
  QuantizationConfig odd;
  odd.k_bits = 3;
  EXPECT_FALSE(CudaQuantizedKvPool::create(shape, odd, true, 1).has_value());

  auto cache = take(CudaPagedKvCache::create(shape));
  auto pool = take(CudaQuantizedKvPool::create(shape, QuantizationConfig{}, true, 1));
  auto attention = take(CudaPagedAttention::create({8, 2, 128, 2, 4}));
  ASSERT_TRUE(cache && pool && attention);
  const int a = take(cache->sequences().add_sequence());
  ASSERT_TRUE(cache->begin_step({a}, {3}).is_ok());
  ASSERT_TRUE(attention->plan({{a}, {3}, {2}}).is_ok());  // two queries: a prefill chunk
  const Status prefill = attention->run_quantized(cache->view(0), pool->view(0, cache->view(0).block_tables), nullptr, 1.0f, nullptr);
  ASSERT_FALSE(prefill.is_ok());
  EXPECT_NE(prefill.message().find("decode only"), std::string::npos) << prefill.message();
}

}  // namespace
}  // namespace slimkv::cuda
