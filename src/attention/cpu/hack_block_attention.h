// HACK attention over one quantized block on the CPU (HACK §5.2, Eq. 4), folded into running partials:
//   Q·K'ᵀ: Q quantized to 8 bits per K partition; Σ q'k' as integer dot products (VNNI vpdpbusd on
//          AVX-512 VNNI machines, 32-bit integer lanes elsewhere), then the corrections
//          s_q s_k Σq'k' + m_k s_q Σq' + m_q s_k Σk' + Z m_q m_k with the stored Σk' (summation elimination).
//   softmax in FP32, with the running max of the online softmax;
//   P·V': P quantized to 8 bits over the block's tokens; Σ p'v' as integer dot products, corrected the
//          same way with the stored per-column Σv'.
// Q' and P' enter the integer products offset by -128 (signed bytes), so one unsigned×signed product
// serves 2-, 4- and 8-bit K'/V'; the offset is undone exactly with the sums.
// Held to attend_hack_block_reference (attention/hack_reference.h) by tests/attention/hack_test.cc.
#pragma once

#include <span>
#include <vector>

#include "attention/partial.h"
#include "tensor/quantized_block.h"

namespace slimkv {

// Q' of every query of a tile, once per tile: the packed signed operands [n_queries][k_dim/4] (int32),
// then the per-partition Operand8 [n_queries][k_partitions]; K per channel: q̂ = q · 127 / max|q|
// [n_queries][k_dim] (float), then max|q| [n_queries][k_partitions] (U''s factors, hack_operands.h).
// attend_hack_blocks reads it from tile.prepared.
void prepare_hack_queries(const QuantizedBlockLayout& layout, const QueryTile& tile, std::vector<uint8_t>& prepared);

// For each query i of the tile, folds tokens [0, tile.visible[i]) of each block, in order, into
// partials(first_partial + i); tile.prepared must hold prepare_hack_queries' result for this tile. One
// call for a run of blocks: each block's setup is done once, and the next block's cache lines are asked
// for while one is read.
void attend_hack_blocks(const QuantizedBlockLayout& layout, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                        AttentionPartials& partials, int first_partial);

// The SIMD target the kernel dispatches to on this CPU ("AVX3_DL" uses VNNI).
const char* hack_kernel_target();

}  // namespace slimkv
