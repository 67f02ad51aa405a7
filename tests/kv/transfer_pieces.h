// A store's transfer as a KV stream sender ships it in pieces (kv/transfer.h): the head, each layer's
// first `early` sealed blocks (write_kv_transfer_blocks, as a chunked prefill sends them), then the rest
// of the layer with its open tokens (write_kv_transfer_layer from there), put back in the transfer's
// order — each layer's sealed bytes head by head, a head's early blocks then its rest, in slots of the
// head's own size (version 2) — with the trailer. Each piece's head CRCs are checked against its bytes.
// For stores whose layers hold the same tokens (an engine's). Shared by the transfer and head-bits tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "kv/store.h"
#include "kv/transfer.h"

namespace slimkv::test {

inline std::vector<uint8_t> transfer_from_pieces(const KvStore& store, std::string_view model, int early) {
  std::vector<uint8_t> head;
  EXPECT_TRUE(write_kv_transfer_head(store, model, store.num_tokens(0), head));
  Expected<KvTransferInfo> info = inspect_kv_transfer_head(head.data(), head.size(), "the pieces' head");
  EXPECT_TRUE(info) << info.status().message();
  if (!info) return {};
  const auto slot = [&](int l, int g) {
    const uint64_t bytes = info->head_block_bytes.empty() ? info->sealed_block_bytes
                                                          : info->head_block_bytes[size_t(l) * size_t(info->shape.num_kv_heads) + size_t(g)];
    return size_t((bytes + 63) / 64 * 64);
  };
  std::vector<uint8_t> sealed, open;
  for (int l = 0; l < info->shape.num_layers; ++l) {
    const int blocks = store.num_sealed_blocks(l), first = std::min(early, blocks);
    std::vector<uint8_t> early_bytes, layer_bytes;
    std::vector<uint32_t> early_crcs, part_crcs;
    size_t layer_sealed = 0;
    EXPECT_TRUE(write_kv_transfer_blocks(store, l, 0, first, early_bytes, &early_crcs));
    EXPECT_TRUE(write_kv_transfer_layer(store, l, first, layer_bytes, layer_sealed, &part_crcs));
    size_t early_at = 0, rest_at = 0;
    for (int g = 0; g < info->shape.num_kv_heads; ++g) {
      const size_t early_size = size_t(first) * slot(l, g), rest_size = size_t(blocks - first) * slot(l, g);
      EXPECT_EQ(crc32c(early_bytes.data() + early_at, early_size), early_crcs[size_t(g)]) << "layer " << l << " head " << g;
      EXPECT_EQ(crc32c(layer_bytes.data() + rest_at, rest_size), part_crcs[size_t(g)]) << "layer " << l << " head " << g;
      sealed.insert(sealed.end(), early_bytes.begin() + std::ptrdiff_t(early_at), early_bytes.begin() + std::ptrdiff_t(early_at + early_size));
      sealed.insert(sealed.end(), layer_bytes.begin() + std::ptrdiff_t(rest_at), layer_bytes.begin() + std::ptrdiff_t(rest_at + rest_size));
      early_at += early_size;
      rest_at += rest_size;
    }
    EXPECT_EQ(early_at, early_bytes.size()) << "layer " << l;
    EXPECT_EQ(rest_at, layer_sealed) << "layer " << l;
    open.insert(open.end(), layer_bytes.begin() + std::ptrdiff_t(layer_sealed), layer_bytes.end());
  }
  std::vector<uint8_t> assembled = head;
  assembled.insert(assembled.end(), sealed.begin(), sealed.end());
  assembled.insert(assembled.end(), open.begin(), open.end());
  const auto trailer = kv_transfer_trailer(crc32c(assembled.data(), assembled.size()));
  assembled.insert(assembled.end(), trailer.begin(), trailer.end());
  return assembled;
}

}  // namespace slimkv::test
