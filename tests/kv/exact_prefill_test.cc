// prefill=exact: a prefill chunk's queries read the chunk's own K/V as appended, and the tokens before
// the chunk from the store. Held to the FP64 reference over exactly those K/V: the store's decoded
// blocks for the history, the appended values for the chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "kv/kv_factory.h"
#include "kv/store_attention.h"
#include "nmse.h"
#include "slimkv/status.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

constexpr int kHeads = 8, kKvHeads = 2, kDim = 64;

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// Appends `history` tokens in one call, then a chunk of `chunk` tokens, and returns the chunk's
// attention output through `spec`, with the reference over (the store's history, the chunk exactly).
struct ChunkResult {
  std::vector<float> out, reference;
};

ChunkResult attend_second_chunk(const std::string& spec, int history, int chunk) {
  SCOPED_TRACE(str_cat("chunk(", spec, ",history=", history, ",chunk=", chunk, ")"));
  std::mt19937 rng(11);  // the same data for every spec
  const int tokens = history + chunk;
  const auto k = random_values(size_t(tokens) * kKvHeads * kDim, rng), v = random_values(k.size(), rng);
  const auto q = random_values(size_t(chunk) * kHeads * kDim, rng);
  auto pipeline = make_kv_pipeline(spec);
  EXPECT_TRUE(pipeline.has_value()) << pipeline.status().message();
  KvStore store({1, kKvHeads, kDim, kDim, tokens}, *pipeline);
  store.append(0, k.data(), v.data(), history);
  store.append(0, k.data() + size_t(history) * kKvHeads * kDim, v.data() + size_t(history) * kKvHeads * kDim, chunk);
  ThreadPool pool(2);
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kDim)), &pool};
  ChunkResult result;
  result.out.resize(q.size());
  attend(store, 0, q.data(), chunk, history, params, result.out.data());

  // The reference's K/V: history tokens as the store holds them (sealed blocks decoded; the open block
  // widened from FP16), then the chunk's tokens as appended.
  std::vector<float> seen_k = k, seen_v = v;
  const int block_tokens = store.block_tokens();
  std::vector<float> block_k(size_t(block_tokens) * kDim), block_v(block_k.size());
  for (int g = 0; g < kKvHeads; ++g) {
    const auto put = [&](int first_token, int n) {
      for (int t = 0; t < n && first_token + t < history; ++t) {
        for (int c = 0; c < kDim; ++c) {
          seen_k[(size_t(first_token + t) * kKvHeads + g) * kDim + c] = block_k[size_t(t) * kDim + c];
          seen_v[(size_t(first_token + t) * kKvHeads + g) * kDim + c] = block_v[size_t(t) * kDim + c];
        }
      }
    };
    for (int b = 0; b < store.num_sealed_blocks(0); ++b) {
      store.codec(0, g).decode(store.block_shape(0, g), store.sealed_block(0, g, b), block_k.data(), block_v.data());
      put(b * block_tokens, block_tokens);
    }
    store.widen_open(0, g, store.open_tokens(0), block_k.data(), block_v.data());
    put(store.num_sealed_blocks(0) * block_tokens, store.open_tokens(0));
  }
  std::vector<int> positions(static_cast<size_t>(chunk));
  for (int i = 0; i < chunk; ++i) positions[size_t(i)] = history + i;
  result.reference.resize(q.size());
  attention_reference(q.data(), chunk, positions.data(), seen_k.data(), seen_v.data(), tokens, kHeads, kKvHeads, kDim,
                      kDim, params.scale, result.reference.data());
  return result;
}

TEST(ExactPrefill, ChunkReadsItsOwnTokensExactlyAndTheHistoryFromTheStore) {
  // quant dequantizes, so its only difference from the reference is float rounding. Histories that end
  // on a block boundary, inside a block that the chunk then seals, and inside the open block.
  for (const auto& [history, chunk] : {std::pair{64, 100}, std::pair{70, 90}, std::pair{130, 20}, std::pair{0, 150}}) {
    const ChunkResult exact = attend_second_chunk("quant:bits=2,pi=32,rot=none,prefill=exact", history, chunk);
    EXPECT_LT(nmse(exact.out, exact.reference), 1e-10) << "history " << history << ", chunk " << chunk;
  }
  // hack adds its 8-bit Q and P (measured NMSE vs the reference ~1e-5); the chunk still exact.
  const ChunkResult hack = attend_second_chunk("hack:bits=2,pi=32,rot=none,prefill=exact", 70, 90);
  EXPECT_LT(nmse(hack.out, hack.reference), 1e-3);
  // prefill=quantized reads the chunk's sealed blocks quantized: far from this reference.
  const ChunkResult quantized = attend_second_chunk("quant:bits=2,pi=32,rot=none,prefill=quantized", 70, 90);
  EXPECT_GT(nmse(quantized.out, quantized.reference), 1e-3);
  // A rotated store: the chunk is kept rotated and the output rotated back, as for every other block.
  const ChunkResult rotated = attend_second_chunk("quant:bits=2,pi=32,rot=hadamard,prefill=exact", 0, 150);
  EXPECT_LT(nmse(rotated.out, rotated.reference), 1e-10);
}

TEST(ExactPrefill, IsTheDefaultAndTheOtherChoiceIsSpelledOut) {
  EXPECT_TRUE(make_kv_pipeline("hack:bits=2")->exact_prefill);
  EXPECT_EQ(make_kv_pipeline("hack:bits=2,prefill=exact")->describe(), make_kv_pipeline("hack:bits=2")->describe());
  EXPECT_EQ(make_kv_pipeline("quant:bits=4,pi=32,prefill=quantized")->describe(),
            "quant:kbits=4,vbits=4,round=nearest,se=on,rqe=on,pi=32,rot=hadamard,prefill=quantized");
  EXPECT_FALSE(make_kv_pipeline("dense:prefill=exact")) << "dense reads its own blocks exactly anyway";
  const auto bad = make_kv_pipeline("hack:bits=2,prefill=fp16");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("prefill"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace slimkv
