// Engine::stream_sealed_kv's and stream_kv_in_next_step's stream of one sequence: on the CPU an observer
// of the forward pass that, right after each layer's attention (the store's layer is final for the step
// then, while later layers still compute), hands out that layer's part of the transfer: during a
// prompt's earlier chunks the blocks sealed since its last piece, and in the step that finishes the
// stream the head and each layer's rest. On the GPU, which has no per-layer hook yet, the pieces of the
// whole transfer after the finishing step.
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
  // `held_bytes` holds their sizes meanwhile (Engine::kv_budget counts them).
  KvLayerStream(std::string model_id, std::shared_ptr<BufferPool> buffers, std::shared_ptr<std::atomic<uint64_t>> held_bytes,
                KvPieceCallback on_piece)
      : model_id_(std::move(model_id)), buffers_(std::move(buffers)), held_bytes_(std::move(held_bytes)),
        on_piece_(std::move(on_piece)) {}

  // The next step finishes the stream, its pieces going to `on_piece`: the head and every layer's rest
  // (on_device: one piece, the whole KV with its sealed blocks in GPU memory, after the step).
  void finish_in_next_step(KvPieceCallback on_piece, bool on_device) {
    on_piece_ = std::move(on_piece);
    finishing_ = true;
    on_device_ = on_device;
  }
  bool finishing() const { return finishing_; }
  bool on_device() const { return on_device_; }
  // A step begins, after which every layer of `store` holds `tokens_after_step` tokens (nullptr: the
  // device has no store; nothing is handed out during the step).
  void begin_step(const KvStore* store, int tokens_after_step);
  void on_attention_output(int layer, const float* out, int n) override;
  const KvPieceCallback& on_piece() const { return on_piece_; }

 private:
  const std::string model_id_;
  const std::shared_ptr<BufferPool> buffers_;
  const std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
  KvPieceCallback on_piece_;
  const KvStore* store_ = nullptr;
  bool finishing_ = false;
  bool on_device_ = false;
  int tokens_after_step_ = 0;
  std::vector<int> blocks_out_;  // per layer: the sealed blocks handed out so far
};

// The pieces of a whole transfer (head, then each layer), as KvLayerStream gives them one by one: each
// a view of `transfer`, which they share (nothing copied).
Status transfer_pieces(std::shared_ptr<const std::vector<uint8_t>> transfer, const KvPieceCallback& on_piece);

}  // namespace slimkv
