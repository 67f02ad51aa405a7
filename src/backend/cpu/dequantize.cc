#include "backend/cpu/dequantize.h"

#include <cstring>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/dequantize.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backend/cpu/vec_ops-inl.h"
#include "hwy/highway.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Every format is decoded in two steps: the bits of a run of values are unpacked into unsigned
// byte codes (plain byte loops), then out = scale · code + offset in SIMD, with the format's zero
// point folded into `offset`. Runs are 16 or 32 values (one scale each), a multiple of the lanes of
// every target this is compiled for (at most 16 FP32 lanes), so there is no scalar tail.
HWY_INLINE void AffineRun(const uint8_t* HWY_RESTRICT codes, size_t count, float scale, float offset,
                          float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t lanes = hn::Lanes(df);
  const auto vs = hn::Set(df, scale), vo = hn::Set(df, offset);
  HWY_DASSERT(count % lanes == 0);
  for (size_t i = 0; i < count; i += lanes) {
    const auto codes_u32 = hn::PromoteTo(hn::RebindToUnsigned<decltype(di)>(), hn::LoadU(du8, codes + i));
    hn::StoreU(hn::MulAdd(vs, hn::ConvertTo(df, hn::BitCast(di, codes_u32)), vo), df, out + i);
  }
}

float HalfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return fp16_to_float(bits);
}

// Q8_0: int8 q; code = q + 128, so x = d·code - 128·d.
void BlockQ8_0(const uint8_t* block, float* out) {
  uint8_t codes[32];
  for (int i = 0; i < 32; ++i) codes[i] = uint8_t(block[2 + i] ^ 0x80);
  const float d = HalfAt(block);
  AffineRun(codes, 32, d, -128.0f * d, out);
}

// Q4_0: low nibbles are values 0..15, high nibbles 16..31; x = d·q - 8·d.
void BlockQ4_0(const uint8_t* block, float* out) {
  uint8_t codes[32];
  for (int i = 0; i < 16; ++i) {
    codes[i] = block[2 + i] & 15;
    codes[i + 16] = block[2 + i] >> 4;
  }
  const float d = HalfAt(block);
  AffineRun(codes, 32, d, -8.0f * d, out);
}

// Q4_K: per 64 values, 32 bytes: low nibbles (sub-block 2j), then high nibbles (2j + 1); x = d·sc·q - dmin·m.
void BlockQ4_K(const uint8_t* block, float* out) {
  const float d = HalfAt(block), dmin = HalfAt(block + 2);
  const uint8_t* packed = block + 4;
  const uint8_t* qs = block + 16;
  uint8_t codes[64];
  for (int j = 0; j < 4; ++j, qs += 32, out += 64) {
    for (int l = 0; l < 32; ++l) {
      codes[l] = qs[l] & 15;
      codes[l + 32] = qs[l] >> 4;
    }
    for (int half = 0; half < 2; ++half) {
      const int sub = 2 * j + half;
      int scale, min;
      q4_k_scale_min(packed, sub, &scale, &min);
      AffineRun(codes + 32 * half, 32, d * float(scale), -dmin * float(min), out + 32 * half);
    }
  }
}

// Q6_K: per 128 values, 64 bytes of ql and 32 of qh give four runs of 32 (see tensor/ggml_type.h);
// 6-bit codes, x = d·sc·q - 32·d·sc per 16 values.
void BlockQ6_K(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = HalfAt(block + 208);
  uint8_t codes[128];
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, scales += 8, out += 128) {
    for (int l = 0; l < 32; ++l) {
      codes[l] = uint8_t((ql[l] & 15) | ((qh[l] & 3) << 4));
      codes[l + 32] = uint8_t((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
      codes[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      codes[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
    for (int run = 0; run < 8; ++run) {
      const float scale = d * float(scales[run]);
      AffineRun(codes + 16 * run, 16, scale, -32.0f * scale, out + 16 * run);
    }
  }
}

void DequantizeExport(BlockQuant quant, const void* blocks, float* out, int64_t n) {
  const auto* block = static_cast<const uint8_t*>(blocks);
  const int64_t per_block = block_elements(quant);
  const size_t bytes = block_bytes(quant);
  for (int64_t b = 0; b < n / per_block; ++b, block += bytes, out += per_block) {
    switch (quant) {
      case BlockQuant::kQ8_0: BlockQ8_0(block, out); break;
      case BlockQuant::kQ4_0: BlockQ4_0(block, out); break;
      case BlockQuant::kQ4_K: BlockQ4_K(block, out); break;
      case BlockQuant::kQ6_K: BlockQ6_K(block, out); break;
      case BlockQuant::kNone: return;
    }
  }
}

void MatVecQuantizedExport(const float* x, int64_t n, const void* w, BlockQuant quant, int64_t rows, int64_t cols,
                           int64_t row_begin, int64_t row_end, float* y) {
  thread_local std::vector<float> row;  // one widened weight row: cols floats, in L1/L2
  row.resize(size_t(cols));
  const size_t row_bytes = size_t(cols / block_elements(quant)) * block_bytes(quant);
  for (int64_t o = row_begin; o < row_end; ++o) {
    DequantizeExport(quant, static_cast<const uint8_t*>(w) + size_t(o) * row_bytes, row.data(), cols);
    for (int64_t i = 0; i < n; ++i) y[i * rows + o] = Dot(x + i * cols, row.data(), size_t(cols));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(DequantizeExport);
HWY_EXPORT(MatVecQuantizedExport);

void dequantize(BlockQuant quant, const void* blocks, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(DequantizeExport)(quant, blocks, out, n);
}

void matvec_quantized(const float* x, int64_t n, const void* w, BlockQuant quant, int64_t rows, int64_t cols,
                      int64_t row_begin, int64_t row_end, float* y) {
  HWY_DYNAMIC_DISPATCH(MatVecQuantizedExport)(x, n, w, quant, rows, cols, row_begin, row_end, y);
}

}  // namespace slimkv
#endif  // HWY_ONCE
