// The offload tier (kv/tier): the block cache's eviction order under LRU and LFU, blocks of the current
// step never evicted, and a store whose sealed blocks live in the file attending exactly as one in RAM,
// with hits, misses and bytes moved counted.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kv/store_attention.h"
#include "kv/tier/block_cache.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv {
namespace {

// Uses each id in its own step; returns what each miss evicted (-1: nothing, or a hit).
std::vector<int64_t> evictions(BlockCache& cache, const std::vector<int64_t>& ids) {
  std::vector<int64_t> evicted;
  for (int64_t id : ids) {
    cache.unpin_all();
    evicted.push_back(cache.use(id).evicted);
  }
  return evicted;
}

TEST(BlockCache, LruEvictsTheLeastRecentlyUsed) {
  BlockCache cache(3, CachePolicy::kLru);
  EXPECT_EQ(evictions(cache, {1, 2, 3, 1, 4, 5, 1, 2}), (std::vector<int64_t>{-1, -1, -1, -1, 2, 3, -1, 4}));
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(cache.misses(), 6);
}

TEST(BlockCache, LfuEvictsTheLeastOftenUsedThenTheOldest) {
  BlockCache cache(3, CachePolicy::kLfu);
  // Uses: 1 ×3, 2 ×2, 3 ×1 -> 4 evicts 3; then 4 (×1) is the least used -> 5 evicts 4; 6 evicts 5.
  EXPECT_EQ(evictions(cache, {1, 1, 1, 2, 2, 3, 4, 5, 6}), (std::vector<int64_t>{-1, -1, -1, -1, -1, -1, 3, 4, 5}));
}

TEST(BlockCache, NeverEvictsABlockOfTheCurrentStep) {
  BlockCache cache(2, CachePolicy::kLru);
  cache.unpin_all();
  EXPECT_EQ(cache.use(1).slot, 0);
  EXPECT_EQ(cache.use(2).slot, 1);
  EXPECT_EQ(cache.use(3).slot, -1) << "both slots hold blocks this step reads";
  cache.unpin_all();
  EXPECT_EQ(cache.use(3).evicted, 1);
}

// Decode steps over random K/V with a token selection (what a store of `spec` attends to), and the
// tier's counters after them.
struct DecodeSteps {
  static constexpr int kHeads = 4, kKvHeads = 2, d = 64, kPrompt = 640, kSteps = 8;
  std::vector<float> k = random(size_t(kPrompt + kSteps) * kKvHeads * d, 1), v = random(k.size(), 2);
  std::vector<float> q = random(size_t(kSteps) * kHeads * d, 3);
  ThreadPool pool{2};
  AttentionParams params{kHeads, 1.0f / std::sqrt(float(d)), &pool};

  static std::vector<float> random(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(n);
    for (float& value : x) value = normal(rng);
    return x;
  }

  std::vector<float> run(const std::string& spec, TierStats* stats) {
    auto pipeline = make_kv_pipeline(spec);
    EXPECT_TRUE(pipeline) << pipeline.status().message();
    KvStore store({1, kKvHeads, d, d, kPrompt + kSteps}, *pipeline);
    store.append(0, k.data(), v.data(), kPrompt);
    std::vector<float> out(size_t(kSteps) * kHeads * d);
    for (int step = 0; step < kSteps; ++step) {
      const size_t row = size_t(kPrompt + step) * kKvHeads * d;
      store.append(0, k.data() + row, v.data() + row, 1);
      const float* q_step = q.data() + size_t(step) * kHeads * d;
      const std::vector<HeadSelection>& selection = store.select(0, q_step, 1, kHeads, pool);
      attend(store, 0, q_step, 1, kPrompt + step, params, out.data() + size_t(step) * kHeads * d, &selection);
    }
    if (stats) *stats = store.tier_stats();
    return out;
  }
};

TEST(OffloadTier, AttendsExactlyAsTheFastTierAndCountsTraffic) {
  DecodeSteps steps;
  TierStats stats;
  const std::string selector = "oracle:topk=64,local=64+hack:bits=4";
  EXPECT_EQ(steps.run(selector + "@offload:cache=256", &stats), steps.run(selector, nullptr));
  EXPECT_GT(stats.hits, 0);
  EXPECT_GT(stats.misses, 0);
  const size_t block_bytes = stats.bytes_written / (DecodeSteps::kPrompt / 64 * DecodeSteps::kKvHeads);
  EXPECT_EQ(stats.bytes_moved, size_t(stats.misses) * block_bytes);
  EXPECT_EQ(steps.run("hack:bits=4@offload:cache=64,policy=lfu", nullptr), steps.run("hack:bits=4", nullptr))
      << "everything";
  EXPECT_FALSE(make_kv_pipeline("dense@offload:dir=/nonexistent/dir"));
  EXPECT_FALSE(make_kv_pipeline("dense@offload:policy=mru"));
}

// pq's re-rank reads its candidates' keys before the step's blocks are staged: those not in the cache
// are read where they lie in the slow tier, key rows only (dense: d FP32 each), and counted as moved.
TEST(OffloadTier, CountsTheReRanksKeyReadsAsTraffic) {
  DecodeSteps steps;
  const size_t key_bytes = DecodeSteps::d * sizeof(float);
  for (const double rerank : {1.0, 2.0}) {
    TierStats stats;
    steps.run(str_cat("pq:topk=64,local=64,rerank=", rerank, "+dense@offload:cache=64"), &stats);
    const size_t block_bytes = stats.bytes_written / (DecodeSteps::kPrompt / 64 * DecodeSteps::kKvHeads);
    const size_t staged = size_t(stats.misses) * block_bytes;
    ASSERT_GE(stats.bytes_moved, staged);
    const size_t direct = stats.bytes_moved - staged;
    if (rerank == 1.0) {
      EXPECT_EQ(direct, 0u) << "codes alone read no keys";
      continue;
    }
    // At most every candidate's key (2 · 64 per KV head and step), and some of them from the slow tier.
    EXPECT_GT(direct, 0u);
    EXPECT_LE(direct, size_t(DecodeSteps::kSteps) * DecodeSteps::kKvHeads * 128 * key_bytes);
    EXPECT_EQ(direct % key_bytes, 0u) << "key rows, not blocks";
  }
}

// `@kvpr` (device cuda: tests/cuda/kv_tier_test.cc runs it): its options and their errors.
TEST(KvprSpec, OptionsParseAndBadOnesAreRefused) {
  auto parsed = make_kv_pipeline("dense:dtype=f16@kvpr");
  ASSERT_TRUE(parsed.has_value()) << parsed.status().message();
  const KvPipeline automatic = parsed.take();
  ASSERT_TRUE(automatic.kvpr.has_value());
  EXPECT_LT(automatic.kvpr->split, 0);
  EXPECT_EQ(automatic.kvpr->micro_batches, 1);
  EXPECT_NE(automatic.describe().find("@kvpr:split=auto,schedule=row"), std::string::npos) << automatic.describe();
  parsed = make_kv_pipeline("dense@kvpr:split=0.25,schedule=column,batches=3,reprofile=on");
  ASSERT_TRUE(parsed.has_value()) << parsed.status().message();
  const KvPipeline column = parsed.take();
  EXPECT_DOUBLE_EQ(column.kvpr->split, 0.25);
  EXPECT_EQ(column.kvpr->micro_batches, 3);
  EXPECT_TRUE(column.kvpr->reprofile);
  EXPECT_NE(column.describe().find("schedule=column,batches=3"), std::string::npos) << column.describe();
  for (const char* bad : {"dense@kvpr:split=1.5", "dense@kvpr:schedule=diagonal", "dense@kvpr:bogus=1",
                          "pq:topk=0.2+dense@kvpr", "dense@kvpr:batches=-1"}) {
    EXPECT_FALSE(make_kv_pipeline(bad).has_value()) << bad;
  }
  // The CPU engine refuses it by name.
  EngineConfig config;
  config.model_dir = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
  config.kv_spec = "dense@kvpr";
  const auto engine = Engine::load(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("device 'cuda' only"), std::string::npos) << engine.status().message();
}

}  // namespace
}  // namespace slimkv
