#include "util/system_memory.h"

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

}  // namespace slimkv
