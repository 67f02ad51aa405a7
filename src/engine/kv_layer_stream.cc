#include "engine/kv_layer_stream.h"

#include "kv/transfer.h"

namespace slimkv {

void KvLayerStream::begin_step(const KvStore* store, int tokens_after_step) {
  store_ = store;
  tokens_after_step_ = tokens_after_step;
  if (store) blocks_out_.resize(size_t(store->shape().num_layers), 0);
}

void KvLayerStream::on_attention_output(int layer, const float*, int) {
  // Errors cannot happen here: Engine::stream_kv_in_next_step wrote this store's head before the step,
  // and the writers fail only for what the head already checked (ZACK's unequal heads, sizes) or for
  // blocks the store does not hold (blocks_out_ counts only blocks it sealed: sealed blocks stay).
  int& out = blocks_out_[size_t(layer)];
  if (!finishing_) {
    const int sealed = store_->num_sealed_blocks(layer);
    if (sealed == out) return;
    std::vector<uint8_t> bytes = buffers_->take_largest();
    std::vector<uint32_t> crcs;
    (void)write_kv_transfer_blocks(*store_, layer, out, sealed, bytes, &crcs);
    KvTransferPiece piece{.layer = layer, .bytes = {}, .open = {}, .owner = share_pooled(buffers_, std::move(bytes), held_bytes_),
                          .first_block = out, .final = false, .crcs = std::move(crcs)};
    piece.bytes = *piece.owner;
    out = sealed;
    on_piece_(std::move(piece));
    return;
  }
  if (layer == 0) {
    std::vector<uint8_t> head;
    (void)write_kv_transfer_head(*store_, model_id_, tokens_after_step_, head);
    KvTransferPiece piece{.layer = -1, .bytes = {}, .open = {}, .owner = std::make_shared<const std::vector<uint8_t>>(std::move(head))};
    piece.bytes = *piece.owner;
    on_piece_(std::move(piece));
  }
  // Copied out of the store (not sent from it: the sequence may be gone, its blocks reused, before the
  // sender is done; Engine::kv_budget counts the copy meanwhile), each head checksummed as it is copied.
  std::vector<uint8_t> bytes = buffers_->take_largest();
  size_t sealed_bytes = 0;
  std::vector<uint32_t> crcs;
  (void)write_kv_transfer_layer(*store_, layer, out, bytes, sealed_bytes, &crcs);
  KvTransferPiece piece{.layer = layer, .bytes = {}, .open = {}, .owner = share_pooled(buffers_, std::move(bytes), held_bytes_),
                        .first_block = out, .final = true, .crcs = std::move(crcs)};
  piece.bytes = std::span(*piece.owner).first(sealed_bytes);
  piece.open = std::span(*piece.owner).subspan(sealed_bytes);
  on_piece_(std::move(piece));
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
