// Which blocks of a pool each sequence holds, kept on the host (ARCHITECTURE.md "paged KV store"): the
// bookkeeping shared by the GPU's block pool (paged_kv_cache.h) and the host pool of the offload tiers
// (host_kv_tier.h). A block index addresses the same slot in every layer, as the tokens of a sequence
// are the same in each layer.
#pragma once

#include <set>
#include <vector>

#include "attention/cuda/kv_views.h"  // kCudaBlockTokens
#include "slimkv/status.h"

namespace slimkv::cuda {

class SequenceBlocks {
 public:
  SequenceBlocks(int num_blocks, int max_sequences, int max_blocks_per_sequence);

  int num_blocks() const { return num_blocks_; }
  int max_sequences() const { return int(sequences_.size()); }
  int max_blocks_per_sequence() const { return max_blocks_per_sequence_; }

  // A new, empty sequence (its id), or an error when every id is taken.
  Expected<int> add_sequence();
  // Returns the sequence's blocks to the pool; its id may be reused.
  void remove_sequence(int sequence);
  bool is_live(int sequence) const {
    return sequence >= 0 && sequence < max_sequences() && sequences_[size_t(sequence)].live;
  }
  int num_tokens(int sequence) const { return sequences_[size_t(sequence)].num_tokens; }
  // The sequence's blocks, in order (kReleased for those release_leading gave back).
  const std::vector<int>& blocks(int sequence) const { return sequences_[size_t(sequence)].blocks; }
  static constexpr int kReleased = -1;
  int free_blocks() const { return int(returned_.size()) + (num_blocks_ - next_fresh_); }

  // Blocks the sequence needs to hold `tokens` tokens in all (0 when it has them).
  int blocks_to_grow(int sequence, int tokens) const;
  // Lets the sequence hold `tokens` tokens, taking the blocks it lacks: the block after its last one
  // when free (a sequence's blocks then tend to be consecutive, which the offload tiers move in one
  // copy), else the lowest free one. Errors (changing nothing) when the pool or its table is too small.
  Status grow(int sequence, int tokens);
  // Returns the sequence's first `count` blocks to the pool while it keeps its tokens: a pool that holds
  // only a window of each sequence (the FP16 blocks of quantized KV, which are dropped once sealed).
  void release_leading(int sequence, int count);
  // Makes the empty sequence hold count · kCudaBlockTokens tokens whose blocks this pool never held (as
  // if taken and given back by release_leading): a window pool's part of a restored sequence.
  void skip_leading(int sequence, int count);
  // How many of the sequence's first blocks release_leading has given back.
  int released_blocks(int sequence) const { return sequences_[size_t(sequence)].released; }

 private:
  struct Sequence {
    bool live = false;
    int num_tokens = 0;
    std::vector<int> blocks;
    int released = 0;  // blocks[0, released) are kReleased
  };
  int num_blocks_;
  int max_blocks_per_sequence_;
  std::vector<Sequence> sequences_;
  // Free blocks: those returned by removed sequences, and [next_fresh_, num_blocks) never used (a pool
  // of millions of host blocks costs nothing until used).
  std::set<int> returned_;
  int next_fresh_ = 0;
  // Takes `block` if free (false if not).
  bool take(int block);
};

// A step's growth of a paged cache's sequences (the FP16 pages, ZACK's blocks): each sequences[i] grows by
// new_tokens[i] tokens, its blocks are written into its row of host_tables ([max_sequences,
// max_blocks_per_sequence]) and each new token's slot (block · kCudaBlockTokens + offset) appended to
// slots, sequence by sequence. Errors name the sequence, a full pool or more than max_step_tokens.
Status grow_for_step(SequenceBlocks& held, const std::vector<int>& sequences, const std::vector<int>& new_tokens,
                     int max_step_tokens, std::vector<int>& host_tables, std::vector<int>& slots);

}  // namespace slimkv::cuda
