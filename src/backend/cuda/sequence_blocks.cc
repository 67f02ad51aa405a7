#include "backend/cuda/sequence_blocks.h"

#include <algorithm>

namespace slimkv::cuda {

SequenceBlocks::SequenceBlocks(int num_blocks, int max_sequences, int max_blocks_per_sequence)
    : num_blocks_(num_blocks), max_blocks_per_sequence_(max_blocks_per_sequence), sequences_(size_t(max_sequences)) {
  for (int block = 0; block < num_blocks; ++block) free_.insert(free_.end(), block);
}

Expected<int> SequenceBlocks::add_sequence() {
  for (size_t id = 0; id < sequences_.size(); ++id) {
    if (!sequences_[id].live) {
      sequences_[id] = Sequence{true, 0, {}};
      return int(id);
    }
  }
  return error("all ", sequences_.size(), " sequence slots are in use");
}

void SequenceBlocks::remove_sequence(int sequence) {
  Sequence& s = sequences_[size_t(sequence)];
  free_.insert(s.blocks.begin(), s.blocks.end());
  s = Sequence{};
}

int SequenceBlocks::blocks_to_grow(int sequence, int tokens) const {
  const int needed = (tokens + kCudaBlockTokens - 1) / kCudaBlockTokens;
  return std::max(0, needed - int(blocks(sequence).size()));
}

Status SequenceBlocks::grow(int sequence, int tokens) {
  Sequence& s = sequences_[size_t(sequence)];
  const int more = blocks_to_grow(sequence, tokens);
  if (int(s.blocks.size()) + more > max_blocks_per_sequence_) {
    return error("sequence ", sequence, " would hold ", tokens, " tokens, over the ",
                 max_blocks_per_sequence_ * kCudaBlockTokens, " its block table allows");
  }
  if (more > free_blocks()) {
    return error("the pool's ", num_blocks_, " blocks are all in use (", more, " more of ", kCudaBlockTokens,
                 " tokens needed, ", free_blocks(), " free)");
  }
  for (int i = 0; i < more; ++i) {
    auto next = s.blocks.empty() ? free_.end() : free_.find(s.blocks.back() + 1);
    if (next == free_.end()) next = free_.begin();
    s.blocks.push_back(*next);
    free_.erase(next);
  }
  s.num_tokens = std::max(s.num_tokens, tokens);
  return Status::ok();
}

}  // namespace slimkv::cuda
