// Decode attention over sealed `hack` / `quant` blocks (kv/cuda/quantized_kv_pool.h) plus each
// sequence's open FP16 block: CudaPagedAttention::run_quantized. The work split, the tiles (a GQA group
// reads each KV block once) and the merge of the splits are the dense kernel's (split_k.cuh); what
// differs is how a warp reads one block:
//   hack (HACK §5.2–5.3): Q quantized to 8 bits per K partition once per CTA; Σ q'k' with dp4a on
//     codes unpacked in registers from the block staged in shared memory; Eq. 4's corrections with the
//     stored Σk'; softmax in FP32; P quantized to 8 bits over the block (one V partition); Σ p'v' with
//     dp4a, corrected with the stored Σv'. Held to attend_hack_block_reference (FP64).
//   quant (the KIVI-style fused baseline): the same staging and unpacking, each code converted to FP32
//     in registers and multiplied with FP32 q and p (FFMA on CUDA cores); the scale and min applied once
//     per partition (s·Σ q k' + m·Σ q), so no dequantized value is ever stored.
//   hack over KIVI's layouts (K per channel, V per token; issue 28, attend_hack_block_reference): the
//     scales vary along the dot products, so they are folded into the operands per block and warp:
//     u = q∘s per K token group and K partition, U' = lrint(q̂ ŝ) in the range its factors bound
//     (q̂ = q · 127 / max|q|, ŝ = s / max s: attention/hack_operands.h), Σ_d q_d m_d exact; w = p∘s per
//     V column group over the block's tokens, W' = lrint(w · 255 / max w), Σ_t p_t m_t and Σ_t p_t
//     exact. The integer products are the same dp4a on U', W' instead of Q', P'.
// The open block is read in FP16 and computed in FP32, as the dense kernel does. Those are DotLanes
// (quantized_dot_lanes.cuh); 2-bit `hack` blocks of head_dim 128 are read by MmaLanes instead
// (quantized_mma_lanes.cuh: the same steps with the integer products on INT8 tensor cores, the same bits).
// ZACK's heads (zack:...+hack / +quant: QuantizedKvView::heads): each KV head's blocks at its own K and V
// dims (multiples of 4, at most kHeadDim), the same kernels: Q' per K partition over the head's dims (the
// last partition shorter), dim groups and V columns past them not read (a lane's columns are all in or
// all out), their outputs 0.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/quantized_dot_lanes.cuh"
#include "attention/cuda/quantized_mma_lanes.cuh"
#include "attention/cuda/split_k.cuh"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

using namespace quantized_decode;  // NOLINT: the kernel's own pieces (quantized_decode.cuh and its lanes)

// The attention partial of one decode tile (a sequence's GQA group) over one split of its blocks, each
// block read by Lanes.
template <class Lanes>
__global__ __launch_bounds__(kThreads) void quantized_attention_partials(QuantizedLaunch L) {
  constexpr int kHeadDim = Lanes::kHeadDim, kRows = Lanes::kRows, kPartitions = kHeadDim / T;
  constexpr bool kHack = Lanes::kHack;
  static_assert(kHeadDim % 64 == 0, "head dims of 64 or 128");
  // [kWarps][2][block_bytes]: each warp's blocks, double-buffered (measured on H100 at 64K: 0.174 ms
  // against 0.181 single-buffered); after the loop, the warps' partials.
  extern __shared__ uint4 staging[];
  __shared__ CtaShared<kHeadDim, kRows> s;
  const AttentionLaunch& p = L.a;
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const SealedHead head = sealed_head(L.sealed, kv_head, kHeadDim);

  // The tile's queries, times the softmax scale (rows past the group, and dims past the head's k_dim,
  // stay 0 and are never written).
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, c = i % kHeadDim;
    float x = 0.0f;
    if (r < tq.active_rows && c < head.k_dim) {
      const int query_head = kv_head * p.group + r % p.group, query = tq.first_query + r / p.group;
      x = __fmul_rn(__half2float(p.q[(size_t(tq.query_begin + query) * p.num_heads + query_head) * kHeadDim + c]), p.scale);
    }
    s.q[r][c] = x;
  }
  __syncthreads();
  // Per (row, K partition), one warp each, 2 values per lane: hack quantizes to Q' (quantize_operand8
  // in attention/hack_operands.h, the same IEEE operations; a zero's sign in the min cannot change
  // a code or a sum), quant sums the row. A partition holds the head's dims from part · T on, at most T
  // (fewer in a ZACK head's last one; codes past them are 0); partitions past the head's are not read.
  for (int item = warp; item < kRows * kPartitions; item += kWarps) {
    const int r = item / kPartitions, part = item % kPartitions, dims = min(T, head.k_dim - part * T);
    if (dims <= 0) continue;
    const float x0 = s.q[r][part * T + 2 * lane], x1 = s.q[r][part * T + 2 * lane + 1];
    const bool in0 = 2 * lane < dims, in1 = 2 * lane + 1 < dims;
    if constexpr (kHack) {
      const float lo = warp_min(fminf(in0 ? x0 : INFINITY, in1 ? x1 : INFINITY));
      const float hi = warp_max(fmaxf(in0 ? x0 : -INFINITY, in1 ? x1 : -INFINITY));
      const float scale = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
      const float inverse = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.q_codes[r]);
      int sum = 0;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float x = j == 0 ? x0 : x1;
        const int code = (j == 0 ? in0 : in1) ? min(max(__float2int_rn(__fmul_rn(__fsub_rn(x, lo), inverse)), 0), 255) : 0;
        sum += code;
        codes[Lanes::operand_byte(part * T + 2 * lane + j)] = uint8_t(code);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == 0) s.q_meta[r][part] = make_float3(scale, lo, fmaf(scale, float(sum), float(dims) * lo));
    } else {
      float sum = x0 + x1;
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == 0) s.q_meta[r][part] = make_float3(sum, 0.0f, 0.0f);
    }
  }
  __syncthreads();
  const Lanes lanes(s, lane);

  // The warp's blocks: block_begin + warp + kWarps·j; those before n_sealed are sealed, the last one
  // may be the open block.
  const int num_blocks = (tq.kv_end + T - 1) / T, n_sealed = tq.kv_end / T;
  const TileSplit range = tile_split(p, tq, split, 0, num_blocks);
  const int block_begin = range.begin, block_end = range.end;
  const int sealed_end = min(block_end, n_sealed);
  const int* table = p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride;
  const auto sealed_block = [&](int block) {
    return sealed_block_address(L.sealed, p, p.sequence_ids[tq.batch_index], block, kv_head);
  };
  uint8_t* stage = reinterpret_cast<uint8_t*>(staging) + size_t(warp) * 2 * L.sealed.offsets.block_bytes;
  uint8_t* scratch = reinterpret_cast<uint8_t*>(staging) + L.scratch.offset + warp * L.scratch.bytes;
  typename Lanes::Partial partial;
  int buffer = 0;
  const int head_bytes = head.offsets.block_bytes;  // staged in buffers of the view's block_bytes (the largest head's)
  if (block_begin + warp < sealed_end) lanes.stage(stage, sealed_block(block_begin + warp), head_bytes, L, lane);
  for (int block = block_begin + warp; block < block_end; block += kWarps) {
    if (block < n_sealed) {
      if (block + kWarps < sealed_end) {  // the next block's copy is in flight while this one is read
        lanes.stage(stage + (buffer ^ 1) * L.sealed.offsets.block_bytes, sealed_block(block + kWarps), head_bytes, L, lane);
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncwarp();
      lanes.sealed(L, head, stage + buffer * L.sealed.offsets.block_bytes, s, scratch, warp, lane, partial);
      __syncwarp();  // every lane is done with the buffer before it is refilled
      buffer ^= 1;
    } else {
      const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * T * kHeadDim;
      lanes.open(p.k_pool + offset, p.v_pool + offset, tq.kv_end - block * T, s, warp, lane, partial);
    }
  }

  __syncthreads();  // every warp is done with the staging buffers
  auto& warp_acc = *reinterpret_cast<float(*)[kWarps][kRows][kHeadDim]>(staging);
  lanes.write(partial, warp_acc, s.warp_max_sum, warp, lane);
  __syncthreads();
  store_cta_partial<kHeadDim, kRows>(p, tq.active_rows, warp_acc, s.warp_max_sum);
}

using QuantizedKernel = void (*)(QuantizedLaunch);

// hack: HACK's layout, or KIVI's (`layouts`); quant: HACK's layout only.
template <int kHeadDim, int kRows, int kBits>
QuantizedKernel pick_kind(bool hack, bool layouts) {
  if (!hack) return layouts ? nullptr : quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, false, false>>;
  return layouts ? quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, true, true>>
                 : quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, true, false>>;
}

template <int kHeadDim, int kRows>
QuantizedKernel pick(int bits, bool hack, bool layouts) {
  switch (bits) {
    case 2: return pick_kind<kHeadDim, kRows, 2>(hack, layouts);
    case 4: return pick_kind<kHeadDim, kRows, 4>(hack, layouts);
    case 8: return pick_kind<kHeadDim, kRows, 8>(hack, layouts);
    default: return nullptr;
  }
}

// The one switch from the run-time shape to the decode kernel's template parameters; null when no
// kernel has it (run_quantized's error names the values). With `tensor_cores`, blocks MmaLanes can read
// take it: 2-bit HACK layout at head_dim 128 for every KV head (no ZACK heads), V codes at a multiple of
// 128 bytes (its staging swizzle).
QuantizedKernel pick_kernel(int head_dim, int rows, const QuantizedKvView& sealed, bool layouts, bool tensor_cores) {
  const bool four = rows == 4;
  if (rows != 4 && rows != 8) return nullptr;
  if (tensor_cores && head_dim == kMmaHeadDim && sealed.k_bits == 2 && sealed.hack && !layouts && sealed.heads == nullptr &&
      sealed.offsets.v_codes % 128 == 0) {
    return four ? quantized_attention_partials<MmaLanes<4>> : quantized_attention_partials<MmaLanes<8>>;
  }
  const int bits = sealed.k_bits;
  const bool hack = sealed.hack;
  switch (head_dim) {
    case 64: return four ? pick<64, 4>(bits, hack, layouts) : pick<64, 8>(bits, hack, layouts);
    case 128: return four ? pick<128, 4>(bits, hack, layouts) : pick<128, 8>(bits, hack, layouts);
    default: return nullptr;
  }
}

// The warps' scratch for KIVI's layouts (LayoutScratch), after `offset` bytes of staging.
LayoutScratch layout_scratch(const QuantizedKvView& sealed, int rows, int head_dim, size_t offset) {
  LayoutScratch scratch;
  if (!sealed.k_per_channel && !sealed.v_per_token) return scratch;
  const int k_groups = sealed.k_per_channel ? kCudaBlockTokens / sealed.k_group_tokens : 0;
  const int v_groups = sealed.v_per_token ? head_dim / sealed.v_group_dims : 0;
  int bytes = 0;
  const auto section = [&](int size) {
    const int start = bytes;
    bytes += (size + 15) / 16 * 16;
    return start;
  };
  scratch.u_codes = section(k_groups * rows * head_dim);
  scratch.u_meta = section(k_groups * rows * (head_dim / kCudaBlockTokens) * int(sizeof(float4)));
  scratch.w_codes = section(v_groups * rows * kCudaBlockTokens);
  scratch.w_meta = section(v_groups * rows * int(sizeof(float4)));
  scratch.bytes = bytes;
  scratch.offset = int(offset);
  return scratch;
}

}  // namespace

Status CudaPagedAttention::run_quantized(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q,
                                         float scale, uint16_t* out) {
  SLIMKV_RETURN_IF_ERROR(check_run(kv));
  for (Part& part : parts_) {
    SLIMKV_RETURN_IF_ERROR(part.tensor_cores ? run_quantized_prefill(part, kv, sealed, q, scale, out)
                                             : run_quantized_decode(part, kv, sealed, q, scale, out));
  }
  return Status::ok();
}

Status CudaPagedAttention::run_quantized_decode(Part& part, const PagedKvView& kv, const QuantizedKvView& sealed,
                                                const uint16_t* q, float scale, uint16_t* out) {
  if (part.max_query_count != 1) {
    return error("CUDA quantized attention: steps of several queries per sequence need the tensor-core kernel (head_dim 64 ",
                 "or 128, tensor_core_min_queries > 0); the plan has ", part.max_query_count);
  }
  if (sealed.k_bits != sealed.v_bits) {
    return error("CUDA quantized attention: K and V bits must match on the GPU, got ", sealed.k_bits, " and ", sealed.v_bits);
  }
  const bool layouts = sealed.k_per_channel || sealed.v_per_token;
  if (layouts && !sealed.hack) {
    return error("CUDA quantized attention: quant with klayout=channel or vlayout=token has no GPU decode kernel (hack has)");
  }
  if (layouts && sealed.v_per_token && sealed.v_group_dims % (shape_.head_dim / 32) != 0) {
    return error("CUDA quantized attention: vgroup=", sealed.v_group_dims, " must hold whole lanes' columns (a multiple of ",
                 shape_.head_dim / 32, ")");
  }
  const QuantizedKernel kernel = pick_kernel(shape_.head_dim, rows_per_tile_, sealed, layouts, shape_.integer_tensor_cores);
  if (kernel == nullptr) {
    return error("CUDA quantized attention: no decode kernel for head_dim ", shape_.head_dim, ", ", rows_per_tile_,
                 " rows per tile, ", sealed.k_bits, " bits (there: head_dim 64 or 128, 4 or 8 rows, 2, 4 or 8 bits)");
  }
  // The staging buffers, which also hold the warps' partials at the end; then the warps' scratch.
  const size_t buffers = std::max(size_t(kWarps) * 2 * sealed.offsets.block_bytes,
                                  size_t(kWarps) * rows_per_tile_ * shape_.head_dim * sizeof(float));
  const LayoutScratch scratch = layout_scratch(sealed, rows_per_tile_, shape_.head_dim, buffers);
  const size_t staging_bytes = buffers + size_t(kWarps) * size_t(scratch.bytes);
  // Once per kernel and staging size: its shared-memory limit, and its residency (one wave of this
  // kernel differs from one of the dense kernel).
  const auto known = std::find_if(quantized_residency_.begin(), quantized_residency_.end(), [&](const auto& entry) {
    return entry.first == reinterpret_cast<const void*>(kernel) && entry.second.first == staging_bytes;
  });
  int resident = 1;
  if (known != quantized_residency_.end()) {
    resident = known->second.second;
  } else {
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(staging_bytes)));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, staging_bytes));
    quantized_residency_.push_back({reinterpret_cast<const void*>(kernel), {staging_bytes, resident}});
  }
  // A sequence's splits: half a wave, of at least 16 blocks (four a warp). A CTA's fixed work (its queries
  // read and quantized, the first block's staging latency, the warps' partials combined and written)
  // costs about what ten 2-bit blocks' bytes do, so a sequence alone over a whole wave in splits of two
  // blocks (the dense kernel's rule) spends most of each CTA on it, and a batch of such sequences runs
  // wave after wave of it: at 16K (256 blocks in 66 splits), batch 5, Nsight Compute saw 20% of an H200's
  // DRAM bandwidth in use. Measured by splits (H200, 2-bit, µs at batch 1 / 5 / 8): 16K in 66 splits
  // 22.3 / 67.9 / 94.5, in 16 19.5 / 44.8 / 59.7; 64K in 66 38.8 / 137.5 / 202.8, in 33 38.0 / 123.5 /
  // 184.5; 4K in 32 15.0 / 29.1 / 37.0, in 4 18.4 / 21.5 / 21.7 (docs/cuda.md, "Splits of the quantized
  // decode kernel"). Still a rule of the sequence alone (split_rule.h): its bits do not depend on the batch.
  constexpr int kMinBlocksPerQuantizedSplit = 4 * kWarps;
  const int half_wave = std::max(resident, 1) * multiprocessor_count() / 2;
  SLIMKV_RETURN_IF_ERROR(split_blocks(part, half_wave, kMinBlocksPerQuantizedSplit));

  QuantizedLaunch L{};
  L.a = launch_params(part, kv, q, scale, out);
  L.sealed = sealed;
  L.scratch = scratch;
  const dim3 grid(unsigned(L.a.num_splits), unsigned(L.a.num_kv_heads), unsigned(L.a.num_tiles));
  kernel<<<grid, kThreads, staging_bytes>>>(L);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  launch_merge_split_partials(L.a);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
