// Engine::stream_sealed_kv's and stream_kv_in_next_step's stream of one sequence. On the CPU an observer
// of the forward pass that, right after each layer's attention (the store's layer is final for the step
// then, while later layers still compute), hands out that layer's part of the transfer: during a
// prompt's earlier chunks the blocks sealed since its last piece, and in the step that finishes the
// stream the head and each layer's rest. On the GPU (a cache with device pages) the device hands out
// each layer's newly sealed blocks during every step the same way (DeviceModel::stream_blocks_in_next_step),
// and the stream adds the head and each layer's open tokens after the finishing step; other GPU KV gets
// the pieces of the whole transfer after the finishing step.
#pragma once

#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "kv/store.h"
#include "model/forward_observer.h"
#include "slimkv/engine.h"
#include "util/buffer_pool.h"

namespace slimkv {

class KvLayerStream : public ForwardObserver {
 public:
  // Each piece's bytes are written into a buffer taken from `buffers` and go back there once sent;
  // `held_bytes` holds their sizes meanwhile (Engine::kv_budget counts them). form: how the KV leaves
  // (KvStreamForm; kDeviceWhole hands nothing out before the finishing step).
  KvLayerStream(std::string model_id, std::shared_ptr<BufferPool> buffers, std::shared_ptr<std::atomic<uint64_t>> held_bytes,
                KvPieceCallback on_piece, KvStreamForm form)
      : model_id_(std::move(model_id)), buffers_(std::move(buffers)), held_bytes_(std::move(held_bytes)),
        on_piece_(std::move(on_piece)), form_(form) {}

  // The next step finishes the stream, its pieces going to `on_piece`: the head and every layer's rest
  // (kDeviceWhole: one piece, the whole KV with its sealed blocks in GPU memory, after the step).
  void finish_in_next_step(KvPieceCallback on_piece, KvStreamForm form) {
    on_piece_ = std::move(on_piece);
    finishing_ = true;
    form_ = form;
  }
  bool finishing() const { return finishing_; }
  KvStreamForm form() const { return form_; }
  // A step begins, after which every layer of `store` holds `tokens_after_step` tokens (nullptr: the
  // device has no store; it hands out blocks itself, or nothing during the step).
  void begin_step(const KvStore* store, int tokens_after_step);
  void on_attention_output(int layer, const float* out, int n) override;
  const KvPieceCallback& on_piece() const { return on_piece_; }

  // A device without a store: the full blocks of every layer handed out so far, and that the step just
  // run handed out those up to the tokens it left.
  int device_blocks_out() const { return device_blocks_out_; }
  void device_step_done(int block_tokens) { device_blocks_out_ = tokens_after_step_ / block_tokens; }
  // After the finishing step on a device that handed out every sealed block: the head and each layer's
  // final piece, its open tokens alone (`open`: a store of the sequence's pipeline holding only them).
  Status finish_with_open_tokens(const KvStore& open);

 private:
  // A layer's piece of `bytes` (a buffer of buffers_): [0, sealed_bytes) its blocks from first_block, the
  // rest its open tokens when `final`.
  void hand_out(int layer, std::vector<uint8_t> bytes, size_t sealed_bytes, int first_block, bool final,
                std::vector<uint32_t> crcs);
  void hand_out_head(std::vector<uint8_t> head);

  const std::string model_id_;
  const std::shared_ptr<BufferPool> buffers_;
  const std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
  KvPieceCallback on_piece_;
  const KvStore* store_ = nullptr;
  bool finishing_ = false;
  KvStreamForm form_ = KvStreamForm::kHostBytes;
  int tokens_after_step_ = 0;
  std::vector<int> blocks_out_;  // per layer: the sealed blocks handed out so far (a store's)
  int device_blocks_out_ = 0;
};

// The pieces of a whole transfer (head, then each layer), as KvLayerStream gives them one by one: each
// a view of `transfer`, which they share (nothing copied).
Status transfer_pieces(std::shared_ptr<const std::vector<uint8_t>> transfer, const KvPieceCallback& on_piece);

}  // namespace slimkv
