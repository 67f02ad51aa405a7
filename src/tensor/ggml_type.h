// ggml's tensor types as GGUF files store them, and the block layouts of the quantized ones slimkv
// computes with (ggml's `ggml-common.h` block structs; GGUF docs "Tensor types").
//
// A quantized row is a sequence of blocks along the columns; each block holds `block_elements`
// values in `block_bytes`. All scales are little-endian FP16.
//   Q8_0 (32 values, 34 bytes):  d; int8 q[32]                           x = d·q
//   Q4_0 (32 values, 18 bytes):  d; uint8 qs[16]                         x[j] = d·((qs[j] & 15) - 8),
//                                                                        x[j+16] = d·((qs[j] >> 4) - 8)
//   Q4_K (256 values, 144 bytes): d; dmin; uint8 scales[12]; uint8 qs[128]
//        8 sub-blocks of 32 with 6-bit scale sc and min m packed in `scales`; x = d·sc·q - dmin·m,
//        q a nibble: 64 values per 32 bytes of qs, low nibbles first, then high nibbles.
//   Q6_K (256 values, 210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; d
//        16 sub-blocks of 16 with an int8 scale; q = (4 low bits from ql | 2 high bits from qh) - 32,
//        x = d·scale·q. Per half of 128 values: ql[0..64) and qh[0..32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "util/host_device.h"

namespace slimkv {

// The weight encodings slimkv multiplies with directly. kNone: plain F32/F16/BF16 (see DType).
enum class BlockQuant : uint8_t { kNone, kQ8_0, kQ4_0, kQ4_K, kQ6_K };

struct GgmlType {
  uint32_t id;                 // ggml_type value in the file
  std::string_view name;       // as ggml names it
  int64_t block_elements;      // values per block (1 for plain types)
  size_t block_bytes;          // bytes per block
  bool supported;              // slimkv computes with it
};

// The ggml type with this id, or nullptr when ggml defines no such type (or one whose block size
// slimkv does not know: such a file is refused at parse time, naming the id).
const GgmlType* find_ggml_type(uint32_t id);
std::string supported_ggml_type_names();  // "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K"

inline constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ8_0 = 8, kGgmlQ4_K = 12, kGgmlQ6_K = 14,
                          kGgmlBF16 = 30;

// Bytes of one block and values per block of a quantized encoding (kNone: not meaningful).
int64_t block_elements(BlockQuant quant);
size_t block_bytes(BlockQuant quant);
std::string_view block_quant_name(BlockQuant quant);

// Q4_K's 6-bit scale and min of sub-block j (0..7), packed in 12 bytes: bytes 0-3 hold the low 6
// bits of the scales of sub-blocks 0-3, bytes 4-7 those of their mins; sub-blocks 4-7 keep their low
// 4 bits in bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits in the spare top
// bits of bytes 0-3 (scales) and 4-7 (mins). Inline: the SIMD kernels unpack them per 256 values, and
// the CUDA ones (backend/cuda/quantized_gemm.cu) call it too.
SLIMKV_HOST_DEVICE inline void q4_k_scale_min(const uint8_t* packed, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// The plain scalar reference: out[0 .. n) = the values of n / block_elements consecutive blocks.
// Readable, obviously correct; the fast kernels (backend/cpu) are tested against it.
void dequantize_reference(BlockQuant quant, const void* blocks, float* out, int64_t n);

// The index of the first block whose FP16 scales are NaN or Inf, or -1: the quantized values are
// small integers, so a block is finite exactly when its scales are. n: values, a multiple of the
// block size.
int64_t first_non_finite_block(BlockQuant quant, const void* blocks, int64_t n);

}  // namespace slimkv
