// Asks for a block's cache lines a little at a time, spread over the reading of the block before it: a
// head's blocks are not adjacent in the pool, so the hardware prefetcher starts cold on every block, and
// a whole block asked for at once (88 lines of a 2-bit HACK block, 512 of an FP16 one) stalls on the
// core's few outstanding misses (prefetches hold line-fill buffers too): 11-17% of a batched decode
// step's samples sat on such a loop. Into L2 (prefetcht1), as the kernel's own misses need the L1's
// buffers. Used by the kernels that read a run of blocks (hack_block_attention, dense_block_attention).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace slimkv {

class SpreadPrefetch {
 public:
  // `block` null: nothing to ask for (the run's last block).
  SpreadPrefetch(const uint8_t* block, size_t bytes) : block_(block), bytes_(block ? bytes : 0) {}
  // Asks for the next `bytes` of the block (the lines they start in): a kernel that reads blocks of one
  // size passes what it has just read of the block before, so the next block arrives as fast as this
  // one is read.
  void advance(size_t bytes) {
    wanted_ = std::min(wanted_ + bytes, bytes_);
    for (; offset_ < wanted_; offset_ += 64) __builtin_prefetch(block_ + offset_, 0, 2);
  }
  void finish() { advance(bytes_); }  // what is left (a block whose queries saw few of its tokens)

 private:
  const uint8_t* block_;
  size_t bytes_, wanted_ = 0, offset_ = 0;
};

}  // namespace slimkv
