// A session's KV cache read from outside the engine, as the store holds it: per (layer, KV head) its
// sealed blocks (codec-encoded) and its open tokens, each decodable to FP32, and what the selector last
// chose. For researchers comparing codecs (the Python module's session.kv), and for tools that measure
// fidelity without the internal KvStore.
//
//   auto kv = kv_snapshot(*engine, *session);   // device cpu: the live store; cuda: a host copy
//   decode_kv_block(*kv, layer, head, block, k, v);
//
// K and V come back in the store's basis: per-head Hadamard-rotated when the spec says rot=hadamard
// (KvLayout::rotated), with ZACK's reduced dims when the spec has a zack stage.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

// What the functions below read. On device cpu: the session's own store, which the session's later
// calls change (the snapshot must not outlive the session, nor be read while the engine runs a step).
// On device cuda: a host copy of the GPU's KV taken by kv_snapshot — the sealed blocks' encoded bytes
// and the open tokens' FP16 values, as Engine::export_kv moves them — which later calls do not change.
class KvSnapshot {
 public:
  KvSnapshot(KvSnapshot&&) noexcept;
  KvSnapshot& operator=(KvSnapshot&&) noexcept;
  ~KvSnapshot();

  const KvStore& store() const { return *store_; }
  bool copied_from_gpu() const { return copy_ != nullptr; }

 private:
  friend Expected<KvSnapshot> kv_snapshot(const Engine& engine, const Session& session);
  KvSnapshot(const KvStore* store, std::unique_ptr<KvStore> copy);
  const KvStore* store_ = nullptr;
  std::unique_ptr<KvStore> copy_;  // device cuda: what store_ points to
};

// `session` is one of `engine`'s (on device cuda its KV is read through the engine's export_kv).
// Errors: a session the engine had no room for, or of another engine; on device cuda, KV the transfer
// format cannot carry yet (the zack stage), naming it.
Expected<KvSnapshot> kv_snapshot(const Engine& engine, const Session& session);

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int block_tokens = 0;      // tokens per sealed block
  std::string spec;          // the pipeline as the store runs it, every option spelled out
  std::string codec;         // the codec stage of it ("hack:bits=2,..."), what sealed blocks are encoded with
                             // (every head's but those of hiheads=: KvHeadLayout::codec)
  bool sealed_in_slow_tier = false;  // @offload: sealed blocks live in the slow tier (a file), hot ones cached
  bool rotated = false;      // K/V stored Hadamard-rotated
};

// One (layer, KV head): `sealed_blocks` blocks of block_tokens tokens each ([i * block_tokens, (i + 1) *
// block_tokens) for block i), then `open_tokens` newer tokens in the open block.
struct KvHeadLayout {
  int k_dim = 0, v_dim = 0;  // per-head dims as stored
  int sealed_blocks = 0;
  int open_tokens = 0;
  size_t block_bytes = 0;    // one sealed block as the codec encodes it
  std::string codec;         // the head's codec: KvLayout::codec, or the wider one of hiheads=
};

// The selector's last choice for one (layer, KV head) (the last decode step): every token (all), or these.
struct KvSelection {
  bool all = true;
  std::vector<int> tokens;  // the chosen token indices when !all
};

// Errors (each names the bad value): a layer, head or block out of range; a selector's choice on
// device cuda (not copied back).
KvLayout kv_layout(const KvSnapshot& kv);
Expected<KvHeadLayout> kv_head_layout(const KvSnapshot& kv, int layer, int head);
// Sealed block `block` decoded by its codec: k [block_tokens, k_dim], v [block_tokens, v_dim]. With
// sinks=N, block 0's first N rows are the FP16 sink tokens (the block holds stand-ins for them).
Status decode_kv_block(const KvSnapshot& kv, int layer, int head, int block, std::vector<float>& k,
                       std::vector<float>& v);
// The open tokens widened to FP32: k [open_tokens, k_dim], v [open_tokens, v_dim].
Status read_open_kv(const KvSnapshot& kv, int layer, int head, std::vector<float>& k, std::vector<float>& v);
Expected<KvSelection> kv_last_selection(const KvSnapshot& kv, int layer, int head);

}  // namespace slimkv
