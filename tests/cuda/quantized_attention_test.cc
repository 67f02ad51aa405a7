// `hack` and `quant` KV on the GPU (kv/cuda/quantized_kv_cache.h, kv/cuda/quantized_kv_pool.h,
// CudaPagedAttention::run_quantized):
//   sealing: byte-identical to the CPU codec (quantize_block) for the same seeds: stochastic and nearest
//     rounding, 2/4/8 bits, head dims 64/128, blocks filled over several steps, HACK's layout and KIVI's
//     (K per channel, V per token, their groups, symmetric ranges);
//   decode attention: hack against the FP64 HACK reference (attend_hack_block_reference over the sealed
//     blocks, exact attention over the open FP16 block) in either layout, quant against FP64 attention
//     over the dequantized blocks; one token, whole and partial blocks, GQA 1..8, batches of unequal
//     lengths, many splits;
//   prefill attention (steps of many queries): the same references over the sealed blocks before each
//     sequence's step (hack over KIVI's layouts: dequantized, as the GPU reads them there), exact causal
//     attention from there on (prefill=exact);
//   the cache: FP16 only for unsealed tokens, a full sealed pool refused with nothing changed;
//   ZACK's heads (zack:...+hack / +quant: HeadDims, every (layer, KV head) at its own K and V dims):
//     sealing byte-identical to quantize_block at each head's dims, decode and prefill against the same
//     references per head, on random dims 4..128 (multiples of 4 that split K partitions and 2-bit
//     quads unevenly), GQA, partial blocks, 2/4/8 bits; dims the codec cannot hold refused by name.
// Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/hack_reference.h"
#include "attention/reference.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "cuda_test_util.h"
#include "util/half.h"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr uint64_t kStoreSeed = 0x5eed5eedull;
constexpr int kLayer = 1;  // of two: the per-layer offsets are exercised

// A quantized cache filled with random FP16 K/V: sequence b holds lengths[b] tokens, written in steps
// of at most `step_tokens` per sequence up to lengths[b] - last_step[b], then one step of last_step[b]
// tokens (the step attention then runs for), sealing as they fill blocks. With HeadDims (ZACK's heads)
// each head's dims past its k_dim / v_dim are 0, as the reduced vectors arrive.
struct Filled {
  std::unique_ptr<CudaQuantizedKvCache> cache;
  std::vector<int> ids;
  std::vector<std::vector<float>> k, v;  // per sequence [tokens, kv_heads, d], as stored (FP16-rounded)
  // kLayer's heads: each one's block layout and byte offset in a sealed block of every head (block_stride).
  std::vector<QuantizedBlockLayout> layouts;
  std::vector<size_t> head_offsets;
  size_t block_stride = 0;
};

Filled fill(const std::vector<int>& lengths, const std::vector<int>& last_step, int step_tokens, int num_kv_heads, int d,
            const QuantizationConfig& config, bool hack, std::mt19937& rng, const HeadDims& dims = {}) {
  Filled f;
  const int batch = int(lengths.size()), width = num_kv_heads * d;
  for (int h = 0; h < num_kv_heads; ++h) {
    const size_t i = size_t(kLayer) * num_kv_heads + size_t(h);
    f.layouts.emplace_back(config, BlockShape{kCudaBlockTokens, dims.empty() ? d : dims.k_dims[i], dims.empty() ? d : dims.v_dims[i]});
    f.head_offsets.push_back(f.block_stride);
    f.block_stride += f.layouts.back().block_bytes;
  }
  // Zeros past head h's dims (HeadDims) in rows [n, kv_heads, d].
  const auto narrow = [&](std::vector<uint16_t>& halves, std::vector<float>& floats, bool keys) {
    for (size_t x = 0; x < halves.size() && !dims.empty(); ++x) {
      const size_t h = x / size_t(d) % size_t(num_kv_heads), i = size_t(kLayer) * num_kv_heads + h;
      if (int(x % size_t(d)) >= (keys ? dims.k_dims[i] : dims.v_dims[i])) halves[x] = 0, floats[x] = 0.0f;
    }
  };
  const int max_len = *std::max_element(lengths.begin(), lengths.end());
  const int blocks_per_sequence = (max_len + kCudaBlockTokens - 1) / kCudaBlockTokens;
  int last_tokens = 0;
  for (int n : last_step) last_tokens += n;
  const CudaKvShape shape{2, num_kv_heads, d, batch * blocks_per_sequence + 3, batch + 1, blocks_per_sequence,
                          std::max(step_tokens * batch, last_tokens)};
  f.cache = take(CudaQuantizedKvCache::create(shape, config, hack, kStoreSeed, dims));
  if (!f.cache) return f;
  const int scratch = take(f.cache->add_sequence());  // recycled, non-contiguous blocks for the real ones
  EXPECT_TRUE(f.cache->begin_step({scratch}, {1}).is_ok());
  for (int b = 0; b < batch; ++b) f.ids.push_back(take(f.cache->add_sequence()));
  f.cache->remove_sequence(scratch);
  f.k.resize(size_t(batch));
  f.v.resize(size_t(batch));
  auto k_step = take(DeviceArray<uint16_t>::allocate(size_t(shape.max_step_tokens) * width, "test"));
  auto v_step = take(DeviceArray<uint16_t>::allocate(size_t(shape.max_step_tokens) * width, "test"));
  for (bool last = false; !last;) {
    std::vector<int> sequences, counts;
    std::vector<uint16_t> k_new, v_new;
    std::vector<float> k_float, v_float;
    const auto held = [&](int b) { return int(f.k[size_t(b)].size()) / width; };
    bool filling = false;  // some sequence is short of lengths - last_step
    for (int b = 0; b < batch; ++b) filling = filling || held(b) < lengths[size_t(b)] - last_step[size_t(b)];
    for (int b = 0; b < batch; ++b) {
      const int have = held(b);
      const int n = filling ? std::min(step_tokens, std::max(0, lengths[size_t(b)] - last_step[size_t(b)] - have))
                            : lengths[size_t(b)] - have;
      if (n == 0) continue;
      sequences.push_back(f.ids[size_t(b)]);
      counts.push_back(n);
      auto k = random_halves(size_t(n) * width, 1.5f, rng, k_float);
      auto v = random_halves(size_t(n) * width, 1.0f, rng, v_float);
      narrow(k, k_float, true);
      narrow(v, v_float, false);
      k_new.insert(k_new.end(), k.begin(), k.end());
      v_new.insert(v_new.end(), v.begin(), v.end());
      f.k[size_t(b)].insert(f.k[size_t(b)].end(), k_float.begin(), k_float.end());
      f.v[size_t(b)].insert(f.v[size_t(b)].end(), v_float.begin(), v_float.end());
    }
    last = !filling;  // the step of last_step's tokens ends it
    if (sequences.empty()) break;
    const Status began = f.cache->begin_step(sequences, counts);
    EXPECT_TRUE(began.is_ok()) << began.message();
    EXPECT_TRUE(k_step.upload(k_new.data(), k_new.size()).is_ok());
    EXPECT_TRUE(v_step.upload(v_new.data(), v_new.size()).is_ok());
    const Status appended = f.cache->append(kLayer, k_step.data(), v_step.data());
    EXPECT_TRUE(appended.is_ok()) << appended.message();
  }
  EXPECT_TRUE(device_synchronize("fill").is_ok());
  return f;
}

// Block `ordinal` of sequence b, head h, as the GPU sealed it.
std::vector<uint8_t> download_block(const Filled& f, int b, int h, int ordinal) {
  const QuantizedKvView view = f.cache->sealed_view(kLayer);
  const int index = f.cache->sequences().blocks(f.ids[size_t(b)])[size_t(ordinal)];
  std::vector<uint8_t> block(f.layouts[size_t(h)].block_bytes);
  const size_t offset = size_t(index) * f.block_stride + f.head_offsets[size_t(h)];
  EXPECT_TRUE(copy_to_host(block.data(), view.blocks + offset, block.size()).is_ok());
  return block;
}

// Rows [first, first + n) of head h of a sequence's [tokens, kv_heads, d] array, their first `width`
// dims (the head's own, ZACK's; 0: all d).
std::vector<float> head_rows(const std::vector<float>& all, int kv_heads, int d, int h, int first, int n, int width = 0) {
  const int w = width > 0 ? width : d;
  std::vector<float> rows(size_t(n) * w);
  for (int t = 0; t < n; ++t) {
    std::memcpy(&rows[size_t(t) * w], &all[(size_t(first + t) * kv_heads + h) * d], size_t(w) * sizeof(float));
  }
  return rows;
}

// Random ZACK-like dims for the (layer, KV head)s of two layers: multiples of 4 from 4 to d, most of them
// not multiples of 16 (K partitions and 2-bit quads end inside a head); kLayer's first head has K dims 4,
// its last V dims d.
HeadDims random_head_dims(int num_kv_heads, int d, std::mt19937& rng) {
  std::uniform_int_distribution<int> fours(1, d / 4);
  HeadDims dims;
  for (int i = 0; i < 2 * num_kv_heads; ++i) {
    dims.k_dims.push_back(4 * fours(rng));
    dims.v_dims.push_back(4 * fours(rng));
  }
  dims.k_dims[size_t(kLayer) * num_kv_heads] = 4;
  dims.v_dims[size_t(kLayer + 1) * num_kv_heads - 1] = d;
  return dims;
}

// Which values share a min and scale (QuantizationConfig's layout options); the default: HACK's.
struct Layout {
  bool k_per_channel = false;
  int k_group = 0;
  bool v_per_token = false;
  int v_group = 0;
  bool symmetric = false;

  bool kivi() const { return k_per_channel || v_per_token; }
  void apply(QuantizationConfig& config) const {
    config.k_per_channel = k_per_channel;
    config.k_group = k_group;
    config.v_per_token = v_per_token;
    config.v_group = v_group;
    config.symmetric = symmetric;
  }
  std::string name() const {
    return str_cat(k_per_channel ? str_cat(",klayout=channel,kgroup=", k_group) : "",
                   v_per_token ? str_cat(",vlayout=token,vgroup=", v_group) : "", symmetric ? ",range=sym" : "");
  }
};
const Layout kChannelToken{true, 0, true, 0, false};

struct SealCase {
  int k_bits, v_bits, head_dim;
  Rounding rounding;
  Layout layout = {};
  bool zack = false;  // every (layer, KV head) at random dims of its own (HeadDims)
};

TEST_F(CudaTest, SealingMatchesTheCpuCodecByteForByte) {
  const std::vector<SealCase> cases = {{2, 2, 128, Rounding::kStochastic}, {4, 4, 128, Rounding::kStochastic},
                                       {8, 8, 128, Rounding::kStochastic}, {2, 2, 64, Rounding::kStochastic},
                                       {4, 8, 64, Rounding::kNearest},     {2, 2, 128, Rounding::kNearest},
                                       {2, 2, 128, Rounding::kStochastic, kChannelToken},
                                       {4, 4, 64, Rounding::kNearest, {true, 16, true, 16, true}},
                                       {2, 4, 128, Rounding::kStochastic, {true, 32, false, 0, false}},
                                       {8, 8, 128, Rounding::kNearest, {false, 0, true, 32, true}},
                                       {2, 2, 128, Rounding::kNearest, {false, 0, false, 0, true}},
                                       {2, 2, 128, Rounding::kStochastic, {}, true},
                                       {4, 4, 64, Rounding::kNearest, {}, true},
                                       {8, 8, 128, Rounding::kStochastic, {}, true},
                                       {2, 4, 128, Rounding::kNearest, {}, true},
                                       {2, 2, 128, Rounding::kNearest, {false, 0, false, 0, true}, true}};
  for (const SealCase& c : cases) {
    std::mt19937 rng(unsigned(c.k_bits * 1000 + c.v_bits * 100 + c.head_dim + (c.zack ? 7 : 0)));
    const int kv_heads = 3;
    const HeadDims dims = c.zack ? random_head_dims(kv_heads, c.head_dim, rng) : HeadDims{};
    std::string ranks;
    for (size_t i = 0; i < dims.k_dims.size(); ++i) ranks += str_cat(i == 0 ? " dims " : ",", dims.k_dims[i], "/", dims.v_dims[i]);
    SCOPED_TRACE(str_cat("kbits ", c.k_bits, " vbits ", c.v_bits, " d ", c.head_dim,
                         c.rounding == Rounding::kStochastic ? " stochastic" : " nearest", c.layout.name(), ranks));
    QuantizationConfig config;
    config.k_bits = c.k_bits;
    config.v_bits = c.v_bits;
    config.rounding = c.rounding;
    c.layout.apply(config);
    const std::vector<int> lengths = {200, 64, 131};
    Filled f = fill(lengths, {1, 1, 1}, 50, kv_heads, c.head_dim, config, true, rng, dims);
    ASSERT_TRUE(f.cache);
    int compared = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      for (int ordinal = 0; ordinal < lengths[b] / kCudaBlockTokens; ++ordinal) {
        for (int h = 0; h < kv_heads; ++h) {
          const QuantizedBlockLayout& layout = f.layouts[size_t(h)];
          std::vector<uint8_t> expected(layout.block_bytes);
          const int first = ordinal * kCudaBlockTokens;
          const auto k = head_rows(f.k[b], kv_heads, c.head_dim, h, first, kCudaBlockTokens, layout.shape.k_dim);
          const auto v = head_rows(f.v[b], kv_heads, c.head_dim, h, first, kCudaBlockTokens, layout.shape.v_dim);
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

// A step's attention: sequence b holds lengths[b] tokens after the step, of which queries[b] are the
// step's (empty: decode, one each).
struct AttentionCase {
  std::vector<int> lengths;
  int num_heads, num_kv_heads, head_dim, bits;
  bool hack;
  std::vector<int> queries = {};
  Layout layout = {};
  bool zack = false;  // every (layer, KV head) at random dims of its own (HeadDims), drawn from the case's seed
  std::vector<int> step() const { return queries.empty() ? std::vector<int>(lengths.size(), 1) : queries; }
  // The GPU computes a sequence's n queries on the integers (HACK's Eq. 4) in decode (n = 1: a decode
  // row beside a prefill chunk takes the decode kernel too), and in prefill over HACK's layout at
  // head_dim (ZACK's heads: dequantized into the FP16 tiles, as KIVI's layouts).
  bool integer(int n) const { return hack && (n == 1 || (!layout.kivi() && !zack)); }
  std::string name() const {
    const auto list = [](const std::vector<int>& values) {
      std::string text;
      for (int n : values) text += (text.empty() ? "" : ",") + std::to_string(n);
      return text;
    };
    return str_cat(zack ? "zack+" : "", hack ? "hack" : "quant", "(lengths=", list(lengths), ",queries=", list(step()),
                   ",heads=", num_heads, "/", num_kv_heads, ",d=", head_dim, ",bits=", bits, layout.name(), ")");
  }
};

// The FP64 reference of sequence b's n queries (positions kv_len - n onwards; q [n, num_heads, d]): its
// first `sealed` blocks through the codec (on the integers: attend_hack_block_reference; else
// dequantized), the tokens after them exact, causal.
std::vector<float> reference_output(const AttentionCase& c, const Filled& f, int b, const std::vector<float>& q, int n,
                                    int sealed, float scale) {
  const int d = c.head_dim, group = c.num_heads / c.num_kv_heads, kv_len = c.lengths[size_t(b)];
  const int exact_first = sealed * kCudaBlockTokens, first_position = kv_len - n;
  std::vector<float> out(size_t(n) * c.num_heads * d);  // dims past a ZACK head's v_dim stay 0
  if (!c.integer(n)) {  // plain attention over the dequantized blocks and the exact tokens (0 past a head's dims)
    std::vector<float> k = f.k[size_t(b)], v = f.v[size_t(b)], k_block(size_t(kCudaBlockTokens) * d), v_block(k_block.size());
    for (int ordinal = 0; ordinal < sealed; ++ordinal) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const QuantizedBlockLayout& layout = f.layouts[size_t(h)];
        const int k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
        const auto block = download_block(f, b, h, ordinal);
        dequantize_block(layout, block.data(), k_block.data(), v_block.data());
        for (int t = 0; t < kCudaBlockTokens; ++t) {
          const size_t at = (size_t(ordinal * kCudaBlockTokens + t) * c.num_kv_heads + h) * d;
          std::memcpy(&k[at], &k_block[size_t(t) * k_dim], size_t(k_dim) * sizeof(float));
          std::memcpy(&v[at], &v_block[size_t(t) * v_dim], size_t(v_dim) * sizeof(float));
        }
      }
    }
    std::vector<int> positions(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) positions[size_t(i)] = first_position + i;
    attention_reference(q.data(), n, positions.data(), k.data(), v.data(), kv_len, c.num_heads, c.num_kv_heads, d, d, scale,
                        out.data());
    return out;
  }
  // hack: row r of KV head h is query r / group, head h·group + r % group, over the head's dims.
  const int rows = n * group;
  for (int h = 0; h < c.num_kv_heads; ++h) {
    const QuantizedBlockLayout& layout = f.layouts[size_t(h)];
    const int k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
    std::vector<float> q_rows(size_t(rows) * k_dim);
    for (int r = 0; r < rows; ++r) {
      const float* from = &q[(size_t(r / group) * c.num_heads + size_t(h) * group + size_t(r % group)) * d];
      for (int x = 0; x < k_dim; ++x) q_rows[size_t(r) * k_dim + x] = from[x] * scale;
    }
    const std::vector<int> visible(size_t(rows), kCudaBlockTokens);
    AttentionPartials partials(rows, v_dim);
    for (int ordinal = 0; ordinal < sealed; ++ordinal) {
      const auto block = download_block(f, b, h, ordinal);
      const QueryTile tile{q_rows.data(), rows, visible.data(), nullptr};
      attend_hack_block_reference(layout, block.data(), tile, partials, 0);
    }
    const int n_exact = kv_len - exact_first;
    const auto k = head_rows(f.k[size_t(b)], c.num_kv_heads, d, h, exact_first, n_exact, k_dim);
    const auto v = head_rows(f.v[size_t(b)], c.num_kv_heads, d, h, exact_first, n_exact, v_dim);
    AttentionPartials exact(rows, v_dim);
    for (int r = 0; r < rows; ++r) {
      const int seen = first_position + r / group + 1 - exact_first;  // causal
      if (seen <= 0) continue;
      std::vector<double> scores(static_cast<size_t>(seen));
      double max_score = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < seen; ++t) {
        double dot = 0;
        for (int x = 0; x < k_dim; ++x) dot += double(q_rows[size_t(r) * k_dim + x]) * double(k[size_t(t) * k_dim + x]);
        scores[size_t(t)] = dot;
        max_score = std::max(max_score, dot);
      }
      double sum = 0;
      std::vector<double> acc(size_t(v_dim), 0.0);
      for (int t = 0; t < seen; ++t) {
        const double weight = std::exp(scores[size_t(t)] - max_score);
        sum += weight;
        for (int x = 0; x < v_dim; ++x) acc[size_t(x)] += weight * double(v[size_t(t) * v_dim + x]);
      }
      exact.max(r) = float(max_score);
      exact.sum(r) = float(sum);
      for (int x = 0; x < v_dim; ++x) exact.acc(r)[x] = float(acc[size_t(x)]);
      partials.merge(r, exact, r);
    }
    for (int r = 0; r < rows; ++r) {
      partials.write_output(r, &out[(size_t(r / group) * c.num_heads + size_t(h) * group + size_t(r % group)) * d]);
    }
  }
  return out;
}

// The GPU's attention of the case's step over f's cache for queries q (FP16), into out; decode over 2-bit
// HACK blocks of head_dim 128 on INT8 tensor cores or (false) on the dp4a kernel.
void run_attention(const AttentionCase& c, const Filled& f, const std::vector<uint16_t>& q, float scale, bool integer_tensor_cores,
                   std::vector<uint16_t>& out) {
  const std::vector<int> step = c.step();
  int total_queries = 0;
  for (int n : step) total_queries += n;
  PagedAttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, int(c.lengths.size()), total_queries};
  shape.integer_tensor_cores = integer_tensor_cores;
  auto attention = take(CudaPagedAttention::create(shape));
  ASSERT_TRUE(attention);
  auto q_device = take(DeviceArray<uint16_t>::allocate(q.size(), "test"));
  auto out_device = take(DeviceArray<uint16_t>::allocate(q.size(), "test"));
  ASSERT_TRUE(q_device.upload(q.data(), q.size()).is_ok());
  ASSERT_TRUE(attention->plan({f.ids, c.lengths, step}).is_ok());
  ASSERT_EQ(attention->tensor_cores(), !c.queries.empty());
  // Twice: a second launch over the same plan gives the same bits (nothing a launch leaves behind changes
  // the next one).
  std::vector<uint16_t> first;
  for (int launch = 0; launch < 2; ++launch) {
    ASSERT_TRUE(device_fill_bytes(out_device.data(), 0xff, out_device.bytes()).is_ok());  // NaN: unwritten shows
    const Status ran = attention->run_quantized(f.cache->view(kLayer), f.cache->sealed_view(kLayer), q_device.data(), scale,
                                                out_device.data());
    ASSERT_TRUE(ran.is_ok()) << ran.message();
    ASSERT_TRUE(device_synchronize("quantized attention").is_ok());
    out.resize(q.size());
    ASSERT_TRUE(out_device.download(out.data(), out.size()).is_ok());
    if (launch == 0) first = out;
  }
  ASSERT_TRUE(out == first) << "a second launch over the same plan gave other outputs";
}

void check_attention(const AttentionCase& c) {
  SCOPED_TRACE(c.name());
  const unsigned seed = 777u + unsigned(c.lengths.size() * 131 + c.lengths[0] * 7 + c.head_dim + c.num_heads + c.bits);
  std::mt19937 rng(seed);
  QuantizationConfig config;
  config.k_bits = config.v_bits = c.bits;
  c.layout.apply(config);
  const std::vector<int> step = c.step();
  const int batch = int(c.lengths.size()), d = c.head_dim, q_width = c.num_heads * d;
  int total_queries = 0;
  for (int n : step) total_queries += n;
  const HeadDims dims = c.zack ? random_head_dims(c.num_kv_heads, d, rng) : HeadDims{};
  std::string ranks;
  for (int h = 0; h < c.num_kv_heads && c.zack; ++h) {
    ranks += str_cat(h == 0 ? "" : ",", dims.k_dims[size_t(kLayer * c.num_kv_heads + h)], "/",
                     dims.v_dims[size_t(kLayer * c.num_kv_heads + h)]);
  }
  SCOPED_TRACE(str_cat("seed ", seed, c.zack ? ", head dims (K/V) " : "", ranks));
  Filled f = fill(c.lengths, step, 512, c.num_kv_heads, d, config, c.hack, rng, dims);
  ASSERT_TRUE(f.cache);
  std::vector<float> q_float;
  const auto q = random_halves(size_t(total_queries) * q_width, 1.0f, rng, q_float);
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<uint16_t> out;
  run_attention(c, f, q, scale, true, out);
  if (::testing::Test::HasFatalFailure()) return;

  double error_sq = 0, reference_sq = 0;
  std::string per_sequence;  // each sequence's relative error: which one departs shows
  size_t first = 0;  // the sequence's first query
  for (int b = 0; b < batch; ++b) {
    const double error_before = error_sq, reference_before = reference_sq;
    const int n = step[size_t(b)], kv_len = c.lengths[size_t(b)];
    // A decode row (one query) reads every full block sealed (the step sealed the one it filled), a
    // prefill chunk beside it or not (such a row takes the decode kernel); prefill the blocks wholly
    // before the step.
    const int sealed = (n == 1 ? kv_len : kv_len - n) / kCudaBlockTokens;
    const std::vector<float> q_b(q_float.begin() + ptrdiff_t(first * q_width),
                                 q_float.begin() + ptrdiff_t((first + size_t(n)) * q_width));
    const std::vector<float> want = reference_output(c, f, b, q_b, n, sealed, scale);
    for (size_t x = 0; x < want.size(); ++x) {
      const float got = fp16_to_float(out[first * q_width + x]);
      ASSERT_TRUE(std::isfinite(got)) << "sequence " << b << ", element " << x;
      error_sq += double(got - want[x]) * double(got - want[x]);
      reference_sq += double(want[x]) * double(want[x]);
    }
    per_sequence += str_cat(b == 0 ? "" : " ", std::sqrt((error_sq - error_before) / (reference_sq - reference_before)));
    first += size_t(n);
  }
  // FP16 output rounding is ~3e-4 relative; FP32 arithmetic, the odd 8-bit P' code that rounds the other
  // way (the running max differs from the reference's) and, in prefill, FP16 P and dequantized K/V in
  // the FP16 kernel's mma (rounded to 11 bits) add little.
  const double relative = std::sqrt(error_sq / reference_sq);
  std::printf("  %s%s: relative error %.2e (by sequence: %s)\n", c.name().c_str(), c.zack ? str_cat(" dims ", ranks).c_str() : "",
              relative, per_sequence.c_str());
  EXPECT_LT(relative, 2e-3);
}

TEST_F(CudaTest, QuantizedDecodeAttentionMatchesReference) {
  const std::vector<AttentionCase> cases = {
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
      // KIVI's layouts on the integers: U' per K token group, W' per V column group.
      {{130, 1, 77, 200, 64}, 32, 8, 128, 2, true, {}, kChannelToken},
      {{97, 33}, 16, 2, 128, 2, true, {}, {true, 16, true, 16, true}},  // GQA 8, the smallest groups, symmetric
      {{100, 3}, 12, 4, 64, 2, true, {}, {true, 32, true, 16, false}},  // GQA 3, d 64
      {{300, 129}, 8, 8, 64, 4, true, {}, {true, 32, false, 0, false}},  // K per channel alone, 4 bits
      {{3000}, 8, 2, 128, 2, true, {}, {false, 0, true, 32, false}},     // V per token alone, many splits
      {{2100, 1500, 9}, 32, 8, 128, 8, true, {}, kChannelToken},
      {{1000}, 32, 8, 128, 2, true, {}, {false, 0, false, 0, true}},     // HACK's layout, symmetric
      {{130, 700, 64}, 16, 4, 128, 4, true, {}, {true, 16, true, 32, true}},  // 4 bits, groups, symmetric
      {{130, 700, 64}, 16, 4, 128, 4, true, {}, {false, 0, true, 32, false}},  // V per token alone, 4 bits
      {{130, 700, 64}, 16, 4, 128, 4, true, {}, {true, 16, false, 0, true}},  // K per channel alone, 4 bits, symmetric
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

// Decode over 2-bit HACK blocks of head_dim 128 runs on INT8 tensor cores; it computes what the dp4a
// kernel does, bit for bit (the integer products are exact, the float operations per token and column
// the same): GQA 4 and 8 (one and two row groups), 1..3 rows used of 4, one token to many splits, open
// blocks of every fill, symmetric ranges.
TEST_F(CudaTest, QuantizedDecodeOnTensorCoresIsTheDp4aKernelBitForBit) {
  const std::vector<AttentionCase> cases = {
      {{1, 63, 64, 65, 127, 130}, 32, 8, 128, 2, true},  // the open block alone, whole, one token past
      {{3000, 77, 2100}, 32, 8, 128, 2, true},           // several splits
      {{97, 33, 640}, 16, 2, 128, 2, true},              // GQA 8: two row groups
      {{200, 1000}, 12, 4, 128, 2, true},                // GQA 3: a row of 4 unused
      {{300, 1}, 8, 8, 128, 2, true},                    // GQA 1
      {{1000, 70}, 32, 8, 128, 2, true, {}, {false, 0, false, 0, true}},  // symmetric
  };
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name());
    std::mt19937 rng(4242u + unsigned(c.lengths[0]));
    QuantizationConfig config;
    config.k_bits = config.v_bits = c.bits;
    c.layout.apply(config);
    Filled f = fill(c.lengths, c.step(), 512, c.num_kv_heads, c.head_dim, config, c.hack, rng);
    ASSERT_TRUE(f.cache);
    std::vector<float> q_float;
    const auto q = random_halves(c.lengths.size() * size_t(c.num_heads * c.head_dim), 2.0f, rng, q_float);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    std::vector<uint16_t> mma, dp4a;
    run_attention(c, f, q, scale, true, mma);
    run_attention(c, f, q, scale, false, dp4a);
    if (::testing::Test::HasFatalFailure()) return;
    size_t differ = 0, first = mma.size();
    for (size_t x = 0; x < mma.size(); ++x) {
      if (mma[x] != dp4a[x]) ++differ, first = std::min(first, x);
    }
    EXPECT_EQ(differ, 0u) << "first at " << first << ": " << (first < mma.size() ? fp16_to_float(mma[first]) : 0.0f) << " vs "
                          << (first < mma.size() ? fp16_to_float(dp4a[first]) : 0.0f);
  }
}

// Prefill steps: the sealed blocks before each sequence's step (hack over HACK's layout: INT8 tensor
// cores; quant, and hack over KIVI's: dequantized into the FP16 kernel's tiles), then its open block
// and the step's tokens exact, causal.
TEST_F(CudaTest, QuantizedPrefillAttentionMatchesReference) {
  const std::vector<AttentionCase> cases = {
      {{1000}, 32, 8, 128, 2, true, {200}},                  // 12 sealed blocks, the step starts mid-block
      {{1216}, 32, 8, 128, 2, true, {64}},                   // the step is exactly one block
      {{130, 700, 64}, 16, 4, 128, 4, true, {66, 100, 1}},   // a decode row in a prefill step, 4 bits
      {{2100, 37}, 8, 1, 64, 2, true, {37, 37}},             // GQA 8, d 64; the short one has nothing sealed
      {{3000, 2000}, 32, 8, 128, 8, true, {128, 300}},       // many blocks: splits of both kernels, 8 bits
      {{150}, 8, 2, 128, 2, true, {150}},                    // a first chunk: nothing sealed before it
      {{3000, 1300, 640}, 32, 8, 128, 2, true, {1, 512, 1}}, // long decode rows beside a chunk: two kernels
      {{1000}, 32, 8, 128, 2, false, {200}},
      {{130, 700, 64}, 16, 4, 128, 4, false, {66, 100, 1}},
      {{2100, 37}, 8, 1, 64, 8, false, {37, 37}},
      {{3000, 2000}, 32, 8, 128, 2, false, {128, 300}},
      {{1000}, 32, 8, 128, 2, true, {200}, kChannelToken},
      {{130, 700, 64}, 16, 4, 128, 4, true, {66, 100, 1}, {true, 16, true, 32, true}},
      {{2100, 37}, 8, 1, 64, 2, true, {37, 37}, kChannelToken},
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

// ZACK's heads (zack:...+hack / +quant): each KV head at random K and V dims of its own (drawn from the
// case's seed, printed with it), decode and prefill steps as above; the references per head at its dims.
TEST_F(CudaTest, ZackHeadsQuantizedAttentionMatchesReference) {
  const Layout hack_layout = {};
  const std::vector<AttentionCase> cases = {
      {{1}, 4, 4, 64, 2, true, {}, hack_layout, true},                  // one token: only the open block
      {{64}, 8, 2, 128, 2, true, {}, hack_layout, true},                // exactly one sealed block
      {{65}, 32, 8, 128, 4, true, {}, hack_layout, true},               // one block and one token, 4 bits
      {{130, 1, 77, 200, 64}, 32, 8, 128, 2, true, {}, hack_layout, true},  // unequal batch
      {{97, 33}, 16, 2, 128, 2, true, {}, hack_layout, true},           // GQA 8
      {{100, 3}, 12, 4, 64, 4, true, {}, hack_layout, true},            // GQA 3, d 64
      {{300, 129}, 8, 8, 64, 2, true, {}, hack_layout, true},           // GQA 1
      {{3000}, 8, 2, 128, 2, true, {}, hack_layout, true},              // many blocks: several splits
      {{2100, 1500, 9}, 32, 8, 128, 8, true, {}, hack_layout, true},    // 8 bits
      {{130, 1, 77, 200, 64}, 32, 8, 128, 2, false, {}, hack_layout, true},
      {{97, 33}, 16, 2, 128, 4, false, {}, hack_layout, true},
      {{100, 3}, 12, 4, 64, 8, false, {}, hack_layout, true},
      // Prefill: the sealed blocks before the step dequantized into the FP16 tiles, the rest exact.
      {{1000}, 32, 8, 128, 2, true, {200}, hack_layout, true},
      {{130, 700, 64}, 16, 4, 128, 4, true, {66, 100, 1}, hack_layout, true},  // a decode row in a prefill step
      {{2100, 37}, 8, 1, 64, 2, true, {37, 37}, hack_layout, true},             // GQA 8, d 64
      {{3000, 1300, 640}, 32, 8, 128, 2, true, {1, 512, 1}, hack_layout, true},  // decode rows beside a chunk
      {{150}, 8, 2, 128, 4, true, {150}, hack_layout, true},                     // a first chunk: nothing sealed
      {{1000}, 32, 8, 128, 4, false, {200}, hack_layout, true},
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

TEST_F(CudaTest, QuantizedKvCacheKeepsFp16OnlyForUnsealedTokens) {
  // A window pool of 64 / 64 + 2 · 2 = 5 FP16 blocks holds a sequence of 30 blocks written 64 tokens
  // at a time: FP16 blocks go back once sealed.
  const CudaKvShape shape{1, 2, 128, 31, 2, 40, 64};
  EXPECT_EQ(CudaQuantizedKvCache::window_blocks(shape), 5);
  auto cache = take(CudaQuantizedKvCache::create(shape, QuantizationConfig{}, true, 1));
  ASSERT_TRUE(cache);
  const int a = take(cache->add_sequence()), b = take(cache->add_sequence());
  auto kv = take(DeviceArray<uint16_t>::allocate(size_t(64) * 2 * 128, "test"));
  ASSERT_TRUE(device_fill_bytes(kv.data(), 0, kv.bytes()).is_ok());
  for (int step = 0; step < 30; ++step) {
    const int sequence = step % 3 == 2 ? b : a, n = step == 0 ? 7 : 64;  // steps start mid-block
    const Status began = cache->begin_step({sequence}, {n});
    ASSERT_TRUE(began.is_ok()) << "step " << step << ": " << began.message();
    ASSERT_TRUE(cache->append(0, kv.data(), kv.data()).is_ok());
  }
  EXPECT_EQ(cache->sequences().free_blocks(), 31 - int(cache->sequences().blocks(a).size() + cache->sequences().blocks(b).size()));
  // The sealed pool is full: refused, naming it, nothing changed.
  const int tokens = cache->sequences().num_tokens(a), free_blocks = cache->sequences().free_blocks();
  const Status full = cache->begin_step({a}, {64 * (free_blocks + 1)});
  ASSERT_FALSE(full.is_ok());
  EXPECT_NE(full.message().find("sealed KV pool is full"), std::string::npos) << full.message();
  EXPECT_EQ(cache->sequences().num_tokens(a), tokens);
  EXPECT_EQ(cache->sequences().free_blocks(), free_blocks);
  cache->remove_sequence(a);
  cache->remove_sequence(b);
  EXPECT_EQ(cache->sequences().free_blocks(), 31);
  EXPECT_GT(cache->bytes(), size_t(31) * 2 * cache->layout().block_bytes);
}

TEST_F(CudaTest, QuantizedAttentionRejectsWhatItCannotRun) {
  const CudaKvShape shape{1, 2, 128, 4, 2, 2, 128};
  QuantizationConfig ablation;
  ablation.store_sums = false;
  auto no_sums = CudaQuantizedKvCache::create(shape, ablation, true, 1);
  ASSERT_FALSE(no_sums.has_value());
  EXPECT_NE(no_sums.status().message().find("ablations"), std::string::npos) << no_sums.status().message();
  QuantizationConfig odd;
  odd.k_bits = 3;
  EXPECT_FALSE(CudaQuantizedKvCache::create(shape, odd, true, 1).has_value());

  // quant over KIVI's layouts has no decode kernel: refused by name.
  {
    QuantizationConfig kivi;
    kChannelToken.apply(kivi);
    auto quant = take(CudaQuantizedKvCache::create(shape, kivi, false, 1));
    auto decode = take(CudaPagedAttention::create({8, 2, 128, 2, 4}));
    ASSERT_TRUE(quant && decode);
    const int a = take(quant->add_sequence());
    ASSERT_TRUE(quant->begin_step({a}, {1}).is_ok());
    ASSERT_TRUE(decode->plan({{a}, {1}, {1}}).is_ok());
    const Status refused = decode->run_quantized(quant->view(0), quant->sealed_view(0), nullptr, 1.0f, nullptr);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_NE(refused.message().find("klayout=channel"), std::string::npos) << refused.message();
  }
  // ZACK's heads: dims the codec's layout cannot hold (not a multiple of 4, past head_dim, one missing),
  // and KIVI's layouts, refused by name.
  {
    const HeadDims odd{{4, 36}, {5, 8}}, wide{{4, 132}, {8, 8}}, short_list{{4}, {8}};
    for (const auto& [dims, named] : std::vector<std::pair<HeadDims, std::string>>{
             {odd, "multiples of 4"}, {wide, "multiples of 4"}, {short_list, "one per layer and KV head"}}) {
      const auto refused = CudaQuantizedKvCache::create(shape, QuantizationConfig{}, true, 1, dims);
      ASSERT_FALSE(refused.has_value()) << named;
      EXPECT_NE(refused.status().message().find(named), std::string::npos) << refused.status().message();
    }
    QuantizationConfig kivi;
    kChannelToken.apply(kivi);
    const auto refused = CudaQuantizedKvCache::create(shape, kivi, true, 1, HeadDims{{4, 36}, {8, 8}});
    ASSERT_FALSE(refused.has_value());
    EXPECT_NE(refused.status().message().find("klayout=channel"), std::string::npos) << refused.status().message();
  }
  auto cache = take(CudaQuantizedKvCache::create(shape, QuantizationConfig{}, true, 1));
  PagedAttentionShape no_tensor_cores{8, 2, 128, 2, 4};
  no_tensor_cores.tensor_core_min_queries = 0;
  auto attention = take(CudaPagedAttention::create(no_tensor_cores));
  ASSERT_TRUE(cache && attention);
  const int a = take(cache->add_sequence());
  ASSERT_TRUE(cache->begin_step({a}, {3}).is_ok());
  ASSERT_TRUE(attention->plan({{a}, {3}, {2}}).is_ok());  // two queries on the CUDA-core kernel
  const Status prefill = attention->run_quantized(cache->view(0), cache->sealed_view(0), nullptr, 1.0f, nullptr);
  ASSERT_FALSE(prefill.is_ok());
  EXPECT_NE(prefill.message().find("tensor-core"), std::string::npos) << prefill.message();
}

}  // namespace
}  // namespace slimkv::cuda
