// A 64-bit checksum of GPU memory computed on the GPU, for checking that gigabytes of KV arrived intact
// without copying them to the host first (a 64K-token dense KV of a Llama-3-8B shape is 8.6 GB: its
// host export alone took ~17 s).
//
// The checksum is the sum, modulo 2^64, of a strong 64-bit mix (splitmix64's finalizer) of each 8-byte
// word keyed by the word's position, plus a mix of the length: any change of a word changes its term
// to an unrelated value, so two different buffers agree with probability about 2^-64, and moving a
// word changes its key. A sum lets every thread add its words in any order. Not a CRC: it is not
// stored or sent anywhere, only compared between two processes that computed it the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// The checksum of `bytes` bytes at `device` (8-byte aligned: an allocation's base, or an offset into
// one that is a multiple of 8) on the current GPU; the last partial word is taken zero-padded. Waits
// for the result.
Expected<uint64_t> device_checksum(const void* device, size_t bytes);

}  // namespace slimkv::cuda
