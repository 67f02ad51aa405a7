// sinks=N and window=W (issue 28): a sequence's first N tokens and its W newest tokens besides the open
// block are read exactly, from FP16. Held to the FP64 reference over K/V built here from the spec's
// definition alone: those tokens (and the open block) FP16-rounded, every other block sealed by the
// codec from FP16-rounded rows in which the sink rows are replaced by the first other row (the sinks
// leave the block's ranges), then decoded.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "kv/kv_factory.h"
#include "kv/spec_errors.h"
#include "kv/rotation.h"
#include "kv/store_attention.h"
#include "kv/transfer.h"
#include "nmse.h"
#include "random_values.h"
#include "slimkv/status.h"
#include "util/half.h"
#include "util/random.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

constexpr int kHeads = 4, kKvHeads = 2, kDim = 64;

float fp16(float x) { return fp16_to_float(float_to_fp16(x)); }

struct Outputs {
  std::vector<float> store, reference;
};

// `tokens` tokens appended in chunks of `chunk`, then the last token's query through the store and
// through the reference. Token 0's keys are large (an attention sink's outlier), so a block quantized
// with it differs visibly from one quantized without.
Outputs decode_step(const std::string& spec, int tokens, int chunk) {
  SCOPED_TRACE(str_cat("decode_step(", spec, ",tokens=", tokens, ",chunk=", chunk, ")"));
  std::mt19937 rng(7);
  auto k = random_values(size_t(tokens) * kKvHeads * kDim, rng, 1.0f), v = random_values(k.size(), rng, 1.0f);
  for (int c = 0; c < kKvHeads * kDim; ++c) k[size_t(c)] *= 12.0f;
  const auto q = random_values(size_t(kHeads) * kDim, rng, 1.0f);
  auto pipeline = make_kv_pipeline(spec);
  EXPECT_TRUE(pipeline.has_value()) << pipeline.status().message();
  KvStore store({1, kKvHeads, kDim, kDim, tokens}, *pipeline);
  for (int first = 0; first < tokens; first += chunk) {
    const size_t offset = size_t(first) * kKvHeads * kDim;
    store.append(0, k.data() + offset, v.data() + offset, std::min(chunk, tokens - first));
  }
  ThreadPool pool(2);
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kDim)), &pool};
  Outputs outputs;
  outputs.store.resize(q.size());
  attend(store, 0, q.data(), 1, tokens - 1, params, outputs.store.data());

  // The reference, from the spec's definition: the blocks sealed are those wholly older than the
  // `recent` newest tokens; of block 0, the first `sinks` tokens are exact.
  const int pi = pipeline->block_tokens, sinks = pipeline->sink_tokens, recent = pipeline->recent_tokens;
  const int sealed = tokens < pi + recent ? 0 : (tokens - recent) / pi;
  EXPECT_EQ(store.num_sealed_blocks(0), sealed);
  std::vector<float> seen_k(k.size()), seen_v(v.size()), rotated_q(q);
  for (size_t i = 0; i < k.size(); i += kDim) {  // as the store holds them: rotated per head, FP16
    std::copy(k.begin() + long(i), k.begin() + long(i) + kDim, seen_k.begin() + long(i));
    std::copy(v.begin() + long(i), v.begin() + long(i) + kDim, seen_v.begin() + long(i));
    if (pipeline->hadamard) {
      hadamard_rotate(seen_k.data() + i, kDim);
      hadamard_rotate(seen_v.data() + i, kDim);
    }
    for (size_t c = i; c < i + kDim; ++c) {
      seen_k[c] = fp16(seen_k[c]);
      seen_v[c] = fp16(seen_v[c]);
    }
  }
  for (int h = 0; h < kHeads && pipeline->hadamard; ++h) hadamard_rotate(rotated_q.data() + size_t(h) * kDim, kDim);
  const BlockShape shape{pi, kDim, kDim};
  std::vector<uint8_t> block(pipeline->codec->block_bytes(shape));
  std::vector<float> block_k(size_t(pi) * kDim), block_v(block_k.size()), decoded_k(block_k.size()),
      decoded_v(block_k.size());
  for (int g = 0; g < kKvHeads; ++g) {
    for (int b = 0; b < sealed; ++b) {
      for (int t = 0; t < pi; ++t) {
        const int source = b == 0 && t < sinks && sinks < pi ? sinks : b * pi + t;  // sinks: not in the ranges
        for (int c = 0; c < kDim; ++c) {
          block_k[size_t(t) * kDim + c] = seen_k[(size_t(source) * kKvHeads + g) * kDim + c];
          block_v[size_t(t) * kDim + c] = seen_v[(size_t(source) * kKvHeads + g) * kDim + c];
        }
      }
      pipeline->codec->seal(shape, block_k.data(), block_v.data(), block_seal_seed(pipeline->seed, 0, g, b), block.data());
      pipeline->codec->decode(shape, block.data(), decoded_k.data(), decoded_v.data());
      for (int t = b == 0 ? sinks : 0; t < pi; ++t) {  // the sinks keep their FP16 values
        for (int c = 0; c < kDim; ++c) {
          seen_k[(size_t(b * pi + t) * kKvHeads + g) * kDim + c] = decoded_k[size_t(t) * kDim + c];
          seen_v[(size_t(b * pi + t) * kKvHeads + g) * kDim + c] = decoded_v[size_t(t) * kDim + c];
        }
      }
    }
  }
  const int position = tokens - 1;
  outputs.reference.resize(q.size());
  attention_reference(rotated_q.data(), 1, &position, seen_k.data(), seen_v.data(), tokens, kHeads, kKvHeads, kDim,
                      kDim, params.scale, outputs.reference.data());
  for (int h = 0; h < kHeads && pipeline->hadamard; ++h) {
    hadamard_rotate(outputs.reference.data() + size_t(h) * kDim, kDim);
  }
  return outputs;
}

// quant attends over the dequantized blocks, as the reference does: equal up to FP32 summation.
TEST(ExactTokens, QuantAttentionEqualsTheReferenceThatKeepsThoseTokensExact) {
  for (const char* spec : {"quant:bits=2,pi=32,rot=none,sinks=4", "quant:bits=2,pi=32,rot=none,window=40",
                           "quant:bits=2,pi=32,sinks=32,window=64", "quant:bits=4,pi=64,sinks=1,window=1",
                           "kivi:bits=2,sinks=4,window=32"}) {
    for (const int chunk : {1, 37, 500}) {
      const Outputs outputs = decode_step(spec, 300, chunk);
      EXPECT_LT(nmse(outputs.store, outputs.reference), 1e-10) << spec << ", chunks of " << chunk;
    }
  }
}

// hack attends on the integers (8-bit Q and P): within its usual error of the dequantized blocks, and
// far closer to the reference than to the same store without sinks.
TEST(ExactTokens, HackAttentionMatchesTheReference) {
  for (const char* spec : {"hack:bits=2,pi=64,sinks=4,window=64",
                           "hack:bits=2,pi=32,klayout=channel,vlayout=token,rot=none,sinks=4,window=32"}) {
    const Outputs outputs = decode_step(spec, 300, 64);
    EXPECT_LT(nmse(outputs.store, outputs.reference), 1e-3) << spec;
  }
  const Outputs with = decode_step("hack:bits=2,pi=64,rot=none,sinks=4", 300, 300);
  const Outputs without = decode_step("hack:bits=2,pi=64,rot=none", 300, 300);
  EXPECT_LT(nmse(with.store, with.reference), 1e-3);
  EXPECT_LT(nmse(with.store, with.reference) * 10, nmse(without.store, with.reference))
      << "the sink's outlier keys are read exactly only with sinks=";
}

TEST(ExactTokens, ZeroIsTheStoreAsBeforeBitForBit) {
  EXPECT_EQ(make_kv_pipeline("hack:bits=2,sinks=0,window=0")->describe(), make_kv_pipeline("hack:bits=2")->describe());
  const Outputs zero = decode_step("hack:bits=2,pi=64,sinks=0,window=0", 300, 37);
  const Outputs plain = decode_step("hack:bits=2,pi=64", 300, 37);
  EXPECT_EQ(zero.store, plain.store);
}

TEST(ExactTokens, CanonicalSpecSpellsThemOutOnlyWhenSet) {
  EXPECT_EQ(make_kv_pipeline("hack:bits=2,window=64,sinks=4")->describe(),
            "hack:kbits=2,vbits=2,round=nearest,se=on,rqe=on,pi=64,rot=hadamard,sinks=4,window=64");
  EXPECT_EQ(make_kv_pipeline("kivi:bits=2,window=32")->describe(),
            make_kv_pipeline("kivi:bits=2")->describe() + ",window=32");
  EXPECT_EQ(make_kv_pipeline("hack:bits=2,pi=128,sinks=128")->unsealed_rows(), 128 + 128);
}

TEST(ExactTokens, SpecErrorsNameTheOptionAndTheRange) {
  test::expect_specs_refused({
      {"hack:bits=2,pi=64,sinks=65", "sinks=65 is invalid: expected an integer in [0, 64]"},
      {"quant:bits=2,pi=32,sinks=-1", "sinks=-1 is invalid: expected an integer in [0, 32]"},
      {"hack:bits=2,window=4097", "window=4097 is invalid: expected an integer in [0, 4096]"},
      {"kivi:bits=2,window=x", "window=x"},
      {"dense:sinks=4", "no option 'sinks'"},
      {"hack:bits=2,rqe=off,window=64", "rqe=off"},
      {"pq:topk=0.2+hack:bits=2,sinks=4", "with a selector"},
  });
}

TEST(ExactTokens, MemoryCountsTheFp16Rows) {
  auto pipeline = make_kv_pipeline("hack:bits=2,pi=64,sinks=4,window=32");
  ASSERT_TRUE(pipeline);
  KvStore store({2, 2, 128, 128, 1000}, *pipeline);
  std::vector<float> kv(size_t(200) * 2 * 128, 0.5f);
  for (int layer = 0; layer < 2; ++layer) store.append(layer, kv.data(), kv.data(), 200);
  const KvMemory memory = store.memory();
  EXPECT_EQ(store.num_sealed_blocks(0), 2);  // (200 - 32) / 64: the 32 newest stay unsealed
  EXPECT_EQ(store.open_tokens(0), 72);
  EXPECT_EQ(store.sink_tokens(0), 4);
  EXPECT_EQ(memory.sealed_bytes, 2u * 2u * 2u * store.block_bytes(0, 0));
  EXPECT_EQ(memory.open_bytes, 2u * 2u * (64u + 32u + 4u) * 256u * 2u);  // layers × heads × rows × K+V dims × FP16
}

// KV transfers carry the FP16 rows (format version 3, tests/kv/transfer_test.cc holds it in detail); a
// receiver with them refuses a transfer without them by the spec.
TEST(ExactTokens, KvTransferCarriesThemAsVersion3) {
  auto pipeline = make_kv_pipeline("hack:bits=2,pi=32,sinks=4");
  ASSERT_TRUE(pipeline);
  KvStore store({1, 2, 16, 16, 100}, *pipeline);
  std::vector<float> kv(size_t(40) * 2 * 16, 0.25f);
  store.append(0, kv.data(), kv.data(), 40);
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(write_kv_transfer(store, "model", bytes).is_ok());
  auto info = inspect_kv_transfer(bytes.data(), bytes.size(), "test");
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_EQ(info->version, 3u);
  EXPECT_EQ(info->sink_tokens, 4);
  KvStore restored({1, 2, 16, 16, 100}, *pipeline);
  ASSERT_TRUE(read_kv_transfer(bytes.data(), bytes.size(), "test", "model", restored).is_ok());
  EXPECT_EQ(restored.sink_tokens(0), 4);
  std::vector<uint8_t> again;
  ASSERT_TRUE(write_kv_transfer(restored, "model", again).is_ok());
  EXPECT_EQ(again, bytes);

  KvStore plain({1, 2, 16, 16, 100}, *make_kv_pipeline("hack:bits=2,pi=32"));
  plain.append(0, kv.data(), kv.data(), 40);
  ASSERT_TRUE(write_kv_transfer(plain, "model", bytes).is_ok());
  KvStore receiver({1, 2, 16, 16, 100}, *make_kv_pipeline("hack:bits=2,pi=32,window=8"));
  const Status read = read_kv_transfer(bytes.data(), bytes.size(), "test", "model", receiver);
  ASSERT_FALSE(read.is_ok());
  EXPECT_NE(read.message().find("window=8"), std::string::npos) << read.message();
}

}  // namespace
}  // namespace slimkv
