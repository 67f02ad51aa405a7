// One KV codec on its own, without a model or a store: encode a block of keys and values, decode it,
// and attend to it with queries — so that a codec can be tried and tested on plain arrays (the Python
// module's slimkv.codecs). The same codec objects and kernels a KV store seals and reads blocks with.
//
//   auto codec = BlockCodec::from_spec("hack:bits=2");
//   auto block = codec->encode(k, v, /*k_dim=*/128, /*v_dim=*/128);   // k, v: [codec->block_tokens(), dim]
//   std::vector<float> out;
//   codec->attention(*block, q, /*n_queries=*/4, 1.0f / std::sqrt(128.0f), out);  // out [4, v_dim]
//
// What the store does around the codec is not done here: no Hadamard rotation (rot=hadamard rotates K, V
// and q before the codec sees them), no ZACK dims, no open block. The block's tokens are all visible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

class Codec;

// A sealed block as its codec encoded it.
struct EncodedBlock {
  std::string codec;  // the codec that encoded it, every option spelled out
  int block_tokens = 0, k_dim = 0, v_dim = 0;
  std::vector<uint8_t> bytes;
};

class BlockCodec {
 public:
  // The codec stage of a KV spec ("dense", "quant:bits=4", "hack:bits=2,pi=32"). A spec with a selector,
  // a zack stage or a tier is refused: those belong to a store and a model, not to a block.
  static Expected<BlockCodec> from_spec(std::string_view spec);

  std::string describe() const;                // the codec, every option spelled out
  int block_tokens() const { return block_tokens_; }  // the spec's block size (pi, block)

  // Encodes k [block_tokens, k_dim] and v [block_tokens, v_dim] (FP32); errors: dims the codec cannot
  // encode. `seed`: the stochastic rounding's, where the codec has one.
  Expected<EncodedBlock> encode(const float* k, const float* v, int k_dim, int v_dim, uint64_t seed = 0) const;
  // The block decoded: k [block_tokens, k_dim], v [block_tokens, v_dim]. Errors: a block of another codec or size.
  Status decode(const EncodedBlock& block, std::vector<float>& k, std::vector<float>& v) const;
  // softmax(scale · q Kᵀ) V over the block's tokens, with the codec's own attention kernel (HACK's on the
  // quantized values): q [n_queries, k_dim], out [n_queries, v_dim].
  Status attention(const EncodedBlock& block, const float* q, int n_queries, float scale, std::vector<float>& out) const;

 private:
  BlockCodec(std::shared_ptr<const Codec> codec, int block_tokens) : codec_(std::move(codec)), block_tokens_(block_tokens) {}
  Status check_block(const EncodedBlock& block) const;

  std::shared_ptr<const Codec> codec_;
  int block_tokens_ = 0;
};

}  // namespace slimkv
