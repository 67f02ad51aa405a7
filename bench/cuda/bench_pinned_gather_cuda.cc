// Warp reads of scattered 256-byte rows from host memory mapped into the GPU (issue 25): does reading
// PQCache's ~1.1K selected tokens per KV head grow with the pool they sit in (16 MB: an 8K context's
// layer; 512 MB: beyond a 128K context's 256 MB) because each row lands on its own 4 KB page and the
// GPU's address translation misses, not the bytes, bound the reads? Side by side, the same number of
// rows (random, distinct, ascending as the selection's gather reads them) from:
//   driver   cudaHostAlloc(Mapped): what pinned_allocate and the pq@offload pools use today
//   4K       mmap + madvise(MADV_NOHUGEPAGE) + cudaHostRegister(Mapped | Portable)
//   thp      mmap 2 MB-aligned + madvise(MADV_HUGEPAGE) + cudaHostRegister: 2 MB pages where THP gives them
//   hugetlb  mmap(MAP_HUGETLB) + cudaHostRegister: reserved 2 MB pages (vm.nr_hugepages), else skipped
//   device   GPU memory, for scale
// with how much of each buffer the OS backed with 2 MB pages (/proc/self/smaps), the 4 KB and 2 MB pages
// a launch touches, µs per launch (median; L2 flushed before each, every launch other rows), GB/s, and
// the ratio to the smallest buffer of the same pages.
//
//   bench_pinned_gather_cuda --sizes-mb 16,512 --rows 8704
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/row_gather.h"
#include "bench_errors.h"

namespace slimkv::cuda {
namespace {

struct Options {
  std::vector<int> sizes_mb = {16, 512};
  int rows = 8704;  // 8 KV heads × (1024 kept + 64 local): one layer's selection at topk=1024
  int row_bytes = 256;  // a 128-dim FP16 key (or value)
  int repetitions = 21;
  uint64_t seed = 1;
};

// Bytes of [pointer, pointer + bytes) that the kernel backs with 2 MB pages: AnonHugePages (THP), or
// the whole range where the mapping's kernel page size is 2 MB (hugetlb); -1 when smaps is unreadable.
long long huge_backed_bytes(const void* pointer, size_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const auto at = reinterpret_cast<uintptr_t>(pointer);
  long long huge = 0;
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin < at + bytes && at < end;
      continue;
    }
    if (!inside) continue;
    std::istringstream field(line);
    std::string name;
    long long kb = 0;
    field >> name >> std::dec >> kb;
    if (name == "AnonHugePages:") huge += kb * 1024;
    if (name == "KernelPageSize:" && kb == 2048) return (long long)bytes;
  }
  return std::min(huge, (long long)bytes);  // the mapping may have merged with a neighbour
}

// A buffer of one kind, or why there is none.
struct Buffer {
  std::string pages;
  uint8_t* data = nullptr;
  long long huge_bytes = 0;
  PinnedArray<uint8_t> driver;
  RegisteredHostMemory registered;
  DeviceArray<uint8_t> device;
};

Expected<Buffer> make_buffer(const std::string& pages, size_t bytes) {
  Buffer b;
  b.pages = pages;
  if (pages == "driver") {
    SLIMKV_ASSIGN_OR_RETURN(b.driver, PinnedArray<uint8_t>::allocate(bytes, "the gather bench's rows"));
    b.data = b.driver.data();
  } else if (pages == "device") {
    SLIMKV_ASSIGN_OR_RETURN(b.device, DeviceArray<uint8_t>::allocate(bytes, "the gather bench's rows"));
    SLIMKV_RETURN_IF_ERROR(device_fill_bytes(b.device.data(), 0, bytes));
    b.data = b.device.data();
    return b;
  } else {
    const HostPageSize size = pages == "4K"    ? HostPageSize::k4K
                              : pages == "thp" ? HostPageSize::kTransparentHuge
                                               : HostPageSize::kHugeTlb;
    SLIMKV_ASSIGN_OR_RETURN(b.registered, RegisteredHostMemory::allocate(bytes, size, "the gather bench's rows"));
    b.data = static_cast<uint8_t*>(b.registered.data());
  }
  b.huge_bytes = huge_backed_bytes(b.data, bytes);
  return b;
}

// `sets` launches' worth of row offsets: each set `rows` distinct rows of the buffer, ascending.
std::vector<std::vector<long long>> row_offsets(const Options& o, size_t bytes, int sets) {
  std::mt19937_64 rng(o.seed);
  const long long slots = (long long)(bytes / size_t(o.row_bytes));
  std::uniform_int_distribution<long long> pick(0, slots - 1);
  std::vector<std::vector<long long>> all;
  for (int s = 0; s < sets; ++s) {
    std::set<long long> chosen;
    while ((long long)chosen.size() < std::min<long long>(o.rows, slots)) chosen.insert(pick(rng));
    std::vector<long long> offsets;
    for (long long r : chosen) offsets.push_back(r * o.row_bytes);
    all.push_back(std::move(offsets));
  }
  return all;
}

size_t pages_touched(const std::vector<long long>& offsets, long long page_bytes) {
  std::set<long long> pages;
  for (long long o : offsets) pages.insert(o / page_bytes);
  return pages.size();
}

struct Measured {
  double us = 0;
  size_t pages_4k = 0, pages_2m = 0;
};

// The median of `repetitions` launches, each reading its own set of rows after an L2 flush.
Expected<Measured> measure(const Options& o, const Buffer& buffer, size_t bytes, DeviceArray<uint8_t>& flush) {
  const int sets = o.repetitions + 2;
  const std::vector<std::vector<long long>> offsets = row_offsets(o, bytes, sets);
  const int rows = int(offsets[0].size());
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<long long> device_offsets, DeviceArray<long long>::allocate(size_t(sets) * rows, "offsets"));
  for (int s = 0; s < sets; ++s) {
    SLIMKV_RETURN_IF_ERROR(copy_to_device(device_offsets.data() + size_t(s) * rows, offsets[size_t(s)].data(),
                                          size_t(rows) * sizeof(long long)));
  }
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<uint8_t> out, DeviceArray<uint8_t>::allocate(size_t(rows) * o.row_bytes, "rows read"));
  cudaEvent_t start, stop;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> us;
  Status status = Status::ok();
  for (int s = 0; s < sets && status.is_ok(); ++s) {
    status = device_fill_bytes(flush.data(), s, flush.bytes());
    if (!status.is_ok()) break;
    cudaEventRecord(start);
    status = gather_rows({buffer.data, device_offsets.data() + size_t(s) * rows, rows, o.row_bytes, out.data()});
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (s >= 2) us.push_back(double(ms) * 1e3);  // two warm-up launches
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  SLIMKV_RETURN_IF_ERROR(status);
  SLIMKV_RETURN_IF_ERROR(device_synchronize("the gather launches"));
  std::sort(us.begin(), us.end());
  return Measured{us[us.size() / 2], pages_touched(offsets[0], 4096), pages_touched(offsets[0], 2 << 20)};
}

Status run(const Options& o) {
  SLIMKV_RETURN_IF_ERROR(device_usable());
  // Larger than the H100's 50 MB L2: rewriting it evicts the rows the last launch read.
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<uint8_t> flush, DeviceArray<uint8_t>::allocate(size_t(256) << 20, "the L2 flush"));
  std::printf("# %d rows of %d bytes per launch, warp per row (8-byte lanes); median of %d launches; seed %llu\n",
              o.rows, o.row_bytes, o.repetitions, (unsigned long long)o.seed);
  std::printf("%-8s %9s %9s %9s %9s %10s %9s %14s\n", "pages", "buffer MB", "2M-backed", "4K pages", "2M pages",
              "us/launch", "GB/s", "vs smallest");
  std::map<std::string, double> smallest_us;
  for (const std::string pages : {"driver", "4K", "thp", "hugetlb", "device"}) {
    for (const int mb : o.sizes_mb) {
      const size_t bytes = size_t(mb) << 20;
      Expected<Buffer> buffer = make_buffer(pages, bytes);
      if (!buffer.has_value()) {
        std::printf("# %s %d MB: %s\n", pages.c_str(), mb, buffer.status().message().c_str());
        continue;
      }
      SLIMKV_ASSIGN_OR_RETURN(const Measured m, measure(o, *buffer, bytes, flush));
      if (!smallest_us.count(pages)) smallest_us[pages] = m.us;
      const std::string backed = pages == "device" ? "-"
                                 : buffer->huge_bytes < 0 ? "?"
                                                          : str_cat(int(100.0 * double(buffer->huge_bytes) / double(bytes)), "%");
      std::printf("%-8s %9d %9s %9zu %9zu %10.1f %9.2f %13.2fx\n", pages.c_str(), mb, backed.c_str(), m.pages_4k,
                  m.pages_2m, m.us, double(o.rows) * o.row_bytes / (m.us * 1e3), m.us / smallest_us[pages]);
    }
  }
  return Status::ok();
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  slimkv::cuda::Options o;
  CLI::App app{"Scattered row reads from mapped pinned host memory: 4 KB vs 2 MB pages, small vs large buffers (issue 25)"};
  app.add_option("--sizes-mb", o.sizes_mb, "buffer sizes in MB")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--rows", o.rows, "rows read per launch")->check(CLI::PositiveNumber);
  app.add_option("--row-bytes", o.row_bytes, "bytes per row (a multiple of 8)")->check(CLI::PositiveNumber);
  app.add_option("--repetitions", o.repetitions, "timed launches")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "the rows' random seed");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (slimkv::cuda::failed(slimkv::cuda::run(o))) return 1;
  return 0;
}
