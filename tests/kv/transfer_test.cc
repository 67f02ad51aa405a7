// The KV transfer format: round trips that must be lossless (the same bytes written again, the same
// attention bit for bit, the same blocks sealed when appending continues), then every way an input can
// be cut, corrupted or meant for another receiver, each an error that names what is wrong.
#include "kv/transfer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kv/store_attention.h"
#include "kv/transfer_pieces.h"
#include "source_dir.h"

namespace slimkv {
namespace {

constexpr const char* kModel = "slimkv-test-model@1";

// --- helpers ----------------------------------------------------------------------------------

struct TransferCase {
  std::string spec;
  int tokens;  // layer l holds max(0, tokens - l) tokens: the layers differ, as mid-prefill
  int num_layers, num_heads, num_kv_heads, head_dim;
  std::string name() const {
    return str_cat("transfer(kv=", spec, ",tokens=", tokens, ",layers=", num_layers, ",heads=", num_heads, "/",
                   num_kv_heads, ",d=", head_dim, ")");
  }
  int layer_tokens(int layer) const { return std::max(0, tokens - layer); }
};

KvPipeline pipeline_of(const std::string& spec) {
  auto pipeline = make_kv_pipeline(spec);
  EXPECT_TRUE(pipeline) << pipeline.status().message();
  return *pipeline;
}

// Appends `n` random tokens to every layer of the store, in chunks of 7 (chunks cross block edges).
void append_random(KvStore& store, const std::vector<int>& layer_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const KvShape& shape = store.shape();
  for (int l = 0; l < shape.num_layers; ++l) {
    for (int done = 0; done < layer_tokens[size_t(l)];) {
      const int n = std::min(7, layer_tokens[size_t(l)] - done);
      std::vector<float> k(size_t(n) * shape.num_kv_heads * shape.k_dim), v(size_t(n) * shape.num_kv_heads * shape.v_dim);
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      store.append(l, k.data(), v.data(), n);
      done += n;
    }
  }
}

std::vector<uint8_t> write(const KvStore& store, std::string_view model = kModel) {
  std::vector<uint8_t> bytes;
  const Status status = write_kv_transfer(store, model, bytes);
  EXPECT_TRUE(status.is_ok()) << status.message();
  return bytes;
}

Status read(const std::vector<uint8_t>& bytes, KvStore& into, std::string_view model = kModel) {
  return read_kv_transfer(bytes.data(), bytes.size(), "test", model, into);
}

// A transfer restored from its pieces as a KV stream receiver restores it (kv/transfer.h): the head
// checked, each layer's sealed blocks in runs of `run` blocks per head, its open tokens, then the trailer
// against the CRC of the bytes before it. The first error.
Status restore_in_pieces(const std::vector<uint8_t>& bytes, const KvTransferInfo& info, int run, KvStore& into) {
  SLIMKV_RETURN_IF_ERROR(check_kv_transfer_head_for(info, "test", kModel, into));
  into.clear();
  const uint64_t stride = (info.sealed_block_bytes + 63) / 64 * 64;
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  for (int l = 0; l < info.shape.num_layers; ++l) {
    const int blocks = kv_transfer_sealed_blocks(info, l);
    for (int g = 0; g < info.shape.num_kv_heads; ++g) {
      for (int b = 0; b < blocks; b += run) {
        const uint8_t* slots = bytes.data() + ranges[size_t(l)].sealed_offset + (uint64_t(g) * uint64_t(blocks) + uint64_t(b)) * stride;
        SLIMKV_RETURN_IF_ERROR(restore_kv_transfer_blocks(slots, std::min(run, blocks - b), info, l, g, b, "test", into));
      }
    }
    SLIMKV_RETURN_IF_ERROR(restore_kv_transfer_open(bytes.data() + ranges[size_t(l)].open_offset, info, l, "test", into));
  }
  return check_kv_transfer_trailer(bytes.data() + info.trailer_offset, info, crc32c(bytes.data(), info.trailer_offset), "test");
}

// Attention of the last min(3, tokens) positions of every layer, over `store`.
std::vector<float> attend_all(const KvStore& store, int num_heads, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const KvShape& shape = store.shape();
  std::vector<float> outputs;
  for (int l = 0; l < shape.num_layers; ++l) {
    const int tokens = store.num_tokens(l), n = std::min(3, tokens);
    if (n == 0) continue;
    std::vector<float> q(size_t(n) * num_heads * shape.k_dim), out(size_t(n) * num_heads * shape.v_dim, NAN);
    for (float& x : q) x = normal(rng);
    ThreadPool pool(1);
    attend(store, l, q.data(), n, tokens - n, {num_heads, 1.0f / std::sqrt(float(shape.k_dim)), &pool}, out.data());
    outputs.insert(outputs.end(), out.begin(), out.end());
  }
  return outputs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Sets a little-endian u32 field and repairs both checksums, so that a test reaches the check behind them.
void patch_u32(std::vector<uint8_t>& bytes, size_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + size_t(i)] = uint8_t(value >> (8 * i));
}
void repair_checksums(std::vector<uint8_t>& bytes) {
  patch_u32(bytes, 124, crc32c(bytes.data(), 124));
  const size_t trailer = bytes.size() - kKvTransferTrailerBytes;
  patch_u32(bytes, trailer, crc32c(bytes.data(), trailer));
}

::testing::AssertionResult fails_mentioning(const Status& status, const std::vector<std::string>& parts) {
  if (status.is_ok()) return ::testing::AssertionFailure() << "succeeded";
  for (const std::string& part : parts) {
    if (status.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << part << "': " << status.message();
    }
  }
  return ::testing::AssertionSuccess();
}

// A small hack-encoded store: 2 layers, 2 KV heads, d = 16, Π = 32; 40 and 39 tokens.
KvStore small_store(const std::string& spec = "hack:bits=2,pi=32", int max_tokens = 64) {
  KvStore store({2, 2, 16, 16, max_tokens}, pipeline_of(spec));
  std::mt19937 rng(7);
  append_random(store, {40, 39}, rng);
  return store;
}

// --- the checksum ------------------------------------------------------------------------------

TEST(KvTransfer, Crc32cMatchesTheStandardCheckValueAndChains) {
  const std::string text = "123456789";
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  EXPECT_EQ(crc32c(bytes, text.size()), 0xE3069283u);  // the CRC-32C check value (RFC 3720 B.4 family)
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  for (size_t split = 0; split <= text.size(); ++split) {
    EXPECT_EQ(crc32c(bytes + split, text.size() - split, crc32c(bytes, split)), 0xE3069283u) << split;
  }
  std::vector<uint8_t> zeros(32, 0);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
}

// --- lossless round trips ------------------------------------------------------------------------

void check_round_trip(const TransferCase& c) {
  SCOPED_TRACE(c.name());
  const unsigned seed = 99u + unsigned(c.tokens * 13 + c.head_dim);
  std::mt19937 rng(seed);
  const int grow = 70;  // tokens appended after the transfer, to check that sealing continues alike
  const KvShape shape{c.num_layers, c.num_kv_heads, c.head_dim, c.head_dim, c.tokens + grow};
  KvStore original(shape, pipeline_of(c.spec));
  std::vector<int> layer_tokens(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) layer_tokens[size_t(l)] = c.layer_tokens(l);
  append_random(original, layer_tokens, rng);

  const std::vector<uint8_t> bytes = write(original);
  ASSERT_EQ(bytes.size() % 16, 0u);
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->spec, original.pipeline().describe());
  EXPECT_EQ(info->model_id, kModel);
  EXPECT_EQ(info->layer_tokens, layer_tokens);
  EXPECT_EQ(info->total_bytes, bytes.size());

  // The receiver holds another sequence first: reading replaces it.
  KvStore restored(shape, pipeline_of(c.spec));
  std::mt19937 other_rng(seed + 1);
  append_random(restored, std::vector<int>(size_t(c.num_layers), 5), other_rng);
  const Status status = read(bytes, restored);
  ASSERT_TRUE(status.is_ok()) << status.message() << " seed " << seed;

  for (int l = 0; l < c.num_layers; ++l) {
    ASSERT_EQ(restored.num_tokens(l), original.num_tokens(l));
    ASSERT_EQ(restored.num_sealed_blocks(l), original.num_sealed_blocks(l));
  }
  EXPECT_EQ(write(restored), bytes) << "write → read → write changed the bytes";
  // Piece by piece, as a KV stream's receiver restores a transfer while it arrives (runs of 3 blocks
  // here): the same store.
  KvStore pieces(shape, pipeline_of(c.spec));
  const Status in_pieces = restore_in_pieces(bytes, *info, 3, pieces);
  ASSERT_TRUE(in_pieces.is_ok()) << in_pieces.message();
  EXPECT_EQ(write(pieces), bytes) << "restoring in pieces differs from reading the whole";
  EXPECT_TRUE(same_bits(attend_all(restored, c.num_heads, seed), attend_all(original, c.num_heads, seed)))
      << "attention over the restored store differs, seed " << seed;

  // Both go on alike: the same tokens seal into the same blocks (the seeds follow the block's identity).
  std::mt19937 rng_a(seed + 2), rng_b(seed + 2);
  const std::vector<int> more(size_t(c.num_layers), grow);
  append_random(original, more, rng_a);
  append_random(restored, more, rng_b);
  EXPECT_EQ(write(restored), write(original)) << "appending after the transfer diverged";
  EXPECT_TRUE(same_bits(attend_all(restored, c.num_heads, seed), attend_all(original, c.num_heads, seed)));
}

TEST(KvTransfer, RoundTripIsLosslessForEveryCodecAndLength) {
  // prefill=quantized: attention then reads only what the stores hold (with prefill=exact the sender
  // would read its last appended chunk from scratch, which is not part of the KV and is not sent).
  const std::vector<std::string> specs = {"dense", "dense:dtype=f16", "hack:bits=2,pi=64,prefill=quantized",
                                          "quant:bits=4,pi=32,prefill=quantized",
                                          "hack:bits=2,pi=64,rot=hadamard,prefill=quantized"};
  struct Shape {
    int num_layers, num_heads, num_kv_heads, head_dim;
  };
  const std::vector<Shape> shapes = {{2, 8, 2, 64}, {3, 4, 1, 128}};  // GQA 4 and 4 (MQA)
  for (const std::string& spec : specs) {
    for (const Shape& s : shapes) {
      for (const int tokens : {0, 1, 63, 64, 65, 200}) {
        check_round_trip({spec, tokens, s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim});
      }
    }
  }
}

TEST(KvTransfer, SectionsAreAlignedForUseInPlace) {
  const KvStore store = small_store();
  const std::vector<uint8_t> bytes = write(store);
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  // Header fields 64..112: metadata, sealed and open offsets and sizes; all multiples of 64.
  for (size_t at = 64; at < 112; at += 8) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[at + size_t(i)];
    EXPECT_EQ(value % kKvTransferAlignment, 0u) << "header field at byte " << at;
  }
  // The first sealed block lies at the sealed offset, byte for byte as stored.
  uint64_t sealed_offset = 0;
  for (int i = 7; i >= 0; --i) sealed_offset = (sealed_offset << 8) | bytes[80 + size_t(i)];
  EXPECT_EQ(std::memcmp(bytes.data() + sealed_offset, store.sealed_block(0, 0, 0), info->sealed_block_bytes), 0);
}

TEST(KvTransfer, FilesRoundTripAndMissingFilesNameThePath) {
  const KvStore store = small_store();
  const std::string path =
      (std::filesystem::temp_directory_path() / str_cat("slimkv_transfer_", ::getpid(), ".kvx")).string();
  ASSERT_TRUE(write_kv_transfer_file(store, kModel, path).is_ok());
  KvStore restored({2, 2, 16, 16, 64}, pipeline_of("hack:bits=2,pi=32"));
  const Status status = read_kv_transfer_file(path, kModel, restored);
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(write(restored), write(store));
  std::filesystem::remove(path);
  EXPECT_TRUE(fails_mentioning(read_kv_transfer_file(path, kModel, restored), {path}));
}

// A transfer's CRC computed by its receiver as the bytes arrived stands in for the reader's pass over
// them, so it must be compared with the trailer: a wrong one is refused. A file has none: a flipped
// byte in its sealed blocks is found by the reader's own pass.
TEST(KvTransfer, AReceivedCrcIsComparedAndAFileIsStillChecksummed) {
  const KvStore store = small_store();
  const std::vector<uint8_t> bytes = write(store);
  const size_t body = bytes.size() - kKvTransferTrailerBytes;
  const uint32_t crc = crc32c(bytes.data(), body);
  KvStore into({2, 2, 16, 16, 64}, pipeline_of("hack:bits=2,pi=32"));
  ASSERT_TRUE(read_kv_transfer(bytes.data(), bytes.size(), "received", kModel, into, crc).is_ok());
  EXPECT_EQ(write(into), bytes);
  EXPECT_TRUE(fails_mentioning(read_kv_transfer(bytes.data(), bytes.size(), "received", kModel, into, crc ^ 1),
                               {"received", "checksum mismatch"}));

  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  std::vector<uint8_t> corrupt = bytes;
  corrupt[info->sealed_offset + 3] ^= 0x40;
  const std::string path =
      (std::filesystem::temp_directory_path() / str_cat("slimkv_transfer_crc_", ::getpid(), ".kvx")).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(corrupt.data()), std::streamsize(corrupt.size()));
  EXPECT_TRUE(fails_mentioning(read_kv_transfer_file(path, kModel, into), {path, "checksum mismatch"}));
  std::filesystem::remove(path);
}

// --- cut and corrupt inputs ----------------------------------------------------------------------

TEST(KvTransfer, EveryTruncationIsAnErrorNamingTheSection) {
  const KvStore store = small_store();
  const std::vector<uint8_t> bytes = write(store);
  KvStore into({2, 2, 16, 16, 64}, pipeline_of("hack:bits=2,pi=32"));
  for (size_t size = 0; size < bytes.size(); ++size) {
    // A copy of exactly `size` bytes, so that ASan sees any read past the end.
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(size));
    const Status status = read_kv_transfer(cut.data(), cut.size(), "cut", kModel, into);
    ASSERT_TRUE(fails_mentioning(status, {"kv transfer 'cut'", "truncated in the "})) << "size " << size;
    const char* section = size < kKvTransferHeaderBytes                     ? "header"
                          : size >= bytes.size() - kKvTransferTrailerBytes ? "trailer"
                                                                           : "section";
    ASSERT_NE(status.message().find(section), std::string::npos) << status.message();
    EXPECT_EQ(into.num_tokens(0), 0) << "the store was touched";
  }
  EXPECT_TRUE(fails_mentioning(read_kv_transfer(bytes.data(), 200, "cut", kModel, into),
                               {"truncated in the metadata section", "200 of"}));
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_TRUE(fails_mentioning(read(longer, into), {"1 bytes follow the end"}));
}

TEST(KvTransfer, EveryFlippedBitIsAnError) {
  const KvStore store = small_store();
  const std::vector<uint8_t> bytes = write(store);
  KvStore into = small_store();  // holds a sequence, which no failed read may change
  const std::vector<uint8_t> before = write(into);
  const size_t trailer = bytes.size() - kKvTransferTrailerBytes;
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::vector<uint8_t> corrupt = bytes;
    corrupt[at] ^= uint8_t(1u << (at % 8));
    const Status status = read(corrupt, into);
    ASSERT_FALSE(status.is_ok()) << "flipping a bit of byte " << at << " went unnoticed";
    const std::string expected = at < 8               ? "not a KV transfer"
                                 : at < 12            ? "version"
                                 : at < 128           ? "header checksum mismatch"
                                 : at < trailer + 4   ? "checksum mismatch"
                                 : at < trailer + 8   ? "reserved"
                                                      : "end magic";
    ASSERT_NE(status.message().find(expected), std::string::npos) << "byte " << at << ": " << status.message();
  }
  EXPECT_EQ(write(into), before) << "a failed read changed the store";
}

TEST(KvTransfer, NewerVersionNamesBothVersions) {
  std::vector<uint8_t> bytes = write(small_store());
  patch_u32(bytes, 8, kKvTransferVersion + 1);
  repair_checksums(bytes);
  KvStore into = small_store();
  const std::string newer = str_cat("format version ", kKvTransferVersion + 1, " is newer than this reader's version ",
                                    kKvTransferVersion);
  EXPECT_TRUE(fails_mentioning(read(bytes, into), {newer}));
  // A newer version is recognised from its first 12 bytes alone, whatever its header looks like.
  EXPECT_TRUE(fails_mentioning(read_kv_transfer(bytes.data(), 12, "test", kModel, into), {newer}));
}

TEST(KvTransfer, InconsistentHeaderAndTokenCountsAreErrors) {
  const std::vector<uint8_t> bytes = write(small_store());
  KvStore into = small_store();
  {
    std::vector<uint8_t> bad = bytes;
    patch_u32(bad, 128, 41);  // layer 0 claims one more token than its blocks and open rows hold
    repair_checksums(bad);
    EXPECT_TRUE(fails_mentioning(read(bad, into), {"token counts per layer need", "header declares"}));
  }
  {
    std::vector<uint8_t> bad = bytes;
    patch_u32(bad, 128, 65);  // more than the sender's max_tokens (64)
    repair_checksums(bad);
    EXPECT_TRUE(fails_mentioning(read(bad, into), {"layer 0 holds 65 tokens", "max_tokens 64"}));
  }
  {
    std::vector<uint8_t> bad = bytes;
    patch_u32(bad, 24, 40);  // 40 layers: their token counts no longer fit where the header says
    repair_checksums(bad);
    EXPECT_TRUE(fails_mentioning(read(bad, into), {"header field metadata_bytes is 128", "at 256"}));
  }
  {
    std::vector<uint8_t> bad = bytes;
    patch_u32(bad, 28, 0);  // no KV heads
    repair_checksums(bad);
    EXPECT_TRUE(fails_mentioning(read(bad, into), {"num_kv_heads is 0"}));
  }
  {
    std::vector<uint8_t> bad = bytes;
    bad[255] = 1;  // the metadata section is bytes [128, 256): its last byte is padding
    repair_checksums(bad);
    EXPECT_TRUE(fails_mentioning(read(bad, into), {"metadata section's padding is not zero"}));
  }
}

// --- the wrong receiver --------------------------------------------------------------------------

TEST(KvTransfer, WrongModelSpecOrShapeNamesBothSides) {
  const std::vector<uint8_t> bytes = write(small_store());
  {
    KvStore into = small_store();
    EXPECT_TRUE(fails_mentioning(read(bytes, into, "other-model"),
                                 {"model mismatch", std::string("'") + kModel + "'", "'other-model'"}));
  }
  {
    const std::string receiver_spec = "quant:bits=2,pi=32";
    KvStore into({2, 2, 16, 16, 64}, pipeline_of(receiver_spec));
    EXPECT_TRUE(fails_mentioning(read(bytes, into), {"KV spec mismatch", pipeline_of("hack:bits=2,pi=32").describe(),
                                                     pipeline_of(receiver_spec).describe()}));
  }
  {
    KvStore into({2, 2, 16, 16, 64}, pipeline_of("hack:bits=2,pi=32,seed=5"));
    EXPECT_TRUE(fails_mentioning(read(bytes, into), {"KV spec mismatch", "seed=5"}));
  }
  {
    KvStore into({2, 4, 16, 16, 64}, pipeline_of("hack:bits=2,pi=32"));
    EXPECT_TRUE(fails_mentioning(read(bytes, into), {"KV shape mismatch", "2 × 2 × 16 × 16", "2 × 4 × 16 × 16"}));
  }
  {
    KvStore into({2, 2, 16, 16, 39}, pipeline_of("hack:bits=2,pi=32"));  // a shorter context
    EXPECT_TRUE(fails_mentioning(read(bytes, into), {"layer 0 holds 40 tokens", "this store's max_tokens 39"}));
  }
  {
    KvStore into({2, 2, 16, 16, 40}, pipeline_of("hack:bits=2,pi=32"));  // just long enough
    EXPECT_TRUE(read(bytes, into).is_ok());
  }
}

// --- the fuzz seeds --------------------------------------------------------------------------------

// The receivers of the fuzz target (fuzz/kv_transfer_fuzz.cc), the specs its seeds are written with:
// version 1, and version 3 (FP16 sinks and a recent window); keep the two files in step.
constexpr const char* kFuzzSpec = "hack:bits=2,pi=32,round=stochastic";
constexpr const char* kFuzzExactTokensSpec = "hack:bits=2,pi=32,round=stochastic,sinks=4,window=40";
KvStore fuzz_receiver(int max_tokens, const char* spec = kFuzzSpec) {
  return KvStore({2, 2, 16, 16, max_tokens}, pipeline_of(spec));
}
constexpr const char* kFuzzModel = "fuzz-model";
const std::filesystem::path kSeedDir = std::filesystem::path(slimkv::test::source_dir()) / "fuzz/corpus/kv_transfer_fuzz";

// Writes the seeds: run with --gtest_also_run_disabled_tests --gtest_filter='*WriteFuzzSeeds*'.
// The open block is FP16 in the store and FP32 in the format: a value FP16 cannot hold was not written by
// any sender with this spec, and restoring would round it, so it is refused.
TEST(KvTransfer, OpenValuesThatAreNotFp16AreRefused) {
  std::vector<uint8_t> bytes = write(small_store());
  // The last open value is the last non-zero word before the trailer (records are zero-padded to 64).
  size_t at = bytes.size() - kKvTransferTrailerBytes - 4;
  while (bytes[at] == 0 && bytes[at + 1] == 0 && bytes[at + 2] == 0 && bytes[at + 3] == 0) at -= 4;
  bytes[at] |= 1;  // an FP16 value has the low 13 mantissa bits clear
  repair_checksums(bytes);
  KvStore into = small_store();
  EXPECT_TRUE(fails_mentioning(read(bytes, into), {"layer 1 KV head 1", "not FP16"}));
}

// Restored from pieces (no buffer of the whole transfer), every check of the whole reader still holds:
// a block's padding, an open record's padding or values, the trailer's CRC; each error names the piece.
TEST(KvTransfer, CorruptPiecesAreRefusedNamingThem) {
  // d = 12, 5-token FP16 blocks: 240-byte blocks in 256-byte slots; layer 0's 2 open tokens in 128-byte
  // records of 96 bytes.
  const KvShape shape{2, 2, 12, 12, 64};
  const std::string spec = "dense:dtype=f16,block=5";
  KvStore store(shape, pipeline_of(spec));
  std::mt19937 rng(7);
  append_random(store, {42, 39}, rng);
  const std::vector<uint8_t> good = write(store);
  const KvTransferInfo info = *inspect_kv_transfer(good.data(), good.size(), "test");
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  const uint64_t stride = (info.sealed_block_bytes + 63) / 64 * 64;
  ASSERT_LT(info.sealed_block_bytes, stride);
  const auto refused = [&](const std::function<void(std::vector<uint8_t>&)>& corrupt, const std::vector<std::string>& parts) {
    std::vector<uint8_t> bytes = good;
    corrupt(bytes);
    repair_checksums(bytes);  // only the piece's own check can find it
    KvStore into(shape, pipeline_of(spec));
    return fails_mentioning(restore_in_pieces(bytes, info, 2, into), parts);
  };
  // Layer 1, head 1, block 3: its slot's last (padding) byte.
  const uint64_t layer1_blocks = uint64_t(info.layer_tokens[1] / info.block_tokens);
  EXPECT_TRUE(refused([&](auto& b) { b[ranges[1].sealed_offset + (layer1_blocks + 3) * stride + stride - 1] = 1; },
                      {"layer 1 KV head 1 block 3", "padding after the sealed block is not zero"}));
  // Layer 0's open records: head 0's K record's first padding byte, then its first value.
  EXPECT_TRUE(refused([&](auto& b) { b[ranges[0].open_offset + 96] = 1; }, {"layer 0 head 0's open tokens", "not zero"}));
  EXPECT_TRUE(refused([&](auto& b) { b[ranges[0].open_offset] |= 1; }, {"layer 0 KV head 0", "not FP16"}));
  // A sealed byte flipped after the trailer was computed: every piece checks out, the trailer does not.
  std::vector<uint8_t> flipped = good;
  flipped[ranges[0].sealed_offset] ^= 0x10;
  KvStore into(shape, pipeline_of(spec));
  EXPECT_TRUE(fails_mentioning(restore_in_pieces(flipped, info, 2, into), {"checksum mismatch"}));
  // And the good bytes restore.
  KvStore restored(shape, pipeline_of(spec));
  ASSERT_TRUE(restore_in_pieces(good, info, 2, restored));
  EXPECT_EQ(write(restored), good);
}

// --- sealed blocks as a GPU cache's pages ---------------------------------------------------------

// A store's sealed blocks as pages [num_layers][blocks, page_bytes] of `pieces` pieces per head (each
// block cut into that many near-equal pieces: the dense GPU cache cuts its blocks into K and V), with
// unused bytes between the pieces' runs; and its open tokens in a store of their own.
struct Pages {
  KvPageLayout layout;
  std::vector<std::vector<uint8_t>> layers;
};
Pages pages_of(const KvStore& store, int pieces) {
  const int heads = store.shape().num_kv_heads, blocks = store.num_sealed_blocks(0);
  const size_t block_bytes = store.block_bytes(0, 0);
  Pages pages;
  size_t at = 0;
  for (int p = 0; p < pieces; ++p) {
    const size_t bytes = block_bytes / size_t(pieces) + (p == pieces - 1 ? block_bytes % size_t(pieces) : 0);
    pages.layout.piece_offsets.push_back(at);
    pages.layout.piece_bytes.push_back(bytes);
    at += size_t(heads) * bytes + 24;  // a gap no piece covers
  }
  pages.layout.page_bytes = at;
  for (int l = 0; l < store.shape().num_layers; ++l) {
    std::vector<uint8_t> layer(size_t(blocks) * pages.layout.page_bytes, 0xEE);
    for (int g = 0; g < heads; ++g) {
      for (int b = 0; b < blocks; ++b) {
        size_t in_block = 0;
        for (int p = 0; p < pieces; ++p) {
          std::memcpy(layer.data() + size_t(b) * pages.layout.page_bytes + pages.layout.piece_offsets[size_t(p)] +
                          size_t(g) * pages.layout.piece_bytes[size_t(p)],
                      store.sealed_block(l, g, b) + in_block, pages.layout.piece_bytes[size_t(p)]);
          in_block += pages.layout.piece_bytes[size_t(p)];
        }
      }
    }
    pages.layers.push_back(std::move(layer));
  }
  return pages;
}

KvStore open_tokens_of(const KvStore& store) {
  KvStore open(store.shape(), store.pipeline());
  const KvShape& shape = store.shape();
  for (int l = 0; l < shape.num_layers; ++l) {
    const int n = store.open_tokens(l);
    std::vector<float> k(size_t(n) * size_t(shape.k_dim)), v(size_t(n) * size_t(shape.v_dim));
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      store.widen_open(l, g, n, k.data(), v.data());
      open.restore_open_tokens(l, g, k.data(), v.data(), n);
    }
  }
  return open;
}

TEST(KvTransfer, PagesWriteAndReadAsTheStoreDoes) {
  for (const std::string spec : {"dense:dtype=f16", "hack:bits=2,pi=32", "dense"}) {
    for (const int pieces : {1, 2}) {
      SCOPED_TRACE(str_cat(spec, ", ", pieces, " pieces per head"));
      // 3 sealed blocks and an open block in every layer (the pages path's sequences: every layer alike).
      KvStore store({3, 2, 16, 16, 256}, pipeline_of(spec));
      std::mt19937 rng(11);
      const int tokens = 3 * store.block_tokens() + 5;
      append_random(store, {tokens, tokens, tokens}, rng);
      std::vector<uint8_t> expected;
      ASSERT_TRUE(write_kv_transfer(store, kModel, expected));
      const Pages pages = pages_of(store, pieces);
      const KvStore open = open_tokens_of(store);

      std::vector<uint8_t> written;
      const auto layer_pages = [&](int l) -> Expected<const uint8_t*> { return pages.layers[size_t(l)].data(); };
      ASSERT_TRUE(write_kv_transfer_from_pages(pages.layout, 3, layer_pages, open, kModel, written));
      EXPECT_EQ(written, expected);

      KvStore receiver({3, 2, 16, 16, 512}, pipeline_of(spec));
      Expected<KvTransferInfo> info = check_kv_transfer_for(expected.data(), expected.size(), "pages", kModel, receiver);
      ASSERT_TRUE(info) << info.status().message();
      KvStore restored({3, 2, 16, 16, 512}, pipeline_of(spec));
      ASSERT_TRUE(read_kv_transfer(expected.data(), expected.size(), "pages", kModel, restored));
      for (int l = 0; l < 3; ++l) {
        std::vector<uint8_t> copied(pages.layers[size_t(l)].size(), 0xEE);
        copy_kv_transfer_pages(expected.data(), *info, l, pages.layout, copied.data());
        EXPECT_EQ(copied, pages.layers[size_t(l)]) << "layer " << l;
        // A staged import's (engine/kv_staging.h): the same pages from a store the transfer was restored into.
        std::vector<uint8_t> from_store(pages.layers[size_t(l)].size(), 0xEE);
        copy_kv_store_pages(restored, l, 0, 3, pages.layout, from_store.data());
        EXPECT_EQ(from_store, pages.layers[size_t(l)]) << "layer " << l;
      }
      restore_kv_transfer_open_tokens(expected.data(), *info, receiver);
      for (int l = 0; l < 3; ++l) {
        ASSERT_EQ(receiver.num_tokens(l), 5) << "layer " << l;
        for (int g = 0; g < 2; ++g) {
          std::vector<float> k(5 * 16), v(5 * 16), k_sent(5 * 16), v_sent(5 * 16);
          receiver.widen_open(l, g, 5, k.data(), v.data());
          store.widen_open(l, g, 5, k_sent.data(), v_sent.data());
          EXPECT_EQ(k, k_sent) << "layer " << l << " head " << g;
          EXPECT_EQ(v, v_sent) << "layer " << l << " head " << g;
        }
      }
    }
  }
}

// The writers write every byte, padding included, so that a buffer reused from an earlier transfer
// (util/buffer_pool.h: not cleared first) gives the bytes a fresh one does.
TEST(KvTransfer, WritersFillEveryByteOfAReusedBuffer) {
  for (const auto& [spec, head_dim] : {std::pair<std::string, int>{"dense", 24}, {"hack:bits=2,pi=32", 16}}) {
    SCOPED_TRACE(spec);
    KvStore store({3, 2, head_dim, head_dim, 256}, pipeline_of(spec));
    std::mt19937 rng(5);
    const int tokens = 2 * store.block_tokens() + 5;
    append_random(store, {tokens, tokens, tokens}, rng);
    const auto garbage = [](size_t bytes) { return std::vector<uint8_t>(bytes, 0xAB); };
    std::vector<uint8_t> fresh, reused = garbage(1 << 20);
    ASSERT_TRUE(write_kv_transfer(store, kModel, fresh));
    ASSERT_TRUE(write_kv_transfer(store, kModel, reused));
    EXPECT_EQ(reused, fresh);
    const Pages pages = pages_of(store, 2);
    const auto layer_pages = [&](int l) -> Expected<const uint8_t*> { return pages.layers[size_t(l)].data(); };
    reused = garbage(1 << 20);
    ASSERT_TRUE(write_kv_transfer_from_pages(pages.layout, 2, layer_pages, open_tokens_of(store), kModel, reused));
    EXPECT_EQ(reused, fresh);
    std::vector<uint8_t> head, head_reused = garbage(1 << 16);
    ASSERT_TRUE(write_kv_transfer_head(store, kModel, tokens, head));
    ASSERT_TRUE(write_kv_transfer_head(store, kModel, tokens, head_reused));
    EXPECT_EQ(head_reused, head);
    for (int l = 0; l < 3; ++l) {
      std::vector<uint8_t> layer, layer_reused = garbage(1 << 16);
      size_t sealed = 0, sealed_reused = 0;
      ASSERT_TRUE(write_kv_transfer_layer(store, l, 1, layer, sealed));
      ASSERT_TRUE(write_kv_transfer_layer(store, l, 1, layer_reused, sealed_reused));
      EXPECT_EQ(layer_reused, layer);
      std::vector<uint8_t> blocks, blocks_reused = garbage(1 << 16);
      ASSERT_TRUE(write_kv_transfer_blocks(store, l, 0, 2, blocks));
      ASSERT_TRUE(write_kv_transfer_blocks(store, l, 0, 2, blocks_reused));
      EXPECT_EQ(blocks_reused, blocks);
    }
  }
}

TEST(KvTransfer, PagesOfAnotherBlockSizeAreRefused) {
  KvStore store({1, 2, 16, 16, 256}, pipeline_of("dense:dtype=f16"));
  std::mt19937 rng(3);
  append_random(store, {store.block_tokens()}, rng);
  Pages pages = pages_of(store, 2);
  pages.layout.piece_bytes[1] -= 2;
  const KvStore open = open_tokens_of(store);
  std::vector<uint8_t> out;
  const auto layer_pages = [&](int l) -> Expected<const uint8_t*> { return pages.layers[size_t(l)].data(); };
  const Status written = write_kv_transfer_from_pages(pages.layout, 1, layer_pages, open, kModel, out);
  ASSERT_FALSE(written);
  EXPECT_NE(written.message().find("hold blocks of 4094 bytes"), std::string::npos) << written.message();
  EXPECT_NE(written.message().find("this transfer's blocks are 4096 bytes"), std::string::npos) << written.message();
}

TEST(KvTransfer, DISABLED_WriteFuzzSeeds) {
  std::filesystem::create_directories(kSeedDir);
  struct Seed {
    const char* name;
    std::vector<int> layer_tokens;
    const char* spec = kFuzzSpec;
    int max_tokens = 64;
  };
  // sinks_and_window: layer 0 has sealed block 0 (its 4 sink rows) and 58 open tokens (more than a
  // block), layer 1 41 open tokens (more than the window) and no sinks yet.
  for (const Seed& seed : {Seed{"sealed_and_open", {40, 33}}, Seed{"open_only", {5, 0}}, Seed{"empty", {0, 0}},
                           Seed{"sinks_and_window", {90, 41}, kFuzzExactTokensSpec, 128}}) {
    KvStore store = fuzz_receiver(seed.max_tokens, seed.spec);
    std::mt19937 rng(3);
    append_random(store, seed.layer_tokens, rng);
    ASSERT_TRUE(write_kv_transfer_file(store, kFuzzModel, (kSeedDir / seed.name).string()).is_ok());
  }
}

TEST(KvTransfer, FuzzSeedsAreValidTransfers) {
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kSeedDir)) {
    // regression-* files are inputs that once broke the reader: the fuzzer replays them; grown-* files
    // are inputs the long fuzz runs kept for their coverage (docs/testing.md). Neither is meant to be valid.
    const std::string name = entry.path().filename().string();
    if (name.starts_with("regression-") || name.starts_with("grown-")) continue;
    std::ifstream file(entry.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    auto info = inspect_kv_transfer(bytes.data(), bytes.size(), name);
    ASSERT_TRUE(info) << info.status().message();
    // The sender's context, as the fuzz target reads them: a successful read writes the same bytes.
    KvStore into = fuzz_receiver(info->shape.max_tokens, info->version == 3 ? kFuzzExactTokensSpec : kFuzzSpec);
    const Status status = read(bytes, into, kFuzzModel);
    EXPECT_TRUE(status.is_ok()) << status.message();
    // The seeds were written by earlier versions of the writer: this one writes the same bytes.
    EXPECT_EQ(write(into, kFuzzModel), bytes) << name;
    ++seeds;
  }
  EXPECT_GE(seeds, 4);
}

// --- version 3: FP16 sink tokens and a recent window (sinks=N, window=W) ---------------------------

TEST(KvTransfer, SinksAndWindowRoundTripExactlyInVersion3) {
  // Layer l holds tokens - l: prompts shorter than the sinks, than a block, than the window, ending at
  // a block's end and mid-block, with the open part longer than a block; then 70 more tokens appended
  // on both sides seal the same blocks and sinks, and attention stays bit for bit the sender's.
  const std::vector<std::string> specs = {
      "hack:bits=2,pi=32,sinks=4,prefill=quantized", "hack:bits=2,pi=32,window=48,prefill=quantized",
      "hack:bits=2,pi=32,klayout=channel,kgroup=32,vlayout=token,vgroup=32,sinks=4,window=40,prefill=quantized",
      "quant:bits=2,pi=32,sinks=3,window=16,rot=hadamard,prefill=quantized"};
  for (const std::string& spec : specs) {
    for (const int tokens : {0, 2, 31, 32, 33, 41, 72, 73, 80, 81, 200}) {
      check_round_trip({spec, tokens, 2, 4, 2, 64});
    }
  }
  // What version 3 holds: the counts, and each layer's blocks, sink rows and open tokens.
  KvStore store({2, 2, 16, 16, 128}, pipeline_of("hack:bits=2,pi=32,sinks=4,window=40,prefill=quantized"));
  std::mt19937 rng(5);
  append_random(store, {90, 41}, rng);
  const std::vector<uint8_t> bytes = write(store);
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->version, 3u);
  EXPECT_EQ(info->sink_tokens, 4);
  EXPECT_EQ(info->recent_tokens, 40);
  EXPECT_EQ(kv_transfer_sealed_blocks(*info, 0), 1);
  EXPECT_EQ(kv_transfer_sink_tokens(*info, 0), 4);
  EXPECT_EQ(kv_transfer_open_tokens(*info, 0), 58);
  EXPECT_EQ(kv_transfer_sealed_blocks(*info, 1), 0);
  EXPECT_EQ(kv_transfer_sink_tokens(*info, 1), 0);
  EXPECT_EQ(kv_transfer_open_tokens(*info, 1), 41);
  // Layer 0 head 0's records start with its sink keys, FP32 of the store's FP16.
  std::vector<float> sink_k(4 * 16), sink_v(4 * 16);
  store.widen_sinks(0, 0, sink_k.data(), sink_v.data());
  EXPECT_EQ(std::memcmp(bytes.data() + info->open_offset, sink_k.data(), sink_k.size() * sizeof(float)), 0);
}

TEST(KvTransfer, Version3IsCheckedAgainstTheReceiverAndItsCounts) {
  const std::string spec = "hack:bits=2,pi=32,sinks=4,window=40,prefill=quantized";
  KvStore original({2, 2, 16, 16, 128}, pipeline_of(spec));
  std::mt19937 rng(5);
  append_random(original, {90, 41}, rng);
  const std::vector<uint8_t> bytes = write(original);
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  KvStore into({2, 2, 16, 16, 128}, pipeline_of(spec));
  // The record after the 2 token counts: u32 sink_tokens at 136, u32 recent_tokens at 140.
  constexpr size_t kSinks = 128 + 8, kRecent = kSinks + 4;
  std::vector<uint8_t> bad = bytes;
  patch_u32(bad, kSinks, 33);
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"metadata field sink_tokens is 33, expected 0 to block_tokens 32"}));
  bad = bytes;
  patch_u32(bad, kSinks, 0);
  patch_u32(bad, kRecent, 0);
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"sink_tokens and recent_tokens are both 0"}));
  bad = bytes;
  patch_u32(bad, kSinks, 5);  // one more sink row per head than the sections hold
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"the token counts per layer need"}));
  bad = bytes;
  patch_u32(bad, kRecent, 41);  // the same sections (layer 0: 1 block; layer 1: none), another window
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"sink_tokens and recent_tokens are 4 and 41", "sinks=4 and window=40"}));
  // A sink row that FP16 does not hold, and a sink count the spec does not have.
  bad = bytes;
  const float not_fp16 = 1.0f + 1.0f / 4096.0f;
  std::memcpy(bad.data() + info->open_offset + 4, &not_fp16, sizeof(float));
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"layer 0 KV head 0: the sink tokens hold values that are not FP16"}));
  KvStore other_sinks({2, 2, 16, 16, 128}, pipeline_of("hack:bits=2,pi=32,sinks=2,window=40,prefill=quantized"));
  EXPECT_TRUE(fails_mentioning(read(bytes, other_sinks), {"KV spec mismatch", "sinks=4", "sinks=2"}));
  KvStore plain({2, 2, 16, 16, 128}, pipeline_of("hack:bits=2,pi=32,prefill=quantized"));
  EXPECT_TRUE(fails_mentioning(read(bytes, plain), {"KV spec mismatch"}));
  EXPECT_EQ(into.num_tokens(0), 0) << "a refused read touched the store";
  // Every cut names where it is cut; a flipped bit anywhere is caught by a checksum.
  for (size_t size = 0; size < bytes.size(); size += 41) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(size));
    ASSERT_TRUE(fails_mentioning(read_kv_transfer(cut.data(), cut.size(), "cut", kModel, into), {"truncated in the "})) << size;
  }
  for (size_t at = 0; at < bytes.size(); at += 97) {
    bad = bytes;
    bad[at] ^= 0x10;
    ASSERT_FALSE(read(bad, into).is_ok()) << at;
  }
  ASSERT_TRUE(read(bytes, into).is_ok());
  EXPECT_EQ(write(into), bytes);
}

TEST(KvTransfer, SinksWithHeadsOfDifferentDimsAreRefusedByName) {
  KvShape shape(1, 2, 16, 16, 64);
  shape.head_k_dims = {16, 8};
  shape.head_v_dims = {16, 8};
  const KvStore store(shape, pipeline_of("hack:bits=4,pi=32,window=8,prefill=quantized"));
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(fails_mentioning(write_kv_transfer(store, kModel, bytes), {"window=", "heads differ"}));
}

// --- version 2: heads of different dims (ZACK's ranks) -------------------------------------------

// A store whose (layer, KV head)s keep their own dims, as ZACK's ranks make them: 3 layers × 2 KV heads,
// dims multiples of 4 (hack's fields), layer l holding `tokens` - l · shortfall tokens.
KvStore per_head_store(const std::string& spec, int tokens, unsigned seed, int max_tokens = 300, int shortfall = 1) {
  KvShape shape(3, 2, 32, 32, max_tokens);
  shape.head_k_dims = {32, 8, 12, 20, 4, 16};
  shape.head_v_dims = {16, 28, 8, 32, 12, 4};
  KvStore store(shape, pipeline_of(spec));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int l = 0; l < shape.num_layers; ++l) {
    const int layer_tokens = std::max(0, tokens - l * shortfall);
    for (int done = 0; done < layer_tokens;) {
      const int n = std::min(7, layer_tokens - done);  // chunks cross block edges
      std::vector<float> k(size_t(n) * size_t(shape.layer_k_dims(l))), v(size_t(n) * size_t(shape.layer_v_dims(l)));
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      store.append(l, k.data(), v.data(), n);
      done += n;
    }
  }
  return store;
}

TEST(KvTransfer, HeadsOfDifferentDimsRoundTripInVersion2) {
  for (const char* spec : {"dense", "dense:dtype=f16", "hack:bits=4,pi=32,prefill=quantized"}) {
    for (const int tokens : {0, 1, 31, 32, 33, 100}) {
      SCOPED_TRACE(str_cat(spec, ", ", tokens, " tokens"));
      const KvStore original = per_head_store(spec, tokens, 5);
      const std::vector<uint8_t> bytes = write(original);
      auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
      ASSERT_TRUE(info) << info.status().message();
      EXPECT_EQ(info->version, 2u);
      EXPECT_EQ(info->shape.head_k_dims, original.shape().head_k_dims);
      EXPECT_EQ(info->shape.head_v_dims, original.shape().head_v_dims);
      EXPECT_EQ(info->shape.k_dim, 32);  // the widest head's
      ASSERT_EQ(info->head_block_bytes.size(), 6u);
      EXPECT_EQ(info->head_block_bytes[1], original.block_bytes(0, 1));
      EXPECT_EQ(info->sealed_block_bytes, *std::max_element(info->head_block_bytes.begin(), info->head_block_bytes.end()));
      KvStore restored = per_head_store(spec, 9, 6);  // holds another sequence first: reading replaces it
      const Status status = read(bytes, restored);
      ASSERT_TRUE(status.is_ok()) << status.message();
      EXPECT_EQ(write(restored), bytes) << "write → read → write changed the bytes";
      for (int l = 0; l < 3; ++l) {
        for (int g = 0; g < 2; ++g) {
          for (int b = 0; b < original.num_sealed_blocks(l); ++b) {
            ASSERT_EQ(std::memcmp(restored.sealed_block(l, g, b), original.sealed_block(l, g, b), original.block_bytes(l, g)), 0);
          }
        }
      }
    }
  }
}

TEST(KvTransfer, Version2IsCheckedAgainstTheReceiverAndItsRecords) {
  const KvStore original = per_head_store("dense:dtype=f16", 100, 5);
  const std::vector<uint8_t> bytes = write(original);
  // A receiver whose heads hold other dims, or one dim for all, is refused naming the head.
  KvShape other = original.shape();
  other.head_k_dims[3] = 24;
  KvStore other_dims(other, pipeline_of("dense:dtype=f16"));
  EXPECT_TRUE(fails_mentioning(read(bytes, other_dims), {"KV shape mismatch at layer 1 KV head 1", "20/32", "24/32"}));
  KvStore uniform({3, 2, 32, 32, 300}, pipeline_of("dense:dtype=f16"));
  EXPECT_TRUE(fails_mentioning(read(bytes, uniform), {"KV shape mismatch at layer 0 KV head 0", "32/16", "32/32"}));
  // ...and a version 1 transfer into a store whose heads differ.
  std::mt19937 rng(3);
  KvStore one_dim({3, 2, 32, 32, 300}, pipeline_of("dense:dtype=f16"));
  append_random(one_dim, {40, 40, 40}, rng);
  KvStore per_head = per_head_store("dense:dtype=f16", 0, 5);
  EXPECT_TRUE(fails_mentioning(read(write(one_dim), per_head), {"KV shape mismatch at layer 0 KV head 0"}));
  // Records (at 128 + 4 · layers: k_dim, v_dim, block bytes per head) that a writer would not write.
  KvStore into = per_head_store("dense:dtype=f16", 0, 5);
  std::vector<uint8_t> bad = bytes;
  patch_u32(bad, 128 + 12 + 16, 0);  // layer 0 KV head 1's k_dim
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"layer 0 KV head 1's record holds k_dim 0"}));
  bad = bytes;
  patch_u32(bad, 128 + 12, 28);  // layer 0 KV head 0's k_dim below the header's 32, the only 32
  repair_checksums(bad);
  EXPECT_TRUE(fails_mentioning(read(bad, into), {"not the head records' largest"}));
  EXPECT_EQ(into.num_tokens(0), 0) << "a refused read touched the store";
  // Every cut names where it is cut.
  for (size_t size = 0; size < bytes.size(); size += 37) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(size));
    ASSERT_TRUE(fails_mentioning(read_kv_transfer(cut.data(), cut.size(), "cut", kModel, into), {"truncated in the "})) << size;
  }
}

// The KV stream's pieces of a store whose heads differ (each head's blocks in slots of its own size):
// head, early blocks, the layers' rest, put together, are the whole transfer; device pages, which hold
// one block size, refuse such a store by name.
TEST(KvTransfer, PiecesOfHeadsOfDifferentDimsAreTheWholeTransfer) {
  for (const char* spec : {"dense:dtype=f16", "hack:bits=4,pi=32,prefill=quantized"}) {
    for (const int tokens : {0, 31, 100}) {
      SCOPED_TRACE(str_cat(spec, ", ", tokens, " tokens"));
      const KvStore store = per_head_store(spec, tokens, 3, 300, /*shortfall=*/0);
      const std::vector<uint8_t> whole = write(store);
      for (const int early : {0, 1, 2}) EXPECT_EQ(test::transfer_from_pieces(store, kModel, early), whole) << early << " early";
    }
  }
  const KvStore store = per_head_store("dense:dtype=f16", 64, 3, 300, 0);
  KvPageLayout pages;
  pages.page_bytes = 1 << 16;
  pages.piece_offsets = {0};
  pages.piece_bytes = {size_t(store.block_bytes(0, 0))};
  std::vector<uint8_t> out;
  const auto no_pages = [](int) -> Expected<const uint8_t*> { return error("not read"); };
  EXPECT_TRUE(fails_mentioning(write_kv_transfer_from_pages(pages, 1, no_pages, store, kModel, out),
                               {"device pages", "heads differ"}));
}

TEST(KvTransfer, HeaderClaimingBillionsOfHeadsIsHandledQuickly) {
  // Once a fuzzer timeout: a corrupt header with an enormous head count and no open tokens.
  KvStore into = fuzz_receiver(64);
  const Status status = read_kv_transfer_file((kSeedDir / "regression-huge-head-count").string(), kFuzzModel, into);
  EXPECT_FALSE(status.is_ok());
}

}  // namespace
}  // namespace slimkv
