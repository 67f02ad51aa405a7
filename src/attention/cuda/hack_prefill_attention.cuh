// HACK prefill attention on INT8 tensor cores (HACK §5.1–5.3, Eq. 4): for a prefill step (many new
// queries per sequence), the attention of every query over the sequence's sealed `hack` blocks that lie
// wholly before the step's first new token. Every query of the step sees every token of those blocks,
// so no causal mask is needed; the rest of the step (the open block and the step's own tokens) is
// exact FP16 attention, whose partials merge with these (split_k.cuh's format;
// CudaPagedAttention::run_quantized does both).
//
// Per CTA: 128 query rows (positions × the GQA group sharing one KV head, as prefill_attention.cuh),
// 8 warps of one m16 row tile (128 registers: 16 warps per multiprocessor). Q is quantized once per
// CTA to 8 bits per K partition (quantize_operand8's operations, attention/hack_operands.h). Each
// block (64 tokens) is staged packed in shared memory by cp.async, 4 stages deep, and
//   S  = Σ_partitions s_q s_k (Q'·K'ᵀ) + s_q m_k Σq' + m_q s_k Σk' + n m_q m_k   (Eq. 4, stored Σk')
// with Q'·K'ᵀ on mma.sync m16n8k32 u8×u8→s32; online softmax in FP32, base 2; P quantized to 8 bits
// per (row, block) (quantize_operand8 again, over the block's 64 tokens: one V partition) in registers,
// straight into the A fragments; P'·V' on the same mma and V's corrections with the stored Σv':
//   P·V = s_p s_v (P'·V') + s_p m_v Σp' + m_p s_v Σv' + T m_p m_v.
// The correction terms that are not integer products (rank 4 in S, rank 2 in O) run as one FP16 mma
// per tile on hi/lo-split factors (see write_row_factor in the .cu). Each CTA writes its split partial
// (base-2 max, sum, weighted V); launch_merge_split_partials merges.
//
// Operands straight from the packed block (tensor/quantized_block.h), no unpacking pass: a B
// fragment register of m16n8k32 is 4 k values of one column, and a packed K field is 4 dims of one
// token, a V field 4 tokens of one column. The k order inside an mma is free as long as A and B agree,
// and so is which token (dim) each n column of S (O) is: column n of S's tile j is token 8n + j, so a
// lane's K fields for all 8 tiles are one run of 8 tokens in each of its 4 dim-group rows (one 8- to
// 32-byte load per row); column n of O's tile d is dim (head_dim / 8)·n + d, likewise one run of V
// columns per token-group row. Then a lane's S accumulators are the tokens 16i..16i+15 (i = lane % 4)
// of its two rows, exactly the tokens its P' A fragments need when it reads V's token groups
// 4i..4i+3: P' is packed from the lane's own registers, no shuffles. 4- and 8-bit registers are
// spread fields; 2-bit ones take code r of 4 fields (a 4×4 byte transpose of 4 packed words), Q' and
// P' stored in the matching k order. Staged rows are chunk-swizzled so those loads are free of bank
// conflicts. A block's parameters (scales, correction factors) are converted once per CTA one block
// ahead. No __syncthreads per block: mbarriers say when a stage has landed, when a block's parameters
// are converted and when every warp is done with a stage, which is refilled two blocks later, so the
// warps drift up to a block apart (softmax of one overlapping the mma of another).
//
// Measured on H100 (32 q / 8 kv heads, d 128, 512 queries; bench/cuda/bench_hack_prefill_cuda
// --batches 1,8 --contexts 4096,32768 --queries 512 --repetitions 3, one run): 2 bits 153–207
// TFLOP/s-equivalent against the FP16 kernel's 240–310, i.e. 0.60–0.67x its work rate (was 0.50–0.62x;
// batch 8 at 32K: FP16 7.16 ms, HACK 10.6 ms, was 12.2); 4 bits 0.65x, 8 bits 0.63x (batch 8, 32K).
// The issue's 1.3x is not reached. Steps (batch 8 at 32K / at 4K, 2 bits): no unpacking pass, 8 warps
// of one tile, __syncthreads per block 0.63x / 0.55x; 4 warps of 2 tiles 0.66x / 0.55x (255
// registers, 8 warps); mbarriers instead of the block barrier: 2 tiles 0.65x / 0.55x (8 bits 0.57x),
// 1 tile 0.67x / 0.60x (kept). ncu (batch 8, 32K): issue slots 61% busy, stalls mostly fixed-latency
// dependencies and pipe throttles, not barriers or memory: the kernel is bound by issue. A warp runs
// ~1600 instructions per block (for 64 mma): ~290 FFMA for Eq. 4's folds (s_q s_k per S element and
// K partition, s_p s_v per O element: the per-token, per-partition scales leave no integer sum to
// share), ~240 for the softmax and P', ~290 to pull 2-bit codes out of their fields, ~120 shared loads,
// ~70 register moves, 96 bytes of spills. Next: fewer instructions per block (2 row tiles per warp
// share the decoding and the loads but need 255 registers here; wgmma would take the mma and their
// operand registers off the warps, not the folds).
// Also measured, not kept (2026-11-23, docs/results/cuda/prefill_instruction_mix_h100.txt): decoding
// each block once per CTA into shared memory as 16-byte B fragments per lane cut the instructions to
// 1375 per warp and block but not the time (10.93 vs 10.53 ms: unpacked operands are 4x the packed
// bytes, so shared-memory traffic per warp quadruples, and the CTA-wide unpack ties the warps); with
// 4 warps of 2 tiles on it 10.49 ms. The FP16 kernel issues 796 per 16 rows and block in all; Eq. 4's
// element-wise FP32 work here is ~600 of those. A wgmma version (branch int8-wgmma: operands unpacked
// once per CTA into wgmma's layout, two warpgroups) is as exact but slower, 12.5 ms: 227 registers
// (one CTA per SM), accumulators preset every block, 1372 instructions per 16 rows and block.
// Ablation (branch ablate-prefill, docs/results/cuda/prefill_ablation_h100.txt): deleting Eq. 4's
// folds, P's quantization, the 2-bit decoding and the exponent leaves this pipeline at 1.04x FP16
// (862 instructions per unit at IPC 2.24): the required work, not the mma rate, bounds the kernel.
// This header is host C++ (the kernel and its launch parameters live in the .cu).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/kv_views.h"

namespace slimkv::cuda {

// m16 row tiles per warp: 1 (128 registers, 16 warps per multiprocessor) measured ahead of 2 (each
// K/V fragment serving both, but 255 registers and 8 warps).
constexpr int kHackPrefillRowTilesPerWarp = 1;
constexpr int kHackPrefillWarps = 8;
constexpr int kHackPrefillThreads = kHackPrefillWarps * 32;
constexpr int kHackPrefillTileRows = kHackPrefillWarps * 16 * kHackPrefillRowTilesPerWarp;

// The kernel alone, for CudaPagedAttention's prefill steps over `hack` blocks (the open block and the
// step's own tokens go to the FP16 kernel, whose partials take other splits of the same rows): opts it
// into its shared memory for (head_dim, bits, block_bytes) and returns its CTAs resident per
// multiprocessor (0 on an error); launches it over p's tiles and splits, writing partials only (at
// p.split_stride) for launch_merge_split_partials.
int hack_prefill_kernel_setup(int head_dim, int bits, int block_bytes);
void launch_hack_prefill_kernel(const AttentionLaunch& p, const QuantizedKvView& sealed);

// The host side for one shape and bit width: plans a prefill step's tiles and splits, runs the kernel
// and the merge. Outputs are the attention over the sealed blocks before each sequence's first new
// token only (zeros for a sequence that has none).
class CudaHackPrefillAttention {
 public:
  // shape: heads (GQA group at most 8), head_dim 64 or 128, max_batch, max_queries; bits of K and V.
  static Expected<std::unique_ptr<CudaHackPrefillAttention>> create(const PagedAttentionShape& shape, int bits);

  Status plan(const PagedAttentionBatch& batch);
  // q, out: FP16 [total queries, num_heads, head_dim] (device); scores are scale · q·k. kv gives the block
  // tables; sealed must be `hack` blocks of this bit width and head dim.
  Status run(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q, float scale, uint16_t* out);

  int num_splits() const { return num_splits_; }
  int num_tiles() const { return num_tiles_; }

 private:
  CudaHackPrefillAttention(const PagedAttentionShape& shape, int bits) : shape_(shape), bits_(bits) {}

  PagedAttentionShape shape_;
  int bits_;
  int group_ = 0;
  int block_bytes_ = 0;
  size_t shared_bytes_ = 0;
  int target_ctas_ = 0;  // one wave of the kernel
  // Planned:
  int batch_size_ = 0, num_tiles_ = 0, num_splits_ = 1, splits_per_tile_ = 1;
  // Device: [sequence_ids B | kv_lens B | query_starts B+1 | pad | tiles], and the partials.
  DeviceArray<int> metadata_;
  DeviceArray<float> partial_acc_;
  DeviceArray<float> partial_max_sum_;
};

}  // namespace slimkv::cuda
