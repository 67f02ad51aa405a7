#include "attention/cuda/prefill_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "attention/cuda/device_ops.cuh"

namespace slimkv::cuda {
namespace {

// --- PTX wrappers (sm_80+; the shared ones: device_ops.cuh) ---

// Four 8×8 FP16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
// Lane t receives row t / 4, columns 2(t % 4) and +1 of each (transposed with .trans).
__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* shared) {
  const unsigned address = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* shared) {
  const unsigned address = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ inline unsigned pack_halves(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// Shared tiles are rows of kHeadDim halves in 16-byte chunks; chunk c of row r sits at c ^ (r % 8),
// so the 8 rows one ldmatrix phase reads fall in 8 different bank groups (no conflicts).
template <int kHeadDim>
__device__ inline int swizzled(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row % 8)) * 8);
}

// --- the kernel ---

// The attention of one tile of kPrefillTileRows query rows (row r: query head kv_head·group + r % group
// at query first_query + r / group) over one split of its KV blocks. Warp w owns kRowTiles m16 tiles
// of rows, 16·kRowTiles·w onwards: sharing each K/V fragment loaded from shared memory between them
// halves that traffic per mma (the bound with one tile: a fragment per two mma). In tile m a lane
// holds rows g = lane / 4 and g + 8, and columns 2(lane % 4), +1 of every 8-column tile of S and O
// (the mma accumulator layout); its row h = 2m + (0 or 1).
template <int kHeadDim>
__global__ __launch_bounds__(kPrefillThreads) void prefill_attention_partials(AttentionLaunch p) {
  constexpr int kRowTiles = kPrefillRowTilesPerWarp;
  constexpr int kRows = 2 * kRowTiles;                  // rows of S and O a lane holds
  constexpr int kChunks = kHeadDim / 8;                 // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;                // k16 steps of Q·Kᵀ
  constexpr int kTokenTiles = kCudaBlockTokens / 8;     // n8 tiles of S per block
  constexpr int kDimTiles = kHeadDim / 8;               // n8 tiles of O
  constexpr int kBlockHalves = kCudaBlockTokens * kHeadDim;
  constexpr unsigned kFullMask = 0xffffffffu;
  extern __shared__ uint4 shared_raw[];
  __half* q_shared = reinterpret_cast<__half*>(shared_raw);   // [kPrefillTileRows, kHeadDim]
  __half* k_shared = q_shared + kPrefillTileRows * kHeadDim;  // [2 stages, block tokens, kHeadDim]
  __half* v_shared = k_shared + 2 * kBlockHalves;

  // The longest tiles (a sequence's last) are launched first, so short ones fill the tail of the grid.
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = p.num_tiles - 1 - int(blockIdx.z);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const int num_blocks = (tq.kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const int block_begin = split * p.blocks_per_split;
  const int block_end = min(block_begin + p.blocks_per_split, num_blocks);
  const int* table = p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride;

  // Q rows (zeros for inactive rows) and K/V blocks go to shared memory through cp.async.
  for (int i = threadIdx.x; i < kPrefillTileRows * kChunks; i += kPrefillThreads) {
    const int r = i / kChunks, chunk = i % kChunks;
    const bool active = r < tq.active_rows;
    const int head = kv_head * p.group + r % p.group;
    const size_t query = size_t(tq.query_begin + tq.first_query + (active ? r / p.group : 0));
    cp_async_16(q_shared + swizzled<kHeadDim>(r, chunk), p.q + (query * p.num_heads + (active ? head : 0)) * kHeadDim + chunk * 8,
                active);
  }
  const auto load_block = [&](int block, int stage) {
    const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * kBlockHalves;
    for (int i = threadIdx.x; i < kCudaBlockTokens * kChunks; i += kPrefillThreads) {
      const int token = i / kChunks, chunk = i % kChunks;
      const bool valid = block * kCudaBlockTokens + token < tq.kv_end;
      const size_t source = offset + size_t(token) * kHeadDim + chunk * 8;
      cp_async_16(k_shared + stage * kBlockHalves + swizzled<kHeadDim>(token, chunk), p.k_pool + source, valid);
      cp_async_16(v_shared + stage * kBlockHalves + swizzled<kHeadDim>(token, chunk), p.v_pool + source, valid);
    }
  };
  if (block_begin < block_end) load_block(block_begin, 0);
  cp_async_commit();

  // This lane's rows: their positions (inactive rows attend like the tile's last query and are never
  // written) and the online-softmax state, in base 2 (scores · scale · log2 e).
  const int group_row = lane / 4, column = 2 * (lane % 4);
  const int warp_row = warp * 16 * kRowTiles;
  int position[kRows];
  float running_max[kRows], sum[kRows];
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int r = warp_row + 16 * (h / 2) + group_row + 8 * (h % 2);
    position[h] = r < tq.active_rows ? tq.first_position + tq.first_query + r / p.group : tq.kv_end - 1;
    running_max[h] = -INFINITY;
    sum[h] = 0.0f;
  }
  const int first_position = tq.first_position + tq.first_query;  // the tile's; later blocks need the mask
  float o[kRowTiles][kDimTiles][4];
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
  }

  for (int block = block_begin; block < block_end; ++block) {
    const int stage = (block - block_begin) & 1;
    if (block + 1 < block_end) {
      load_block(block + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __half* k_block = k_shared + stage * kBlockHalves;
    const __half* v_block = v_shared + stage * kBlockHalves;

    // S = Q · Kᵀ for the warp's rows × the block's 64 tokens (K rows are Kᵀ's columns), two k16 steps
    // at a time; Q's fragments come from shared memory each time (registers hold S and O).
    float s[kRowTiles][kTokenTiles][4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; kk += 2) {
      unsigned a[kRowTiles][2][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const int r = warp_row + 16 * m + lane % 8 + (lane / 8 % 2) * 8;
        ldmatrix_x4(a[m][0], q_shared + swizzled<kHeadDim>(r, 2 * kk + lane / 16));
        ldmatrix_x4(a[m][1], q_shared + swizzled<kHeadDim>(r, 2 * kk + 2 + lane / 16));
      }
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        unsigned b[4];
        ldmatrix_x4(b, k_block + swizzled<kHeadDim>(8 * j + lane % 8, 2 * kk + lane / 8));
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) {
          mma_16816(s[m][j], a[m][0], b[0], b[1]);
          mma_16816(s[m][j], a[m][1], b[2], b[3]);
        }
      }
    }
    // Causal mask (and the sequence's end) only where the block reaches past the tile's first position.
    if ((block + 1) * kCudaBlockTokens - 1 > first_position) {
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const int token = block * kCudaBlockTokens + 8 * j + column;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (token + e % 2 > position[2 * m + e / 2]) s[m][j][e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax (FlashAttention-2 Algorithm 1, lines 9-10): a new row max rescales O and the sum.
    float reference[kRows];
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      const int m = h / 2, e0 = 2 * (h % 2);
      float block_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) block_max = fmaxf(block_max, fmaxf(s[m][j][e0], s[m][j][e0 + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 2));
      const float new_max = fmaxf(running_max[h], block_max * p.scale_log2);
      reference[h] = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: exp2 gives 0, not NaN
      const float rescale = exp2f(running_max[h] - reference[h]);
      running_max[h] = new_max;
      sum[h] *= rescale;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        o[m][d][e0] *= rescale;
        o[m][d][e0 + 1] *= rescale;
      }
    }
    // O += P · V, 16 tokens at a time: S's accumulators for token tiles 2t, 2t+1 are exactly the A
    // fragment of P for k-step t (rounded to FP16).
#pragma unroll
    for (int t = 0; t < kTokenTiles / 2; ++t) {
      unsigned a[kRowTiles][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int half_tile = 0; half_tile < 2; ++half_tile) {
          float weight[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = 2 * m + e / 2;
            weight[e] = exp2f(fmaf(s[m][2 * t + half_tile][e], p.scale_log2, -reference[h]));
            sum[h] += weight[e];
          }
          a[m][2 * half_tile] = pack_halves(weight[0], weight[1]);
          a[m][2 * half_tile + 1] = pack_halves(weight[2], weight[3]);
        }
      }
#pragma unroll
      for (int d = 0; d < kDimTiles; d += 2) {
        unsigned b[4];
        ldmatrix_x4_trans(b, v_block + swizzled<kHeadDim>(16 * t + lane % 8 + (lane / 8 % 2) * 8, d + lane / 16));
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) {
          mma_16816(o[m][d], a[m], b[0], b[1]);
          mma_16816(o[m][d + 1], a[m], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration
  }
  cp_async_wait<0>();  // a CTA with no blocks still has its Q copy in flight

  // Each row's sum over its quad of lanes; the max is already uniform over the quad.
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    sum[h] += __shfl_xor_sync(kFullMask, sum[h], 1);
    sum[h] += __shfl_xor_sync(kFullMask, sum[h], 2);
  }
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int m = h / 2, e0 = 2 * (h % 2);
    const int r = warp_row + 16 * m + group_row + 8 * (h % 2);
    if (r >= tq.active_rows) continue;
    if (p.split_stride == 1) {
      const float inverse = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
      const int head = kv_head * p.group + r % p.group;
      __half* out = p.out + (size_t(tq.query_begin + tq.first_query + r / p.group) * p.num_heads + head) * kHeadDim + column;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        *reinterpret_cast<__half2*>(out + 8 * d) = __floats2half2_rn(o[m][d][e0] * inverse, o[m][d][e0 + 1] * inverse);
      }
    } else {
      const size_t row = (size_t(tile) * p.num_kv_heads + kv_head) * kPrefillTileRows + r;
      float* acc = p.partial_acc + (row * p.split_stride + split) * kHeadDim + column;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) *reinterpret_cast<float2*>(acc + 8 * d) = make_float2(o[m][d][e0], o[m][d][e0 + 1]);
      if (lane % 4 == 0) p.partial_max_sum[row * p.split_stride + split] = make_float2(running_max[h], sum[h]);
    }
  }
}

template <int kHeadDim>
constexpr size_t prefill_shared_bytes() {
  return size_t(kPrefillTileRows + 4 * kCudaBlockTokens) * kHeadDim * sizeof(__half);  // Q, 2 stages of K and V
}

template <int kHeadDim>
int setup() {
  const auto kernel = prefill_attention_partials<kHeadDim>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill_shared_bytes<kHeadDim>())) != cudaSuccess) {
    return 0;
  }
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kPrefillThreads, prefill_shared_bytes<kHeadDim>()) != cudaSuccess) {
    return 0;
  }
  return ctas;
}

template <int kHeadDim>
void launch(const AttentionLaunch& p) {
  const dim3 grid(unsigned(p.num_splits), unsigned(p.num_kv_heads), unsigned(p.num_tiles));
  prefill_attention_partials<kHeadDim><<<grid, kPrefillThreads, prefill_shared_bytes<kHeadDim>()>>>(p);
}

}  // namespace

int prefill_attention_setup(int head_dim) { return head_dim == 64 ? setup<64>() : setup<128>(); }

void launch_prefill_attention(const AttentionLaunch& p) { p.head_dim == 64 ? launch<64>(p) : launch<128>(p); }

}  // namespace slimkv::cuda
