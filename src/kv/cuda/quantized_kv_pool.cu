#include "kv/cuda/quantized_kv_pool.h"

#include <cuda_fp16.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/kv_slots.cuh"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr int kSealThreads = 128;
constexpr int kMaxHeadDim = 128;
constexpr int kWriteTokens = 32;  // step rows per writing CTA (and KV head)

struct SealLaunch {
  uint4* k_pool;  // the FP16 cache's layer: [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
  uint4* v_pool;
  const uint4* step_k;  // the step's rows [step_tokens, num_kv_heads, head_dim] (append_and_seal), or none
  const uint4* step_v;
  const int* step_slots;  // their slots in the pool (negative: none)
  int step_tokens;
  const int* block_rows;  // per block to seal: (offset of its first step row, that row); none: all in the pool
  int seal_ctas;          // blockIdx.x below: a block to seal; from there: kWriteTokens step rows to write
  const int* list;        // per block to seal: (FP16 block, destination block, ordinal in its sequence)
  uint8_t* blocks;       // [destination blocks, num_kv_heads, block_bytes]
  // ZACK's heads at their own dims (device [num_kv_heads]): head g's block at heads[g], blocks of
  // block_stride bytes; null: every head head_dim wide, `o` alike.
  const QuantizedHeadLayout* heads;
  long long block_stride;
  int num_kv_heads, head_dim, k_bits, v_bits;
  QuantizedBlockOffsets o;
  bool k_per_channel, v_per_token;  // the layouts of tensor/quantized_block.h (k_group_tokens, v_group_dims)
  int k_group_tokens, v_group_dims;
  bool stochastic, symmetric;
  uint64_t seed;
  int layer;
};

// One partition of n values x[i·x_stride], quantized exactly as quantize_partition in
// tensor/quantized_block.cc: the same comparisons (symmetric: the grid centred on 0), the same
// IEEE-rounded float operations (no contraction into FMA), the same counter-based noise (value i's
// counter: first_counter + i·counter_stride); codes go to codes[i·code_stride].
struct Partition {
  __half min, scale;
  int sum;
};
__device__ Partition quantize_partition(const __half* x, int x_stride, int n, int bits, bool symmetric, bool stochastic,
                                        uint64_t seed, uint64_t first_counter, uint64_t counter_stride, uint8_t* codes,
                                        int code_stride) {
  float lo = __half2float(x[0]), hi = lo;
  for (int i = 1; i < n; ++i) {
    const float value = __half2float(x[i * x_stride]);
    lo = value < lo ? value : lo;  // std::min / std::max: the first of equals (signed zeros) stays
    hi = hi < value ? value : hi;
  }
  if (symmetric) {
    hi = hi < -lo ? -lo : hi;
    lo = -hi;
  }
  const int levels = (1 << bits) - 1;
  Partition p;
  p.min = __float2half_rn(lo);
  const float min_value = __half2float(p.min);
  p.scale = __float2half_rn(__fdiv_rn(__fsub_rn(hi, min_value), float(levels)));
  const float scale = __half2float(p.scale);
  const float inverse = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
  p.sum = 0;
  for (int i = 0; i < n; ++i) {
    const float y = __fmul_rn(__fsub_rn(__half2float(x[i * x_stride]), min_value), inverse);
    const float noise = stochastic ? counter_uniform(seed, first_counter + uint64_t(i) * counter_stride) : 0.5f;
    const int code = min(max(int(floorf(__fadd_rn(y, noise))), 0), levels);
    codes[i * code_stride] = uint8_t(code);
    p.sum += code;
  }
  return p;
}

// Packs 4 codes at `bits` each into `bits / 2` bytes (write_group in tensor/quantized_block.cc).
__device__ void write_group(uint8_t* out, uint8_t c0, uint8_t c1, uint8_t c2, uint8_t c3, int bits) {
  const uint32_t field = uint32_t(c0) | uint32_t(c1) << bits | uint32_t(c2) << (2 * bits) | uint32_t(c3) << (3 * bits);
  for (int b = 0; b < bits / 2; ++b) out[b] = uint8_t(field >> (8 * b));
}

// CTA (c, head) of a launch with c past seal_ctas: the step rows [kWriteTokens·c', +kWriteTokens)
// (c' = c - seal_ctas) of the head into their slots.
__device__ void write_step_rows(const SealLaunch& p, int c, int head) {
  const int vectors = p.head_dim / 8;
  for (int i = threadIdx.x; i < kWriteTokens * vectors; i += kSealThreads) {
    const int token = c * kWriteTokens + i / vectors, vector = i % vectors;
    if (token >= p.step_tokens) break;
    write_kv_vector(p.step_k, p.step_v, p.step_slots, token, head, p.num_kv_heads, vectors, vector, p.k_pool, p.v_pool);
  }
}

// One CTA per (block to seal, KV head): the layout of quantize_block (tensor/quantized_block.cc) at the
// head's K and V dims (the staged rows are head_dim wide; ZACK's heads use their first k_dim / v_dim),
// byte for byte, padding zeroed. A thread quantizes a whole partition (a token's K partition or a
// channel's group of tokens, a column of V or a token's group of columns); the staged rows are padded
// (by 2 halves, 4 code bytes) so that threads walking along different rows fall in different banks.
// The rows of the block that the step writes are read from the step's rows (block_rows says which),
// the others from the pool; CTAs past seal_ctas write the step's rows instead.
__global__ __launch_bounds__(kSealThreads) void seal_blocks(SealLaunch p) {
  constexpr int T = kCudaBlockTokens;
  const int head = blockIdx.y, d = p.head_dim;
  if (int(blockIdx.x) >= p.seal_ctas) return write_step_rows(p, int(blockIdx.x) - p.seal_ctas, head);
  const QuantizedHeadLayout own = p.heads != nullptr ? p.heads[head] : QuantizedHeadLayout{0, d, d, p.o};
  const int kd = own.k_dim, vd = own.v_dim, k_partition = min(T, kd);
  const QuantizedBlockOffsets& o = own.offsets;
  __shared__ uint32_t k_words[T * (kMaxHeadDim + 2) / 2], v_words[T * (kMaxHeadDim + 2) / 2];
  __shared__ uint8_t codes[T * (kMaxHeadDim + 4)];
  const int row_halves = d + 2, code_row = d + 4;
  const __half* k = reinterpret_cast<const __half*>(k_words);
  const __half* v = reinterpret_cast<const __half*>(v_words);
  const int* entry = p.list + 3 * blockIdx.x;
  const uint64_t seed = block_seal_seed(p.seed, p.layer, head, entry[2]);
  uint8_t* block = p.heads != nullptr ? p.blocks + size_t(entry[1]) * size_t(p.block_stride) + own.byte_offset
                                      : p.blocks + (size_t(entry[1]) * p.num_kv_heads + head) * p.o.block_bytes;
  const int first_step_offset = p.block_rows ? p.block_rows[2 * blockIdx.x] : T;
  const int first_step_row = p.block_rows ? p.block_rows[2 * blockIdx.x + 1] : 0;
  const int vectors = d / 8;
  for (int i = threadIdx.x; i < T * vectors; i += kSealThreads) {
    const int t = i / vectors, vector = i % vectors;
    const int r = t >= first_step_offset ? first_step_row + t - first_step_offset : -1;  // the step row, or the pool's
    const size_t source = r >= 0 ? (size_t(r) * p.num_kv_heads + head) * vectors + vector
                                 : kv_slot_vector(entry[0] * T + t, head, p.num_kv_heads, vectors, vector);
    const uint4 k_vector = r >= 0 ? p.step_k[source] : p.k_pool[source];
    const uint4 v_vector = r >= 0 ? p.step_v[source] : p.v_pool[source];
    uint32_t* k_row = k_words + (t * row_halves + 8 * vector) / 2;
    uint32_t* v_row = v_words + (t * row_halves + 8 * vector) / 2;
    k_row[0] = k_vector.x, k_row[1] = k_vector.y, k_row[2] = k_vector.z, k_row[3] = k_vector.w;
    v_row[0] = v_vector.x, v_row[1] = v_vector.y, v_row[2] = v_vector.z, v_row[3] = v_vector.w;
  }
  for (int i = threadIdx.x; i < o.block_bytes / 16; i += kSealThreads) reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  // K (element counter: its index in [T, kd]): partitions of k_partition dims along each token's head
  // (the last one shorter when k_partition does not divide kd), or per channel, each dim over a group
  // of tokens; then the sums per (partition, token) in either.
  const int k_partitions = (kd + k_partition - 1) / k_partition;
  const auto partition_dims = [&](int part) { return min(k_partition, kd - part * k_partition); };
  __half* k_mins = reinterpret_cast<__half*>(block + o.k_mins);
  __half* k_scales = reinterpret_cast<__half*>(block + o.k_scales);
  int16_t* k_sums = reinterpret_cast<int16_t*>(block + o.k_sums);
  if (p.k_per_channel) {
    for (int i = threadIdx.x; i < T / p.k_group_tokens * kd; i += kSealThreads) {
      const int group = i / kd, dim = i % kd, t = group * p.k_group_tokens;
      const Partition q = quantize_partition(k + t * row_halves + dim, row_halves, p.k_group_tokens, p.k_bits, p.symmetric,
                                             p.stochastic, seed, uint64_t(t * kd + dim), uint64_t(kd), codes + t * code_row + dim,
                                             code_row);
      k_mins[i] = q.min;  // slot group · kd + dim
      k_scales[i] = q.scale;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < T * k_partitions; i += kSealThreads) {
      const int t = i / k_partitions, part = i % k_partitions;
      int sum = 0;
      for (int x = 0; x < partition_dims(part); ++x) sum += codes[t * code_row + part * k_partition + x];
      k_sums[part * T + t] = int16_t(sum);
    }
  } else {
    for (int i = threadIdx.x; i < T * k_partitions; i += kSealThreads) {
      const int t = i / k_partitions, part = i % k_partitions;
      const int first = t * kd + part * k_partition;  // the element's index (its noise counter)
      const Partition q = quantize_partition(k + t * row_halves + part * k_partition, 1, partition_dims(part), p.k_bits,
                                             p.symmetric, p.stochastic, seed, uint64_t(first), 1,
                                             codes + t * code_row + part * k_partition, 1);
      const int slot = part * T + t;
      k_mins[slot] = q.min;
      k_scales[slot] = q.scale;
      k_sums[slot] = int16_t(q.sum);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kd / 4 * T; i += kSealThreads) {  // group g of dims, token t
    const int g = i / T, t = i % T;
    const uint8_t* c = codes + t * code_row + 4 * g;
    write_group(block + size_t(i) * (p.k_bits / 2), c[0], c[1], c[2], c[3], p.k_bits);
  }
  __syncthreads();

  // V (element counter after K's T·kd): one partition of the block's T tokens per column, or per token,
  // each token's columns in groups; then the sums per column in either.
  __half* v_mins = reinterpret_cast<__half*>(block + o.v_mins);
  __half* v_scales = reinterpret_cast<__half*>(block + o.v_scales);
  int16_t* v_sums = reinterpret_cast<int16_t*>(block + o.v_sums);
  const uint64_t v_counter = uint64_t(T) * uint64_t(kd);
  if (p.v_per_token) {
    const int groups = vd / p.v_group_dims;
    for (int i = threadIdx.x; i < T * groups; i += kSealThreads) {
      const int t = i / groups, group = i % groups, c = group * p.v_group_dims;
      const Partition q = quantize_partition(v + t * row_halves + c, 1, p.v_group_dims, p.v_bits, p.symmetric, p.stochastic, seed,
                                             v_counter + uint64_t(t * vd + c), 1, codes + t * code_row + c, 1);
      v_mins[group * T + t] = q.min;
      v_scales[group * T + t] = q.scale;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < vd; c += kSealThreads) {
      int sum = 0;
      for (int t = 0; t < T; ++t) sum += codes[t * code_row + c];
      v_sums[c] = int16_t(sum);
    }
  } else {
    for (int c = threadIdx.x; c < vd; c += kSealThreads) {
      const Partition q = quantize_partition(v + c, row_halves, T, p.v_bits, p.symmetric, p.stochastic, seed, v_counter + uint64_t(c),
                                             uint64_t(vd), codes + c, code_row);
      v_mins[c] = q.min;
      v_scales[c] = q.scale;
      v_sums[c] = int16_t(q.sum);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < T / 4 * vd; i += kSealThreads) {  // tokens 4u..4u+3 of column c
    const int u = i / vd, c = i % vd;
    const uint8_t* x = codes + 4 * u * code_row + c;
    write_group(block + o.v_codes + size_t(i) * (p.v_bits / 2), x[0], x[code_row], x[2 * code_row], x[3 * code_row], p.v_bits);
  }
}

}  // namespace

Expected<QuantizedBlockSealer> QuantizedBlockSealer::create(const QuantizationConfig& config, bool hack, uint64_t seed,
                                                          int num_kv_heads, int head_dim) {
  const BlockShape block_shape{kCudaBlockTokens, head_dim, head_dim};
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape(config, block_shape));
  if (head_dim != 64 && head_dim != 128) {
    return error("CUDA quantized KV: head_dim ", head_dim, " is not supported (64 or 128)");
  }
  if (!config.store_sums || !config.keep_open_exact) {
    return error("CUDA quantized KV: the se=off and rqe=off ablations run on the CPU only");
  }
  return QuantizedBlockSealer(QuantizedBlockLayout(config, block_shape), hack, seed, num_kv_heads);
}

Status QuantizedBlockSealer::seal(int layer, const PagedKvView& fp16, const int* list, int n, uint8_t* blocks) const {
  return append_and_seal(layer, fp16, StepRows{}, list, n, blocks);  // no step rows: every row from the pool
}

Status QuantizedBlockSealer::append_and_seal(int layer, const PagedKvView& fp16, const StepRows& rows, const int* list, int n,
                                             uint8_t* blocks, const SealedHeadBlocks& heads) const {
  const int write_ctas = (rows.n + kWriteTokens - 1) / kWriteTokens;
  if (n + write_ctas == 0) return Status::ok();
  SealLaunch p{};
  // The pool is the cache's own device memory, written by append: the view is const for attention.
  p.k_pool = reinterpret_cast<uint4*>(const_cast<uint16_t*>(fp16.k));
  p.v_pool = reinterpret_cast<uint4*>(const_cast<uint16_t*>(fp16.v));
  p.step_k = reinterpret_cast<const uint4*>(rows.k);
  p.step_v = reinterpret_cast<const uint4*>(rows.v);
  p.step_slots = rows.slots;
  p.step_tokens = rows.n;
  p.block_rows = rows.block_rows;
  p.seal_ctas = n;
  p.list = list;
  p.blocks = blocks;
  p.heads = heads.heads;
  p.block_stride = heads.block_stride;
  p.num_kv_heads = num_kv_heads_;
  p.head_dim = layout_.shape.k_dim;
  p.k_bits = layout_.config.k_bits;
  p.v_bits = layout_.config.v_bits;
  const QuantizedKvView shape = view(nullptr, nullptr);
  p.o = shape.offsets;
  p.k_per_channel = shape.k_per_channel;
  p.v_per_token = shape.v_per_token;
  p.k_group_tokens = shape.k_group_tokens;
  p.v_group_dims = shape.v_group_dims;
  p.stochastic = layout_.config.rounding == Rounding::kStochastic;
  p.symmetric = layout_.config.symmetric;
  p.seed = seed_;
  p.layer = layer;
  seal_blocks<<<dim3(unsigned(n + write_ctas), unsigned(num_kv_heads_)), kSealThreads>>>(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

QuantizedBlockOffsets quantized_block_offsets(const QuantizedBlockLayout& layout) {
  return {int(layout.block_bytes), int(layout.k_mins),  int(layout.k_scales), int(layout.k_sums),
          int(layout.v_codes),     int(layout.v_mins),  int(layout.v_scales), int(layout.v_sums)};
}

QuantizedKvView QuantizedBlockSealer::view(const uint8_t* blocks, const int* block_tables, int table_shift) const {
  QuantizedKvView view;
  view.blocks = blocks;
  view.block_tables = block_tables;
  view.hack = hack_;
  view.k_bits = layout_.config.k_bits;
  view.v_bits = layout_.config.v_bits;
  view.offsets = quantized_block_offsets(layout_);
  view.k_per_channel = layout_.config.k_per_channel;
  view.v_per_token = layout_.config.v_per_token;
  view.k_group_tokens = layout_.k_group_tokens;
  view.v_group_dims = layout_.v_group_dims;
  view.table_shift = table_shift;
  return view;
}

}  // namespace slimkv::cuda
