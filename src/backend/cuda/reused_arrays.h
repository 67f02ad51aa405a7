// Arrays kept for reuse (PinnedArray, DeviceArray), since allocating them costs the driver milliseconds
// per hundred megabytes and freeing device memory waits for the whole GPU: take() hands out one of at
// least n elements, which comes back to the pool when its last owner lets it go, on any thread. The
// arrays are freed with the pool (the last of it and its arrays' owners).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "slimkv/status.h"

namespace slimkv::cuda {

template <typename Array>
class ReusedArrays : public std::enable_shared_from_this<ReusedArrays<Array>> {
 public:
  static std::shared_ptr<ReusedArrays> create() { return std::shared_ptr<ReusedArrays>(new ReusedArrays()); }

  Expected<std::shared_ptr<Array>> take(size_t n, const char* what) {
    Array array;
    {
      const std::lock_guard lock(mutex_);
      // The smallest free one that holds n; none: a new one.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->size() >= n && (best == free_.end() || it->size() < best->size())) best = it;
      }
      if (best != free_.end()) {
        array = std::move(*best);
        free_.erase(best);
      }
    }
    if (array.size() < n) {
      SLIMKV_ASSIGN_OR_RETURN(array, Array::allocate(n, what));
    }
    return std::shared_ptr<Array>(new Array(std::move(array)), [pool = this->shared_from_this()](Array* given_back) {
      {
        const std::lock_guard lock(pool->mutex_);
        pool->free_.push_back(std::move(*given_back));
      }
      delete given_back;
    });
  }

 private:
  ReusedArrays() = default;
  std::mutex mutex_;
  std::vector<Array> free_;
};

}  // namespace slimkv::cuda
