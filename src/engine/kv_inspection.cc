// The public read-only view of a session's KV store (slimkv/kv_inspection.h).
#include "slimkv/kv_inspection.h"

#include "kv/kv_factory.h"
#include "kv/store.h"
#include "kv/transfer.h"

namespace slimkv {
namespace {

// A GPU session's KV in a host store: through the transfer format, which both devices write the same
// way (sealed blocks as the codec encodes them, open tokens widened from FP16 exactly), into a store
// of the pipeline the GPU runs (the transfer's spec: dense there is dense:dtype=f16).
Expected<std::unique_ptr<KvStore>> copy_from_gpu(const Engine& engine, const Session& session) {
  Expected<std::vector<uint8_t>> transfer = engine.export_kv(session.sequence());
  if (!transfer) return error("reading the KV of a session on device cuda: ", transfer.status().message());
  const std::string source = str_cat("sequence ", session.sequence(), " on device cuda");
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer(transfer->data(), transfer->size(), source));
  SLIMKV_ASSIGN_OR_RETURN(const KvPipeline pipeline, make_kv_pipeline(info.spec));
  auto store = std::make_unique<KvStore>(info.shape, pipeline);
  SLIMKV_RETURN_IF_ERROR(read_kv_transfer(transfer->data(), transfer->size(), source, info.model_id, *store));
  return store;
}

Status check_head(const KvSnapshot& kv, int layer, int head) {
  const KvShape& shape = kv.store().shape();
  if (layer < 0 || layer >= shape.num_layers) {
    return error("layer ", layer, " is out of range: the model has ", shape.num_layers, " layers");
  }
  if (head < 0 || head >= shape.num_kv_heads) {
    return error("KV head ", head, " is out of range: the model has ", shape.num_kv_heads, " KV heads");
  }
  return Status::ok();
}

}  // namespace

KvSnapshot::KvSnapshot(const KvStore* store, std::unique_ptr<KvStore> copy) : store_(store), copy_(std::move(copy)) {}
KvSnapshot::KvSnapshot(KvSnapshot&&) noexcept = default;
KvSnapshot& KvSnapshot::operator=(KvSnapshot&&) noexcept = default;
KvSnapshot::~KvSnapshot() = default;

Expected<KvSnapshot> kv_snapshot(const Engine& engine, const Session& session) {
  if (session.sequence() < 0) return error("the session has no sequence: its engine held max_sequences already");
  // What can be checked of "one of engine's": the engine holds its sequence, on the same device.
  const Expected<int> held = engine.num_tokens(session.sequence());
  if (!held || *held != session.num_tokens() || engine.on_gpu() != session.on_gpu()) {
    return error("the session (sequence ", session.sequence(), ") is not one of this engine's");
  }
  if (!session.on_gpu()) return KvSnapshot(&session.kv(), nullptr);
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> copy, copy_from_gpu(engine, session));
  const KvStore* store = copy.get();
  return KvSnapshot(store, std::move(copy));
}

KvLayout kv_layout(const KvSnapshot& kv) {
  const KvStore& store = kv.store();
  KvLayout layout;
  layout.num_layers = store.shape().num_layers;
  layout.num_kv_heads = store.shape().num_kv_heads;
  layout.block_tokens = store.block_tokens();
  layout.spec = store.pipeline().describe();
  layout.codec = store.pipeline().codec->describe();
  layout.sealed_in_slow_tier = store.memory().sealed_in_slow_tier;
  layout.rotated = store.rotated();
  return layout;
}

Expected<KvHeadLayout> kv_head_layout(const KvSnapshot& kv, int layer, int head) {
  SLIMKV_RETURN_IF_ERROR(check_head(kv, layer, head));
  const KvStore& store = kv.store();
  KvHeadLayout layout;
  layout.k_dim = store.block_shape(layer, head).k_dim;
  layout.v_dim = store.block_shape(layer, head).v_dim;
  layout.sealed_blocks = store.num_sealed_blocks(layer);
  layout.open_tokens = store.open_tokens(layer);
  layout.block_bytes = store.block_bytes(layer, head);
  layout.codec = store.codec(layer, head).describe();
  return layout;
}

Status decode_kv_block(const KvSnapshot& kv, int layer, int head, int block, std::vector<float>& k,
                       std::vector<float>& v) {
  SLIMKV_RETURN_IF_ERROR(check_head(kv, layer, head));
  const KvStore& store = kv.store();
  if (block < 0 || block >= store.num_sealed_blocks(layer)) {
    return error("block ", block, " is out of range: layer ", layer, " has ", store.num_sealed_blocks(layer),
                 " sealed blocks");
  }
  if (block < store.first_live_block(layer)) {
    return error("block ", block, " of layer ", layer, " has left the layer's sliding window and is freed (blocks ",
                 store.first_live_block(layer), " to ", store.num_sealed_blocks(layer) - 1, " are held)");
  }
  const BlockShape& shape = store.block_shape(layer, head);
  k.assign(size_t(shape.block_tokens) * size_t(shape.k_dim), 0.0f);
  v.assign(size_t(shape.block_tokens) * size_t(shape.v_dim), 0.0f);
  store.codec(layer, head).decode(shape, store.sealed_block(layer, head, block), k.data(), v.data());
  // sinks=N: block 0 was sealed with stand-ins for its first N tokens; the tokens are the FP16 sink rows.
  if (block == 0 && store.sink_tokens(layer) > 0) store.widen_sinks(layer, head, k.data(), v.data());
  return Status::ok();
}

Status read_open_kv(const KvSnapshot& kv, int layer, int head, std::vector<float>& k, std::vector<float>& v) {
  SLIMKV_RETURN_IF_ERROR(check_head(kv, layer, head));
  const KvStore& store = kv.store();
  const BlockShape& shape = store.block_shape(layer, head);
  const int n = store.open_tokens(layer);
  k.assign(size_t(n) * size_t(shape.k_dim), 0.0f);
  v.assign(size_t(n) * size_t(shape.v_dim), 0.0f);
  store.widen_open(layer, head, n, k.data(), v.data());
  return Status::ok();
}

Expected<KvSelection> kv_last_selection(const KvSnapshot& kv, int layer, int head) {
  SLIMKV_RETURN_IF_ERROR(check_head(kv, layer, head));
  // A host copy holds the blocks, not what the GPU's selector chose (a GPU without a selector attends
  // to every token: that much is known).
  if (kv.copied_from_gpu() && kv.store().pipeline().selector) {
    return error("the selector's last choice is not read back from device cuda: inspect it on device cpu");
  }
  const HeadSelection& selection = kv.store().last_selection(layer, head);
  return KvSelection{selection.all, selection.all ? std::vector<int>{} : selection.tokens};
}

}  // namespace slimkv
