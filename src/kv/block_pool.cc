#include "kv/block_pool.h"

#include <cstdlib>
#include <new>

namespace slimkv {

void BlockPool::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

BlockPool::BlockPool(size_t block_bytes, size_t blocks_per_chunk)
    : block_bytes_((block_bytes + 63) / 64 * 64),
      blocks_per_chunk_(blocks_per_chunk),
      chunk_bytes_(block_bytes_ * blocks_per_chunk) {}

uint8_t* BlockPool::allocate() {
  ++in_use_;
  if (!released_.empty()) {
    uint8_t* slot = released_.back();
    released_.pop_back();
    return slot;
  }
  const size_t chunk = handed_out_ / blocks_per_chunk_;
  if (chunk == chunks_.size()) {
    void* memory = std::aligned_alloc(64, chunk_bytes_);
    if (!memory) throw std::bad_alloc();
    chunks_.emplace_back(static_cast<uint8_t*>(memory));
  }
  uint8_t* slot = chunks_[chunk].get() + (handed_out_ % blocks_per_chunk_) * block_bytes_;
  ++handed_out_;
  return slot;
}

void BlockPool::release(uint8_t* slot) {
  released_.push_back(slot);
  --in_use_;
}

void BlockPool::clear() {
  handed_out_ = 0;
  released_.clear();
  in_use_ = 0;
}

}  // namespace slimkv
