// The seeds a KV store seals its blocks with are block_seal_seed(store seed, layer, head, block index)
// (util/random.h), the derivation the GPU's sealing kernel uses (backend/cuda/quantized_kv_pool.h):
// every sealed block of a CPU store (unrotated) equals quantize_block of its tokens with that seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kv/kv_factory.h"
#include "kv/store.h"
#include "tensor/quantized_block.h"
#include "util/half.h"
#include "util/random.h"

namespace slimkv {
namespace {

TEST(BlockSealSeed, CpuStoreSealsWithTheSharedDerivation) {
  auto pipeline = make_kv_pipeline("hack:bits=2,pi=32,rot=none,round=stochastic");  // the seed matters
  ASSERT_TRUE(pipeline) << pipeline.status().message();
  pipeline->seed = 0x1234abcdull;
  const int layers = 2, heads = 3, dim = 16, tokens = 100;
  KvStore store({layers, heads, dim, dim, tokens}, *pipeline);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(size_t(tokens) * heads * dim), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (int layer = 0; layer < layers; ++layer) store.append(layer, k.data(), v.data(), tokens);

  const QuantizedBlockLayout layout(QuantizationConfig{}, store.block_shape(0, 0));
  const int block_tokens = store.block_tokens();
  ASSERT_EQ(store.num_sealed_blocks(0), tokens / block_tokens);
  std::vector<float> block_k(size_t(block_tokens) * dim), block_v(block_k.size());
  std::vector<uint8_t> expected(layout.block_bytes);
  for (int layer = 0; layer < layers; ++layer) {
    for (int head = 0; head < heads; ++head) {
      for (int index = 0; index < store.num_sealed_blocks(layer); ++index) {
        for (int t = 0; t < block_tokens; ++t) {
          for (int d = 0; d < dim; ++d) {
            const size_t from = (size_t(index * block_tokens + t) * heads + head) * dim + d;
            block_k[size_t(t) * dim + d] = fp16_to_float(float_to_fp16(k[from]));  // as the open block held it
            block_v[size_t(t) * dim + d] = fp16_to_float(float_to_fp16(v[from]));
          }
        }
        quantize_block(layout, block_k.data(), block_v.data(), block_seal_seed(pipeline->seed, layer, head, index),
                       expected.data());
        const uint8_t* got = store.sealed_block(layer, head, index);
        EXPECT_EQ(std::vector<uint8_t>(got, got + layout.block_bytes), expected)
            << "layer " << layer << " head " << head << " block " << index;
      }
    }
  }
}

}  // namespace
}  // namespace slimkv
