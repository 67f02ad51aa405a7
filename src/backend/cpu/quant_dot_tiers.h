// The tiers of quant_dot.h: the row loop they share, and the x86 SIMD tiers' kernels (quant_dot_x86.cc),
// each of which runs only where quant_dot_tier_supported(its tier) said yes.
#pragma once

#include <cstdint>
#include <cstddef>
#include <cstdlib>

#include "backend/cpu/quant_dot.h"

namespace slimkv {

// How far ahead of the row being multiplied its thread asks for the weights (into L2). One core's hardware
// prefetchers keep too few lines in flight for these kernels' pace: a Q6_K matrix of 55 MB (past L2) ran
// at 5.4 GB/s without, 9.6 GB/s 8 KiB ahead, 6.2-8.2 at 2-4 KiB and 6.4-6.6 at 16-32 KiB (one thread,
// this project's Xeon); Q8_0 and Q4_0 gained 20-30% at 4-32 KiB alike.
constexpr size_t kPrefetchBytes = 8192;

// One input row of QuantizedActivations, its arrays from its first value.
struct InputRow {
  const int8_t* q;
  const float* scales;
  const float* scaled_sums;
  const float* scaled_sums16;
};

// y[i, o] for rows o in [row_begin, row_end) and every input i, one weight row by one input row at a time
// (a row of the 8B model's widest product is 8 KiB of Q4_K: it stays in L1 for the next input). Rows:
// a tier's row products (static q8_0, q4_0, q4_k, q6_k: one weight row of `blocks` ggml blocks by one input).
// Always inlined: in a SIMD tier's function it takes that tier's target attributes, and the row products
// inline into it (a call per row costs as much as a 384-wide row's products).
template <class Rows>
[[gnu::always_inline]] inline void matvec_by_rows(const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows, int64_t row_begin,
                    int64_t row_end, float* y) {
  const int64_t blocks = x.cols / block_elements(quant);
  const size_t row_bytes = size_t(blocks) * block_bytes(quant);
  const int64_t scale_blocks = x.cols / kActivationBlock;
  const uint8_t* end = static_cast<const uint8_t*>(w) + size_t(row_end) * row_bytes;
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + size_t(o) * row_bytes;
    for (const uint8_t* line = row + kPrefetchBytes; line < row + kPrefetchBytes + row_bytes && line < end; line += 64) {
      __builtin_prefetch(line, 0, 2);  // read, into L2
    }
    for (int64_t i = 0; i < x.n; ++i) {
      const InputRow input{x.q.data() + i * x.cols, x.scales.data() + i * scale_blocks,
                           x.scaled_sums.data() + i * scale_blocks, x.scaled_sums16.data() + 2 * i * scale_blocks};
      float& out = y[i * rows + o];
      switch (quant) {
        case BlockQuant::kQ8_0: out = Rows::q8_0(row, input, blocks); break;
        case BlockQuant::kQ4_0: out = Rows::q4_0(row, input, blocks); break;
        case BlockQuant::kQ4_K: out = Rows::q4_k(row, input, blocks); break;
        case BlockQuant::kQ6_K: out = Rows::q6_k(row, input, blocks); break;
        case BlockQuant::kNone: std::abort();
      }
    }
  }
}

// A SIMD tier's kernels: quantize fills out's arrays (sized for `blocks` blocks of 32 values) from x as
// quantize_activations does, bit for bit; matvec is matvec_quant_dot's.
struct QuantDotKernels {
  void (*quantize)(const float* x, int64_t blocks, QuantizedActivations& out);
  void (*matvec)(const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows, int64_t row_begin,
                 int64_t row_end, float* y);
};

// The kernels of an x86 SIMD tier (kAvx2, kAvxVnni, kAvx512Vnni: quant_dot_x86.cc); on other architectures
// and for other tiers both are nullptr.
QuantDotKernels x86_quant_dot_kernels(QuantDotTier tier);

}  // namespace slimkv
