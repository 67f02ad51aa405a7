#include "kv/cuda/sequence_blocks.h"

#include <algorithm>
#include <utility>

namespace slimkv::cuda {

SequenceBlocks::SequenceBlocks(int num_blocks, int max_sequences, int max_blocks_per_sequence)
    : num_blocks_(num_blocks), max_blocks_per_sequence_(max_blocks_per_sequence), sequences_(size_t(max_sequences)) {}

Expected<int> SequenceBlocks::add_sequence() {
  for (size_t id = 0; id < sequences_.size(); ++id) {
    if (!sequences_[id].live) {
      sequences_[id] = Sequence{true, 0, {}, 0};
      return int(id);
    }
  }
  return error("all ", sequences_.size(), " sequence slots are in use");
}

void SequenceBlocks::remove_sequence(int sequence) {
  release_leading(sequence, int(sequences_[size_t(sequence)].blocks.size()));
  sequences_[size_t(sequence)] = Sequence{};
}

void SequenceBlocks::release_leading(int sequence, int count) {
  Sequence& s = sequences_[size_t(sequence)];
  for (; s.released < std::min(int(s.blocks.size()), count); ++s.released) {
    returned_.insert(std::exchange(s.blocks[size_t(s.released)], kReleased));
  }
}

void SequenceBlocks::skip_leading(int sequence, int count) {
  Sequence& s = sequences_[size_t(sequence)];
  s.blocks.assign(size_t(count), kReleased);
  s.released = count;
  s.num_tokens = count * kCudaBlockTokens;
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
    // The block after the sequence's last when free, else the lowest free one.
    if (!s.blocks.empty() && s.blocks.back() != kReleased && take(s.blocks.back() + 1)) {
      s.blocks.push_back(s.blocks.back() + 1);
      continue;
    }
    const int lowest = returned_.empty() ? next_fresh_ : std::min(*returned_.begin(), next_fresh_);
    take(lowest);
    s.blocks.push_back(lowest);
  }
  s.num_tokens = std::max(s.num_tokens, tokens);
  return Status::ok();
}

bool SequenceBlocks::take(int block) {
  if (block == next_fresh_ && next_fresh_ < num_blocks_) {
    ++next_fresh_;
    return true;
  }
  return returned_.erase(block) > 0;
}

Status grow_for_step(SequenceBlocks& held, const std::vector<int>& sequences, const std::vector<int>& new_tokens,
                     int max_step_tokens, std::vector<int>& host_tables, std::vector<int>& slots) {
  if (sequences.size() != new_tokens.size()) {
    return error("CUDA KV cache step: ", sequences.size(), " sequences but ", new_tokens.size(), " token counts");
  }
  slots.clear();
  const size_t stride = size_t(held.max_blocks_per_sequence());
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (!held.is_live(sequences[i])) return error("CUDA KV cache step: sequence ", sequences[i], " does not exist");
    const int before = held.num_tokens(sequences[i]), total = before + new_tokens[i];
    SLIMKV_RETURN_IF_ERROR(held.grow(sequences[i], total).with_context("CUDA KV cache step"));
    const std::vector<int>& blocks = held.blocks(sequences[i]);
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b] != SequenceBlocks::kReleased) host_tables[size_t(sequences[i]) * stride + b] = blocks[b];
    }
    for (int position = before; position < total; ++position) {
      slots.push_back(blocks[size_t(position / kCudaBlockTokens)] * kCudaBlockTokens + position % kCudaBlockTokens);
    }
  }
  if (int(slots.size()) > max_step_tokens) {
    return error("CUDA KV cache step: ", slots.size(), " new tokens, over max_step_tokens ", max_step_tokens);
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
