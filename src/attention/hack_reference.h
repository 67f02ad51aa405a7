// The plain form of HACK attention over one quantized block, the reference its kernels are held to:
// every quantized operand — Q' (8-bit per K partition), K' and V' (the block's codes), P' (8-bit per
// block) — is dequantized and the attention computed in FP64. Eq. 4 is this same computation
// rearranged, so a kernel may differ from it only by float rounding.
#pragma once

#include "attention/partial.h"
#include "tensor/quantized_block.h"

namespace slimkv {

void attend_hack_block_reference(const QuantizedBlockLayout& layout, const uint8_t* block, const QueryTile& tile,
                                 AttentionPartials& partials, int first_partial);

}  // namespace slimkv
