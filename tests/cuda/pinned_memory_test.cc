// Pinned host memory mapped into the GPU (backend/cuda/pinned_memory.h) on each page size that
// SLIMKV_HOST_PAGES names: the GPU reads through the mapping the bytes the host wrote, an array freed
// and allocated again works, and a value not understood is refused naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/row_gather.h"
#include "cuda_test_util.h"

namespace slimkv::cuda {
namespace {

using PinnedMemoryTest = CudaTest;

// Sets SLIMKV_HOST_PAGES for a scope, then restores what it was.
class HostPagesVariable {
 public:
  explicit HostPagesVariable(const char* value) {
    if (const char* old = std::getenv(kName); old != nullptr) old_ = old;
    setenv(kName, value, 1);
  }
  ~HostPagesVariable() {
    if (old_.empty()) {
      unsetenv(kName);
    } else {
      setenv(kName, old_.c_str(), 1);
    }
  }

 private:
  static constexpr const char* kName = "SLIMKV_HOST_PAGES";
  std::string old_;
};

TEST_F(PinnedMemoryTest, TheGpuReadsWhatTheHostWroteOnEachPageSize) {
  for (const char* pages : {"", "driver", "4K", "thp"}) {
    SCOPED_TRACE(std::string("SLIMKV_HOST_PAGES=") + pages);
    const HostPagesVariable variable(pages);
    for (int round = 0; round < 2; ++round) {  // the second allocation after the first is freed
      const size_t bytes = (size_t(3) << 20) + 4096 * size_t(round);  // not a whole number of 2 MB pages
      auto host = take(PinnedArray<uint8_t>::allocate(bytes, "the test's rows"));
      ASSERT_NE(host.data(), nullptr);
      for (size_t i = 0; i < bytes; ++i) host.data()[i] = uint8_t(i * 7 + size_t(round));
      // Rows of 256 bytes 1 MB apart, and the last one.
      std::vector<long long> offsets = {0, 1 << 20, 2 << 20, (long long)(bytes) - 256};
      auto device_offsets = on_device(offsets);
      auto out = take(DeviceArray<uint8_t>::allocate(offsets.size() * 256, "rows read"));
      SLIMKV_ASSERT_OK(gather_rows({host.data(), device_offsets.data(), int(offsets.size()), 256, out.data()}));
      const std::vector<uint8_t> got = on_host(out);
      int mismatches = 0;
      for (size_t r = 0; r < offsets.size(); ++r) {
        for (size_t b = 0; b < 256; ++b) mismatches += got[r * 256 + b] != host.data()[size_t(offsets[r]) + b];
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

TEST_F(PinnedMemoryTest, RefusesAPageSizeNotUnderstood) {
  const HostPagesVariable variable("huge");
  const Expected<PinnedArray<uint8_t>> host = PinnedArray<uint8_t>::allocate(4096, "the test's rows");
  ASSERT_FALSE(host.has_value());
  EXPECT_NE(host.status().message().find("SLIMKV_HOST_PAGES=huge"), std::string::npos) << host.status().message();
}

}  // namespace
}  // namespace slimkv::cuda
