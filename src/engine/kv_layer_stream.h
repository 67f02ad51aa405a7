// Engine::stream_kv_in_next_step's two ways: on the CPU an observer of the forward pass that writes each
// layer's part of the transfer right after that layer's attention (the store's layer is final for the
// step then, while later layers still compute); on the GPU, which has no per-layer hook yet, the pieces
// of the whole transfer after the step.
#pragma once

#include <span>
#include <string>

#include "kv/store.h"
#include "model/forward_observer.h"
#include "slimkv/engine.h"

namespace slimkv {

class KvLayerStream : public ForwardObserver {
 public:
  // `tokens_after_step`: what every layer of `store` holds once the step has run.
  KvLayerStream(const KvStore& store, std::string model_id, int tokens_after_step, KvPieceCallback on_piece)
      : store_(store), model_id_(std::move(model_id)), tokens_after_step_(tokens_after_step), on_piece_(std::move(on_piece)) {}

  void on_attention_output(int layer, const float* out, int n) override;

 private:
  const KvStore& store_;
  const std::string model_id_;
  const int tokens_after_step_;
  const KvPieceCallback on_piece_;
};

// The pieces of a whole transfer (head, then each layer), as KvLayerStream gives them one by one.
Status transfer_pieces(std::span<const uint8_t> transfer, const KvPieceCallback& on_piece);

}  // namespace slimkv
