#include "backend/cuda/quantized_kv_pool.h"

#include <cuda_fp16.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr int kSealThreads = 128;
constexpr int kMaxHeadDim = 128;

struct SealLaunch {
  const __half* k_pool;  // the FP16 cache's layer: [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
  const __half* v_pool;
  const int* list;       // per block to seal: (FP16 block, destination block, ordinal in its sequence)
  uint8_t* blocks;       // [destination blocks, num_kv_heads, block_bytes]
  int num_kv_heads, head_dim, k_bits, v_bits, k_partition;
  QuantizedBlockOffsets o;
  bool stochastic;
  uint64_t seed;
  int layer;
};

// One partition of n values x[i·stride], quantized exactly as quantize_partition in
// kv/codec/quantized_block.cc: the same comparisons, the same IEEE-rounded float operations (no
// contraction into FMA), the same counter-based noise; codes go to codes[i·stride].
struct Partition {
  __half min, scale;
  int sum;
};
__device__ Partition quantize_partition(const __half* x, int n, int stride, int bits, bool stochastic, uint64_t seed,
                                        uint64_t first_counter, uint8_t* codes) {
  float lo = __half2float(x[0]), hi = lo;
  for (int i = 1; i < n; ++i) {
    const float value = __half2float(x[i * stride]);
    lo = value < lo ? value : lo;  // std::min / std::max: the first of equals (signed zeros) stays
    hi = hi < value ? value : hi;
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
    const float y = __fmul_rn(__fsub_rn(__half2float(x[i * stride]), min_value), inverse);
    const float noise = stochastic ? counter_uniform(seed, first_counter + uint64_t(i) * uint64_t(stride)) : 0.5f;
    const int code = min(max(int(floorf(__fadd_rn(y, noise))), 0), levels);
    codes[i * stride] = uint8_t(code);
    p.sum += code;
  }
  return p;
}

// Packs 4 codes at `bits` each into `bits / 2` bytes (write_group in quantized_block.cc).
__device__ void write_group(uint8_t* out, uint8_t c0, uint8_t c1, uint8_t c2, uint8_t c3, int bits) {
  const uint32_t field = uint32_t(c0) | uint32_t(c1) << bits | uint32_t(c2) << (2 * bits) | uint32_t(c3) << (3 * bits);
  for (int b = 0; b < bits / 2; ++b) out[b] = uint8_t(field >> (8 * b));
}

// One CTA per (block to seal, KV head): the layout of quantize_block (kv/codec/quantized_block.cc),
// byte for byte, padding zeroed. Sealing happens once per kCudaBlockTokens tokens: clarity over speed.
__global__ __launch_bounds__(kSealThreads) void seal_blocks(SealLaunch p) {
  constexpr int T = kCudaBlockTokens;
  __shared__ __half k[T * kMaxHeadDim], v[T * kMaxHeadDim];
  __shared__ uint8_t codes[T * kMaxHeadDim];
  const int* entry = p.list + 3 * blockIdx.x;
  const int head = blockIdx.y, d = p.head_dim;
  const uint64_t seed = block_seal_seed(p.seed, p.layer, head, entry[2]);
  const size_t source = (size_t(entry[0]) * p.num_kv_heads + head) * T * d;
  uint8_t* block = p.blocks + (size_t(entry[1]) * p.num_kv_heads + head) * p.o.block_bytes;
  for (int i = threadIdx.x; i < T * d; i += kSealThreads) {
    k[i] = p.k_pool[source + i];
    v[i] = p.v_pool[source + i];
  }
  for (int i = threadIdx.x; i < p.o.block_bytes / 16; i += kSealThreads) reinterpret_cast<uint4*>(block)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  // K: partitions of k_partition dims along each token's head (element counter: its index in [T, d]).
  const int k_partitions = d / p.k_partition;
  for (int i = threadIdx.x; i < T * k_partitions; i += kSealThreads) {
    const int t = i / k_partitions, part = i % k_partitions;
    const int first = t * d + part * p.k_partition;
    const Partition q = quantize_partition(k + first, p.k_partition, 1, p.k_bits, p.stochastic, seed, uint64_t(first), codes + first);
    const int slot = part * T + t;
    reinterpret_cast<__half*>(block + p.o.k_mins)[slot] = q.min;
    reinterpret_cast<__half*>(block + p.o.k_scales)[slot] = q.scale;
    reinterpret_cast<int16_t*>(block + p.o.k_sums)[slot] = int16_t(q.sum);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d / 4 * T; i += kSealThreads) {  // group g of dims, token t
    const int g = i / T, t = i % T;
    const uint8_t* c = codes + t * d + 4 * g;
    write_group(block + size_t(i) * (p.k_bits / 2), c[0], c[1], c[2], c[3], p.k_bits);
  }
  __syncthreads();

  // V: one partition of the block's T tokens per column (element counter after K's T·d).
  for (int c = threadIdx.x; c < d; c += kSealThreads) {
    const Partition q = quantize_partition(v + c, T, d, p.v_bits, p.stochastic, seed, uint64_t(T) * uint64_t(d) + uint64_t(c),
                                           codes + c);
    reinterpret_cast<__half*>(block + p.o.v_mins)[c] = q.min;
    reinterpret_cast<__half*>(block + p.o.v_scales)[c] = q.scale;
    reinterpret_cast<int16_t*>(block + p.o.v_sums)[c] = int16_t(q.sum);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < T / 4 * d; i += kSealThreads) {  // tokens 4u..4u+3 of column c
    const int u = i / d, c = i % d;
    const uint8_t* x = codes + 4 * u * d + c;
    write_group(block + p.o.v_codes + size_t(i) * (p.v_bits / 2), x[0], x[d], x[2 * d], x[3 * d], p.v_bits);
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
  if (n == 0) return Status::ok();
  SealLaunch p{};
  p.k_pool = reinterpret_cast<const __half*>(fp16.k);
  p.v_pool = reinterpret_cast<const __half*>(fp16.v);
  p.list = list;
  p.blocks = blocks;
  p.num_kv_heads = num_kv_heads_;
  p.head_dim = layout_.shape.k_dim;
  p.k_bits = layout_.config.k_bits;
  p.v_bits = layout_.config.v_bits;
  p.k_partition = layout_.k_partition;
  p.o = view(nullptr, nullptr).offsets;
  p.stochastic = layout_.config.rounding == Rounding::kStochastic;
  p.seed = seed_;
  p.layer = layer;
  seal_blocks<<<dim3(unsigned(n), unsigned(num_kv_heads_)), kSealThreads>>>(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

QuantizedKvView QuantizedBlockSealer::view(const uint8_t* blocks, const int* block_tables, int table_shift) const {
  QuantizedKvView view;
  view.blocks = blocks;
  view.block_tables = block_tables;
  view.hack = hack_;
  view.k_bits = layout_.config.k_bits;
  view.v_bits = layout_.config.v_bits;
  view.offsets = {int(layout_.block_bytes), int(layout_.k_mins),  int(layout_.k_scales), int(layout_.k_sums),
                  int(layout_.v_codes),     int(layout_.v_mins),  int(layout_.v_scales), int(layout_.v_sums)};
  view.table_shift = table_shift;
  return view;
}

}  // namespace slimkv::cuda
