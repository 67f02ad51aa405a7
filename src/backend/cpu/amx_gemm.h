// The BF16 prefill tier for CPUs with AMX (Intel Sapphire Rapids and later): the tile unit multiplies a
// 16x32 by a 32x16 block of BF16 into 16x16 FP32 sums in one instruction, many times the multiply-adds
// per cycle of AVX-512 FMAs (panel_gemm.h) or vdpbf16ps (avx512_bf16_gemm.h). The layouts and the loop
// over blocks are bf16_gemm.h's, shared with the AVX-512 BF16 tier.
#pragma once

#include <cstdint>

namespace slimkv {

// True when the CPU has AMX-BF16 and AVX-512 BF16 and the kernel grants this process the tile state
// (asked once, process-wide). Nothing below may run where it is false.
bool amx_bf16_available();

// Configures this thread's tiles for amx_block_product (every tile 16 rows of 64 bytes); amx_end()
// releases them when the thread is done.
void amx_begin();
void amx_end();

// bf16_gemm.h's Bf16BlockProduct on the tiles, between amx_begin() and amx_end().
void amx_block_product(const uint16_t* x, const uint16_t* panel, int64_t steps, bool accumulate, float* c,
                       int64_t c_stride);

// The decode block of bf16_gemm.h's bf16_decode_gemm, between amx_begin() and amx_end(), over all `steps`
// depth steps: x in Bf16SplitActivations' decode layout (a step: `groups` A tiles of 16 rows, the hi parts
// of 8 inputs then their lo parts); panel as in Bf16BlockProduct, the next panel at panel + panel_stride.
// groups 1 (≤ 8 inputs): two panels (panel_stride 0 where there is only one: the copy's sums are not
// read), c [16, 64] = the A tile times panels 0 and 1; groups 2: one panel,
// c [32, 64], rows 16g .. 16g + 15 = A tile g times the panel in columns 0-31. Each sum is of one part of
// one input: the caller adds hi and lo.
void amx_decode_block_product(const uint16_t* x, int64_t groups, const uint16_t* panel, int64_t panel_stride,
                              int64_t steps, float* c);

}  // namespace slimkv
