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
    KvTransferPiece piece{.layer = layer, .bytes = {}, .sealed_bytes = 0, .first_block = out, .final = false};
    (void)write_kv_transfer_blocks(*store_, layer, out, sealed, piece.bytes);
    piece.sealed_bytes = piece.bytes.size();
    out = sealed;
    on_piece_(std::move(piece));
    return;
  }
  if (layer == 0) {
    KvTransferPiece head;
    (void)write_kv_transfer_head(*store_, model_id_, tokens_after_step_, head.bytes);
    on_piece_(std::move(head));
  }
  KvTransferPiece piece{.layer = layer, .bytes = {}, .sealed_bytes = 0, .first_block = out, .final = true};
  (void)write_kv_transfer_layer(*store_, layer, out, piece.bytes, piece.sealed_bytes);
  on_piece_(std::move(piece));
}

Status transfer_pieces(std::span<const uint8_t> transfer, const KvPieceCallback& on_piece) {
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer(transfer.data(), transfer.size(), "the step's KV"));
  on_piece({.layer = -1, .bytes = {transfer.begin(), transfer.begin() + ptrdiff_t(info.sealed_offset)}, .sealed_bytes = 0});
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  for (size_t l = 0; l < ranges.size(); ++l) {
    KvTransferPiece piece{.layer = int(l), .bytes = {}, .sealed_bytes = ranges[l].sealed_bytes};
    piece.bytes.reserve(ranges[l].sealed_bytes + ranges[l].open_bytes);
    const auto at = [&](uint64_t offset) { return transfer.begin() + ptrdiff_t(offset); };
    piece.bytes.insert(piece.bytes.end(), at(ranges[l].sealed_offset), at(ranges[l].sealed_offset + ranges[l].sealed_bytes));
    piece.bytes.insert(piece.bytes.end(), at(ranges[l].open_offset), at(ranges[l].open_offset + ranges[l].open_bytes));
    on_piece(std::move(piece));
  }
  return Status::ok();
}

}  // namespace slimkv
