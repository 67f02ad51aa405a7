// Per-(layer, KV head) bit widths (hibits=B,hiheads=L.H/..., issue 28): the heads listed are sealed by the
// codec at B bits, every other head at the spec's bits. Held to stores of one width: a listed head's
// blocks and attention equal a store whose every head has B bits, the others a store without hiheads;
// transfers carry each head's blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_factory.h"
#include "kv/spec_errors.h"
#include "kv/store_attention.h"
#include "kv/transfer.h"
#include "kv/transfer_pieces.h"
#include "random_values.h"
#include "slimkv/engine.h"
#include "source_dir.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kDim = 64, kTokens = 300;

// A store of `spec` holding the same random K/V in every layer (appended in chunks of 37).
KvStore filled_store(const std::string& spec) {
  auto pipeline = make_kv_pipeline(spec);
  EXPECT_TRUE(pipeline) << pipeline.status().message();
  KvStore store({kLayers, kKvHeads, kDim, kDim, kTokens}, *pipeline);
  std::mt19937 rng(11);
  const auto k = random_values(size_t(kTokens) * kKvHeads * kDim, rng, 1.0f), v = random_values(k.size(), rng, 1.0f);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int first = 0; first < kTokens; first += 37) {
      const size_t offset = size_t(first) * kKvHeads * kDim;
      store.append(layer, k.data() + offset, v.data() + offset, std::min(37, kTokens - first));
    }
  }
  return store;
}

std::vector<uint8_t> block_bytes_of(const KvStore& store, int layer, int head, int block) {
  const uint8_t* data = store.sealed_block(layer, head, block);
  return {data, data + store.block_bytes(layer, head)};
}

// The last token's query of every head over layer `layer`: [kHeads, kDim].
std::vector<float> decode_output(const KvStore& store, int layer) {
  std::mt19937 rng(5);
  const auto q = random_values(size_t(kHeads) * kDim, rng, 1.0f);
  ThreadPool pool(2);
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kDim)), &pool};
  std::vector<float> out(q.size());
  attend(store, layer, q.data(), 1, kTokens - 1, params, out.data());
  return out;
}

TEST(HeadBits, ListedHeadsAreSealedAndReadAsAStoreOfTheirBits) {
  for (const std::string layout : {"", ",klayout=channel,kgroup=32,vlayout=token,vgroup=32"}) {
    SCOPED_TRACE(layout);
    const KvStore mixed = filled_store("hack:bits=2,pi=64" + layout + ",hibits=4,hiheads=1.1");
    const KvStore narrow = filled_store("hack:bits=2,pi=64" + layout);
    const KvStore wide = filled_store("hack:bits=4,pi=64" + layout);
    ASSERT_EQ(mixed.num_sealed_blocks(1), 4);
    EXPECT_GT(mixed.block_bytes(1, 1), mixed.block_bytes(1, 0));
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int g = 0; g < kKvHeads; ++g) {
        const KvStore& like = layer == 1 && g == 1 ? wide : narrow;
        EXPECT_EQ(mixed.block_bytes(layer, g), like.block_bytes(layer, g));
        for (int b = 0; b < mixed.num_sealed_blocks(layer); ++b) {
          EXPECT_EQ(block_bytes_of(mixed, layer, g, b), block_bytes_of(like, layer, g, b))
              << "layer " << layer << " KV head " << g << " block " << b;
        }
      }
    }
    // Query heads 0-1 read KV head 0, heads 2-3 KV head 1 (GQA groups of two).
    const std::vector<float> layer1 = decode_output(mixed, 1), narrow1 = decode_output(narrow, 1),
                             wide1 = decode_output(wide, 1);
    const size_t half = layer1.size() / 2;
    EXPECT_EQ(std::vector<float>(layer1.begin(), layer1.begin() + long(half)),
              std::vector<float>(narrow1.begin(), narrow1.begin() + long(half)));
    EXPECT_EQ(std::vector<float>(layer1.begin() + long(half), layer1.end()),
              std::vector<float>(wide1.begin() + long(half), wide1.end()));
    EXPECT_NE(layer1, narrow1);
    EXPECT_EQ(decode_output(mixed, 0), decode_output(narrow, 0));
  }
}

TEST(HeadBits, MemoryCountsEachHeadsBlocks) {
  const KvStore mixed = filled_store("quant:bits=2,pi=64,hibits=8,hiheads=0.0/1.1");
  const size_t blocks = size_t(mixed.num_sealed_blocks(0));
  const size_t expected = blocks * (mixed.block_bytes(0, 0) + mixed.block_bytes(0, 1) + mixed.block_bytes(1, 0) +
                                    mixed.block_bytes(1, 1));
  EXPECT_EQ(mixed.memory().sealed_bytes, expected);
  EXPECT_EQ(mixed.block_bytes(0, 0), mixed.block_bytes(1, 1));
  EXPECT_GT(mixed.block_bytes(0, 0), mixed.block_bytes(0, 1));
}

TEST(HeadBits, CanonicalSpecListsTheHeadsInOrder) {
  auto pipeline = make_kv_pipeline("hack:bits=2,hiheads=6.1/0.0/6.0,hibits=4");
  ASSERT_TRUE(pipeline) << pipeline.status().message();
  EXPECT_EQ(pipeline->describe(),
            "hack:kbits=2,vbits=2,round=nearest,se=on,rqe=on,pi=64,rot=hadamard,hibits=4,hiheads=0.0/6.0/6.1");
  EXPECT_EQ(make_kv_pipeline(pipeline->describe())->describe(), pipeline->describe());
  EXPECT_EQ(pipeline->codec_of(6, 0).describe(), pipeline->wide_codec->describe());
  EXPECT_EQ(pipeline->codec_of(6, 2).describe(), pipeline->codec->describe());
  EXPECT_EQ(pipeline->wide_codec->describe().substr(0, 16), "hack:kbits=4,vbi");
}

TEST(HeadBits, SpecErrorsNameTheOption) {
  test::expect_specs_refused({
      {"hack:bits=2,hibits=4", "go together"},
      {"hack:bits=2,hiheads=1.0", "go together"},
      {"hack:bits=2,hibits=3,hiheads=1.0", "hibits=3 is invalid"},
      {"hack:bits=4,hibits=4,hiheads=1.0", "must be wider"},
      {"hack:kbits=8,vbits=2,hibits=4,hiheads=1.0", "must be wider"},
      {"hack:bits=2,hibits=4,hiheads=1", "'1' is not layer.head"},
      {"hack:bits=2,hibits=4,hiheads=1.0/x.1", "'x.1' is not layer.head"},
      {"hack:bits=2,hibits=4,hiheads=1.0/", "'' is not layer.head"},
      {"hack:bits=2,hibits=4,hiheads=1.-1", "'1.-1' is not layer.head"},
      {"hack:bits=2,hibits=4,hiheads=1.0/1.0", "names a head twice"},
      {"dense:hibits=4,hiheads=1.0", "no option 'hibits'"},
  });
}

// Each head's block size travels in version 2's head records (as ZACK's per-head dims do): a transfer
// reads back byte for byte and attends as the original, and the KV stream's layer-by-layer pieces are
// its bytes. Version 3 (sinks, window) holds one shape: it refuses such stores by name.
TEST(HeadBits, TransfersCarryEachHeadsBlocksInVersion2) {
  const std::string spec = "hack:bits=2,pi=64,hibits=4,hiheads=0.1/1.0";
  const KvStore original = filled_store(spec);
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(write_kv_transfer(original, "model", bytes).is_ok());
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->version, 2u);
  ASSERT_EQ(info->head_block_bytes.size(), size_t(kLayers * kKvHeads));
  EXPECT_EQ(info->head_block_bytes[1], original.block_bytes(0, 1));
  EXPECT_LT(info->head_block_bytes[0], info->head_block_bytes[1]);
  auto pipeline = make_kv_pipeline(spec);
  ASSERT_TRUE(pipeline);
  KvStore restored({kLayers, kKvHeads, kDim, kDim, kTokens}, *pipeline);
  const Status read = read_kv_transfer(bytes.data(), bytes.size(), "test", "model", restored);
  ASSERT_TRUE(read.is_ok()) << read.message();
  std::vector<uint8_t> again;
  ASSERT_TRUE(write_kv_transfer(restored, "model", again).is_ok());
  EXPECT_EQ(again, bytes) << "write → read → write changed the bytes";
  for (int layer = 0; layer < kLayers; ++layer) EXPECT_EQ(decode_output(restored, layer), decode_output(original, layer));

  KvStore plain = filled_store("hack:bits=2,pi=64");  // the spec names the heads: another store refuses
  const Status refused = read_kv_transfer(bytes.data(), bytes.size(), "test", "model", plain);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("hiheads=0.1/1.0"), std::string::npos) << refused.message();

  for (const int early : {0, 1, 3}) EXPECT_EQ(test::transfer_from_pieces(original, "model", early), bytes) << early;
  const KvStore with_sinks = filled_store(spec + ",sinks=4");
  const Status sinks = write_kv_transfer(with_sinks, "model", bytes);
  ASSERT_FALSE(sinks.is_ok());
  EXPECT_NE(sinks.message().find("hiheads="), std::string::npos) << sinks.message();
}

TEST(HeadBits, EngineChecksTheHeadsAgainstTheModel) {
  const std::string model = test::source_dir() + "/models/slimkv-llama-15m";  // 8 layers, 2 KV heads
  auto beyond = Engine::load({.model_dir = model, .kv_spec = "hack:bits=2,hibits=4,hiheads=3.1/8.0"});
  ASSERT_FALSE(beyond);
  EXPECT_NE(beyond.status().message().find("layer 8 KV head 0; the model has layers 0-7 and KV heads 0-1"),
            std::string::npos)
      << beyond.status().message();
  auto gpu = Engine::load({.model_dir = model, .kv_spec = "hack:bits=2,hibits=4,hiheads=3.1", .device = "cuda"});
  ASSERT_FALSE(gpu);
  EXPECT_NE(gpu.status().message().find("run on device 'cpu' only"), std::string::npos) << gpu.status().message();
  auto fits = Engine::load({.model_dir = model, .kv_spec = "hack:bits=2,hibits=4,hiheads=3.1/7.0"});
  ASSERT_TRUE(fits) << fits.status().message();
  EXPECT_EQ((*fits)->kv_description().find("hiheads=3.1/7.0") != std::string::npos, true) << (*fits)->kv_description();
}

}  // namespace
}  // namespace slimkv
