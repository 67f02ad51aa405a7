// The public read-only view of a session's KV store (slimkv/kv_inspection.h).
#include "slimkv/kv_inspection.h"

#include "kv/store.h"

namespace slimkv {
namespace {

// The session's store, or why there is none to read.
Expected<const KvStore*> store_of(const Session& session) {
  if (session.sequence() < 0) return error("the session has no sequence: its engine held max_sequences already");
  if (session.on_gpu()) return error("the KV of a session on device cuda lives on the GPU: inspect it on device cpu");
  return &session.kv();
}

Expected<const KvStore*> head_of(const Session& session, int layer, int head) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, store_of(session));
  const KvShape& shape = store->shape();
  if (layer < 0 || layer >= shape.num_layers) {
    return error("layer ", layer, " is out of range: the model has ", shape.num_layers, " layers");
  }
  if (head < 0 || head >= shape.num_kv_heads) {
    return error("KV head ", head, " is out of range: the model has ", shape.num_kv_heads, " KV heads");
  }
  return store;
}

}  // namespace

Expected<KvLayout> kv_layout(const Session& session) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, store_of(session));
  KvLayout layout;
  layout.num_layers = store->shape().num_layers;
  layout.num_kv_heads = store->shape().num_kv_heads;
  layout.block_tokens = store->block_tokens();
  layout.spec = store->pipeline().describe();
  layout.codec = store->codec().describe();
  layout.sealed_in_slow_tier = store->memory().sealed_in_slow_tier;
  layout.rotated = store->rotated();
  return layout;
}

Expected<KvHeadLayout> kv_head_layout(const Session& session, int layer, int head) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, head_of(session, layer, head));
  KvHeadLayout layout;
  layout.k_dim = store->block_shape(layer, head).k_dim;
  layout.v_dim = store->block_shape(layer, head).v_dim;
  layout.sealed_blocks = store->num_sealed_blocks(layer);
  layout.open_tokens = store->open_tokens(layer);
  layout.block_bytes = store->block_bytes(layer, head);
  return layout;
}

Status decode_kv_block(const Session& session, int layer, int head, int block, std::vector<float>& k,
                       std::vector<float>& v) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, head_of(session, layer, head));
  if (block < 0 || block >= store->num_sealed_blocks(layer)) {
    return error("block ", block, " is out of range: layer ", layer, " has ", store->num_sealed_blocks(layer),
                 " sealed blocks");
  }
  if (block < store->first_live_block(layer)) {
    return error("block ", block, " of layer ", layer, " has left the layer's sliding window and is freed (blocks ",
                 store->first_live_block(layer), " to ", store->num_sealed_blocks(layer) - 1, " are held)");
  }
  const BlockShape& shape = store->block_shape(layer, head);
  k.assign(size_t(shape.block_tokens) * size_t(shape.k_dim), 0.0f);
  v.assign(size_t(shape.block_tokens) * size_t(shape.v_dim), 0.0f);
  store->codec().decode(shape, store->sealed_block(layer, head, block), k.data(), v.data());
  return Status::ok();
}

Status read_open_kv(const Session& session, int layer, int head, std::vector<float>& k, std::vector<float>& v) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, head_of(session, layer, head));
  const BlockShape& shape = store->block_shape(layer, head);
  const int n = store->open_tokens(layer);
  k.assign(size_t(n) * size_t(shape.k_dim), 0.0f);
  v.assign(size_t(n) * size_t(shape.v_dim), 0.0f);
  store->widen_open(layer, head, n, k.data(), v.data());
  return Status::ok();
}

Expected<KvSelection> kv_last_selection(const Session& session, int layer, int head) {
  SLIMKV_ASSIGN_OR_RETURN(const KvStore* store, head_of(session, layer, head));
  const HeadSelection& selection = store->last_selection(layer, head);
  return KvSelection{selection.all, selection.all ? std::vector<int>{} : selection.tokens};
}

}  // namespace slimkv
