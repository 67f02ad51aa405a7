// The quantized block format shared by the `hack` and `quant` codecs (HACK §5.2): asymmetric b-bit
// quantization, x ≈ min + scale · x', x' in [0, 2^b - 1], with stochastic (or nearest) rounding.
//   K: partitions of Π along the head dimension of each token (Π dims, or the whole head if smaller);
//   V: partitions of Π tokens along the sequence, per column: one V partition is one block.
// Per partition: min and scale in FP16, and the sum of its x' in INT16 (HACK's summation
// elimination), unless `store_sums` is off (the HACK/SE ablation, which recomputes them).
//
// Byte layout of a block, "tokens in lanes" so that an integer dot-product instruction (VNNI
// vpdpbusd) multiplies 4 dims of 16 tokens at once with no horizontal sums:
//   K' : for dim group g = 0 .. k_dim/4 - 1, for token t = 0 .. Π-1: the 4 values of dims 4g..4g+3 of
//        token t, value i in bits [i·b, i·b + b) of a little-endian field of 4b bits (b/2 bytes).
//   K meta: for partition p, for token t: min (FP16); then scales (FP16); then sums (INT16).
//   V' : for token group u = 0 .. Π/4 - 1, for column c = 0 .. v_dim-1: tokens 4u..4u+3 of column c,
//        packed the same way.
//   V meta: for column c: min (FP16); then scales (FP16); then sums (INT16).
// Each section starts at a multiple of 64 bytes.
//
// Two other layouts of the scales (KIVI's, issue 28), chosen per side; the codes and sums are laid out
// as above in every layout, only which values share a min and a scale changes:
//   K per channel (k_per_channel): each dim d of a group of k_group consecutive tokens shares a min and
//        scale; K meta: for token group j, for dim d: min; then scales. The sums stay per (partition, token).
//   V per token (v_per_token): each token t's columns, in groups of v_group, share a min and scale; V
//        meta: for column group g, for token t: min; then scales. The sums stay per column.
// Symmetric ranges (`symmetric`) keep the same format with min = -max|x| (the grid centred on 0).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"
#include "tensor/block_shape.h"
#include "util/random.h"  // counter_uniform: the rounding noise, the same on every backend

namespace slimkv {

enum class Rounding { kStochastic, kNearest };

struct QuantizationConfig {
  int k_bits = 2;           // 2, 4 or 8
  int v_bits = 2;           // 2, 4 or 8
  Rounding rounding = Rounding::kStochastic;
  bool store_sums = true;   // HACK summation elimination; off = the HACK/SE ablation
  bool keep_open_exact = true;  // HACK requantization elimination; off = the HACK/RQE ablation
  bool k_per_channel = false;   // klayout=channel (KIVI) instead of HACK's per token
  bool v_per_token = false;     // vlayout=token (KIVI) instead of HACK's per channel
  int k_group = 0;              // K per channel: tokens per min/scale (divides Π); 0: the whole block
  int v_group = 0;              // V per token: columns per min/scale (divides v_dim); 0: the whole head
  bool symmetric = false;       // range=sym: min = -max|x| instead of the partition's min
};

// Where each section of one block lies, for one shape.
struct QuantizedBlockLayout {
  QuantizedBlockLayout(const QuantizationConfig& config, const BlockShape& shape);

  QuantizationConfig config;
  BlockShape shape;
  int k_partition = 0;        // dims per K partition: min(Π, k_dim) (per channel: Q·s's 8-bit partitions)
  int k_partitions = 0;       // ceil(k_dim / k_partition)
  int k_group_tokens = 0;     // K per channel: tokens per group (k_group, or Π); per token: Π
  int k_groups = 1;           // K per channel: Π / k_group_tokens; per token: 1
  int v_group_dims = 0;       // V per token: columns per group (v_group, or v_dim); per channel: v_dim
  int v_groups = 1;           // V per token: v_dim / v_group_dims; per channel: 1
  size_t k_codes = 0, k_mins = 0, k_scales = 0, k_sums = 0;  // byte offsets in the block
  size_t v_codes = 0, v_mins = 0, v_scales = 0, v_sums = 0;
  size_t block_bytes = 0;

  // The last partition may be shorter. Inline: the attention kernels ask for it in their inner loops.
  int k_partition_dims(int p) const { return std::min(k_partition, shape.k_dim - p * k_partition); }
  // Index of the min (and scale) that value (token t, dim or column d) uses, in its meta section.
  size_t k_meta_slot(int t, int d) const;
  size_t v_meta_slot(int t, int c) const;
};

// Shapes the format can hold: head dims that are multiples of 4, blocks of a multiple of 4 tokens,
// at most 128 tokens when sums are 8-bit-safe in INT16; groups that divide the block or the head.
Status check_quantized_shape(const QuantizationConfig& config, const BlockShape& shape);

// Quantizes a full block: k [Π, k_dim], v [Π, v_dim] (FP32) into `block`.
void quantize_block(const QuantizedBlockLayout& layout, const float* k, const float* v, uint64_t seed,
                    uint8_t* block);

// Dequantizes to FP32: k [Π, k_dim], v [Π, v_dim].
void dequantize_block(const QuantizedBlockLayout& layout, const uint8_t* block, float* k, float* v);

// Dequantizes only some tokens (indices into the block): k [n, k_dim], v [n, v_dim], either null to
// skip it; the rows of dequantize_block exactly. What a token selection reads (pq): a fifth of a block
// costs a fifth of decoding all of it.
void dequantize_tokens(const QuantizedBlockLayout& layout, const uint8_t* block, const int* tokens, int n, float* k,
                       float* v);

// Bytes of the block dequantize_tokens reads for n tokens: their codes and K partitions' metadata, and
// for values the per-column metadata once.
size_t dequantized_token_bytes(const QuantizedBlockLayout& layout, int n, bool keys, bool values);

// The integer codes of a block, unpacked: k_codes [Π, k_dim], v_codes [Π, v_dim], and the sums of
// each partition recomputed from them (what the SE ablation does at every step).
void unpack_block_codes(const QuantizedBlockLayout& layout, const uint8_t* block, uint8_t* k_codes, uint8_t* v_codes);

// Quantizes and dequantizes in place what a partial block holds (the HACK/RQE ablation): K rows
// [first_new, tokens) per K partition, and every V column over rows [0, tokens).
void requantize_partial_block(const QuantizedBlockLayout& layout, float* k, float* v, int first_new, int tokens,
                              uint64_t seed);

}  // namespace slimkv
