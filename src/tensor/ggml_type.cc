#include "tensor/ggml_type.h"

#include <cmath>
#include <cstring>

#include "util/half.h"

namespace slimkv {
namespace {

// Every type whose block size is fixed and known; the rest of ggml's ids (the IQ* family, removed
// types) are refused by id. Ids and sizes: ggml.h `enum ggml_type`, ggml-common.h block structs.
constexpr GgmlType kGgmlTypes[] = {
    {0, "F32", 1, 4, true},        {1, "F16", 1, 2, true},          {2, "Q4_0", 32, 18, true},
    {3, "Q4_1", 32, 20, false},    {6, "Q5_0", 32, 22, false},      {7, "Q5_1", 32, 24, false},
    {8, "Q8_0", 32, 34, true},     {9, "Q8_1", 32, 36, false},      {10, "Q2_K", 256, 84, false},
    {11, "Q3_K", 256, 110, false}, {12, "Q4_K", 256, 144, true},    {13, "Q5_K", 256, 176, false},
    {14, "Q6_K", 256, 210, true},  {15, "Q8_K", 256, 292, false},   {24, "I8", 1, 1, false},
    {25, "I16", 1, 2, false},      {26, "I32", 1, 4, false},        {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},      {30, "BF16", 1, 2, true},
};

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return fp16_to_float(bits);
}

void dequantize_q8_0(const uint8_t* block, float* out) {
  const float d = half_at(block);
  for (int i = 0; i < 32; ++i) out[i] = d * float(int8_t(block[2 + i]));
}

void dequantize_q4_0(const uint8_t* block, float* out) {
  const float d = half_at(block);
  const uint8_t* qs = block + 2;
  for (int i = 0; i < 32; ++i) {
    const int nibble = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
    out[i] = d * float(nibble - 8);
  }
}

void dequantize_q4_k(const uint8_t* block, float* out) {
  const float d = half_at(block), dmin = half_at(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  for (int i = 0; i < 256; ++i) {
    const int sub_block = i / 32;              // 0..7
    const uint8_t byte = qs[(i / 64) * 32 + i % 32];
    const int q = sub_block % 2 == 0 ? (byte & 15) : (byte >> 4);
    int scale, min;
    q4_k_scale_min(scales, sub_block, &scale, &min);
    out[i] = d * float(scale) * float(q) - dmin * float(min);
  }
}

void dequantize_q6_k(const uint8_t* block, float* out) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = half_at(block + 208);
  for (int i = 0; i < 256; ++i) {
    const int half = i / 128, r = i % 128;  // r: position in the half
    const int quarter = r / 32, l = r % 32;  // which of the four 32-value runs, and where in it
    // Runs 0 and 1 take ql's low nibbles (at l and l + 32), runs 2 and 3 its high nibbles; run k
    // takes bits 2k..2k+1 of qh[l].
    const uint8_t low_byte = ql[half * 64 + l + (quarter % 2) * 32];
    const int low = quarter < 2 ? (low_byte & 15) : (low_byte >> 4);
    const int high = (qh[half * 32 + l] >> (2 * quarter)) & 3;
    const int q = (low | (high << 4)) - 32;
    out[i] = d * float(scales[half * 8 + quarter * 2 + l / 16]) * float(q);
  }
}

}  // namespace

const GgmlType* find_ggml_type(uint32_t id) {
  for (const GgmlType& type : kGgmlTypes) {
    if (type.id == id) return &type;
  }
  return nullptr;
}

std::string supported_ggml_type_names() {
  std::string names;
  for (const GgmlType& type : kGgmlTypes) {
    if (!type.supported) continue;
    if (!names.empty()) names += ", ";
    names += type.name;
  }
  return names;
}

int64_t block_elements(BlockQuant quant) {
  switch (quant) {
    case BlockQuant::kQ8_0:
    case BlockQuant::kQ4_0: return 32;
    case BlockQuant::kQ4_K:
    case BlockQuant::kQ6_K: return 256;
    case BlockQuant::kNone: break;
  }
  return 1;
}

size_t block_bytes(BlockQuant quant) {
  switch (quant) {
    case BlockQuant::kQ8_0: return 34;
    case BlockQuant::kQ4_0: return 18;
    case BlockQuant::kQ4_K: return 144;
    case BlockQuant::kQ6_K: return 210;
    case BlockQuant::kNone: break;
  }
  return 0;
}

std::string_view block_quant_name(BlockQuant quant) {
  switch (quant) {
    case BlockQuant::kQ8_0: return "Q8_0";
    case BlockQuant::kQ4_0: return "Q4_0";
    case BlockQuant::kQ4_K: return "Q4_K";
    case BlockQuant::kQ6_K: return "Q6_K";
    case BlockQuant::kNone: break;
  }
  return "none";
}

void dequantize_reference(BlockQuant quant, const void* blocks, float* out, int64_t n) {
  const auto* block = static_cast<const uint8_t*>(blocks);
  const int64_t per_block = block_elements(quant);
  for (int64_t b = 0; b < n / per_block; ++b, block += block_bytes(quant), out += per_block) {
    switch (quant) {
      case BlockQuant::kQ8_0: dequantize_q8_0(block, out); break;
      case BlockQuant::kQ4_0: dequantize_q4_0(block, out); break;
      case BlockQuant::kQ4_K: dequantize_q4_k(block, out); break;
      case BlockQuant::kQ6_K: dequantize_q6_k(block, out); break;
      case BlockQuant::kNone: return;
    }
  }
}

int64_t first_non_finite_block(BlockQuant quant, const void* blocks, int64_t n) {
  // Where each block keeps its FP16 scales (Q4_K: d and dmin).
  const size_t scale_offset = quant == BlockQuant::kQ6_K ? 208 : 0;
  const int scale_count = quant == BlockQuant::kQ4_K ? 2 : 1;
  const auto* bytes = static_cast<const uint8_t*>(blocks);
  for (int64_t b = 0; b < n / block_elements(quant); ++b) {
    const uint8_t* scales = bytes + size_t(b) * block_bytes(quant) + scale_offset;
    for (int s = 0; s < scale_count; ++s) {
      if (!std::isfinite(half_at(scales + 2 * s))) return b;
    }
  }
  return -1;
}

}  // namespace slimkv
