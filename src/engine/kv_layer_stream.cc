#include "engine/kv_layer_stream.h"

#include "kv/transfer.h"

namespace slimkv {

void KvLayerStream::begin_step(const KvStore* store, int tokens_after_step) {
  store_ = store;
  tokens_after_step_ = tokens_after_step;
  if (store) blocks_out_.resize(size_t(store->shape().num_layers), 0);
}

void KvLayerStream::hand_out(int layer, std::vector<uint8_t> bytes, size_t sealed_bytes, int first_block, bool final,
                             std::vector<uint32_t> crcs) {
  const auto owner = share_pooled(buffers_, std::move(bytes), held_bytes_);
  on_piece_({.layer = layer, .bytes = std::span(*owner).first(sealed_bytes), .open = std::span(*owner).subspan(sealed_bytes),
             .owner = owner, .first_block = first_block, .final = final, .crcs = std::move(crcs)});
}

void KvLayerStream::hand_out_head(std::vector<uint8_t> head) {
  const auto owner = std::make_shared<const std::vector<uint8_t>>(std::move(head));
  on_piece_({.layer = -1, .bytes = *owner, .open = {}, .owner = owner});
}

void KvLayerStream::on_attention_output(int layer, const float*, int) {
  // Errors cannot happen here: Engine::stream_kv_in_next_step wrote this store's head before the step,
  // and the writers fail only for what the head already checked (what the format cannot hold, sizes) or for
  // blocks the store does not hold (blocks_out_ counts only blocks it sealed: sealed blocks stay).
  int& out = blocks_out_[size_t(layer)];
  if (!finishing_) {
    const int sealed = store_->num_sealed_blocks(layer);
    if (sealed == out) return;
    std::vector<uint8_t> bytes = buffers_->take_largest();
    std::vector<uint32_t> crcs;
    (void)write_kv_transfer_blocks(*store_, layer, out, sealed, bytes, &crcs);
    const size_t sealed_bytes = bytes.size();
    hand_out(layer, std::move(bytes), sealed_bytes, out, /*final=*/false, std::move(crcs));
    out = sealed;
    return;
  }
  if (layer == 0) {
    std::vector<uint8_t> head;
    (void)write_kv_transfer_head(*store_, model_id_, tokens_after_step_, head);
    hand_out_head(std::move(head));
  }
  // Copied out of the store (not sent from it: the sequence may be gone, its blocks reused, before the
  // sender is done; Engine::kv_budget counts the copy meanwhile), each head checksummed as it is copied.
  std::vector<uint8_t> bytes = buffers_->take_largest();
  size_t sealed_bytes = 0;
  std::vector<uint32_t> crcs;
  (void)write_kv_transfer_layer(*store_, layer, out, bytes, sealed_bytes, &crcs);
  hand_out(layer, std::move(bytes), sealed_bytes, out, /*final=*/true, std::move(crcs));
}

Status KvLayerStream::finish_with_open_tokens(const KvStore& open) {
  std::vector<uint8_t> head;
  SLIMKV_RETURN_IF_ERROR(write_kv_transfer_head(open, model_id_, tokens_after_step_, head));
  hand_out_head(std::move(head));
  for (int layer = 0; layer < open.shape().num_layers; ++layer) {
    std::vector<uint8_t> bytes = buffers_->take_largest();
    size_t sealed_bytes = 0;
    std::vector<uint32_t> crcs;
    SLIMKV_RETURN_IF_ERROR(write_kv_transfer_layer(open, layer, 0, bytes, sealed_bytes, &crcs));
    hand_out(layer, std::move(bytes), sealed_bytes, device_blocks_out_, /*final=*/true, std::move(crcs));
  }
  return Status::ok();
}

Status transfer_pieces(std::shared_ptr<const std::vector<uint8_t>> transfer, const KvPieceCallback& on_piece) {
  const std::span<const uint8_t> bytes(*transfer);
  // The head's checks suffice: the transfer is this engine's own export (the receiver checks it all).
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer_head(bytes.data(), bytes.size(), "the step's KV"));
  if (info.total_bytes != bytes.size()) return error("the step's KV: ", bytes.size(), " bytes, its header declares ", info.total_bytes);
  on_piece({.layer = -1, .bytes = bytes.first(info.sealed_offset), .open = {}, .owner = transfer});
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  for (size_t l = 0; l < ranges.size(); ++l) {
    on_piece({.layer = int(l), .bytes = bytes.subspan(ranges[l].sealed_offset, ranges[l].sealed_bytes),
              .open = bytes.subspan(ranges[l].open_offset, ranges[l].open_bytes), .owner = transfer});
  }
  return Status::ok();
}

}  // namespace slimkv
