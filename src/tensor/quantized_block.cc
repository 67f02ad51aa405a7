#include "tensor/quantized_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "util/half.h"
#include "util/random.h"

namespace slimkv {
namespace {

size_t round_up_64(size_t n) { return (n + 63) / 64 * 64; }

// Bytes of one packed group of 4 values at `bits` each.
size_t group_bytes(int bits) { return size_t(bits) / 2; }

void write_group(uint8_t* out, const uint8_t values[4], int bits) {
  uint32_t field = 0;
  for (int i = 0; i < 4; ++i) field |= uint32_t(values[i]) << (i * bits);
  for (size_t b = 0; b < group_bytes(bits); ++b) out[b] = uint8_t(field >> (8 * b));
}

void read_group(const uint8_t* in, int bits, uint8_t values[4]) {
  uint32_t field = 0;
  for (size_t b = 0; b < group_bytes(bits); ++b) field |= uint32_t(in[b]) << (8 * b);
  const uint32_t mask = (1u << bits) - 1;
  for (int i = 0; i < 4; ++i) values[i] = uint8_t((field >> (i * bits)) & mask);
}

// Quantizes n values read with `stride` (b bits, asymmetric or symmetric about 0); returns min and
// scale (FP16-exact, as stored). Element i draws its rounding noise from counter first_counter + i·stride.
struct Partition {
  uint16_t min_fp16, scale_fp16;
};
Partition quantize_partition(const float* x, int n, size_t stride, int bits, Rounding rounding, bool symmetric,
                             uint64_t seed, uint64_t first_counter, uint8_t* codes, size_t code_stride) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[size_t(i) * stride]);
    hi = std::max(hi, x[size_t(i) * stride]);
  }
  if (symmetric) {
    hi = std::max(hi, -lo);
    lo = -hi;
  }
  const int levels = (1 << bits) - 1;
  Partition p;
  p.min_fp16 = float_to_fp16(lo);
  const float min_value = fp16_to_float(p.min_fp16);
  p.scale_fp16 = float_to_fp16((hi - min_value) / float(levels));
  const float scale = fp16_to_float(p.scale_fp16);
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    const float y = (x[size_t(i) * stride] - min_value) * inverse;
    const float noise = rounding == Rounding::kStochastic ? counter_uniform(seed, first_counter + size_t(i) * stride) : 0.5f;
    codes[size_t(i) * code_stride] = uint8_t(std::clamp(int(std::floor(y + noise)), 0, levels));
  }
  return p;
}

template <typename T>
T* at(uint8_t* block, size_t offset) {
  return reinterpret_cast<T*>(block + offset);
}
template <typename T>
const T* at(const uint8_t* block, size_t offset) {
  return reinterpret_cast<const T*>(block + offset);
}

}  // namespace

QuantizedBlockLayout::QuantizedBlockLayout(const QuantizationConfig& config_in, const BlockShape& shape_in)
    : config(config_in), shape(shape_in) {
  const size_t tokens = size_t(shape.block_tokens);
  k_partition = std::min(shape.block_tokens, shape.k_dim);
  k_partitions = (shape.k_dim + k_partition - 1) / k_partition;
  k_group_tokens = config.k_per_channel && config.k_group > 0 ? config.k_group : shape.block_tokens;
  k_groups = config.k_per_channel ? std::max(1, shape.block_tokens / k_group_tokens) : 1;
  v_group_dims = config.v_per_token && config.v_group > 0 ? config.v_group : shape.v_dim;
  v_groups = config.v_per_token ? std::max(1, shape.v_dim / v_group_dims) : 1;
  const size_t k_meta = config.k_per_channel ? size_t(k_groups) * size_t(shape.k_dim) : size_t(k_partitions) * tokens;
  const size_t v_meta = config.v_per_token ? size_t(v_groups) * tokens : size_t(shape.v_dim);
  size_t offset = 0;
  const auto section = [&](size_t bytes) {
    const size_t start = offset;
    offset += round_up_64(bytes);
    return start;
  };
  const size_t sums = config.store_sums ? 1 : 0;
  k_codes = section(size_t(shape.k_dim) / 4 * tokens * group_bytes(config.k_bits));
  k_mins = section(k_meta * 2);
  k_scales = section(k_meta * 2);
  k_sums = section(sums * size_t(k_partitions) * tokens * 2);
  v_codes = section(tokens / 4 * size_t(shape.v_dim) * group_bytes(config.v_bits));
  v_mins = section(v_meta * 2);
  v_scales = section(v_meta * 2);
  v_sums = section(sums * size_t(shape.v_dim) * 2);
  block_bytes = offset;
}

size_t QuantizedBlockLayout::k_meta_slot(int t, int d) const {
  return config.k_per_channel ? size_t(t / k_group_tokens) * size_t(shape.k_dim) + size_t(d)
                              : size_t(d / k_partition) * size_t(shape.block_tokens) + size_t(t);
}

size_t QuantizedBlockLayout::v_meta_slot(int t, int c) const {
  return config.v_per_token ? size_t(c / v_group_dims) * size_t(shape.block_tokens) + size_t(t) : size_t(c);
}

Status check_quantized_shape(const QuantizationConfig& config, const BlockShape& shape) {
  for (int bits : {config.k_bits, config.v_bits}) {
    if (bits != 2 && bits != 4 && bits != 8) return error("quantized KV: bits must be 2, 4 or 8, got ", bits);
  }
  if (shape.k_dim % 4 != 0 || shape.v_dim % 4 != 0) {
    return error("quantized KV needs per-head dims that are multiples of 4, got k ", shape.k_dim, ", v ", shape.v_dim);
  }
  if (shape.block_tokens % 4 != 0 || shape.block_tokens > 128) {
    return error("quantized KV needs a partition (block) of a multiple of 4 tokens, at most 128, got ",
                 shape.block_tokens);
  }
  if (config.k_per_channel && config.k_group > 0 && shape.block_tokens % config.k_group != 0) {
    return error("quantized KV: kgroup=", config.k_group, " must divide the block of ", shape.block_tokens, " tokens (pi)");
  }
  if (config.v_per_token && config.v_group > 0 && shape.v_dim % config.v_group != 0) {
    return error("quantized KV: vgroup=", config.v_group, " must divide the value head dim ", shape.v_dim);
  }
  return Status::ok();
}

void quantize_block(const QuantizedBlockLayout& layout, const float* k, const float* v, uint64_t seed,
                    uint8_t* block) {
  const QuantizationConfig& config = layout.config;
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  std::memset(block, 0, layout.block_bytes);
  std::vector<uint8_t> k_codes(size_t(tokens) * k_dim), v_codes(size_t(tokens) * v_dim);

  // Value (t, d) draws its rounding noise from counter t·k_dim + d (K), then tokens·k_dim + t·v_dim + c
  // (V), whichever values share its scale.
  const auto store = [&](size_t mins, size_t scales, size_t slot, const Partition& part) {
    at<uint16_t>(block, mins)[slot] = part.min_fp16;
    at<uint16_t>(block, scales)[slot] = part.scale_fp16;
  };
  if (config.k_per_channel) {  // K: each dim over a group of tokens
    for (int j = 0; j < layout.k_groups; ++j) {
      for (int d = 0; d < k_dim; ++d) {
        const size_t first = size_t(j) * layout.k_group_tokens * k_dim + size_t(d);
        store(layout.k_mins, layout.k_scales, layout.k_meta_slot(j * layout.k_group_tokens, d),
              quantize_partition(k + first, layout.k_group_tokens, size_t(k_dim), config.k_bits, config.rounding,
                                 config.symmetric, seed, first, k_codes.data() + first, size_t(k_dim)));
      }
    }
  } else {  // K: partitions along each token's head dimension
    for (int t = 0; t < tokens; ++t) {
      for (int p = 0; p < layout.k_partitions; ++p) {
        const size_t first = size_t(t) * k_dim + size_t(p) * layout.k_partition;
        store(layout.k_mins, layout.k_scales, layout.k_meta_slot(t, p * layout.k_partition),
              quantize_partition(k + first, layout.k_partition_dims(p), 1, config.k_bits, config.rounding,
                                 config.symmetric, seed, first, k_codes.data() + first, 1));
      }
    }
  }
  const uint64_t v_counter = uint64_t(tokens) * uint64_t(k_dim);
  if (config.v_per_token) {  // V: each token's columns, in groups
    for (int t = 0; t < tokens; ++t) {
      for (int g = 0; g < layout.v_groups; ++g) {
        const size_t first = size_t(t) * v_dim + size_t(g) * layout.v_group_dims;
        store(layout.v_mins, layout.v_scales, layout.v_meta_slot(t, g * layout.v_group_dims),
              quantize_partition(v + first, layout.v_group_dims, 1, config.v_bits, config.rounding, config.symmetric,
                                 seed, v_counter + first, v_codes.data() + first, 1));
      }
    }
  } else {  // V: one partition of all the block's tokens per column
    for (int c = 0; c < v_dim; ++c) {
      store(layout.v_mins, layout.v_scales, size_t(c),
            quantize_partition(v + c, tokens, size_t(v_dim), config.v_bits, config.rounding, config.symmetric, seed,
                               v_counter + uint64_t(c), v_codes.data() + c, size_t(v_dim)));
    }
  }
  // Summation elimination's sums, the same in every layout: Σ K' per (partition, token), Σ V' per column.
  if (config.store_sums) {
    for (int p = 0; p < layout.k_partitions; ++p) {
      for (int t = 0; t < tokens; ++t) {
        int sum = 0;
        for (int d = p * layout.k_partition; d < p * layout.k_partition + layout.k_partition_dims(p); ++d) {
          sum += k_codes[size_t(t) * k_dim + d];
        }
        at<int16_t>(block, layout.k_sums)[size_t(p) * tokens + size_t(t)] = int16_t(sum);
      }
    }
    for (int c = 0; c < v_dim; ++c) {
      int sum = 0;
      for (int t = 0; t < tokens; ++t) sum += v_codes[size_t(t) * v_dim + c];
      at<int16_t>(block, layout.v_sums)[c] = int16_t(sum);
    }
  }

  const size_t kg = group_bytes(config.k_bits), vg = group_bytes(config.v_bits);
  for (int g = 0; g < k_dim / 4; ++g) {
    for (int t = 0; t < tokens; ++t) {
      write_group(block + layout.k_codes + (size_t(g) * tokens + t) * kg, &k_codes[size_t(t) * k_dim + 4 * g],
                  config.k_bits);
    }
  }
  for (int u = 0; u < tokens / 4; ++u) {
    for (int c = 0; c < v_dim; ++c) {
      const uint8_t group[4] = {v_codes[size_t(4 * u) * v_dim + c], v_codes[size_t(4 * u + 1) * v_dim + c],
                                v_codes[size_t(4 * u + 2) * v_dim + c], v_codes[size_t(4 * u + 3) * v_dim + c]};
      write_group(block + layout.v_codes + (size_t(u) * v_dim + c) * vg, group, config.v_bits);
    }
  }
}

void requantize_partial_block(const QuantizedBlockLayout& layout, float* k, float* v, int first_new, int tokens,
                              uint64_t seed) {
  const QuantizationConfig& config = layout.config;
  const int k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  std::vector<uint8_t> codes(size_t(std::max(k_dim, tokens)));
  const auto restore = [](float* x, int n, size_t stride, const Partition& part, const uint8_t* c) {
    const float min_value = fp16_to_float(part.min_fp16), scale = fp16_to_float(part.scale_fp16);
    for (int i = 0; i < n; ++i) x[size_t(i) * stride] = min_value + scale * float(c[i]);
  };
  for (int t = first_new; t < tokens; ++t) {
    for (int p = 0; p < layout.k_partitions; ++p) {
      float* x = k + size_t(t) * k_dim + size_t(p) * layout.k_partition;
      const int n = layout.k_partition_dims(p);
      const uint64_t counter = uint64_t(t) * uint64_t(k_dim) + uint64_t(p) * uint64_t(layout.k_partition);
      restore(x, n, 1,
              quantize_partition(x, n, 1, config.k_bits, config.rounding, config.symmetric, seed, counter, codes.data(), 1),
              codes.data());
    }
  }
  // Each append re-draws the V noise (a new counter range), as re-quantizing anew would.
  const uint64_t v_counter = (uint64_t(layout.shape.block_tokens) + uint64_t(tokens)) * uint64_t(k_dim + v_dim);
  for (int c = 0; c < v_dim; ++c) {
    restore(v + c, tokens, size_t(v_dim),
            quantize_partition(v + c, tokens, size_t(v_dim), config.v_bits, config.rounding, config.symmetric, seed,
                               v_counter + uint64_t(c), codes.data(), 1),
            codes.data());
  }
}

void unpack_block_codes(const QuantizedBlockLayout& layout, const uint8_t* block, uint8_t* k_codes, uint8_t* v_codes) {
  const QuantizationConfig& config = layout.config;
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  const size_t kg = group_bytes(config.k_bits), vg = group_bytes(config.v_bits);
  uint8_t group[4];
  for (int g = 0; g < k_dim / 4; ++g) {
    for (int t = 0; t < tokens; ++t) {
      read_group(block + layout.k_codes + (size_t(g) * tokens + t) * kg, config.k_bits, group);
      std::memcpy(&k_codes[size_t(t) * k_dim + 4 * g], group, 4);
    }
  }
  for (int u = 0; u < tokens / 4; ++u) {
    for (int c = 0; c < v_dim; ++c) {
      read_group(block + layout.v_codes + (size_t(u) * v_dim + c) * vg, config.v_bits, group);
      for (int i = 0; i < 4; ++i) v_codes[size_t(4 * u + i) * v_dim + c] = group[i];
    }
  }
}

void dequantize_block(const QuantizedBlockLayout& layout, const uint8_t* block, float* k, float* v) {
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  // The quant baseline calls this for every block at every decode step: buffers are reused, and each
  // slot's FP16 min and scale (one per partition or group) are widened once, not once per value.
  thread_local std::vector<uint8_t> k_codes, v_codes;
  thread_local std::vector<float> k_min, k_scale, v_min, v_scale;
  k_codes.resize(size_t(tokens) * k_dim);
  v_codes.resize(size_t(tokens) * v_dim);
  unpack_block_codes(layout, block, k_codes.data(), v_codes.data());
  const auto widen = [&](size_t mins, size_t scales, size_t slots, std::vector<float>& min, std::vector<float>& scale) {
    min.resize(slots);
    scale.resize(slots);
    for (size_t i = 0; i < slots; ++i) {
      min[i] = fp16_to_float(at<uint16_t>(block, mins)[i]);
      scale[i] = fp16_to_float(at<uint16_t>(block, scales)[i]);
    }
  };
  widen(layout.k_mins, layout.k_scales, layout.k_meta_slot(tokens - 1, k_dim - 1) + 1, k_min, k_scale);
  widen(layout.v_mins, layout.v_scales, layout.v_meta_slot(tokens - 1, v_dim - 1) + 1, v_min, v_scale);
  // In every layout a value's slot is a token's term plus a dimension's: slot(t, d) = slot(t, 0) + slot(0, d).
  thread_local std::vector<size_t> k_column, v_column;
  k_column.resize(size_t(k_dim));
  v_column.resize(size_t(v_dim));
  for (int d = 0; d < k_dim; ++d) k_column[size_t(d)] = layout.k_meta_slot(0, d);
  for (int c = 0; c < v_dim; ++c) v_column[size_t(c)] = layout.v_meta_slot(0, c);
  for (int t = 0; t < tokens; ++t) {
    const size_t k_row = layout.k_meta_slot(t, 0), v_row = layout.v_meta_slot(t, 0);
    for (int d = 0; d < k_dim; ++d) {
      const size_t slot = k_row + k_column[size_t(d)];
      k[size_t(t) * k_dim + d] = k_min[slot] + k_scale[slot] * float(k_codes[size_t(t) * k_dim + d]);
    }
    for (int c = 0; c < v_dim; ++c) {
      const size_t slot = v_row + v_column[size_t(c)];
      v[size_t(t) * v_dim + c] = v_min[slot] + v_scale[slot] * float(v_codes[size_t(t) * v_dim + c]);
    }
  }
}

void dequantize_tokens(const QuantizedBlockLayout& layout, const uint8_t* block, const int* tokens, int n, float* k,
                       float* v) {
  const QuantizationConfig& config = layout.config;
  const int block_tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  const size_t kg = group_bytes(config.k_bits), vg = group_bytes(config.v_bits);
  const auto meta = [&](size_t section, size_t slot) { return fp16_to_float(at<uint16_t>(block, section)[slot]); };
  thread_local std::vector<float> v_min, v_scale;  // per column (HACK's V layout), widened once for all the tokens
  if (v && !config.v_per_token) {
    v_min.resize(size_t(v_dim));
    v_scale.resize(size_t(v_dim));
    for (int c = 0; c < v_dim; ++c) {
      v_min[size_t(c)] = meta(layout.v_mins, size_t(c));
      v_scale[size_t(c)] = meta(layout.v_scales, size_t(c));
    }
  }
  // Value j of a packed group of 4 sits in bits [j·b, j·b + b), within one byte (b is 2, 4 or 8).
  const auto code = [](const uint8_t* group, int j, int bits) {
    return float((group[(j * bits) >> 3] >> ((j * bits) & 7)) & ((1 << bits) - 1));
  };
  for (int i = 0; i < n; ++i) {
    const int t = tokens[i];
    for (int d = 0; k && d < k_dim; d += 4) {
      const uint8_t* group = block + layout.k_codes + (size_t(d / 4) * block_tokens + size_t(t)) * kg;
      float* out = k + size_t(i) * k_dim + size_t(d);
      for (int j = 0; j < 4; ++j) {
        const size_t slot = layout.k_meta_slot(t, d + j);
        out[j] = meta(layout.k_mins, slot) + meta(layout.k_scales, slot) * code(group, j, config.k_bits);
      }
    }
    // Token t's value of column c: value t % 4 of the group of tokens 4⌊t/4⌋.. of that column.
    const uint8_t* v_groups = block + layout.v_codes + size_t(t / 4) * v_dim * vg;
    for (int c = 0; v && c < v_dim; ++c) {
      const float value_code = code(v_groups + size_t(c) * vg, t % 4, config.v_bits);
      const size_t slot = layout.v_meta_slot(t, c);
      v[size_t(i) * v_dim + size_t(c)] = config.v_per_token
                                             ? meta(layout.v_mins, slot) + meta(layout.v_scales, slot) * value_code
                                             : v_min[size_t(c)] + v_scale[size_t(c)] * value_code;
    }
  }
}

size_t dequantized_token_bytes(const QuantizedBlockLayout& layout, int n, bool keys, bool values) {
  const QuantizationConfig& config = layout.config;
  // Per token: the codes, and the min/scale of a per-token side; per block: those of a per-channel side.
  const size_t k_row = size_t(layout.shape.k_dim) * size_t(config.k_bits) / 8 +
                       (config.k_per_channel ? 0 : size_t(layout.k_partitions) * 4);
  const size_t k_block = config.k_per_channel ? size_t(layout.k_groups) * size_t(layout.shape.k_dim) * 4 : 0;
  const size_t v_row = size_t(layout.shape.v_dim) * size_t(config.v_bits) / 8 +
                       (config.v_per_token ? size_t(layout.v_groups) * 4 : 0);
  const size_t v_block = config.v_per_token ? 0 : size_t(layout.shape.v_dim) * 4;
  return (keys ? size_t(n) * k_row + k_block : 0) + (values ? size_t(n) * v_row + v_block : 0);
}

}  // namespace slimkv
