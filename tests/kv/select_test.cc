// Selectors (kv/select): attention over a token selection against the FP64 reference over the same
// tokens, a selection of everything equal to dense exactly (through the whole model too), k-means
// determinism, and the PQ top-k's recall of the exact (oracle) top-k on real keys of the bundled model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "attention/reference.h"
#include "backend/cpu/vec_ops.h"
#include "kv/select/kmeans.h"
#include "kv/select/pq_selector.h"
#include "kv/store_attention.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

#include "sanitizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::vector<float> normal_vector(size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& value : x) value = normal(rng);
  return x;
}

// One decode query over 300 stored tokens (4 sealed blocks + 44 open), 4 query heads on 2 KV heads.
struct SelectionCase {
  static constexpr int kHeads = 4, kKvHeads = 2, kDim = 64, kTokens = 300;
  std::vector<float> q = normal_vector(size_t(kHeads) * kDim, 1);
  std::vector<float> k = normal_vector(size_t(kTokens) * kKvHeads * kDim, 2, 1.5f);
  std::vector<float> v = normal_vector(size_t(kTokens) * kKvHeads * kDim, 3);
  ThreadPool pool{2};
  AttentionParams params{kHeads, 1.0f / std::sqrt(float(kDim)), &pool};

  std::vector<float> attend_with(const std::string& spec, const std::vector<HeadSelection>* selection) {
    auto pipeline = make_kv_pipeline(spec);
    EXPECT_TRUE(pipeline) << pipeline.status().message();
    KvStore store({1, kKvHeads, kDim, kDim, kTokens}, *pipeline);
    store.append(0, k.data(), v.data(), kTokens);
    std::vector<float> out(size_t(kHeads) * kDim);
    attend(store, 0, q.data(), 1, kTokens - 1, params, out.data(), selection);
    return out;
  }
};

TEST(Selection, AllTokensListedIsDenseExactly) {
  SelectionCase c;
  std::vector<HeadSelection> everything(SelectionCase::kKvHeads, HeadSelection{false, {}});
  for (HeadSelection& head : everything) {
    for (int t = 0; t < SelectionCase::kTokens; ++t) head.tokens.push_back(t);
  }
  for (const std::string spec : {"dense", "hack:bits=4"}) {
    EXPECT_EQ(c.attend_with(spec, &everything), c.attend_with(spec, nullptr)) << spec;
  }
}

// Without scores, and with the exact scores of the ranked tokens given (as pq's re-rank gives them:
// attention then reads only their values).
TEST(Selection, AttentionOverSelectedTokensMatchesTheReferenceOverThem) {
  for (const bool scores_given : {false, true}) {
    SCOPED_TRACE(scores_given ? "scores given" : "keys read");
    SelectionCase c;
    constexpr int kHeads = SelectionCase::kHeads, kKvHeads = SelectionCase::kKvHeads, d = SelectionCase::kDim;
    // Head 0: a scatter over every block, one whole block, and more than a block's worth gathered.
    // Head 1: a few tokens only. Both end with the open block (always attended whole).
    std::vector<HeadSelection> selection(kKvHeads, HeadSelection{false, {}});
    for (int t = 0; t < 256; ++t) {
      if (t % 3 == 0 || (t >= 64 && t < 128)) selection[0].tokens.push_back(t);
    }
    selection[1].tokens = {0, 1, 2, 3, 77, 200, 255};
    for (int g = 0; g < kKvHeads && scores_given; ++g) {
      HeadSelection& head = selection[size_t(g)];
      head.ranked_first = 4;  // the first 4 and the last 50 tokens are read whole: mixed blocks
      head.ranked_last = 250;
      for (int t : head.tokens) {
        for (int h = 0; t >= head.ranked_first && t < head.ranked_last && h < kHeads / kKvHeads; ++h) {
          const float* q = c.q.data() + size_t(g * (kHeads / kKvHeads) + h) * d;
          const float* k = c.k.data() + (size_t(t) * kKvHeads + size_t(g)) * d;
          head.scores.push_back(float(std::inner_product(q, q + d, k, 0.0)));
        }
      }
    }
    for (HeadSelection& head : selection) {
      for (int t = 256; t < SelectionCase::kTokens; ++t) head.tokens.push_back(t);
    }
    const std::vector<float> out = c.attend_with("dense", &selection);
    for (int g = 0; g < kKvHeads; ++g) {
      const std::vector<int>& tokens = selection[size_t(g)].tokens;
      std::vector<float> k, v;  // the selected tokens of KV head g, as one head
      for (int t : tokens) {
        const size_t row = (size_t(t) * kKvHeads + size_t(g)) * d;
        k.insert(k.end(), c.k.begin() + ptrdiff_t(row), c.k.begin() + ptrdiff_t(row + d));
        v.insert(v.end(), c.v.begin() + ptrdiff_t(row), c.v.begin() + ptrdiff_t(row + d));
      }
      const int group = kHeads / kKvHeads, position = int(tokens.size()) - 1;
      std::vector<float> expected(size_t(group) * d);
      attention_reference(c.q.data() + size_t(g) * group * d, 1, &position, k.data(), v.data(), int(tokens.size()),
                          group, 1, d, d, c.params.scale, expected.data());
      for (int i = 0; i < group * d; ++i) {
        EXPECT_NEAR(out[size_t(g) * group * d + size_t(i)], expected[size_t(i)], 2e-5) << "kv head " << g << " " << i;
      }
    }
  }
}

// The scores pq's re-rank hands to attention are each query head's own q·k: attention over its selection
// is the same with them as with the keys read again.
TEST(Selection, PqReRankScoresAreEachHeadsExactScores) {
  SelectionCase c;
  auto pipeline = make_kv_pipeline("pq:topk=0.2,local=16,rerank=2");
  ASSERT_TRUE(pipeline) << pipeline.status().message();
  KvStore store({1, SelectionCase::kKvHeads, SelectionCase::kDim, SelectionCase::kDim, SelectionCase::kTokens},
                *pipeline);
  store.append(0, c.k.data(), c.v.data(), SelectionCase::kTokens);
  std::vector<HeadSelection> selection = store.select(0, c.q.data(), 1, SelectionCase::kHeads, c.pool);
  std::vector<HeadSelection> keys_read = selection;
  const int group = SelectionCase::kHeads / SelectionCase::kKvHeads, k = 60;  // 20 % of 300 tokens
  for (HeadSelection& head : keys_read) {
    ASSERT_EQ(head.scores.size(), size_t(k * group));
    head.scores.clear();
  }
  std::vector<float> with_scores(size_t(SelectionCase::kHeads) * SelectionCase::kDim), with_keys(with_scores.size());
  attend(store, 0, c.q.data(), 1, SelectionCase::kTokens - 1, c.params, with_scores.data(), &selection);
  attend(store, 0, c.q.data(), 1, SelectionCase::kTokens - 1, c.params, with_keys.data(), &keys_read);
  for (size_t i = 0; i < with_scores.size(); ++i) EXPECT_NEAR(with_scores[i], with_keys[i], 1e-5) << i;
}

std::vector<int32_t> heldout_ids(const Engine& engine, int tokens) {
  std::ifstream in(kModel + "/heldout.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = engine.tokenizer()->encode(text.str().substr(0, size_t(tokens) * 8));
  ids.resize(size_t(tokens));
  return ids;
}

// Logits of `decode_tokens` decode steps after a prefill, greedy.
std::vector<float> decode_logits(const std::string& spec, int prompt_tokens, int decode_tokens) {
  EngineConfig config;
  config.model_dir = kModel;
  config.kv_spec = spec;
  config.threads = 2;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  if (!engine) return {};
  auto session = (*engine)->new_session();
  auto logits = session->prefill(heldout_ids(**engine, prompt_tokens));
  std::vector<float> all;
  for (int i = 0; i < decode_tokens && logits; ++i) {
    logits = session->decode(int32_t(std::max_element(logits->begin(), logits->end()) - logits->begin()));
    all.insert(all.end(), logits->begin(), logits->end());
  }
  return all;
}

TEST(Selection, PqWithTopkOfAllTokensIsDenseExactly) {
  const std::vector<float> dense = decode_logits("dense", 320, 2);
  EXPECT_EQ(decode_logits("pq:topk=1.0", 320, 2), dense);
  EXPECT_NE(decode_logits("pq:topk=0.1,local=16", 320, 2), dense) << "a real selection changes something";
}

TEST(Selection, TheLastDecodeStepsSelectionIsReportedPerLayerAndKvHead) {
  EngineConfig config;
  config.model_dir = kModel;
  config.kv_spec = "pq:topk=0.1";
  config.threads = 2;
  auto engine = Engine::load(config);
  ASSERT_TRUE(engine) << engine.status().message();
  auto session = (*engine)->new_session();
  ASSERT_TRUE(session->prefill(heldout_ids(**engine, 320)));
  EXPECT_TRUE(session->kv().last_selection(0, 0).all) << "a prompt attends to every token";
  ASSERT_TRUE(session->decode(13));
  for (int layer = 0; layer < session->kv().shape().num_layers; ++layer) {
    for (int g = 0; g < session->kv().shape().num_kv_heads; ++g) {
      const HeadSelection& selection = session->kv().last_selection(layer, g);
      ASSERT_FALSE(selection.all);
      EXPECT_EQ(selection.tokens.size(), size_t(4 + 32 + 64));  // init + 10 % of 321 tokens + local
      EXPECT_TRUE(std::is_sorted(selection.tokens.begin(), selection.tokens.end()));
      EXPECT_EQ(selection.tokens.back(), 320);
    }
  }
}

// pq re-ranks its candidates by keys read back from the store's blocks: with every middle token a
// candidate it is the oracle, through the offload tier too.
TEST(Selection, PqReRankingEveryTokenIsTheOracle) {
  SelectionCase c;
  auto selections = [&](const std::string& spec) {
    auto pipeline = make_kv_pipeline(spec);
    EXPECT_TRUE(pipeline) << pipeline.status().message();
    KvStore store({1, SelectionCase::kKvHeads, SelectionCase::kDim, SelectionCase::kDim, SelectionCase::kTokens},
                  *pipeline);
    store.append(0, c.k.data(), c.v.data(), SelectionCase::kTokens);
    return store.select(0, c.q.data(), 1, SelectionCase::kHeads, c.pool);
  };
  const std::vector<HeadSelection> oracle = selections("oracle:topk=0.1,local=16");
  for (const std::string spec : {"pq:topk=0.1,local=16,rerank=100", "pq:topk=0.1,local=16,rerank=100@offload"}) {
    const std::vector<HeadSelection> pq = selections(spec);
    for (int g = 0; g < SelectionCase::kKvHeads; ++g) {
      ASSERT_FALSE(pq[size_t(g)].all);
      EXPECT_EQ(pq[size_t(g)].tokens, oracle[size_t(g)].tokens) << spec << " head " << g;
    }
  }
  EXPECT_NE(selections("pq:topk=0.1,local=16,rerank=1")[0].tokens, oracle[0].tokens) << "codes alone miss some";
}

// What a selector keeps beside the blocks is counted in the store's memory: oracle an FP32 copy of the
// sealed keys; pq its index (an FP16 codebook of 2^b centroids per segment begun, m code bytes per token) and
// the FP32 keys of the segment still filling (here 64 of 192 tokens), per KV head.
TEST(Selection, SelectorMemoryIsCounted) {
  SelectionCase c;
  const size_t sealed = 256, keys = sealed * SelectionCase::kKvHeads * SelectionCase::kDim * sizeof(float);
  for (const auto& [spec, expected] : std::vector<std::pair<std::string, size_t>>{
           {"dense", 0},
           {"oracle:topk=0.2+dense", keys},
           {"pq:m=2,b=6,segment=192,topk=0.2+dense",
            SelectionCase::kKvHeads * (2 * 64 * SelectionCase::kDim * sizeof(uint16_t) + sealed * 2 +
                                       64 * SelectionCase::kDim * sizeof(float))}}) {
    auto pipeline = make_kv_pipeline(spec);
    ASSERT_TRUE(pipeline) << pipeline.status().message();
    KvStore store({1, SelectionCase::kKvHeads, SelectionCase::kDim, SelectionCase::kDim, SelectionCase::kTokens}, *pipeline);
    store.append(0, c.k.data(), c.v.data(), SelectionCase::kTokens);
    const KvMemory memory = store.memory();
    EXPECT_EQ(memory.selector_bytes, expected) << spec;
    EXPECT_EQ(memory.fast_bytes(), memory.sealed_bytes + memory.open_bytes + expected) << spec;
  }
}

TEST(KMeans, IsDeterministicForASeed) {
  const std::vector<float> points = normal_vector(500 * 16, 9);
  const std::vector<float> a = kmeans(points.data(), 500, 8, 16, 32, 20, 42);
  EXPECT_EQ(a, kmeans(points.data(), 500, 8, 16, 32, 20, 42));
  EXPECT_NE(a, kmeans(points.data(), 500, 8, 16, 32, 20, 43));
  // Every centroid is the mean of its points at convergence: none further than the data's spread.
  for (float x : a) EXPECT_LT(std::abs(x), 4.0f);
}

TEST(KMeans, GemmAssignmentMatchesThePlainNearestCentroid) {
  const int n = 1100, dim = 16, stride = 40, k = 64;  // several GEMM chunks, strided sub-vectors
  const std::vector<float> points = normal_vector(size_t(n) * stride, 5);
  const std::vector<float> centroids = normal_vector(size_t(k) * dim, 6);
  std::vector<int> nearest(n);
  assign_nearest(points.data() + 8, n, dim, stride, centroids.data(), k, nearest.data());
  auto distance = [&](const float* x, int c) {
    double sum = 0;
    for (int j = 0; j < dim; ++j) sum += (x[j] - centroids[size_t(c) * dim + j]) * (x[j] - centroids[size_t(c) * dim + j]);
    return sum;
  };
  for (int i = 0; i < n; ++i) {
    const float* x = points.data() + 8 + size_t(i) * stride;
    const int expected = nearest_centroid(x, centroids.data(), k, dim);
    // The same centroid, or one as near up to float rounding (a near-tie).
    EXPECT_NEAR(distance(x, nearest[size_t(i)]), distance(x, expected), 1e-4 * distance(x, expected)) << i;
  }
}

constexpr int kRecallTokens = 2048, kRecallQueries = 16;

// Keys of every layer and the last tokens' queries, as the model computed them.
struct Recorder : ForwardObserver {
  std::vector<std::vector<float>> keys, last_q;  // last_q: [kRecallQueries, q_width] per layer
  int kv_width = 0, q_width = 0;
  void on_qkv(int layer, const float* q, const float* k, const float*, int n) override {
    if (keys.size() <= size_t(layer)) keys.resize(size_t(layer) + 1), last_q.resize(size_t(layer) + 1);
    keys[size_t(layer)].insert(keys[size_t(layer)].end(), k, k + size_t(n) * kv_width);
    last_q[size_t(layer)].assign(q + size_t(n - kRecallQueries) * q_width, q + size_t(n) * q_width);
  }
};

// The bundled model over 2048 tokens of held-out text, recorded once for the recall tests.
const Recorder& recorded_bundled_model(KvShape& shape) {
  static Recorder recorder;
  static KvShape recorded_shape;
  if (recorder.keys.empty()) {
    EngineConfig config;
    config.model_dir = kModel;
    config.threads = 2;
    auto engine = Engine::load(config);
    EXPECT_TRUE(engine) << engine.status().message();
    recorded_shape = (*engine)->model().kv_shape();
    recorder.kv_width = recorded_shape.num_kv_heads * recorded_shape.k_dim;
    recorder.q_width = int((*engine)->model().config().num_heads) * recorded_shape.k_dim;
    auto session = (*engine)->new_session();
    session->set_observer(&recorder);
    EXPECT_TRUE(session->prefill(heldout_ids(**engine, kRecallTokens)));
  }
  shape = recorded_shape;
  return recorder;
}

// The recorded keys of sealed tokens, scoring them as a store would for pq's re-rank.
struct RecordedKeys : SealedKeys {
  const Recorder& recorder;
  int num_kv_heads, k_dim;
  RecordedKeys(const Recorder& recorder, const KvShape& shape)
      : recorder(recorder), num_kv_heads(shape.num_kv_heads), k_dim(shape.k_dim) {}
  void score(int layer, int head, const float* q, int rows, const int* tokens, int n, float* scores) const override {
    for (int i = 0; i < n; ++i) {
      const float* k = recorder.keys[size_t(layer)].data() +
                       (size_t(tokens[i]) * size_t(num_kv_heads) + size_t(head)) * size_t(k_dim);
      for (int r = 0; r < rows; ++r) *scores++ = dot(q + size_t(r) * size_t(k_dim), k, size_t(k_dim));
    }
  }
};

// How the selector learns the keys: all sealed blocks and then one prefill call (a prompt), or one
// block at a time with a decode step after each (generated tokens: PQ clusters as blocks come).
enum class Feed { kPrompt, kBlockByBlock };

// Recall of `spec`'s middle tokens (top-k) against the oracle's, over every layer and KV head, for the
// queries of the last 16 tokens (one query is a noisy measure) over the same sealed keys.
double recall_on_bundled_model(const std::string& spec, Feed feed) {
  KvShape shape;
  const Recorder& recorder = recorded_bundled_model(shape);
  const int tokens = kRecallTokens, block_tokens = 64, sealed = tokens / block_tokens * block_tokens;
  ThreadPool pool(2);
  const RecordedKeys sealed_keys(recorder, shape);
  // The selections for each query: [query][KV head].
  auto selections = [&](const std::string& selector_spec, Feed how, int layer) {
    auto pipeline = make_kv_pipeline(selector_spec);
    EXPECT_TRUE(pipeline) << pipeline.status().message();
    auto selector = pipeline->selector->make(shape.num_layers, shape.num_kv_heads, shape.k_dim, block_tokens, 0);
    const int num_heads = recorder.q_width / shape.k_dim;
    std::vector<float> block(size_t(block_tokens) * shape.k_dim);
    std::vector<HeadSelection> selection;
    for (int first = 0; first < sealed; first += block_tokens) {
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        for (int t = 0; t < block_tokens; ++t) {
          const size_t row = (size_t(first + t) * shape.num_kv_heads + size_t(g)) * shape.k_dim;
          std::copy_n(recorder.keys[size_t(layer)].data() + row, shape.k_dim, block.data() + size_t(t) * shape.k_dim);
        }
        selector->on_seal(layer, g, block.data());
      }
      if (how == Feed::kBlockByBlock) {  // a decode step with this block's query stand-in
        const int held = first + block_tokens + 1;
        selector->select(layer, recorder.last_q[size_t(layer)].data(), num_heads, held, first + block_tokens,
                         sealed_keys, pool, selection);
      }
    }
    if (how == Feed::kPrompt) selector->on_prefill(layer);
    std::vector<std::vector<HeadSelection>> per_query(kRecallQueries);
    for (int query = 0; query < kRecallQueries; ++query) {
      selector->select(layer, recorder.last_q[size_t(layer)].data() + size_t(query) * recorder.q_width, num_heads,
                       tokens, sealed, sealed_keys, pool, per_query[size_t(query)]);
    }
    return per_query;
  };
  // The exact top-k per layer, computed once for every spec measured (keeps the tests fast under ASan).
  static std::vector<std::vector<std::vector<HeadSelection>>> oracle;
  if (oracle.empty()) {
    for (int layer = 0; layer < shape.num_layers; ++layer) {
      oracle.push_back(selections("oracle:topk=0.2", Feed::kPrompt, layer));
    }
  }
  double recall = 0.0;
  int counted = 0;
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    const std::vector<std::vector<HeadSelection>> approximate_all = selections(spec, feed, layer);
    const std::vector<std::vector<HeadSelection>>& exact_all = oracle[size_t(layer)];
    for (int query = 0; query < kRecallQueries; ++query) {
      const std::vector<HeadSelection>& approximate = approximate_all[size_t(query)];
      const std::vector<HeadSelection>& exact = exact_all[size_t(query)];
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        EXPECT_FALSE(exact[size_t(g)].all);
        // The top-k part only: initial and local tokens are in both selections by construction.
        std::set<int> truth;
        for (int t : exact[size_t(g)].tokens) {
          if (t >= exact[size_t(g)].ranked_first && t < exact[size_t(g)].ranked_last) truth.insert(t);
        }
        EXPECT_EQ(truth.size(), size_t(410)) << "20 % of 2048 tokens";
        int hits = 0;
        for (int t : approximate[size_t(g)].tokens) hits += truth.count(t) ? 1 : 0;
        recall += double(hits) / double(truth.size());
        ++counted;
      }
    }
  }
  return recall / counted;
}

// Recall on the bundled model's keys is a quality figure: under ASan+UBSan (~3.5x slower than release on the model) it
// is left to the release build. The same code is checked for memory errors there by the Selection and
// KMeans tests above (pq with every token re-ranked is the oracle, top-k of all tokens is dense),
// BundledModel.PqAtOneFifthOfTokensFromTheOffloadTierRetrievesThePassKey (pq on the pass-key prompt, segments
// and offload tier) and kv_spec_fuzz (the factory). docs/testing.md: "CI time".

TEST(PqSelector, RecallsTheExactTopKOnRealKeys) {
  SKIP_UNDER_ASAN("quality only");
  // 2048 tokens of held-out text keep the test fast (the eval's fidelity task measures 4096).
  const double recall = recall_on_bundled_model("pq:m=2,b=6,topk=0.2", Feed::kPrompt);
  const double ranked_by_codes = recall_on_bundled_model("pq:m=2,b=6,topk=0.2,rerank=1", Feed::kPrompt);
  EXPECT_GE(recall, 0.8) << "the issue's target";
  EXPECT_GT(recall, ranked_by_codes + 0.03) << "the exact re-rank of 1.25 k candidates finds more";
  RecordProperty("recall", std::to_string(recall));
  std::printf("PQ m=2 b=6 recall of the oracle's selection: %.3f (codes alone, rerank=1: %.3f)\n", recall,
              ranked_by_codes);
}

TEST(PqSelector, SegmentCodebooksFollowTheKeysAsTheyCome) {
  SKIP_UNDER_ASAN("quality only");
  // Tokens sealed one block at a time: a single codebook, trained on the first blocks, codes the later
  // keys badly (RoPE turns them with position); a codebook per segment keeps up.
  const double segmented = recall_on_bundled_model("pq:topk=0.2,rerank=1", Feed::kBlockByBlock);
  const double single = recall_on_bundled_model("pq:topk=0.2,rerank=1,segment=4096", Feed::kBlockByBlock);
  std::printf("PQ recall, blocks one by one: %.3f with segments, %.3f with one codebook\n", segmented, single);
  // A floor under what the bundled model gives (0.774 with segments, 0.685 with one codebook, 2026-11-28):
  // the claim is the margin, the floor catches a codebook that stopped learning.
  EXPECT_GE(segmented, 0.75);
  EXPECT_GT(segmented, single + 0.03);
}

TEST(PqSelector, SpecsAreCheckedAndDescribed) {
  auto pipeline = make_kv_pipeline("pq:m=2,b=6,topk=0.2+hack:bits=2");
  ASSERT_TRUE(pipeline) << pipeline.status().message();
  EXPECT_EQ(pipeline->describe().substr(0, 85),
            "pq:m=2,b=6,topk=0.2,init=4,local=64,rerank=1.25,iters=auto,segment=256,cache=4096,pol");
  EXPECT_FALSE(make_kv_pipeline("pq:segment=32")) << "fewer tokens than centroids";
  EXPECT_FALSE(make_kv_pipeline("pq:m=3"));
  EXPECT_FALSE(make_kv_pipeline("pq:rerank=0.5")) << "fewer candidates than selected tokens";
  EXPECT_FALSE(make_kv_pipeline("pq:policy=fifo"));
  // rows=off and rows=on (CUDA @offload's token-major copies) are described; the default, auto, is not.
  for (const char* rows : {"off", "on"}) {
    auto spec = make_kv_pipeline(std::string("pq:topk=0.2,rows=") + rows + "@offload");
    ASSERT_TRUE(spec) << spec.status().message();
    EXPECT_NE(spec->describe().find(std::string(",rows=") + rows), std::string::npos) << spec->describe();
  }
  EXPECT_EQ(pipeline->describe().find("rows="), std::string::npos) << pipeline->describe();
  EXPECT_FALSE(make_kv_pipeline("pq:rows=maybe"));
  EXPECT_FALSE(make_kv_pipeline("hack+pq")) << "the selector comes first";
  EXPECT_FALSE(make_kv_pipeline("oracle:m=2")) << "oracle has no PQ options";
  EXPECT_TRUE(make_kv_pipeline("oracle:topk=0.1,init=4,local=64+dense"));
}

}  // namespace
}  // namespace slimkv
