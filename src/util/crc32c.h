// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF), the
// checksum of the KV transfer format (docs/kv_transfer_format.md) and of the KV stream's frames. The
// CRC of "123456789" is 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slimkv {

// Chains: crc32c(b, nb, crc32c(a, na)) is the CRC of a followed by b. SSE 4.2's crc32 instruction where
// the CPU has it (three streams at once), else crc32c_portable.
uint32_t crc32c(const uint8_t* data, size_t size, uint32_t crc = 0);

// The CRC of a followed by b from crc32c(a), crc32c(b) and b's size, without reading either again: a
// piece checksummed once serves both orders it is checked in (a KV stream frame's, and the transfer's
// whose pieces travel in other frames). O(log size_b).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

// Copies n bytes from src to dst and returns their CRC chained on `crc`, as crc32c(dst, n, crc), reading
// each piece back while it is still in cache: one pass over memory where a copy then a CRC take two.
uint32_t crc32c_copy(uint8_t* dst, const uint8_t* src, size_t n, uint32_t crc = 0);

// The same CRC from tables (slice-by-8) on every CPU: what the tests compare the hardware path with.
uint32_t crc32c_portable(const uint8_t* data, size_t size, uint32_t crc = 0);

}  // namespace slimkv
