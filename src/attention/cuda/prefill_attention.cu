#include "attention/cuda/prefill_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/prefill_attention_tile.cuh"

namespace slimkv::cuda {
namespace {

// Byte kA of x and byte kB of y, two codes below 1024, as the FP16 pair (x_A, y_B): each put in the low
// mantissa bits of 1024.0 (0x6400), exact, then 1024 taken off: two integer operations and one FP16
// subtraction instead of two quarter-rate int-to-float conversions.
template <int kA, int kB>
__device__ __forceinline__ __half2 code_pair(uint32_t x, uint32_t y) {
  const uint32_t bits = (__byte_perm(x, y, unsigned(kA | (4 + kB) << 8)) & 0x00ff00ffu) | 0x64006400u;
  return __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f));
}

// Writes a sealed block (tensor/quantized_block.h's layout, K and V of kBits) dequantized,
// x = min + scale · x' (one FP16 FMA: the nearest FP16 to the exact value), into the FP16 tiles k and v
// [token][dim] (swizzled as the FP16 blocks are staged). A thread takes a K field (4 dims of a token:
// one 8-byte store) or the V fields of two neighbouring columns (4 tokens each: four 4-byte stores).
// KIVI's layouts (issue 28): K's 4 dims have a min and scale each (their channels' in the token's
// group), V's 4 tokens each their own (the two columns are in one group). A ZACK head's (`head` at its
// own dims) dims and columns past its k_dim / v_dim are written 0.
template <int kHeadDim, int kBits>
__device__ inline void dequantize_sealed_block(const uint8_t* block, const QuantizedKvView& sealed, const SealedHead& head,
                                               __half* k, __half* v) {
  constexpr int T = kCudaBlockTokens;
  constexpr int kPartition = kHeadDim < T ? kHeadDim : T;  // K partition dims: min(Π, head_dim); a head's dims end earlier
  const QuantizedBlockOffsets& o = head.offsets;
  const __half* k_mins = reinterpret_cast<const __half*>(block + o.k_mins);
  const __half* k_scales = reinterpret_cast<const __half*>(block + o.k_scales);
  const __half2* v_mins = reinterpret_cast<const __half2*>(block + o.v_mins);
  const __half2* v_scales = reinterpret_cast<const __half2*>(block + o.v_scales);
  for (int i = threadIdx.x; i < kHeadDim / 4 * T; i += kPrefillThreads) {  // dim group g = i / T, token t = i % T
    const int dim = 4 * (i / T), t = i % T;
    if (dim >= head.k_dim) {
      *reinterpret_cast<uint2*>(k + swizzled<kHeadDim>(t, dim / 8) + dim % 8) = make_uint2(0u, 0u);
      continue;
    }
    const uint32_t codes = spread_codes<kBits>(load_field<kBits>(block + i * kBits / 2));
    __half2 lo[2], scale[2];  // of dims (dim, dim + 1), (dim + 2, dim + 3)
    if (sealed.k_per_channel) {
      const int slot = t / sealed.k_group_tokens * kHeadDim + dim;
      for (int x = 0; x < 2; ++x) {
        lo[x] = *reinterpret_cast<const __half2*>(k_mins + slot + 2 * x);
        scale[x] = *reinterpret_cast<const __half2*>(k_scales + slot + 2 * x);
      }
    } else {
      const int slot = dim / kPartition * T + t;
      lo[0] = lo[1] = __half2half2(k_mins[slot]);
      scale[0] = scale[1] = __half2half2(k_scales[slot]);
    }
    const __half2 low = __hfma2(scale[0], code_pair<0, 1>(codes, codes), lo[0]);
    const __half2 high = __hfma2(scale[1], code_pair<2, 3>(codes, codes), lo[1]);
    *reinterpret_cast<uint2*>(k + swizzled<kHeadDim>(t, dim / 8) + dim % 8) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&low), *reinterpret_cast<const uint32_t*>(&high));
  }
  for (int i = threadIdx.x; i < T / 4 * kHeadDim / 2; i += kPrefillThreads) {  // tokens 4u.. of columns c, c + 1
    const int first = 4 * (i / (kHeadDim / 2)), c = 2 * (i % (kHeadDim / 2));
    if (c >= head.v_dim) {
#pragma unroll
      for (int j = 0; j < 4; ++j) *reinterpret_cast<__half2*>(v + swizzled<kHeadDim>(first + j, c / 8) + c % 8) = __float2half2_rn(0.0f);
      continue;
    }
    const uint8_t* fields = block + o.v_codes + (first / 4 * head.v_dim + c) * kBits / 2;
    const uint32_t left = spread_codes<kBits>(load_field<kBits>(fields));
    const uint32_t right = spread_codes<kBits>(load_field<kBits>(fields + kBits / 2));
    __half2 lo[4], scale[4];  // of token first + j's two values
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (sealed.v_per_token) {
        const int slot = c / sealed.v_group_dims * T + first + j;
        lo[j] = __half2half2(reinterpret_cast<const __half*>(v_mins)[slot]);
        scale[j] = __half2half2(reinterpret_cast<const __half*>(v_scales)[slot]);
      } else {
        lo[j] = v_mins[c / 2];
        scale[j] = v_scales[c / 2];
      }
    }
    const __half2 values[4] = {__hfma2(scale[0], code_pair<0, 0>(left, right), lo[0]), __hfma2(scale[1], code_pair<1, 1>(left, right), lo[1]),
                               __hfma2(scale[2], code_pair<2, 2>(left, right), lo[2]), __hfma2(scale[3], code_pair<3, 3>(left, right), lo[3])};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<__half2*>(v + swizzled<kHeadDim>(first + j, c / 8) + c % 8) = values[j];
    }
  }
}

// --- the paged KV's blocks (prefill_attention_tile.cuh's policy) ---

// Block `block` of the sequence's FP16 pages into stage tiles k, v [token][dim] (tokens outside the
// tile's [kv_begin, kv_end) zero-filled), through cp.async; a sealed block (kDequantize) arrives packed
// in `packed` instead, and land() dequantizes it into the tiles.
template <int kHeadDim, SealedPrefix kPrefix, int kBits>
struct PagedBlocks {
  const AttentionLaunch& p;
  const QuantizedKvView& sealed;
  const TileQueries& tq;
  int kv_head, sequence, sealed_blocks;
  const int* table;
  uint8_t* packed;  // a sealed block (kDequantize), after the tile's shared memory

  __device__ PagedBlocks(const AttentionLaunch& p, const QuantizedKvView& sealed, const TileQueries& tq, int kv_head,
                         uint8_t* packed)
      : p(p), sealed(sealed), tq(tq), kv_head(kv_head), sequence(p.sequence_ids[tq.batch_index]),
        sealed_blocks(kPrefix == SealedPrefix::kNone ? 0 : tq.first_position / kCudaBlockTokens),
        table(p.block_tables + size_t(sequence) * p.block_table_stride), packed(packed) {}

  __device__ int first_block() const {
    return max(kPrefix == SealedPrefix::kSkip ? sealed_blocks : 0, tq.kv_begin / kCudaBlockTokens);
  }
  // The CTA's split of the tile's blocks up to num_blocks: the sequence's own (split_k.cuh), after the
  // INT8 kernel's over the sealed blocks (kSkip).
  __device__ TileSplit split(int split, int num_blocks) const {
    return tile_split(p, tq, split, first_block(), num_blocks, sealed_blocks);
  }
  __host__ __device__ static constexpr int q_dims() { return kHeadDim; }
  __host__ __device__ static constexpr int k_steps() { return kHeadDim / 16; }
  __host__ __device__ static constexpr int v_tiles() { return kHeadDim / 8; }

  __device__ void stage(int block, __half* k, __half* v) const {
    constexpr int kChunks = kHeadDim / 8;
    constexpr int kBlockHalves = kCudaBlockTokens * kHeadDim;
    if constexpr (kPrefix == SealedPrefix::kDequantize) {
      if (block < sealed_blocks) {
        const uint8_t* source = sealed_block_address(sealed, p, sequence, block, kv_head);
        const int bytes = sealed_head(sealed, kv_head, kHeadDim).offsets.block_bytes;
        for (int i = threadIdx.x * 16; i < bytes; i += kPrefillThreads * 16) cp_async_16(packed + i, source + i);
        return;
      }
    }
    const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * kBlockHalves;
    for (int i = threadIdx.x; i < kCudaBlockTokens * kChunks; i += kPrefillThreads) {
      const int token = i / kChunks, chunk = i % kChunks;
      const int at = block * kCudaBlockTokens + token;
      const bool valid = at < tq.kv_end && at >= tq.kv_begin;  // zeros elsewhere (a freed block's stale values)
      const size_t source = offset + size_t(token) * kHeadDim + chunk * 8;
      cp_async_16(k + swizzled<kHeadDim>(token, chunk), p.k_pool + source, valid);
      cp_async_16(v + swizzled<kHeadDim>(token, chunk), p.v_pool + source, valid);
    }
  }

  __device__ void land(int block, __half* k, __half* v) const {
    if constexpr (kPrefix == SealedPrefix::kDequantize) {
      if (block < sealed_blocks) {
        dequantize_sealed_block<kHeadDim, kBits>(packed, sealed, sealed_head(sealed, kv_head, kHeadDim), k, v);
        __syncthreads();  // the stage is written and `packed` free for the next block
      }
    }
  }

  // K rows are Kᵀ's columns: matrix m = lane / 8 is tokens 8j.. at dims 16kk + 8m.
  __device__ static void k_fragments(unsigned (&b)[4], const __half* k, int kk, int j, int lane) {
    ldmatrix_x4(b, k + swizzled<kHeadDim>(8 * j + lane % 8, 2 * kk + lane / 8));
  }
  // V rows are tokens: transposed, matrix m is tokens 16t + 8(m % 2).. at dims 8(d + m / 2).
  __device__ static void v_fragments(unsigned (&b)[4], const __half* v, int t, int d, int lane) {
    ldmatrix_x4_trans(b, v + swizzled<kHeadDim>(16 * t + lane % 8 + (lane / 8 % 2) * 8, d + lane / 16));
  }
};

// --- the kernel ---

// One CTA per (split, KV head, tile) of the paged KV (prefill_attention_tile.cuh). kPrefix, kBits: what it
// does with the sealed blocks before each sequence's step (SealedPrefix; kBits for kDequantize).
template <int kHeadDim, SealedPrefix kPrefix, int kBits>
__global__ __launch_bounds__(kPrefillThreads) void prefill_attention_partials(AttentionLaunch p, QuantizedKvView sealed) {
  extern __shared__ uint4 shared_raw[];
  // The longest tiles (a sequence's last) are launched first, so short ones fill the tail of the grid.
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = p.num_tiles - 1 - int(blockIdx.z);
  const TileQueries tq(p, tile);
  uint8_t* packed = reinterpret_cast<uint8_t*>(shared_raw) + prefill_tile_shared_bytes<kHeadDim>();
  PagedBlocks<kHeadDim, kPrefix, kBits> blocks(p, sealed, tq, kv_head, packed);
  attend_prefill_tile<kHeadDim>(p, tq, tile, kv_head, split, blocks, shared_raw);
}

using PrefillKernel = void (*)(AttentionLaunch, QuantizedKvView);

template <int kHeadDim>
PrefillKernel pick(SealedPrefix prefix, int bits) {
  switch (prefix) {
    case SealedPrefix::kNone: return prefill_attention_partials<kHeadDim, SealedPrefix::kNone, 0>;
    case SealedPrefix::kSkip: return prefill_attention_partials<kHeadDim, SealedPrefix::kSkip, 0>;
    default:
      return bits == 2   ? prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 2>
             : bits == 4 ? prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 4>
                         : prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 8>;
  }
}
PrefillKernel pick(int head_dim, SealedPrefix prefix, int bits) {
  return head_dim == 64 ? pick<64>(prefix, bits) : pick<128>(prefix, bits);
}
// Q and two stages of K and V; with kDequantize, a packed sealed block too (sealed_block_bytes).
size_t shared_bytes(int head_dim, SealedPrefix prefix, int sealed_block_bytes) {
  const size_t fp16 = head_dim == 64 ? prefill_tile_shared_bytes<64>() : prefill_tile_shared_bytes<128>();
  return prefix == SealedPrefix::kDequantize ? fp16 + size_t(sealed_block_bytes) : fp16;
}

}  // namespace

int prefill_attention_setup(int head_dim) {
  // The dequantizing kernels may take any sealed block (its bytes depend on the layout and groups): their
  // limit is the device's, their launches take what the block needs.
  int device = 0, most = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    return 0;
  }
  for (const SealedPrefix prefix : {SealedPrefix::kNone, SealedPrefix::kSkip, SealedPrefix::kDequantize}) {
    for (const int bits : {2, 4, 8}) {
      const int bytes = prefix == SealedPrefix::kDequantize ? most : int(shared_bytes(head_dim, prefix, 0));
      if (cudaFuncSetAttribute(pick(head_dim, prefix, bits), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
        return 0;
      }
    }
  }
  // The dense kernel's residency sizes the waves (the 2- and 4-bit dequantizing ones have the same).
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, pick(head_dim, SealedPrefix::kNone, 0), kPrefillThreads,
                                                    shared_bytes(head_dim, SealedPrefix::kNone, 0)) != cudaSuccess) {
    return 0;
  }
  return ctas;
}

void launch_prefill_attention(const AttentionLaunch& p, SealedPrefix prefix, const QuantizedKvView& sealed) {
  const dim3 grid(unsigned(p.num_splits), unsigned(p.num_kv_heads), unsigned(p.num_tiles));
  pick(p.head_dim, prefix, sealed.k_bits)<<<grid, kPrefillThreads, shared_bytes(p.head_dim, prefix, sealed.offsets.block_bytes)>>>(
      p, sealed);
}

}  // namespace slimkv::cuda
