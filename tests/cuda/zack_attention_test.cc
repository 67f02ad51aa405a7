// ZACK on the GPU (kv/cuda/zack_kv_cache.h, attention/cuda/zack_attention.h) against the FP64 reference
// (attention/reference.h) per KV head at its own ranks: random ranks 4..head_dim (odd ones too) per
// (layer, KV head), and 4 and head_dim, GQA groups 1..8, partial blocks, batches of unequal sequences stepping
// together (a prefill chunk, then decode steps or further chunks), both schedules; prefill chunks of 512
// queries over 8K contexts (the tensor-core prefill kernel). Each sequence's rows of a step have the bits
// they have with the sequence alone in the step. q and k go through the cache's
// projection onto random bases; the reference projects them on the host (FP32, rounded to FP16 as stored).
// Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/zack_attention.h"
#include "attention/reference.h"
#include "cuda_test_util.h"
#include "kv/cuda/zack_kv_cache.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

using ZackCase = AttentionStepCase;

// FP16-rounded B · x for one head: basis [rank, d] row-major.
std::vector<float> project(const float* basis, int rank, int d, const float* x) {
  std::vector<float> out(static_cast<size_t>(rank));
  for (int r = 0; r < rank; ++r) {
    float sum = 0.0f;
    for (int c = 0; c < d; ++c) sum += basis[size_t(r) * d + c] * x[c];
    out[size_t(r)] = fp16_to_float(float_to_fp16(sum));
  }
  return out;
}

// Of a step's n queries of one sequence, those held to the reference: all, or for a long chunk every
// 7th (a prime: every row of the prefill kernel's tiles comes round) and the last two (FP64 over 8K
// contexts costs seconds per head otherwise).
std::vector<int> checked_queries(int n) {
  std::vector<int> checked;
  for (int t = 0; t < n; ++t) {
    if (n <= 256 || t % 7 == 0 || t >= n - 2) checked.push_back(t);
  }
  return checked;
}

// filled_tokens: each sequence's first tokens written before the steps without attention (the earlier
// chunks of a long context), so a step attends a chunk over a long context with a cheap reference.
void check(const ZackCase& c, ZackSchedule schedule, int filled_tokens = 0) {
  SCOPED_TRACE(c.name("zack_attention") + (schedule == ZackSchedule::kBalanced ? " balanced" : " uniform") +
               str_cat(" filled=", filled_tokens));
  const unsigned seed = 20261126u + unsigned(c.lengths.size() * 131 + c.lengths[0] * 7 + c.head_dim + c.num_heads);
  SCOPED_TRACE(str_cat("seed ", seed));
  std::mt19937 rng(seed);
  const int batch = int(c.lengths.size()), d = c.head_dim, H = c.num_heads, G = c.num_kv_heads, group = H / G;
  const int layers = 2, layer = 1;  // the test writes and reads layer 1 (its offsets in the pool are exercised)
  int max_len = 0;
  for (int n : c.lengths) max_len = std::max(max_len, n);
  const int max_step = std::max(c.prefill_tokens, c.later_tokens) * batch;

  ZackKvShape shape;
  shape.num_layers = layers, shape.num_heads = H, shape.num_kv_heads = G, shape.head_dim = d;
  shape.max_sequences = batch + 1;
  shape.max_blocks_per_sequence = (max_len + kCudaBlockTokens - 1) / kCudaBlockTokens;
  shape.num_blocks = batch * shape.max_blocks_per_sequence + 3;
  shape.max_step_tokens = max_step;
  std::uniform_int_distribution<int> rank_of(std::min(4, d), d);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(d)));
  for (int i = 0; i < layers * G; ++i) {
    shape.k_ranks.push_back(rank_of(rng));
    shape.v_ranks.push_back(rank_of(rng));
    if (i / G == layer && i % G < 2 && G >= 2) {  // the extremes beside the random ranks: 4 and head_dim
      shape.k_ranks.back() = i % G == 0 ? 4 : d;
      shape.v_ranks.back() = i % G == 0 ? d : 4;
    }
    for (int e = 0; e < shape.k_ranks.back() * d; ++e) shape.qk_bases.push_back(normal(rng));
  }
  std::vector<size_t> basis_at(size_t(layers * G) + 1, 0);
  for (int i = 0; i < layers * G; ++i) basis_at[size_t(i) + 1] = basis_at[size_t(i)] + size_t(shape.k_ranks[size_t(i)] * d);
  auto cache = take(CudaZackKvCache::create(shape));
  auto attention = take(CudaZackAttention::create({layers, H, G, d, batch, max_step, shape.k_ranks, shape.v_ranks}));
  ASSERT_TRUE(cache && attention);
  const int scratch = take(cache->sequences().add_sequence());  // recycled: non-contiguous blocks
  SLIMKV_ASSERT_OK(cache->begin_step({scratch}, {1}));
  std::vector<int> ids;
  for (int b = 0; b < batch; ++b) ids.push_back(take(cache->sequences().add_sequence()));
  cache->sequences().remove_sequence(scratch);

  // Per sequence and KV head, the reduced keys and values so far: [tokens, rank].
  using PerHead = std::vector<std::vector<float>>;
  std::vector<PerHead> keys(static_cast<size_t>(batch), PerHead(static_cast<size_t>(G)));
  std::vector<PerHead> values = keys;
  std::vector<int> held(size_t(batch), 0);
  auto q_dev = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * H * d, "q"));
  auto k_dev = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * G * d, "k"));
  auto v_dev = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * G * d, "v"));
  auto out_dev = take(DeviceArray<uint16_t>::allocate(size_t(max_step) * H * d, "out"));
  const float scale = 1.0f / std::sqrt(float(d));
  // The step's sequences (b: index into ids) and their new tokens: up to `want` each, within `limit`.
  const auto step_of = [&](int want, int limit) {
    PagedAttentionBatch plan;
    for (int b = 0; b < batch; ++b) {
      const int n = std::min(want, limit - held[size_t(b)]);
      if (n <= 0) continue;
      plan.sequence_ids.push_back(ids[size_t(b)]);
      plan.kv_lens.push_back(held[size_t(b)] + n);
      plan.query_counts.push_back(n);
    }
    return plan;
  };
  const auto batch_index = [&](int sequence) { return int(std::find(ids.begin(), ids.end(), sequence) - ids.begin()); };
  // Random k and v of the step's tokens written into the cache (V as the folded W_V gives it: the first
  // v_rank dims of each head, zeros after), their reduced rows kept on the host.
  const auto write_step = [&](const PagedAttentionBatch& plan, int total) {
    std::vector<float> k, v;
    const auto k_halves = random_halves(size_t(total) * G * d, 1.0f, rng, k);
    auto v_halves = random_halves(size_t(total) * G * d, 1.0f, rng, v);
    for (int t = 0; t < total; ++t) {
      for (int g = 0; g < G; ++g) {
        for (int j = shape.v_ranks[size_t(layer * G + g)]; j < d; ++j) v_halves[(size_t(t) * G + g) * d + j] = 0;
      }
    }
    SLIMKV_ASSERT_OK(k_dev.upload(k_halves.data(), k_halves.size()));
    SLIMKV_ASSERT_OK(v_dev.upload(v_halves.data(), v_halves.size()));
    SLIMKV_ASSERT_OK(cache->begin_step(plan.sequence_ids, plan.query_counts));
    SLIMKV_ASSERT_OK(cache->append(layer, k_dev.data(), v_dev.data()));
    int first = 0;
    for (size_t i = 0; i < plan.sequence_ids.size(); ++i) {
      const int b = batch_index(plan.sequence_ids[i]);
      for (int g = 0; g < G; ++g) {
        const int kr = shape.k_ranks[size_t(layer * G + g)], vr = shape.v_ranks[size_t(layer * G + g)];
        const float* basis = shape.qk_bases.data() + basis_at[size_t(layer * G + g)];
        for (int t = 0; t < plan.query_counts[i]; ++t) {
          const auto kp = project(basis, kr, d, k.data() + (size_t(first + t) * G + g) * d);
          keys[size_t(b)][size_t(g)].insert(keys[size_t(b)][size_t(g)].end(), kp.begin(), kp.end());
          const float* vt = v.data() + (size_t(first + t) * G + g) * d;
          values[size_t(b)][size_t(g)].insert(values[size_t(b)][size_t(g)].end(), vt, vt + vr);
        }
      }
      held[size_t(b)] += plan.query_counts[i];
      first += plan.query_counts[i];
    }
  };
  for (;;) {
    const PagedAttentionBatch plan = step_of(max_step / batch, filled_tokens);
    if (plan.sequence_ids.empty()) break;
    int total = 0;
    for (int n : plan.query_counts) total += n;
    write_step(plan, total);
  }
  for (int step = 0;; ++step) {
    const PagedAttentionBatch plan = step_of(step == 0 ? c.prefill_tokens : c.later_tokens, max_len);
    if (plan.sequence_ids.empty()) break;
    SCOPED_TRACE(str_cat("step ", step));
    int total = 0;
    for (int n : plan.query_counts) total += n;
    std::vector<float> q;
    const auto q_halves = random_halves(size_t(total) * H * d, 1.0f, rng, q);
    SLIMKV_ASSERT_OK(q_dev.upload(q_halves.data(), q_halves.size()));
    write_step(plan, total);
    SLIMKV_ASSERT_OK(attention->plan(plan, {schedule, schedule}));
    // Chunks of 2+ queries take the tensor-core prefill kernel where it is built (head_dim 64, 128).
    const int most_queries = *std::max_element(plan.query_counts.begin(), plan.query_counts.end());
    EXPECT_EQ(attention->num_prefill_tiles() > 0, most_queries >= 2 && (d == 64 || d == 128));
    const uint16_t* reduced = take(cache->project_queries(layer, q_dev.data()));
    SLIMKV_ASSERT_OK(attention->run(layer, cache->view(layer), reduced, scale, out_dev.data()));
    std::vector<uint16_t> out(size_t(total) * H * d);
    SLIMKV_ASSERT_OK(out_dev.download(out.data(), out.size()));
    // Each sequence's rows have the bits they have with the sequence alone in the step (issue 22: its
    // tasks and splits are cut by itself alone, merged in their order).
    for (size_t i = 0, first = 0; i < plan.sequence_ids.size(); first += size_t(plan.query_counts[i]), ++i) {
      PagedAttentionBatch one;
      one.sequence_ids = {plan.sequence_ids[i]};
      one.kv_lens = {plan.kv_lens[i]};
      one.query_counts = {plan.query_counts[i]};
      const size_t values = size_t(plan.query_counts[i]) * H * d, offset = first * H * d;
      SLIMKV_ASSERT_OK(attention->plan(one, {schedule, schedule}));
      SLIMKV_ASSERT_OK(attention->run(layer, cache->view(layer), reduced + offset, scale, out_dev.data() + offset));
      std::vector<uint16_t> alone(values);
      SLIMKV_ASSERT_OK(copy_to_host(alone.data(), out_dev.data() + offset, values * sizeof(uint16_t)));
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), out.begin() + ptrdiff_t(offset)))
          << "sequence " << i << " of " << plan.sequence_ids.size() << ": its rows alone differ from the step's";
    }

    double error_sq = 0, ref_sq = 0;
    int first = 0;
    for (size_t i = 0; i < plan.sequence_ids.size(); ++i) {
      const int b = batch_index(plan.sequence_ids[i]);
      const int n = plan.query_counts[i], n_keys = held[size_t(b)], before = n_keys - n;
      const std::vector<int> checked = checked_queries(n);
      std::vector<int> positions;
      for (int t : checked) positions.push_back(before + t);
      for (int g = 0; g < G; ++g) {
        const int kr = shape.k_ranks[size_t(layer * G + g)], vr = shape.v_ranks[size_t(layer * G + g)];
        const float* basis = shape.qk_bases.data() + basis_at[size_t(layer * G + g)];
        std::vector<float> qg;  // [checked, group, kr]
        for (int t : checked) {
          for (int h = g * group; h < (g + 1) * group; ++h) {
            const auto qp = project(basis, kr, d, q.data() + (size_t(first + t) * H + h) * d);
            qg.insert(qg.end(), qp.begin(), qp.end());
          }
        }
        std::vector<float> expected(checked.size() * size_t(group) * size_t(vr));
        attention_reference(qg.data(), int(checked.size()), positions.data(), keys[size_t(b)][size_t(g)].data(),
                            values[size_t(b)][size_t(g)].data(), n_keys, group, 1, kr, vr, scale, expected.data());
        for (size_t ci = 0; ci < checked.size(); ++ci) {
          const int t = checked[ci];
          for (int hg = 0; hg < group; ++hg) {
            const uint16_t* row = out.data() + (size_t(first + t) * H + size_t(g * group + hg)) * d;
            for (int j = 0; j < d; ++j) {
              const float got = fp16_to_float(row[j]);
              ASSERT_TRUE(std::isfinite(got)) << "query " << first + t << " head " << g * group + hg << " dim " << j;
              if (j >= vr) {
                ASSERT_EQ(got, 0.0f) << "past v_rank " << vr << ": query " << first + t << " dim " << j;
                continue;
              }
              const double want = expected[(ci * size_t(group) + size_t(hg)) * size_t(vr) + size_t(j)];
              error_sq += (got - want) * (got - want);
              ref_sq += want * want;
            }
          }
        }
      }
      first += n;
    }
    // FP16 output rounding is ~2.4e-4 relative; the GPU's FP32 projection may round a stored k' to the
    // neighbouring FP16 value of the host's; the prefill kernel rounds P to FP16 as the dense one does.
    EXPECT_LT(std::sqrt(error_sq / std::max(ref_sq, 1e-30)), 2e-3);
  }
}

class ZackAttentionTest : public CudaTest {};

TEST_F(ZackAttentionTest, PerHeadRanksMatchTheReference) {
  const std::vector<ZackCase> cases = {
      {{1}, 1, 4, 4, 64},                      // one token, no GQA
      {{70, 5, 130}, 70, 8, 2, 128, 1},        // partial blocks, decode after prefill, GQA 4
      {{200, 129}, 64, 12, 4, 64, 37},         // chunks starting mid-block, GQA 3
      {{300}, 300, 8, 1, 128},                 // GQA 8, many blocks in one prefill
      {{65, 64, 63, 1000}, 500, 32, 8, 128, 250},  // Llama-3-8B heads, unequal batch, many splits
      {{90}, 90, 6, 3, 80},                    // head_dim 80, GQA 2
  };
  for (const ZackCase& c : cases) {
    for (ZackSchedule schedule : {ZackSchedule::kBalanced, ZackSchedule::kUniform}) check(c, schedule);
  }
}

// The tensor-core prefill kernel (head_dim 64 and 128): chunks of up to 512 queries over contexts of 8K
// and more (written before without attention), chunks that are not a multiple of the 128-row tile,
// GQA groups 1..8, a step mixing a chunk with one-query sequences (which keep the decode kernel), and
// decode steps after a long chunk.
TEST_F(ZackAttentionTest, PrefillChunksMatchTheReference) {
  struct Prefill {
    ZackCase c;
    int filled_tokens;
  };
  const std::vector<Prefill> cases = {
      {{{8192 + 512}, 512, 8, 2, 128}, 8192},            // a 512-query chunk over 8K, GQA 4 (Llama-3-8B's)
      {{{8192 + 300, 8192 + 77}, 300, 12, 4, 64}, 8192},  // GQA 3: 42 positions a tile; chunks not a tile's multiple
      {{{4096 + 512}, 512, 16, 2, 128}, 4096},           // GQA 8
      {{{4096 + 200}, 200, 4, 4, 128}, 4096},            // GQA 1: 128 positions a tile
      {{{1000, 700}, 333, 8, 4, 64, 333}, 0},            // GQA 2, several chunks, the last ones shorter
      {{{600, 3, 513}, 2, 8, 4, 64, 300}, 0},            // 2-query chunks, then chunks beside a decode
      // A chunk, then decodes over 8.7K: a unit's tasks are a wave's share (dozens), merged in slices.
      {{{8192 + 512 + 2, 8192 + 512 + 2}, 512, 32, 8, 128, 1}, 8192},
  };
  for (const Prefill& p : cases) {  // the schedules split the heads' blocks differently (zack_attention.h)
    for (ZackSchedule schedule : {ZackSchedule::kBalanced, ZackSchedule::kUniform}) check(p.c, schedule, p.filled_tokens);
  }
}

TEST_F(ZackAttentionTest, ABlockHoldsExactlyItsRanks) {
  ZackKvShape shape;
  shape.num_layers = 1, shape.num_heads = 2, shape.num_kv_heads = 2, shape.head_dim = 128, shape.num_blocks = 2;
  shape.max_sequences = 1, shape.max_blocks_per_sequence = 2, shape.max_step_tokens = 1;
  shape.k_ranks = {5, 128};
  shape.v_ranks = {7, 64};
  shape.qk_bases.assign(size_t(5 + 128) * 128, 0.0f);
  auto cache = take(CudaZackKvCache::create(shape));
  ASSERT_TRUE(cache);
  EXPECT_EQ(CudaZackKvCache::block_bytes(shape.k_ranks, shape.v_ranks), size_t(5 + 7 + 128 + 64) * 64 * 2);
  EXPECT_EQ(cache->device_bytes(), 2 * CudaZackKvCache::block_bytes(shape.k_ranks, shape.v_ranks));
  shape.v_ranks = {0, 64};
  EXPECT_FALSE(CudaZackKvCache::create(shape).has_value());
}

}  // namespace
}  // namespace slimkv::cuda
