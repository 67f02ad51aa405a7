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

}  // namespace slimkv
