// The BF16 prefill tier for CPUs with AVX-512 BF16 and no AMX (AMD Zen 4 and later): vdpbf16ps multiplies
// 16 pairs of consecutive depth elements of one input's activations by 16 weight rows and adds each
// pair's two products to one of 16 FP32 sums. A register tile of 8 inputs x 32 rows (16 sums) reuses each
// loaded weight vector for 8 inputs x (hi, lo) = 16 instructions; the activations are broadcast a pair at
// a time. The layouts and the loop over blocks are bf16_gemm.h's, shared with the AMX tier.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__linux__)
// Functions that use AVX-512 BF16 are compiled for it alone: the rest of the binary stays portable, and
// they run only after avx512_bf16_available() said yes.
#define SLIMKV_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define SLIMKV_HAVE_AVX512_BF16 1
#endif

namespace slimkv {

// True when the CPU has AVX-512 F, BW, DQ, VL and BF16 and the OS saves the AVX-512 registers.
bool avx512_bf16_available();

// True where this tier is the faster prefill path: AMD CPUs. There vdpbf16ps issues as often as an FP32 FMA
// of the same width (bf16 x bf16 -> f32 at twice the f32 rate on Zen 4: IREE's mmt4d, iree-org/iree#15089),
// so the two BF16 parts cost what FP32 FMAs cost, without widening weights or reading them twice as wide.
// On Intel's AVX-512 BF16 CPUs it issues a quarter as often as an FMA (this project's Xeon: 1.37 G
// vdpbf16ps/s vs 5.5 G vfmadd231ps/s, zmm, one core): the tier ran at 0.4x panel_gemm there.
bool avx512_bf16_beats_fp32();

// bf16_gemm.h's Bf16BlockProduct on vdpbf16ps; only where avx512_bf16_available().
void avx512_bf16_block_product(const uint16_t* x, const uint16_t* panel, int64_t steps, bool accumulate, float* c,
                               int64_t c_stride);

}  // namespace slimkv
