// Fixed-size, 64-byte-aligned block slots, allocated in chunks so that a long sequence does not make
// thousands of small allocations. Counts what it holds, so memory is measured, not computed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace slimkv {

class BlockPool {
 public:
  explicit BlockPool(size_t block_bytes, size_t blocks_per_chunk = 64);

  uint8_t* allocate();  // a slot of block_bytes(); never moves until clear() or release()
  void release(uint8_t* slot);  // gives one slot back (a sliding-window layer's block left its window)
  void clear();         // forgets every slot (they are reused by later allocations)

  size_t block_bytes() const { return block_bytes_; }
  size_t blocks_in_use() const { return in_use_; }
  size_t bytes_in_use() const { return in_use_ * block_bytes_; }
  size_t bytes_reserved() const { return chunks_.size() * chunk_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  size_t block_bytes_;   // rounded up to 64
  size_t blocks_per_chunk_;
  size_t chunk_bytes_;
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> chunks_;
  size_t handed_out_ = 0;          // slots ever taken from the chunks since clear()
  std::vector<uint8_t*> released_;  // of those, the ones given back: allocate() takes these first
  size_t in_use_ = 0;
};

}  // namespace slimkv
