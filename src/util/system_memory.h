// How much memory the machine can give this process now: Linux's MemAvailable (free memory plus what
// the kernel can reclaim without swapping), for budgets sized "within what is free" by default.
#pragma once

#include <cstddef>

namespace slimkv {

// MemAvailable from /proc/meminfo in bytes; where that cannot be read, the free physical pages.
size_t available_memory_bytes();

}  // namespace slimkv
