// The GPU's slow KV tiers (issue 11): every token's K/V lives in pinned host memory and streams to the
// GPU layer by layer for attention — `offload`, FlexGen's way — or, with `kvpr`, each layer's
// attention inputs X (the normed hidden states that K and V are projected from) are kept on the host
// too, and the K/V of each sequence's first l tokens is recomputed on the GPU from X while the K/V of
// the others streams in (KVPR, ../shared/papers/004 §3). GPU memory for KV is two staging buffers,
// whatever the contexts.
//
//   host, pinned and mapped:  KV [layer][host block] K|V — K [kv_heads, 64, head_dim], then V — FP16
//                             X  [layer][host block][64, hidden] in the model's dtype (kvpr)
//   GPU:                      2 staging buffers of staging_blocks blocks of K|V (+ X rows, kvpr)
//
// A step's sequences are cut into micro-batches: one is the paper's row-by-row schedule (the batch
// goes through a layer, then the next), several its column-by-column one (each layer takes the
// micro-batches in turn). A unit of work is (layer, micro-batch); units run layer-major and unit u
// uses buffer u % 2, so while unit u computes, unit u+1's X and then its K/V stream in on the copy
// stream. In a unit: recompute waits for X only, so it overlaps the K/V transfer; the new tokens'
// K/V and the attention wait for both.
//
// The new tokens' K/V (and X) are written by kernels straight into the host pool through its device
// mapping (tens of KB a step), and into the staging buffer for this step's attention.
//
// With a quantized codec (`hack`, `quant`: a QuantizedBlockSealer) the host also keeps every full
// block sealed, and steps move those sealed bytes (2-bit: a fifth of FP16's) for the blocks before
// each sequence's open block, and FP16 from there on; recomputed blocks and blocks a step fills are
// sealed on the GPU (into the staging buffer, and the filled ones into the host through the mapping).
// Attention reads them as it reads the resident quantized cache (CudaPagedAttention::run_quantized:
// decode, and prefill over the sealed blocks before the step, prefill=exact for the rest).
//
// A staging (or host) block of K|V is two blocks of the paged layout of paged_kv_cache.h: K in block
// 2s, V in block 2s + 1, the view's v pointer one block after k. The attention kernels read the staging
// buffer unchanged, through block tables naming 2s.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/quantized_kv_pool.h"
#include "kv/cuda/sequence_blocks.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

struct HostKvTierShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden = 0;          // X's row (kvpr)
  DType x_dtype = DType::kF16;
  int max_sequences = 0;
  int max_blocks_per_sequence = 0;
  int max_step_tokens = 0;
  int host_blocks = 0;     // the host pool: blocks of 64 tokens of every layer
  int staging_blocks = 0;  // per staging buffer: what one unit's sequences may hold, new tokens included
  bool keep_x = false;     // kvpr: X kept on the host, recomputation possible
  // 1: row-by-row; 0: column-by-column with as few micro-batches as fit the staging buffer (at least
  // two when the step has two sequences); n > 1: column-by-column in n micro-batches.
  int micro_batches = 1;
};

// The sequences of one micro-batch, a range of the step's (in step order), and their queries.
struct MicroBatch {
  int first_sequence = 0, num_sequences = 0;
  int first_query = 0, num_queries = 0;
  int recompute_rows = 0;  // X rows of the blocks recomputed (64 per block)
  int first_recompute_row = 0;  // of the step's recomputed rows
  int staged_blocks = 0;   // blocks in its staging buffer
};

// Where a unit's recomputation reads and writes: X rows [rows, hidden] on the GPU, each row's token
// position, and its slot in the staging pool (negative: a row past the tokens held, not written).
struct RecomputeRows {
  const void* x = nullptr;
  int rows = 0;
  const int32_t* positions = nullptr;
  const int* slots = nullptr;
};

class CudaHostKvTier {
 public:
  // sealer: the codec's sealing (hack, quant), or none (dense).
  static Expected<std::unique_ptr<CudaHostKvTier>> create(const HostKvTierShape& shape,
                                                          const std::optional<QuantizedBlockSealer>& sealer);
  ~CudaHostKvTier();

  const HostKvTierShape& shape() const { return shape_; }
  SequenceBlocks& sequences() { return sequences_; }
  const SequenceBlocks& sequences() const { return sequences_; }
  size_t host_bytes() const;     // the pinned pool: KV (sealed blocks too, and X)
  size_t staging_bytes() const;  // GPU: the two staging buffers of K|V (and sealed blocks)
  // Per token and layer, the bytes a decode step moves for a token not recomputed: FP16 K|V, or its
  // sealed block's share.
  double kv_bytes_per_token() const;
  size_t staging_x_bytes() const;  // GPU: their X rows (kvpr)

  // The step's micro-batches when sequences[i] gains new_tokens[i], or an error naming the sequence
  // or micro-batch whose blocks do not fit a staging buffer. Changes nothing.
  Expected<std::vector<MicroBatch>> plan_micro_batches(const std::vector<int>& sequences,
                                                       const std::vector<int>& new_tokens) const;
  // Grows the sequences (host blocks), plans the micro-batches, recomputes `recompute_fraction` of the
  // tokens each sequence held before the step (rounded to whole blocks; 1: every token, the open
  // block's too), uploads the tables and slots and, when `stage`, puts unit 0's copies on the copy
  // stream (a step that only stores K/V, store_kv, stages nothing).
  Status begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens, double recompute_fraction,
                    bool stage = true);
  const std::vector<MicroBatch>& micro_batches() const { return micro_batches_; }
  int num_units() const { return shape_.num_layers * int(micro_batches_.size()); }

  // Puts unit u's copies (X, then K/V) on the copy stream once the unit before it on the same buffer is
  // done with it.
  Status prefetch(int unit);
  // kvpr: makes the GPU wait for unit u's X and says where its rows are (rows = 0: nothing to do).
  Expected<RecomputeRows> recompute_rows(int unit);
  // Writes recomputed K/V (FP16 [n, kv_heads, head_dim]) of unit u into the slots `slots` of its buffer.
  Status write_recomputed(int unit, const uint16_t* k, const uint16_t* v, const int* slots, int n);
  // After the last write_recomputed of unit u: seals its recomputed full blocks (quantized codecs).
  Status seal_recomputed(int unit);
  // kvpr: keeps the step's new X of `layer` (rows [step tokens, hidden] on the GPU) on the host.
  Status store_x(int layer, const void* x);
  // Makes the GPU wait for unit u's K/V, then writes its micro-batch's new K/V (rows of the step's k, v
  // FP16 [step tokens, kv_heads, head_dim]) into its buffer and into the host pool.
  Status append(int unit, const uint16_t* k, const uint16_t* v);
  // Writes every new token's K/V of `layer` into the host pool only (contexts built without attention).
  Status store_kv(int layer, const uint16_t* k, const uint16_t* v);
  // What unit u's attention reads; the batch's sequence ids are the step indices of its micro-batch.
  PagedKvView view(int unit) const;
  // A quantized codec: the sealed blocks unit u's attention reads beside view(u)'s unsealed ones.
  bool attends_sealed() const { return sealer_.has_value(); }
  QuantizedKvView sealed_view(int unit) const;
  // Marks unit u's buffer free once the work queued so far (its attention) is done.
  Status release(int unit);

  // The host pool of one block, for moving a sequence in and out (GpuKvCache::export_sequence and
  // import_sequence) once the GPU is done with it: K|V of host block `block` of `layer` (K [num_kv_heads,
  // 64, head_dim] FP16, then V), and its sealed form [num_kv_heads, block_bytes] (null without a sealer).
  uint16_t* host_kv_block(int layer, int block) const {
    return static_cast<uint16_t*>(host_kv_) + (size_t(layer) * shape_.host_blocks + size_t(block)) * kv_block_bytes() / 2;
  }
  uint8_t* host_sealed_block(int layer, int block) const {
    if (!sealer_) return nullptr;
    return static_cast<uint8_t*>(host_sealed_) + (size_t(layer) * shape_.host_blocks + size_t(block)) * sealed_block_bytes();
  }
  const std::optional<QuantizedBlockSealer>& sealer() const { return sealer_; }

 private:
  struct CopyRun {
    int host_block, staging_block, count;
  };
  // A micro-batch's copies and blocks to seal (list entries of QuantizedBlockSealer::seal, 3 ints each),
  // the same for every layer.
  struct UnitPlan {
    std::vector<CopyRun> x, kv, sealed;
    int recompute_seals = 0, filled_seals = 0;  // counts; first of each list: the offsets below
    int first_recompute_seal = 0, first_staging_seal = 0, first_host_seal = 0;
  };
  CudaHostKvTier(const HostKvTierShape& shape, const std::optional<QuantizedBlockSealer>& sealer);
  size_t kv_block_bytes() const;      // one block of K|V
  size_t sealed_block_bytes() const;  // one sealed block of every KV head
  size_t x_block_bytes() const;
  int buffer(int unit) const { return unit % 2; }
  // Copies of blocks[first, last) to staging blocks from staging_block on: one per run of blocks
  // consecutive in the host pool.
  static void add_runs(const std::vector<int>& blocks, int first, int last, int staging_block,
                       std::vector<CopyRun>& runs);
  // The step's new K/V rows [first, first + n) of `layer` into the host pool.
  Status write_host_kv(int layer, int first, int n, const uint16_t* k, const uint16_t* v);

  HostKvTierShape shape_;
  SequenceBlocks sequences_;
  void* host_kv_ = nullptr;  // pinned, mapped: [layers][host_blocks] K|V
  void* host_x_ = nullptr;   // pinned, mapped: [layers][host_blocks][64, hidden] (kvpr)
  void* host_sealed_ = nullptr;  // pinned, mapped: [layers][host_blocks][num_kv_heads, block_bytes] (quantized)
  std::optional<QuantizedBlockSealer> sealer_;
  DeviceArray<uint8_t> staging_kv_[2];
  DeviceArray<uint8_t> staging_sealed_[2];
  DeviceArray<uint8_t> staging_x_[2];
  void* copy_stream_ = nullptr;  // cudaStream_t
  void* x_ready_[2] = {};        // cudaEvent_t per buffer
  void* kv_ready_[2] = {};
  void* free_[2] = {};
  // The planned step.
  std::vector<MicroBatch> micro_batches_;
  std::vector<UnitPlan> plans_;  // per micro-batch
  int step_tokens_ = 0;
  DeviceArray<int> seal_lists_;  // the plans' seal lists
  DeviceArray<int> tables_;         // [max_sequences (step index), max_blocks_per_sequence]: 2·staging block
  DeviceArray<int> step_slots_;     // [3, max_step_tokens]: new tokens' staging, host KV and host X slots
  DeviceArray<int> recompute_;      // [2, capacity]: recomputed rows' positions and staging slots
  int recompute_capacity_ = 0;
};

}  // namespace slimkv::cuda
