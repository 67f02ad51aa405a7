// Fuzzes the KV transfer reader: any bytes must give either an error naming the source, or a restored
// store that attends without fault and writes back the very same bytes (the format is canonical).
// Each input is read twice: as it is, and with both CRC32Cs repaired, so that mutations reach the
// checks behind the checksums. The receiver matches tests/kv/transfer_test.cc's fuzz_receiver.
// Seeds: fuzz/corpus/kv_transfer_fuzz/ (written by that test's DISABLED_WriteFuzzSeeds).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kv/store_attention.h"
#include "kv/transfer.h"

namespace {

constexpr const char* kModel = "fuzz-model";

// The specs the seed corpus (fuzz/corpus/kv_transfer_fuzz) was written with: version 1, and version 3
// (FP16 sinks and a recent window). A transfer is read into the one its spec names (else the first, which
// refuses it), so that mutations reach the checks of both.
const slimkv::KvPipeline& receiver_pipeline(const std::string& spec) {
  static const slimkv::KvPipeline plain = *slimkv::make_kv_pipeline("hack:bits=2,pi=32,round=stochastic");
  static const slimkv::KvPipeline exact_tokens =
      *slimkv::make_kv_pipeline("hack:bits=2,pi=32,round=stochastic,sinks=4,window=40");
  return spec == exact_tokens.describe() ? exact_tokens : plain;
}

void store_u32(uint8_t* p, uint32_t value) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(value >> (8 * i));
}

void read_one(const uint8_t* data, size_t size) {
  auto info = slimkv::inspect_kv_transfer(data, size, "fuzz");
  if (!info.has_value()) {
    if (info.status().message().rfind("kv transfer 'fuzz'", 0) != 0) std::abort();
    return;
  }
  // The receiver's context is the sender's, so that a successful read writes back identical bytes.
  slimkv::KvStore store({2, 2, 16, 16, info->shape.max_tokens}, receiver_pipeline(info->spec));
  const slimkv::Status status = slimkv::read_kv_transfer(data, size, "fuzz", kModel, store);
  if (!status.is_ok()) {
    if (status.message().rfind("kv transfer 'fuzz'", 0) != 0) std::abort();
    return;
  }
  std::vector<uint8_t> again;
  if (!slimkv::write_kv_transfer(store, kModel, again).is_ok()) std::abort();
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  // Attention over whatever the blocks hold (codes are any bits; mins and scales any FP16) must not fault.
  static slimkv::ThreadPool pool(1);
  for (int l = 0; l < 2; ++l) {
    const int tokens = store.num_tokens(l);
    if (tokens == 0) continue;
    std::vector<float> q(4 * 16, 0.5f), out(4 * 16);
    slimkv::attend(store, l, q.data(), 1, tokens - 1, {4, 0.25f, &pool}, out.data());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_one(data, size);
  if (size >= slimkv::kKvTransferHeaderBytes + slimkv::kKvTransferTrailerBytes) {
    std::vector<uint8_t> repaired(data, data + size);
    store_u32(repaired.data() + 124, slimkv::crc32c(repaired.data(), 124));
    const size_t trailer = size - slimkv::kKvTransferTrailerBytes;
    store_u32(repaired.data() + trailer, slimkv::crc32c(repaired.data(), trailer));
    read_one(repaired.data(), repaired.size());
  }
  return 0;
}
