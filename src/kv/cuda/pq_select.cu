#include "kv/cuda/pq_select.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/pq_token_cache.cuh"
#include "kv/cuda/top_k_rows.h"

namespace slimkv::cuda {
namespace {

using i64 = long long;

constexpr int kWarpsPerBlock = 8;

__device__ float half_at(const uint16_t* p, long long i) { return __half2float(__ushort_as_half(p[i])); }

// The summed query of KV head g's group (FP32, heads in order: the CPU selector's Σ_h q_h) into sum[d],
// widened to FP64 once here for the FP64 dot products that read it, which then convert only their other
// operand (an H100 SM converts to FP64 at a quarter of its FP64 multiply-add rate; the tables at 128K
// tokens take 2^b · head_dim products per segment, KV head and layer).
__device__ void group_query(const uint16_t* q, int row, int g, int num_heads, int num_kv_heads, int d, double* sum) {
  const int group = num_heads / num_kv_heads;
  for (int c = threadIdx.x + threadIdx.y * blockDim.x; c < d; c += blockDim.x * blockDim.y) {
    float s = 0.0f;
    for (int h = 0; h < group; ++h) s += half_at(q, (i64(row) * num_heads + g * group + h) * d + c);
    sum[c] = double(s);
  }
}

// Where token t of sequence s, KV head g sits in a paged view.
__device__ long long paged_offset(const PagedKvView& v, int s, int g, int t) {
  const int block = v.block_tables[i64(s) * v.block_table_stride + t / kCudaBlockTokens];
  return ((i64(block) * v.num_kv_heads + g) * kCudaBlockTokens + t % kCudaBlockTokens) * v.head_dim;
}

// --- Sealed blocks (`pq:...+hack`): one token's K or V dequantized from its block, as dequantize_tokens ---

// Token t of sequence s, KV head g: its sealed block and its row in the block.
struct SealedToken {
  const uint8_t* block;
  int t;
};

__device__ SealedToken sealed_token(const QuantizedKvView& q, int table_stride, int num_kv_heads, int s, int g, int t) {
  const int id = q.block_tables[i64(s) * table_stride + t / kCudaBlockTokens] >> q.table_shift;
  return {q.blocks + (i64(id) * num_kv_heads + g) * q.offsets.block_bytes, t % kCudaBlockTokens};
}
__device__ SealedToken sealed_token(const PqSelectLaunch& p, int s, int g, int t) {
  return sealed_token(p.sealed, p.source.block_table_stride, p.num_kv_heads, s, g, t);
}

// Four FP16 values (8 bytes) as floats.
__device__ void unpack4(uint2 four, float out[4]) {
  const unsigned words[2] = {four.x, four.y};
  for (int j = 0; j < 4; ++j) out[j] = __half2float(__ushort_as_half(uint16_t(words[j / 2] >> (16 * (j % 2)))));
}

__device__ float meta_at(const uint8_t* block, int section, int slot) {
  return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t*>(block + section)[slot]));
}

// The FP16 mins (or scales) of slots [slot, slot + 4) in one 8-byte load (slot a multiple of 4: the
// section starts at a multiple of 64 bytes). Over PCIe each load is a request of its own.
__device__ void meta4_at(const uint8_t* block, int section, int slot, float out[4]) {
  unpack4(*reinterpret_cast<const uint2*>(block + section + 2 * slot), out);
}

// A packed group of 4 codes (b/2 bytes, a little-endian field of 4b bits) in one load.
__device__ unsigned group_at(const uint8_t* group, int bits) {
  return bits == 2 ? group[0] : bits == 4 ? *reinterpret_cast<const uint16_t*>(group) : *reinterpret_cast<const unsigned*>(group);
}
// Value j of the group: bits [j·b, j·b + b).
__device__ float code_of(unsigned group, int j, int bits) { return float((group >> (j * bits)) & ((1u << bits) - 1)); }

// min + scale · code, unfused: the CPU's rounding (dequantize_tokens), so the re-rank's scores are its.
__device__ float dequantized(float min, float scale, float code) { return __fadd_rn(min, __fmul_rn(scale, code)); }

// HACK's K partitions: min(Π, d) dims each (a multiple of 4), each with a min and scale per token.
__device__ int k_partition_dims(int d) { return min(kCudaBlockTokens, d); }

// Dims 4c..4c+3 of the token's key (K codes: dim group-major, the block's tokens in each group).
__device__ void sealed_key4(const QuantizedKvView& q, SealedToken x, int c, int d, float out[4]) {
  const unsigned group = group_at(x.block + (i64(c) * kCudaBlockTokens + x.t) * (q.k_bits / 2), q.k_bits);
  float mins[4], scales[4];
  if (q.k_per_channel) {  // a min and scale per dim of the token's group of tokens
    const int slot = x.t / q.k_group_tokens * d + 4 * c;
    meta4_at(x.block, q.offsets.k_mins, slot, mins);
    meta4_at(x.block, q.offsets.k_scales, slot, scales);
  } else {  // per K partition: the 4 dims share one
    const int slot = 4 * c / k_partition_dims(d) * kCudaBlockTokens + x.t;
    mins[0] = mins[1] = mins[2] = mins[3] = meta_at(x.block, q.offsets.k_mins, slot);
    scales[0] = scales[1] = scales[2] = scales[3] = meta_at(x.block, q.offsets.k_scales, slot);
  }
  for (int j = 0; j < 4; ++j) out[j] = dequantized(mins[j], scales[j], code_of(group, j, q.k_bits));
}

// --- Token-major rows (PqTokenRows). A key's: [codes, d·b/8 bytes][mins, 2 bytes a partition][scales];
// a value's: [codes, d·b/8 bytes] and with V per token [mins, 2 bytes a column group][scales] ---

__device__ int row_codes_bytes(int d, int bits) { return d * bits / 8; }
__device__ int row_partitions(int d) { return (d + k_partition_dims(d) - 1) / k_partition_dims(d); }

__device__ uint8_t* token_row(const PqTokenRows& rows, int num_kv_heads, int s, int g, int t) {
  return rows.rows + ((i64(s) * num_kv_heads + g) * rows.max_tokens + t) * rows.row_bytes;
}

// Dims 4c..4c+3 of the key in `row`: the values sealed_key4 reads from the block, so the same floats.
__device__ void row_key4(const QuantizedKvView& q, const uint8_t* row, int c, int d, float out[4]) {
  const unsigned group = group_at(row + c * (q.k_bits / 2), q.k_bits);
  const int meta = row_codes_bytes(d, q.k_bits), part = 4 * c / k_partition_dims(d);
  const float k_min = meta_at(row, meta, part), k_scale = meta_at(row, meta + 2 * row_partitions(d), part);
  for (int j = 0; j < 4; ++j) out[j] = dequantized(k_min, k_scale, code_of(group, j, q.k_bits));
}

// Token t's block's copy of its per-column V mins and scales, if the launch has copies.
__device__ const uint16_t* value_scales_of(const PqValueScales& v, int num_kv_heads, int d, int s, int g, int t) {
  if (v.scales == nullptr) return nullptr;
  return v.scales + ((i64(s) * num_kv_heads + g) * v.max_blocks + t / kCudaBlockTokens) * 2 * d;
}

// Columns 4c..4c+3 of the value in `row` (PqTokenRows: group c of its codes, then with V per token its
// column groups' mins, then their scales), with HACK's per-column V mins and scales from column_scales
// (the block's copy, PqValueScales): the values sealed_value4 reads from the block, so the same floats.
__device__ void row_value4(const QuantizedKvView& q, const uint8_t* row, int c, int d, const uint16_t* column_scales,
                           float out[4]) {
  const unsigned group = group_at(row + c * (q.v_bits / 2), q.v_bits);
  float mins[4], scales[4];
  if (q.v_per_token) {
    const int meta = row_codes_bytes(d, q.v_bits), groups = d / q.v_group_dims;
    for (int j = 0; j < 4; ++j) {
      const int column_group = (4 * c + j) / q.v_group_dims;
      mins[j] = meta_at(row, meta, column_group);
      scales[j] = meta_at(row, meta + 2 * groups, column_group);
    }
  } else {
    unpack4(reinterpret_cast<const uint2*>(column_scales)[c], mins);
    unpack4(reinterpret_cast<const uint2*>(column_scales + d)[c], scales);
  }
  for (int j = 0; j < 4; ++j) out[j] = dequantized(mins[j], scales[j], code_of(group, j, q.v_bits));
}

// Dims 4c..4c+3 of the key of token t (in x's sealed block): from its row where the launch has rows.
__device__ void stored_key4(const PqSelectLaunch& p, int s, int g, int t, SealedToken x, int c, float out[4]) {
  const int d = p.index.head_dim;
  const PqTokenRows& rows = p.copies.key_rows;
  if (rows.rows != nullptr) return row_key4(p.sealed, token_row(rows, p.num_kv_heads, s, g, t), c, d, out);
  sealed_key4(p.sealed, x, c, d, out);
}

// Columns 4c..4c+3 of the token's value (V codes: groups of 4 tokens, every column's group in turn).
// column_scales: the block's per-column mins then scales (FP16 [2, d]) where a copy is read instead of
// the block's (PqValueScales), else null.
__device__ void sealed_value4(const QuantizedKvView& q, SealedToken x, int c, int d, const uint16_t* column_scales,
                              float out[4]) {
  const int group_bytes = q.v_bits / 2;
  const uint8_t* groups = x.block + q.offsets.v_codes + (i64(x.t / 4) * d + 4 * c) * group_bytes;
  float mins[4], scales[4];
  if (q.v_per_token) {  // a min and scale per group of v_group_dims columns of the token
    // Groups of a multiple of 4 columns hold all 4: one load each (over PCIe, a request each).
    const int distinct = q.v_group_dims % 4 == 0 ? 1 : 4;
    for (int j = 0; j < 4; ++j) {
      const int slot = (4 * c + j) / q.v_group_dims * kCudaBlockTokens + x.t;
      mins[j] = j < distinct ? meta_at(x.block, q.offsets.v_mins, slot) : mins[0];
      scales[j] = j < distinct ? meta_at(x.block, q.offsets.v_scales, slot) : scales[0];
    }
  } else if (column_scales != nullptr) {  // per column over the block, from the copy
    unpack4(reinterpret_cast<const uint2*>(column_scales)[c], mins);
    unpack4(reinterpret_cast<const uint2*>(column_scales + d)[c], scales);
  } else {  // per column over the block
    meta4_at(x.block, q.offsets.v_mins, 4 * c, mins);
    meta4_at(x.block, q.offsets.v_scales, 4 * c, scales);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = dequantized(mins[j], scales[j], code_of(group_at(groups + j * group_bytes, q.v_bits), x.t % 4, q.v_bits));
  }
}

__device__ uint2 pack4(const float in[4]) {
  const auto bits = [](float x) { return unsigned(__half_as_ushort(__float2half_rn(x))); };
  return make_uint2(bits(in[0]) | bits(in[1]) << 16, bits(in[2]) | bits(in[3]) << 16);
}

// Whether token t of the row lies in a full block (before the open block).
__device__ bool in_full_block(const PqSelectRow& r, int t) { return t < r.num_tokens / kCudaBlockTokens * kCudaBlockTokens; }

// Whether token t of the row lies in a sealed block that the launch reads.
__device__ bool reads_sealed(const PqSelectLaunch& p, const PqSelectRow& r, int t) {
  return p.sealed.blocks != nullptr && in_full_block(r, t);
}

// Token t's FP16 key (or value) where the launch reads it: over FP16 pages with their token-major
// copies (pq_fp16_row_copies), a full block's token from its row; else from its page.
__device__ const uint16_t* fp16_at(const PqSelectLaunch& p, const PqSelectRow& r, int g, int t, bool value) {
  const PqTokenRows& rows = value ? p.copies.value_rows : p.copies.key_rows;
  if (p.sealed.blocks == nullptr && rows.rows != nullptr && in_full_block(r, t)) {
    return reinterpret_cast<const uint16_t*>(token_row(rows, p.num_kv_heads, r.sequence, g, t));
  }
  return (value ? p.source.v : p.source.k) + paged_offset(p.source, r.sequence, g, t);
}

// 1. grid (segments, kv heads, rows).
__global__ void tables_kernel(PqSelectLaunch p) {
  extern __shared__ double qsum[];
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, seg = blockIdx.x;
  if (r.all || seg >= r.trained_segments) return;
  const PqIndexView& x = p.index;
  group_query(p.q, blockIdx.z, g, p.num_heads, p.num_kv_heads, x.head_dim, qsum);
  __syncthreads();
  const int K = 1 << x.bits, sub = x.head_dim / x.m;
  const uint16_t* c = x.centroids + ((i64(r.sequence) * p.num_kv_heads + g) * x.max_segments + seg) *
                                        (i64(x.head_dim) * K);
  float* table = p.scratch.tables + ((i64(blockIdx.z) * p.num_kv_heads + g) * x.max_segments + seg) * (x.m * K);
  for (int e = threadIdx.x; e < x.m * K; e += blockDim.x) {
    const int s = e / K, i = e % K;
    double sum = 0.0;
    // Unrolled so that several centroid loads are in flight (a 128K context has 512 segments' codebooks
    // to read each layer); the sum keeps its order.
#pragma unroll 8
    for (int j = 0; j < sub; ++j) sum += qsum[s * sub + j] * double(half_at(c, (i64(s) * sub + j) * K + i));
    table[e] = float(sum);
  }
}

// 2. grid (middle / 256, kv heads, rows).
__global__ void adc_kernel(PqSelectLaunch p) {
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y;
  const int t = r.init_end + blockIdx.x * blockDim.x + threadIdx.x;
  if (r.all || t >= r.middle_end) return;
  const PqIndexView& x = p.index;
  const int K = 1 << x.bits;
  const int seg = min(t / x.segment_tokens, r.trained_segments - 1);
  const float* table = p.scratch.tables + ((i64(blockIdx.z) * p.num_kv_heads + g) * x.max_segments + seg) * (x.m * K);
  const uint8_t* code = x.codes + ((i64(r.sequence) * p.num_kv_heads + g) * x.max_tokens + t) * x.m;
  float sum = 0.0f;
  for (int s = 0; s < x.m; ++s) sum += table[s * K + code[s]];
  p.scratch.scores[(i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_middle + (t - r.init_end)] = sum;
}

// 4. grid (candidates / warps, kv heads, rows), a warp per candidate.
__global__ void rerank_kernel(PqSelectLaunch p) {
  extern __shared__ double qsum[];
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, d = p.index.head_dim;
  if (r.all || r.candidates <= r.k) return;
  group_query(p.q, blockIdx.z, g, p.num_heads, p.num_kv_heads, d, qsum);
  __syncthreads();
  const int i = blockIdx.x * blockDim.y + threadIdx.y;
  if (i >= r.candidates) return;
  const long long row = (i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_candidates;
  const int t = r.init_end + p.scratch.ranked[row + i];
  uint16_t* kept_key = p.scratch.keys + (row + i) * d;
  double sum = 0.0;
  if (reads_sealed(p, r, t)) {  // the key as the block stores it (a candidate is always sealed)
    const SealedToken x = sealed_token(p, r.sequence, g, t);
    for (int c = threadIdx.x; c < d / 4; c += 32) {
      float four[4];
      stored_key4(p, r.sequence, g, t, x, c, four);
      reinterpret_cast<uint2*>(kept_key)[c] = pack4(four);
      for (int j = 0; j < 4; ++j) sum += qsum[4 * c + j] * double(four[j]);
    }
  } else {
    const int slot = pq_cached_slot(p.cache, r.sequence, g, t);
    const uint16_t* key = slot >= 0 ? p.cache.k + pq_cache_row(p.cache, r.sequence, g, slot) : fp16_at(p, r, g, t, false);
    // 8 bytes a lane: a warp reads a 128-dim key in one 256-byte request (over PCIe with @offload).
    for (int c = threadIdx.x; c < d / 4; c += 32) {
      const uint2 packed = reinterpret_cast<const uint2*>(key)[c];
      reinterpret_cast<uint2*>(kept_key)[c] = packed;
      float four[4];
      unpack4(packed, four);
      for (int j = 0; j < 4; ++j) sum += qsum[4 * c + j] * double(four[j]);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x == 0) p.scratch.exact[row + i] = float(sum);
}

// 5. grid (selected / warps, kv heads, rows), a warp per selected token: 8-byte loads.
__global__ void gather_kernel(PqSelectLaunch p) {
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, d = p.index.head_dim;
  const int i = blockIdx.x * blockDim.y + threadIdx.y;
  if (i >= r.selected) return;
  const long long row = (i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_candidates;
  int t = i;
  const uint16_t* key = nullptr;
  if (!r.all && i >= r.init_end) {
    if (i < r.init_end + r.k) {
      const int j = i - r.init_end;  // the j-th kept, ascending
      const int c = r.candidates > r.k ? p.scratch.kept[row + j] : j;
      t = r.init_end + p.scratch.ranked[row + c];
      if (r.candidates > r.k) key = p.scratch.keys + (row + c) * d;
    } else {
      t = r.middle_end + (i - r.init_end - r.k);
    }
  }
  if (p.cache.step_tokens != nullptr && threadIdx.x == 0) {
    p.cache.step_tokens[(i64(blockIdx.z) * p.num_kv_heads + g) * p.cache.tokens_stride + i] = t;
  }
  const int block = blockIdx.z * p.out_blocks_per_row + i / kCudaBlockTokens;
  const long long to = ((i64(block) * p.num_kv_heads + g) * kCudaBlockTokens + i % kCudaBlockTokens) * d;
  uint2* k_out = reinterpret_cast<uint2*>(p.out_k + to);
  uint2* v_out = reinterpret_cast<uint2*>(p.out_v + to);
  // From the GPU cache where the token is there, else from the pages or their rows (or its sealed block).
  const int slot = pq_cached_slot(p.cache, r.sequence, g, t);
  const uint16_t* value = nullptr;
  if (slot >= 0) {
    const long long at = pq_cache_row(p.cache, r.sequence, g, slot);
    if (key == nullptr) key = p.cache.k + at;
    value = p.cache.v + at;
  } else if (reads_sealed(p, r, t)) {
    const SealedToken x = sealed_token(p, r.sequence, g, t);
    const uint16_t* column_scales =
        p.sealed.v_per_token ? nullptr : value_scales_of(p.copies.value_scales, p.num_kv_heads, d, r.sequence, g, t);
    for (int c = threadIdx.x; c < d / 4; c += 32) {
      float four[4];
      if (key == nullptr) {
        stored_key4(p, r.sequence, g, t, x, c, four);
        k_out[c] = pack4(four);
      } else {
        k_out[c] = reinterpret_cast<const uint2*>(key)[c];
      }
      if (p.copies.value_rows.rows != nullptr) {
        row_value4(p.sealed, token_row(p.copies.value_rows, p.num_kv_heads, r.sequence, g, t), c, d, column_scales, four);
      } else {
        sealed_value4(p.sealed, x, c, d, column_scales, four);
      }
      v_out[c] = pack4(four);
    }
    return;
  } else {
    if (key == nullptr) key = fp16_at(p, r, g, t, false);
    value = fp16_at(p, r, g, t, true);
  }
  const uint2* k_in = reinterpret_cast<const uint2*>(key);
  const uint2* v_in = reinterpret_cast<const uint2*>(value);
  // Both loads before either store: the compiler cannot tell that the stores miss the inputs, and would
  // otherwise wait for the key's store before loading the value (two trips over PCIe, not one; from a
  // row, the key and value are one 512-byte range).
  for (int c = threadIdx.x; c < d / 4; c += 32) {
    const uint2 k_piece = k_in[c], v_piece = v_in[c];
    k_out[c] = k_piece;
    v_out[c] = v_piece;
  }
}

// grid (n / warps, kv heads), a warp per token.
__global__ void sealed_keys_kernel(SealedTokenRange p, uint16_t* keys) {
  const int i = blockIdx.x * blockDim.y + threadIdx.y, g = blockIdx.y;
  if (i >= p.n) return;
  const SealedToken x = sealed_token(p.sealed, p.block_table_stride, p.num_kv_heads, p.sequence, g, p.first + i);
  uint2* row = reinterpret_cast<uint2*>(keys + (i64(i) * p.num_kv_heads + g) * p.head_dim);
  for (int c = threadIdx.x; c < p.head_dim / 4; c += 32) {
    float four[4];
    sealed_key4(p.sealed, x, c, p.head_dim, four);
    row[c] = pack4(four);
  }
}

// Token x.t's key row (lane `lane` of a warp): lane c copies group c of its codes (b/2 bytes), lane j <
// partitions partition j's min and scale.
__device__ void write_key_row(const QuantizedKvView& q, SealedToken x, int d, int lane, uint8_t* row) {
  const int group_bytes = q.k_bits / 2;
  for (int c = lane; c < d / 4; c += 32) {
    const uint8_t* from = x.block + (i64(c) * kCudaBlockTokens + x.t) * group_bytes;
    for (int b = 0; b < group_bytes; ++b) row[c * group_bytes + b] = from[b];
  }
  const int meta = row_codes_bytes(d, q.k_bits), partitions = row_partitions(d);
  uint16_t* mins_then_scales = reinterpret_cast<uint16_t*>(row + meta);
  for (int j = lane; j < partitions; j += 32) {
    const int slot = j * kCudaBlockTokens + x.t;
    mins_then_scales[j] = reinterpret_cast<const uint16_t*>(x.block + q.offsets.k_mins)[slot];
    mins_then_scales[partitions + j] = reinterpret_cast<const uint16_t*>(x.block + q.offsets.k_scales)[slot];
  }
}

// Token x.t's value row (lane `lane` of a warp): lane c regroups its codes of columns 4c..4c+3 (each in
// its column's group of 4 tokens) into group c, lane j < groups copies V per token's column group j's
// min and scale.
__device__ void write_value_row(const QuantizedKvView& q, SealedToken x, int d, int lane, uint8_t* row) {
  const int group_bytes = q.v_bits / 2;
  const unsigned mask = (1u << q.v_bits) - 1u;
  for (int c = lane; c < d / 4; c += 32) {
    const uint8_t* groups = x.block + q.offsets.v_codes + (i64(x.t / 4) * d + 4 * c) * group_bytes;
    unsigned packed = 0;
    for (int j = 0; j < 4; ++j) {
      const unsigned code = (group_at(groups + j * group_bytes, q.v_bits) >> (x.t % 4 * q.v_bits)) & mask;
      packed |= code << (j * q.v_bits);
    }
    for (int b = 0; b < group_bytes; ++b) row[c * group_bytes + b] = uint8_t(packed >> (8 * b));
  }
  if (!q.v_per_token) return;
  const int meta = row_codes_bytes(d, q.v_bits), column_groups = d / q.v_group_dims;
  uint16_t* mins_then_scales = reinterpret_cast<uint16_t*>(row + meta);
  for (int j = lane; j < column_groups; j += 32) {
    const int slot = j * kCudaBlockTokens + x.t;
    mins_then_scales[j] = reinterpret_cast<const uint16_t*>(x.block + q.offsets.v_mins)[slot];
    mins_then_scales[column_groups + j] = reinterpret_cast<const uint16_t*>(x.block + q.offsets.v_scales)[slot];
  }
}

constexpr int kCopyThreads = 256;

// grid (blocks of the range, kv heads): the sealed block staged in shared memory in 16-byte loads (a
// warp per token reading its key in place would move a sector per 4 dims over PCIe from a pool in host
// memory), then a warp per token writes its rows, and the threads the per-column V mins and scales.
__global__ void __launch_bounds__(kCopyThreads) copy_sealed_kernel(SealedTokenRange p, PqSealedCopies copies) {
  extern __shared__ uint4 staged[];
  const QuantizedKvView& q = p.sealed;
  const int g = blockIdx.y, d = p.head_dim, first = p.first + int(blockIdx.x) * kCudaBlockTokens;
  const SealedToken block = sealed_token(q, p.block_table_stride, p.num_kv_heads, p.sequence, g, first);
  const uint4* from = reinterpret_cast<const uint4*>(block.block);
  for (int i = threadIdx.x; i < q.offsets.block_bytes / 16; i += blockDim.x) staged[i] = from[i];
  __syncthreads();
  const uint8_t* local = reinterpret_cast<const uint8_t*>(staged);
  const int lane = threadIdx.x % 32;
  for (int t = threadIdx.x / 32; t < kCudaBlockTokens; t += blockDim.x / 32) {
    if (copies.key_rows.rows != nullptr) {
      write_key_row(q, {local, t}, d, lane, token_row(copies.key_rows, p.num_kv_heads, p.sequence, g, first + t));
    }
    if (copies.value_rows.rows != nullptr) {
      write_value_row(q, {local, t}, d, lane, token_row(copies.value_rows, p.num_kv_heads, p.sequence, g, first + t));
    }
  }
  const PqValueScales& v = copies.value_scales;
  if (v.scales == nullptr) return;
  uint16_t* to = v.scales + ((i64(p.sequence) * p.num_kv_heads + g) * v.max_blocks + first / kCudaBlockTokens) * 2 * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    to[c] = reinterpret_cast<const uint16_t*>(local + q.offsets.v_mins)[c];
    to[d + c] = reinterpret_cast<const uint16_t*>(local + q.offsets.v_scales)[c];
  }
}

// grid (blocks of the range, kv heads): FP16 pages' keys and values into their rows (pq_fp16_row_copies),
// 16 bytes a thread. A head's block in a page is its 64 keys back to back (its values likewise), so the
// reads coalesce as they are: no staging.
__global__ void __launch_bounds__(kCopyThreads) copy_pages_kernel(SealedTokenRange p, PqSealedCopies copies) {
  const int g = blockIdx.y, first = p.first + int(blockIdx.x) * kCudaBlockTokens;
  const int row_pieces = p.head_dim / 8, pieces = kCudaBlockTokens * row_pieces;  // of a head's K (or V) block
  const long long page = paged_offset(p.pages, p.sequence, g, first);
  for (int i = threadIdx.x; i < 2 * pieces; i += blockDim.x) {
    const bool value = i >= pieces;
    const int piece = i % pieces, t = piece / row_pieces;
    const uint4* from = reinterpret_cast<const uint4*>((value ? p.pages.v : p.pages.k) + page);
    uint8_t* row = token_row(value ? copies.value_rows : copies.key_rows, p.num_kv_heads, p.sequence, g, first + t);
    reinterpret_cast<uint4*>(row)[piece % row_pieces] = from[piece];
  }
}

unsigned ceil_div(int a, int b) { return unsigned((a + b - 1) / b); }

// The FP16 pages' copies: a key and a value row for each of the range's tokens.
Status copy_pages(const SealedTokenRange& p, const PqSealedCopies& copies) {
  const int row_bytes = pq_fp16_row_bytes(p.head_dim);
  if (p.pages.k == nullptr || copies.key_rows.rows == nullptr || copies.value_rows.rows == nullptr ||
      copies.value_scales.scales != nullptr) {
    return error("pq's copies of FP16 pages: need the pages and the keys' and values' rows (pq_fp16_row_copies), no V scales");
  }
  if (p.head_dim % 8 != 0 || copies.key_rows.row_bytes != row_bytes || copies.value_rows.row_bytes != row_bytes) {
    return error("pq's copies of FP16 pages: head_dim ", p.head_dim, " (a multiple of 8 expected) with rows of ",
                 copies.key_rows.row_bytes, " bytes (", row_bytes, " expected)");
  }
  copy_pages_kernel<<<dim3(unsigned(p.n / kCudaBlockTokens), unsigned(p.num_kv_heads)), kCopyThreads>>>(p, copies);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace

Status pq_select_and_gather(const PqSelectLaunch& p) {
  if (p.num_rows == 0) return Status::ok();
  if (p.sealed.blocks != nullptr && p.copies.value_rows.rows != nullptr && !p.sealed.v_per_token &&
      p.copies.value_scales.scales == nullptr) {
    return error("pq selection: value rows with V per column need the blocks' V scales copied (value_scales)");
  }
  const int heads = p.num_kv_heads, rows = p.num_rows;
  const size_t q_bytes = size_t(p.index.head_dim) * sizeof(double);
  if (p.max_trained_segments > 0 && p.max_middle > 0) {
    tables_kernel<<<dim3(unsigned(p.max_trained_segments), unsigned(heads), unsigned(rows)), 128, q_bytes>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    adc_kernel<<<dim3(ceil_div(p.max_middle, 256), unsigned(heads), unsigned(rows)), 256>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    const PqSelectScratch& s = p.scratch;
    // 3. the candidates by ADC score.
    TopKRows select;
    select.per_length = heads;
    select.rows = rows * heads;
    select.scratch = s.top_k;
    select.scores = s.scores;
    select.score_stride = s.max_middle;
    select.n = s.lengths;
    select.k = s.lengths + rows;
    select.max_n = p.max_middle;
    select.out = s.ranked;
    select.out_stride = s.max_candidates;
    SLIMKV_RETURN_IF_ERROR(top_k_rows(select));
    if (p.max_candidates > 0) {
      const dim3 warps(32, kWarpsPerBlock);
      rerank_kernel<<<dim3(ceil_div(p.max_candidates, kWarpsPerBlock), unsigned(heads), unsigned(rows)), warps, q_bytes>>>(p);
      SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
      // 4. the k best of them by exact score.
      select.scores = s.exact;
      select.score_stride = s.max_candidates;
      select.n = s.lengths + 2 * rows;
      select.k = s.lengths + 3 * rows;
      select.max_n = p.max_candidates;
      select.out = s.kept;
      SLIMKV_RETURN_IF_ERROR(top_k_rows(select));
    }
  }
  if (p.max_selected > 0) {
    gather_kernel<<<dim3(ceil_div(p.max_selected, kWarpsPerBlock), unsigned(heads), unsigned(rows)), dim3(32, kWarpsPerBlock)>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  return Status::ok();
}

Status pq_sealed_keys(const SealedTokenRange& p, uint16_t* keys) {
  if (p.n == 0) return Status::ok();
  sealed_keys_kernel<<<dim3(ceil_div(p.n, kWarpsPerBlock), unsigned(p.num_kv_heads)), dim3(32, kWarpsPerBlock)>>>(p, keys);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

int pq_key_row_bytes(int head_dim, int k_bits) {
  const int partition_dims = std::min(kCudaBlockTokens, head_dim);
  const int partitions = (head_dim + partition_dims - 1) / partition_dims;
  const int bytes = head_dim * k_bits / 8 + 4 * partitions;
  return (bytes + 7) / 8 * 8;
}

int pq_value_row_bytes(int head_dim, int v_bits, int v_groups) {
  const int bytes = head_dim * v_bits / 8 + 4 * v_groups;
  return (bytes + 7) / 8 * 8;
}

int pq_fp16_row_bytes(int head_dim) { return 4 * head_dim; }

PqSealedCopies pq_fp16_row_copies(uint8_t* rows, int head_dim, int max_tokens) {
  const int row_bytes = pq_fp16_row_bytes(head_dim);
  return {PqTokenRows{rows, row_bytes, max_tokens}, PqTokenRows{rows + 2 * head_dim, row_bytes, max_tokens}, PqValueScales{}};
}

Status pq_copy_sealed(const SealedTokenRange& p, const PqSealedCopies& copies) {
  if (p.n == 0) return Status::ok();
  const QuantizedKvView& q = p.sealed;
  if (p.first % kCudaBlockTokens != 0 || p.n % kCudaBlockTokens != 0) {
    return error("pq's sealed copies: tokens [", p.first, ", ", p.first + p.n, ") are not whole blocks of ", kCudaBlockTokens);
  }
  if (q.blocks == nullptr) return copy_pages(p, copies);
  if (copies.key_rows.rows != nullptr && q.k_per_channel) {
    return error("pq's sealed copies: K per channel has no key rows (HACK's K layout only)");
  }
  if (copies.value_scales.scales != nullptr && q.v_per_token) {
    return error("pq's sealed copies: V per token has no per-column V scales (HACK's V layout only)");
  }
  constexpr int kMaxStaged = 48 << 10;  // without opting in to more shared memory
  if (q.offsets.block_bytes > kMaxStaged || q.offsets.block_bytes % 16 != 0) {
    return error("pq's sealed copies: a sealed block of ", q.offsets.block_bytes, " bytes; at most ", kMaxStaged,
                 ", a multiple of 16");
  }
  copy_sealed_kernel<<<dim3(unsigned(p.n / kCudaBlockTokens), unsigned(p.num_kv_heads)), kCopyThreads,
                       size_t(q.offsets.block_bytes)>>>(p, copies);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
