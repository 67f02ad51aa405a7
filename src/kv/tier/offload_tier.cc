#include "kv/tier/offload_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>

namespace slimkv {

Expected<std::unique_ptr<OffloadTier>> OffloadTier::open(const OffloadConfig& config, int cache_blocks,
                                                         size_t block_bytes, size_t max_blocks) {
  std::error_code ignored;
  const std::string dir = config.dir.empty() ? std::filesystem::temp_directory_path(ignored).string() : config.dir;
  std::string path = dir + "/slimkv-offload-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) return error("offload tier: cannot create a file in '", dir, "': ", std::strerror(errno));
  unlink(path.c_str());  // the file lives as long as the mapping, never longer
  const size_t bytes = std::max<size_t>(1, block_bytes * max_blocks);
  if (ftruncate(fd, off_t(bytes)) != 0) {
    close(fd);
    return error("offload tier: cannot size a file in '", dir, "' to ", bytes, " bytes: ", std::strerror(errno));
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapping == MAP_FAILED) {
    close(fd);
    return error("offload tier: cannot map ", bytes, " bytes of a file in '", dir, "': ", std::strerror(errno));
  }
  return std::unique_ptr<OffloadTier>(
      new OffloadTier(cache_blocks, config.policy, block_bytes, max_blocks, fd, static_cast<uint8_t*>(mapping)));
}

OffloadTier::OffloadTier(int cache_blocks, CachePolicy policy, size_t block_bytes, size_t max_blocks, int fd,
                         uint8_t* mapping)
    : block_bytes_(block_bytes),
      max_blocks_(max_blocks),
      fd_(fd),
      mapping_(mapping),
      scratch_(block_bytes),
      slots_(size_t(cache_blocks) * block_bytes),
      resident_(max_blocks, nullptr),
      cache_(cache_blocks, policy) {}

OffloadTier::~OffloadTier() {
  munmap(mapping_, std::max<size_t>(1, block_bytes_ * max_blocks_));
  close(fd_);
}

int64_t OffloadTier::write(const uint8_t* block) {
  assert(size_t(blocks_) < max_blocks_);
  std::memcpy(mapping_ + size_t(blocks_) * block_bytes_, block, block_bytes_);
  bytes_written_ += block_bytes_;
  return blocks_++;
}

void OffloadTier::stage(const std::vector<int64_t>& ids) {
  cache_.unpin_all();
  for (int64_t id : ids) {
    const uint8_t* slow = mapping_ + size_t(id) * block_bytes_;
    const BlockCache::Lookup lookup = cache_.use(id);
    if (lookup.slot < 0) {  // every slot holds a block of this step: read it where it lies
      resident_[size_t(id)] = slow;
      bytes_moved_ += block_bytes_;
      continue;
    }
    uint8_t* slot = slots_.data() + size_t(lookup.slot) * block_bytes_;
    if (lookup.evicted >= 0) resident_[size_t(lookup.evicted)] = nullptr;
    if (!lookup.hit) {
      std::memcpy(slot, slow, block_bytes_);
      bytes_moved_ += block_bytes_;
    }
    resident_[size_t(id)] = slot;
  }
}

TierStats OffloadTier::stats() const {
  return {cache_.hits(), cache_.misses(), bytes_moved_ + direct_bytes_.load(std::memory_order_relaxed), bytes_written_};
}

void OffloadTier::clear() {
  cache_.clear();
  std::fill(resident_.begin(), resident_.end(), nullptr);
  blocks_ = 0;
  bytes_moved_ = bytes_written_ = 0;
  direct_bytes_ = 0;
}

}  // namespace slimkv
