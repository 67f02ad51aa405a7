// A session's KV cache read from outside the engine, as the store holds it (device "cpu"): per (layer,
// KV head) its sealed blocks (codec-encoded) and its open tokens, each decodable to FP32, and what the
// selector last chose. For researchers comparing codecs (the Python module's session.kv), and for tools
// that measure fidelity without the internal KvStore.
//
// K and V come back in the store's basis: per-head Hadamard-rotated when the spec says rot=hadamard
// (KvLayout::rotated), with ZACK's reduced dims when the spec has a zack stage.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int block_tokens = 0;      // tokens per sealed block
  std::string spec;          // the pipeline as the store runs it, every option spelled out
  std::string codec;         // the codec stage of it ("hack:bits=2,..."), what every sealed block is encoded with
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
};

// The selector's last choice for one (layer, KV head) (the last decode step): every token (all), or these.
struct KvSelection {
  bool all = true;
  std::vector<int> tokens;  // the chosen token indices when !all
};

// Errors (each names the bad value): a session the engine had no room for, a GPU session (its KV is on
// the device), a layer, head or block out of range.
Expected<KvLayout> kv_layout(const Session& session);
Expected<KvHeadLayout> kv_head_layout(const Session& session, int layer, int head);
// Sealed block `block` decoded by its codec: k [block_tokens, k_dim], v [block_tokens, v_dim].
Status decode_kv_block(const Session& session, int layer, int head, int block, std::vector<float>& k,
                       std::vector<float>& v);
// The open tokens widened to FP32: k [open_tokens, k_dim], v [open_tokens, v_dim].
Status read_open_kv(const Session& session, int layer, int head, std::vector<float>& k, std::vector<float>& v);
Expected<KvSelection> kv_last_selection(const Session& session, int layer, int head);

}  // namespace slimkv
