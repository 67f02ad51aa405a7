// slimkv/kv_inspection.h and slimkv/codec.h, the public views the Python module reads: a session's
// sealed blocks are what its open block held (dense: exactly), ranges and errors name the bad value,
// and a codec used alone attends as attention over its decoded block does.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "slimkv/codec.h"
#include "slimkv/kv_inspection.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

TEST(KvInspection, DenseSealsExactlyWhatTheOpenBlockHeld) {
  auto engine = Engine::load({.model_dir = kModel, .threads = 1});
  ASSERT_TRUE(engine) << engine.status().message();
  auto session = (*engine)->new_session();
  std::vector<int32_t> ids(63);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(10 + 7 * i);
  ASSERT_TRUE(session->prefill(ids));
  auto kv = kv_snapshot(**engine, *session);  // device cpu: the live store
  ASSERT_TRUE(kv) << kv.status().message();
  EXPECT_FALSE(kv->copied_from_gpu());
  const KvLayout layout = kv_layout(*kv);
  EXPECT_EQ(layout.num_layers, 8);  // config.json's num_hidden_layers, num_key_value_heads
  EXPECT_EQ(layout.num_kv_heads, 2);
  EXPECT_EQ(layout.block_tokens, 64);
  std::vector<float> open_k, open_v, k, v;
  ASSERT_TRUE(read_open_kv(*kv, 2, 1, open_k, open_v));
  auto head = kv_head_layout(*kv, 2, 1);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->open_tokens, 63);
  EXPECT_EQ(head->sealed_blocks, 0);
  ASSERT_EQ(open_k.size(), size_t(63 * head->k_dim));

  ASSERT_TRUE(session->decode(5));  // the 64th token seals block 0
  head = kv_head_layout(*kv, 2, 1);
  EXPECT_EQ(head->sealed_blocks, 1);
  EXPECT_EQ(head->open_tokens, 0);
  ASSERT_TRUE(decode_kv_block(*kv, 2, 1, 0, k, v));
  ASSERT_EQ(k.size(), size_t(64 * head->k_dim));
  EXPECT_EQ(std::vector<float>(k.begin(), k.begin() + std::ptrdiff_t(open_k.size())), open_k);
  EXPECT_EQ(std::vector<float>(v.begin(), v.begin() + std::ptrdiff_t(open_v.size())), open_v);
  auto selection = kv_last_selection(*kv, 2, 1);
  ASSERT_TRUE(selection);
  EXPECT_TRUE(selection->all);

  EXPECT_NE(kv_head_layout(*kv, 8, 0).status().message().find("layer 8 is out of range"), std::string::npos);
  EXPECT_NE(kv_head_layout(*kv, 0, -1).status().message().find("KV head -1"), std::string::npos);
  EXPECT_NE(decode_kv_block(*kv, 0, 0, 1, k, v).message().find("block 1 is out of range"), std::string::npos);
  auto other = Engine::load({.model_dir = kModel, .threads = 1});
  ASSERT_TRUE(other) << other.status().message();
  EXPECT_NE(kv_snapshot(**other, *session).status().message().find("is not one of this engine's"), std::string::npos);
}

// sinks=N: block 0 is sealed with stand-ins for its first N tokens (kept in FP16 beside it); decoding the
// block gives the tokens themselves, as the open block held them.
TEST(KvInspection, BlockZeroOfASinksStoreDecodesToItsSinkTokens) {
  auto engine = Engine::load({.model_dir = kModel, .kv_spec = "hack:bits=4,pi=64,sinks=4", .threads = 1});
  ASSERT_TRUE(engine) << engine.status().message();
  auto session = (*engine)->new_session();
  std::vector<int32_t> ids(63);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(10 + 7 * i);
  ASSERT_TRUE(session->prefill(ids));
  auto kv = kv_snapshot(**engine, *session);
  ASSERT_TRUE(kv) << kv.status().message();
  std::vector<float> open_k, open_v, k, v;
  ASSERT_TRUE(read_open_kv(*kv, 2, 1, open_k, open_v));
  ASSERT_TRUE(session->decode(5));  // the 64th token seals block 0
  ASSERT_TRUE(decode_kv_block(*kv, 2, 1, 0, k, v));
  // The 4 sink rows exactly as the open block held them (the other rows are 4-bit codes).
  const auto head = kv_head_layout(*kv, 2, 1);
  ASSERT_TRUE(head);
  const std::ptrdiff_t k_rows = 4 * head->k_dim, v_rows = 4 * head->v_dim;
  EXPECT_EQ(std::vector<float>(k.begin(), k.begin() + k_rows), std::vector<float>(open_k.begin(), open_k.begin() + k_rows));
  EXPECT_EQ(std::vector<float>(v.begin(), v.begin() + v_rows), std::vector<float>(open_v.begin(), open_v.begin() + v_rows));
  // Row 4 is not a sink: quantized, it is not what the open block held.
  EXPECT_NE(std::vector<float>(k.begin() + k_rows, k.begin() + k_rows + head->k_dim),
            std::vector<float>(open_k.begin() + k_rows, open_k.begin() + k_rows + head->k_dim));
}

TEST(BlockCodec, AttendsAsAttentionOverItsDecodedBlock) {
  auto codec = BlockCodec::from_spec("quant:bits=4");
  ASSERT_TRUE(codec) << codec.status().message();
  const int tokens = codec->block_tokens(), k_dim = 64, v_dim = 80;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(tokens * k_dim)), v(size_t(tokens * v_dim)), q(size_t(2 * k_dim));
  for (float* values : {k.data(), v.data()}) {
    for (size_t i = 0; i < (values == k.data() ? k.size() : v.size()); ++i) values[i] = normal(rng);
  }
  for (float& x : q) x = normal(rng);
  auto block = codec->encode(k.data(), v.data(), k_dim, v_dim);
  ASSERT_TRUE(block) << block.status().message();
  std::vector<float> dk, dv, out;
  ASSERT_TRUE(codec->decode(*block, dk, dv));
  const float scale = 1.0f / std::sqrt(float(k_dim));
  ASSERT_TRUE(codec->attention(*block, q.data(), 2, scale, out));
  for (int i = 0; i < 2; ++i) {  // FP64 reference over the decoded K/V
    std::vector<double> weights(static_cast<size_t>(tokens));
    double top = -1e300, sum = 0;
    for (int t = 0; t < tokens; ++t) {
      double s = 0;
      for (int c = 0; c < k_dim; ++c) s += double(q[size_t(i * k_dim + c)]) * dk[size_t(t * k_dim + c)];
      weights[size_t(t)] = s * scale;
      top = std::max(top, weights[size_t(t)]);
    }
    for (double& w : weights) sum += (w = std::exp(w - top));
    for (int c = 0; c < v_dim; ++c) {
      double expected = 0;
      for (int t = 0; t < tokens; ++t) expected += weights[size_t(t)] / sum * dv[size_t(t * v_dim + c)];
      EXPECT_NEAR(out[size_t(i * v_dim + c)], expected, 1e-4) << "query " << i << " column " << c;
    }
  }
  EncodedBlock wrong = *block;
  wrong.bytes.pop_back();
  EXPECT_NE(codec->decode(wrong, dk, dv).message().find("bytes are not a"), std::string::npos);
  EXPECT_NE(BlockCodec::from_spec("pq:topk=0.1").status().message().find("a codec alone"), std::string::npos);
}

}  // namespace
}  // namespace slimkv
