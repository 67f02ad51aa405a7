// A codec used on its own (slimkv/codec.h): the spec's codec, a block shape, and the codec's calls.
#include "slimkv/codec.h"

#include "attention/partial.h"
#include "kv/codec/codec.h"
#include "kv/kv_factory.h"

namespace slimkv {

Expected<BlockCodec> BlockCodec::from_spec(std::string_view spec) {
  SLIMKV_ASSIGN_OR_RETURN(KvPipeline pipeline, make_kv_pipeline(spec));
  if (pipeline.selector || pipeline.zack || pipeline.offload || pipeline.kvpr) {
    return error("KV spec '", spec, "': a codec alone is wanted (dense, quant, hack); selectors, zack and tiers "
                 "need a store and a model");
  }
  return BlockCodec(pipeline.codec, pipeline.block_tokens);
}

std::string BlockCodec::describe() const { return codec_->describe(); }

Expected<EncodedBlock> BlockCodec::encode(const float* k, const float* v, int k_dim, int v_dim, uint64_t seed) const {
  if (k_dim < 1 || v_dim < 1) return error("k_dim and v_dim must be >= 1, got ", k_dim, " and ", v_dim);
  const BlockShape shape{block_tokens_, k_dim, v_dim};
  SLIMKV_RETURN_IF_ERROR(codec_->check_shape(shape).with_context(describe()));
  EncodedBlock block{describe(), block_tokens_, k_dim, v_dim, std::vector<uint8_t>(codec_->block_bytes(shape))};
  codec_->seal(shape, k, v, seed, block.bytes.data());
  return block;
}

Status BlockCodec::check_block(const EncodedBlock& block) const {
  if (block.codec != describe()) return error("the block was encoded by ", block.codec, ", not by ", describe());
  const BlockShape shape{block.block_tokens, block.k_dim, block.v_dim};
  if (block.block_tokens != block_tokens_ || block.k_dim < 1 || block.v_dim < 1 ||
      block.bytes.size() != codec_->block_bytes(shape)) {
    return error("the block's ", block.bytes.size(), " bytes are not a ", describe(), " block of ", block.block_tokens,
                 " tokens, k_dim ", block.k_dim, ", v_dim ", block.v_dim);
  }
  return Status::ok();
}

Status BlockCodec::decode(const EncodedBlock& block, std::vector<float>& k, std::vector<float>& v) const {
  SLIMKV_RETURN_IF_ERROR(check_block(block));
  k.assign(size_t(block.block_tokens) * size_t(block.k_dim), 0.0f);
  v.assign(size_t(block.block_tokens) * size_t(block.v_dim), 0.0f);
  codec_->decode({block.block_tokens, block.k_dim, block.v_dim}, block.bytes.data(), k.data(), v.data());
  return Status::ok();
}

Status BlockCodec::attention(const EncodedBlock& block, const float* q, int n_queries, float scale,
                             std::vector<float>& out) const {
  SLIMKV_RETURN_IF_ERROR(check_block(block));
  if (n_queries < 1) return error("n_queries must be >= 1, got ", n_queries);
  const BlockShape shape{block.block_tokens, block.k_dim, block.v_dim};
  // As the store's read path does: queries scaled first, the codec's per-tile work, then one block.
  std::vector<float> scaled(q, q + size_t(n_queries) * size_t(block.k_dim));
  for (float& x : scaled) x *= scale;
  const std::vector<int> visible(size_t(n_queries), block.block_tokens);
  QueryTile tile{scaled.data(), n_queries, visible.data(), nullptr};
  std::vector<uint8_t> prepared;
  codec_->prepare_queries(shape, tile, prepared);
  tile.prepared = prepared.data();
  AttentionPartials partials(n_queries, block.v_dim);
  const uint8_t* bytes = block.bytes.data();
  codec_->attend(shape, {&bytes, 1}, tile, partials, 0);
  out.assign(size_t(n_queries) * size_t(block.v_dim), 0.0f);
  for (int i = 0; i < n_queries; ++i) {
    for (int c = 0; c < block.v_dim; ++c) out[size_t(i) * size_t(block.v_dim) + size_t(c)] = partials.acc(i)[c] / partials.sum(i);
  }
  return Status::ok();
}

}  // namespace slimkv
