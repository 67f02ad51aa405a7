// PQCache's GPU cache of selected tokens (kv/cuda/pq_token_cache.h) against the CPU offload tier's
// policy (kv/tier/block_cache.h) fed each step's hits then misses ascending: after every step the token
// of every slot (so the eviction order), the hit, use and fill counts, and the K/V copied into each slot
// equal the reference's; LRU and LFU, slot counts below and above a step's selection, steps selecting
// nothing or one token, two layers and sequences out of order. And a cache size out of range is refused
// naming `cache` and its range. (The whole selection with the cache, bundled model: pq_select_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kv/cuda/pq_token_cache.h"
#include "kv/tier/block_cache.h"

namespace slimkv::cuda {
namespace {

using PqGpuCacheTest = CudaTest;

struct CacheCase {
  int slots;
  CachePolicy policy;
  int max_selected;  // a step's tokens per (row, KV head): at most this
  std::string name() const {
    return str_cat("pq_token_cache(slots=", slots, ",policy=", policy == CachePolicy::kLfu ? "lfu" : "lru",
                   ",max_selected=", max_selected, ")");
  }
};

// The bits each (sequence, layer, KV head, token)'s K (value: +1) element e holds in the compact buffer.
uint16_t row_bits(int sequence, int layer, int head, int token, int e, int value) {
  return uint16_t((token * 131 + sequence * 7919 + layer * 257 + head * 31 + e * 3 + value) & 0xffff);
}

// One (sequence, layer, KV head)'s reference: the CPU policy and what it put in each slot.
struct Reference {
  BlockCache policy;
  std::vector<int> slot_tokens;
  Reference(int slots, CachePolicy p) : policy(slots, p), slot_tokens(size_t(slots), -1) {}
  // One step's selection (ascending): hits first, then misses; returns (hits, filled).
  std::pair<long, long> step(const std::vector<int>& tokens) {
    std::set<int> resident(slot_tokens.begin(), slot_tokens.end());
    policy.unpin_all();
    long hits = 0, filled = 0;
    for (const bool want_hit : {true, false}) {
      for (const int t : tokens) {
        if (resident.count(t) != size_t(want_hit)) continue;
        const BlockCache::Lookup found = policy.use(t);
        EXPECT_EQ(found.hit, want_hit) << "token " << t;
        if (found.hit) ++hits;
        if (!found.hit && found.slot >= 0) {
          slot_tokens[size_t(found.slot)] = t;
          ++filled;
        }
      }
    }
    return {hits, filled};
  }
};

void run_case(const CacheCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  constexpr int kLayers = 2, kHeads = 2, kHeadDim = 16, kSequences = 3, kMaxTokens = 700, kSteps = 14;
  const int blocks_per_row = (c.max_selected + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const PqTokenCacheShape shape{kLayers, kHeads, kHeadDim, kSequences, kMaxTokens, c.slots, blocks_per_row * kCudaBlockTokens};
  auto cache = take(CudaPqTokenCache::create(shape, c.policy));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<int> sequences = {2, 0};  // the step's rows, out of order
  const int rows = int(sequences.size());
  std::vector<Reference> references;
  for (int u = 0; u < kSequences * kLayers * kHeads; ++u) references.emplace_back(c.slots, c.policy);
  const auto unit = [&](int s, int layer, int g) { return (s * kLayers + layer) * kHeads + g; };
  // Each (row, head)'s last selection: the next step keeps most of it (as decode steps do).
  std::vector<std::vector<int>> last(size_t(rows * kHeads));
  long long expected_hits = 0, expected_filled = 0;
  for (int step = 0; step < kSteps; ++step) {
    const int layer = step % kLayers;
    // This step's size: none, one token, or up to max_selected.
    const int n = step == 3 ? 0 : step == 5 ? 1 : std::uniform_int_distribution<int>(c.max_selected / 2, c.max_selected)(rng);
    ASSERT_TRUE(cache->begin_step().is_ok());
    std::vector<PqSelectRow> select_rows(static_cast<size_t>(rows));
    std::vector<int> step_tokens(size_t(rows * kHeads) * size_t(shape.max_selected), -1);
    std::vector<uint16_t> compact_k(size_t(rows * blocks_per_row * kHeads * kCudaBlockTokens * kHeadDim));
    std::vector<uint16_t> compact_v(compact_k.size());
    long long step_hits = 0, step_filled = 0;
    for (int r = 0; r < rows; ++r) {
      select_rows[size_t(r)].sequence = sequences[size_t(r)];
      select_rows[size_t(r)].selected = n;
      for (int g = 0; g < kHeads; ++g) {
        std::set<int> chosen;
        std::vector<int>& before = last[size_t(r * kHeads + g)];
        std::shuffle(before.begin(), before.end(), rng);
        for (size_t i = 0; i < before.size() && int(chosen.size()) < n * 3 / 4; ++i) chosen.insert(before[i]);
        while (int(chosen.size()) < n) chosen.insert(std::uniform_int_distribution<int>(0, kMaxTokens - 1)(rng));
        const std::vector<int> tokens(chosen.begin(), chosen.end());
        before = tokens;
        const int s = sequences[size_t(r)];
        for (int i = 0; i < n; ++i) {
          step_tokens[size_t(r * kHeads + g) * size_t(shape.max_selected) + size_t(i)] = tokens[size_t(i)];
          const size_t block = size_t(r * blocks_per_row + i / kCudaBlockTokens);
          const size_t at = ((block * kHeads + size_t(g)) * kCudaBlockTokens + size_t(i % kCudaBlockTokens)) * kHeadDim;
          for (int e = 0; e < kHeadDim; ++e) {
            compact_k[at + size_t(e)] = row_bits(s, layer, g, tokens[size_t(i)], e, 0);
            compact_v[at + size_t(e)] = row_bits(s, layer, g, tokens[size_t(i)], e, 1);
          }
        }
        const auto [hits, filled] = references[size_t(unit(s, layer, g))].step(tokens);
        step_hits += hits;
        step_filled += filled;
      }
    }
    auto device_rows = take(DeviceArray<PqSelectRow>::allocate(size_t(rows), "rows"));
    ASSERT_TRUE(device_rows.upload(select_rows.data(), select_rows.size()).is_ok());
    auto device_k = take(DeviceArray<uint16_t>::allocate(compact_k.size(), "compact K"));
    auto device_v = take(DeviceArray<uint16_t>::allocate(compact_v.size(), "compact V"));
    ASSERT_TRUE(device_k.upload(compact_k.data(), compact_k.size()).is_ok());
    ASSERT_TRUE(device_v.upload(compact_v.data(), compact_v.size()).is_ok());
    const PqTokenCacheView view = cache->view(layer);
    ASSERT_TRUE(copy_to_device(view.step_tokens, step_tokens.data(), step_tokens.size() * sizeof(int)).is_ok());
    ASSERT_TRUE(cache->update(layer, {device_rows.data(), rows, view, device_k.data(), device_v.data(), blocks_per_row}).is_ok());
    const PqCacheCounters counters = take(cache->counters());
    EXPECT_EQ(counters.used_tokens, (long long)rows * kHeads * n) << "step " << step;
    EXPECT_EQ(counters.hit_tokens, step_hits) << "step " << step;
    EXPECT_EQ(counters.filled_tokens, step_filled) << "step " << step;
    expected_hits += step_hits;
    expected_filled += step_filled;
    // Every slot of every (sequence, layer, KV head): the reference's token, and its K/V.
    const size_t slots = size_t(kSequences * kLayers * kHeads) * size_t(c.slots);
    std::vector<int> slot_tokens(slots);
    std::vector<uint16_t> k(slots * kHeadDim), v(slots * kHeadDim);
    ASSERT_TRUE(copy_to_host(slot_tokens.data(), view.slot_tokens, slots * sizeof(int)).is_ok());
    ASSERT_TRUE(copy_to_host(k.data(), view.k, k.size() * sizeof(uint16_t)).is_ok());
    ASSERT_TRUE(copy_to_host(v.data(), view.v, v.size() * sizeof(uint16_t)).is_ok());
    for (int s = 0; s < kSequences; ++s) {
      for (int l = 0; l < kLayers; ++l) {
        for (int g = 0; g < kHeads; ++g) {
          const int u = unit(s, l, g);
          for (int slot = 0; slot < c.slots; ++slot) {
            const size_t at = size_t(u) * size_t(c.slots) + size_t(slot);
            const int token = references[size_t(u)].slot_tokens[size_t(slot)];
            ASSERT_EQ(slot_tokens[at], token) << "step " << step << " sequence " << s << " layer " << l << " head " << g
                                              << " slot " << slot;
            if (token < 0) continue;
            for (int e = 0; e < kHeadDim; ++e) {
              ASSERT_EQ(k[at * kHeadDim + size_t(e)], row_bits(s, l, g, token, e, 0)) << "slot " << slot;
              ASSERT_EQ(v[at * kHeadDim + size_t(e)], row_bits(s, l, g, token, e, 1)) << "slot " << slot;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(expected_hits, 0);
  EXPECT_GT(expected_filled, 0);
}

TEST_F(PqGpuCacheTest, EvictionOrderEqualsTheReferencePolicy) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", (unsigned long long)seed);
  for (const CachePolicy policy : {CachePolicy::kLru, CachePolicy::kLfu}) {
    // Fewer slots than a step selects (misses left out), a few more, and many (the sort's padding).
    for (const CacheCase& c : {CacheCase{37, policy, 60}, CacheCase{64, policy, 50}, CacheCase{1000, policy, 300},
                               CacheCase{1, policy, 5}}) {
      run_case(c, seed);
    }
  }
}

TEST_F(PqGpuCacheTest, RefusesSizesOutOfRange) {
  for (const int slots : {-1, kPqCacheMaxSlots + 1}) {
    const auto made = CudaPqTokenCache::create({2, 2, 16, 1, 128, slots, 64}, CachePolicy::kLru);
    ASSERT_FALSE(made.has_value());
    EXPECT_NE(made.status().message().find(str_cat("cache=", slots)), std::string::npos) << made.status().message();
    EXPECT_NE(made.status().message().find(str_cat("1 to ", kPqCacheMaxSlots)), std::string::npos);
  }
}

}  // namespace
}  // namespace slimkv::cuda
