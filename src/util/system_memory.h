// This process's memory beside the machine's: how much the machine can give it now (Linux's
// MemAvailable: free memory plus what the kernel can reclaim without swapping), for budgets sized
// "within what is free" by default; and giving back what the heap holds free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace slimkv {

// MemAvailable from /proc/meminfo in bytes; where that cannot be read, the free physical pages.
size_t available_memory_bytes();

// Returns the heap's free pages to the operating system (glibc's malloc_trim, over every arena). A
// server's heap keeps the high-water mark of its busiest moment (many long sequences at once) long after
// they ended; an idle server calls this so that its resident memory is what it holds, not what it held.
// A no-op where the C library has no such call.
void return_free_heap_to_os();

// Makes `out` hold `bytes` zero bytes. A new allocation is first marked for transparent huge pages
// (madvise; the kernel's "madvise" THP mode, Debian's default), so that touching it faults once per
// 2 MiB instead of once per 4 KiB: a KV transfer's gigabytes are a fresh buffer per request, and on this
// VM 4 KiB faults fill fresh memory at 0.8-2 GB/s, huge pages at ~4 GB/s. Where THP is off, plain pages.
void assign_zeroed(std::vector<uint8_t>& out, size_t bytes);
// Makes `out` hold `bytes` bytes for a caller that writes every one of them: what `out` already held
// stays as it was (no pass over it; a reused buffer of a transfer at least this large costs nothing),
// only bytes beyond its old size are zeroed; a larger allocation is made as assign_zeroed makes it.
void assign_for_overwrite(std::vector<uint8_t>& out, size_t bytes);

}  // namespace slimkv
