#include "util/system_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fstream>
#include <string>

namespace slimkv {

size_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.starts_with("MemAvailable:")) return std::stoull(line.substr(13)) * 1024;  // "...  123 kB"
  }
  return size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
}

void return_free_heap_to_os() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void assign_zeroed(std::vector<uint8_t>& out, size_t bytes) {
  out.clear();
  if (out.capacity() < bytes) {
    std::vector<uint8_t>().swap(out);
    out.reserve(bytes);  // allocated, not touched yet
    constexpr uintptr_t kPage = 4096;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(out.data()) + kPage - 1) & ~(kPage - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(out.data()) + bytes) & ~(kPage - 1);
    if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: ignored where unsupported
  }
  out.resize(bytes);
}

void assign_for_overwrite(std::vector<uint8_t>& out, size_t bytes) {
  if (out.capacity() < bytes) return assign_zeroed(out, bytes);
  out.resize(bytes);
}

}  // namespace slimkv
