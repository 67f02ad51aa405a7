// The shape of one KV block: the tokens it holds and the per-head key and value dims as stored. A block
// format's sizes follow from it (tensor/quantized_block.h), so it lies below every codec and kernel that
// reads blocks.
#pragma once

namespace slimkv {

struct BlockShape {
  int block_tokens = 64;
  int k_dim = 0;  // per-head key dims as stored (ZACK stores fewer than head_dim)
  int v_dim = 0;  // per-head value dims as stored
};

}  // namespace slimkv
