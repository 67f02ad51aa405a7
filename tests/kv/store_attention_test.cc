// Paged attention over the KV store against the FP64 reference: shapes that break naive code (one
// token, partial blocks, many blocks, GQA ratios, head dims 64/80/128), tokens appended in chunks of
// every size, and every dense storage dtype (compared with the reference on the same rounded K/V).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/reference.h"
#include "kv/kv_factory.h"
#include "kv/spec_errors.h"
#include "kv/store_attention.h"
#include "util/half.h"

namespace slimkv {
namespace {

struct AttentionCase {
  std::string spec;
  int n_tokens, num_heads, num_kv_heads, head_dim, chunk, threads;
  int window = 0;  // a sliding-window layer (KvShape::window_tokens): each query sees its last `window`
  std::string name() const {
    return str_cat("attn(kv=", spec, ",tokens=", n_tokens, ",heads=", num_heads, "/", num_kv_heads,
                   ",d=", head_dim, ",chunk=", chunk, ",threads=", threads, ",window=", window, ")");
  }
};

// What the open block holds: FP16, but FP32 for dense FP32 (Codec::open_block_dtype).
float held_open(float x, const std::string& spec) {
  return spec.find("dtype=") == std::string::npos ? x : fp16_to_float(float_to_fp16(x));
}

// What the stored value is after the codec's rounding (dense only).
float stored(float x, const std::string& spec) {
  if (spec.find("dtype=f16") != std::string::npos) return fp16_to_float(float_to_fp16(x));
  if (spec.find("dtype=bf16") != std::string::npos) return bf16_to_float(float_to_bf16(x));
  return x;
}

void check(const AttentionCase& c) {
  SCOPED_TRACE(c.name());
  const unsigned seed = 1234u + unsigned(c.n_tokens * 31 + c.head_dim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int d = c.head_dim, n = c.n_tokens;
  std::vector<float> q(size_t(n) * c.num_heads * d), k(size_t(n) * c.num_kv_heads * d), v(k.size());
  for (float& x : q) x = normal(rng);
  for (float& x : k) x = 1.5f * normal(rng);  // peaky softmax: errors in max handling show
  for (float& x : v) x = normal(rng);

  auto pipeline = make_kv_pipeline(c.spec);
  ASSERT_TRUE(pipeline) << pipeline.status().message();
  KvShape shape(1, c.num_kv_heads, d, d, n);
  if (c.window > 0) shape.window_tokens = {c.window};
  KvStore store(shape, *pipeline);
  std::vector<float> out(size_t(n) * c.num_heads * d, NAN);
  ThreadPool pool(c.threads);
  const AttentionParams params{c.num_heads, 1.0f / std::sqrt(float(d)), &pool, true, c.window};
  for (int first = 0; first < n; first += c.chunk) {
    const int m = std::min(c.chunk, n - first);
    store.append(0, k.data() + size_t(first) * c.num_kv_heads * d, v.data() + size_t(first) * c.num_kv_heads * d, m);
    attend(store, 0, q.data() + size_t(first) * c.num_heads * d, m, first, params,
           out.data() + size_t(first) * c.num_heads * d);
    store.release_outside_window(0);  // a later chunk's queries must not need what this frees
  }
  // The reference sees the values as stored: the open block as it holds them, sealed blocks rounded
  // by the codec from that.
  const int sealed_tokens = store.num_sealed_blocks(0) * store.block_tokens();
  std::vector<float> k_open(k), v_open(v);
  for (float& x : k_open) x = held_open(x, c.spec);
  for (float& x : v_open) x = held_open(x, c.spec);
  std::vector<float> k_seen(k_open), v_seen(v_open);
  for (size_t i = 0; i < size_t(sealed_tokens) * c.num_kv_heads * d; ++i) {
    k_seen[i] = stored(k_open[i], c.spec);
    v_seen[i] = stored(v_open[i], c.spec);
  }
  // ...but a query that was answered before its block sealed saw the open block's values. Recompute
  // the reference per chunk to mirror that.
  std::vector<float> expected(out.size());
  for (int first = 0; first < n; first += c.chunk) {
    const int m = std::min(c.chunk, n - first);
    const int sealed_then = ((first + m) / store.block_tokens()) * store.block_tokens();
    std::vector<float> k_then(k_open), v_then(v_open);
    for (size_t i = 0; i < size_t(sealed_then) * c.num_kv_heads * d; ++i) {
      k_then[i] = k_seen[i];
      v_then[i] = v_seen[i];
    }
    if (c.window == 0) {
      std::vector<int> positions(static_cast<size_t>(m));
      for (int i = 0; i < m; ++i) positions[size_t(i)] = first + i;
      attention_reference(q.data() + size_t(first) * c.num_heads * d, m, positions.data(), k_then.data(),
                          v_then.data(), first + m, c.num_heads, c.num_kv_heads, d, d, params.scale,
                          expected.data() + size_t(first) * c.num_heads * d);
      continue;
    }
    for (int p = first; p < first + m; ++p) {  // one query at a time over its window's keys
      const int lo = std::max(0, p - c.window + 1), position = p - lo;
      const size_t row = size_t(lo) * c.num_kv_heads * d;
      attention_reference(q.data() + size_t(p) * c.num_heads * d, 1, &position, k_then.data() + row,
                          v_then.data() + row, p + 1 - lo, c.num_heads, c.num_kv_heads, d, d, params.scale,
                          expected.data() + size_t(p) * c.num_heads * d);
    }
  }
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "non-finite output at " << i;
    err2 += double(out[i] - expected[i]) * (out[i] - expected[i]);
    ref2 += double(expected[i]) * expected[i];
  }
  // FP32 accumulation against FP64: NMSE ~1e-13 expected; allow 1e-10.
  EXPECT_LT(err2 / ref2, 1e-10) << "seed " << seed;
}

TEST(Attention, DenseMatchesReferenceOnEdgeShapes) {
  const std::vector<AttentionCase> cases = {
      {"dense", 1, 4, 4, 64, 1, 1},
      {"dense", 63, 8, 2, 64, 63, 2},
      {"dense", 64, 8, 2, 128, 64, 1},
      {"dense", 65, 8, 2, 128, 7, 2},
      {"dense", 200, 32, 8, 128, 1, 2},
      {"dense", 130, 6, 1, 80, 130, 2},
      {"dense", 97, 4, 2, 96, 33, 1},
      {"dense:block=16", 113, 8, 2, 64, 5, 2},
      {"dense:block=1", 9, 2, 1, 16, 2, 1},
      {"dense:dtype=f16", 150, 8, 2, 128, 150, 2},
      {"dense:dtype=bf16,block=32", 150, 4, 4, 64, 1, 2},
      {"dense:dtype=f16,block=128", 300, 4, 2, 64, 100, 2},
  };
  for (const AttentionCase& c : cases) check(c);
}

// Sliding-window layers (Gemma 3): each query sees only its last `window` tokens, whether the window
// starts inside a sealed block (read through the codec's decode_tokens), the open block or a prefill
// chunk; the blocks that leave the window are freed between calls and never read again.
TEST(Attention, SlidingWindowMatchesReference) {
  const std::vector<AttentionCase> cases = {
      {"dense", 150, 4, 2, 64, 150, 2, 40},         // window < block: starts in the open block and chunk
      {"dense:block=16", 113, 8, 2, 64, 5, 2, 40},  // starts inside sealed blocks
      {"dense:block=16", 100, 4, 1, 32, 1, 1, 16},  // window = block, token by token
      {"dense:dtype=f16,block=32", 150, 4, 2, 64, 7, 2, 33},
      {"dense:block=8", 90, 2, 2, 16, 90, 2, 1},    // only the token itself
  };
  for (const AttentionCase& c : cases) check(c);
}

// zack's ranks are rounded as the codec after it stores dims unless the spec says align=: 4 before hack or
// quant, whole V groups with vlayout=token, 1 over dense; an explicit align is kept (and checked at load).
TEST(KvSpec, ZackRanksAlignToTheCodecAfterItUnlessTold) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"zack:rate=0.5", 1},
      {"zack:rate=0.5+hack:bits=4", 4},
      {"zack:r=0.1+quant:bits=2", 4},
      {"zack:rate=0.5+hack:bits=2,klayout=channel,vlayout=token,vgroup=32", 32},
      {"zack:rate=0.5,align=1+hack:bits=4", 1},
      {"zack:rate=0.5,align=16+hack:bits=4", 16},
  };
  for (const auto& [spec, align] : cases) {
    const Expected<KvPipeline> pipeline = make_kv_pipeline(spec);
    ASSERT_TRUE(pipeline) << spec << ": " << pipeline.status().message();
    ASSERT_TRUE(pipeline->zack) << spec;
    EXPECT_EQ(pipeline->zack->align, align) << spec;
    EXPECT_NE(pipeline->describe().find(str_cat("align=", align)), std::string::npos) << pipeline->describe();
  }
}

TEST(KvSpec, ErrorsQuoteTheSpecAndNameThePart) {
  test::expect_specs_refused({
      {"", "empty"},
      {"nosuch", "unknown stage 'nosuch'"},
      {"dense:dtype=f8", "dtype=f8"},
      {"dense:blocks=64", "no option 'blocks'"},
      {"dense:block=0", "block=0"},
      {"dense:block=abc", "block=abc"},
      {"dense:dtype", "key=value"},
      {"dense:dtype=f16,dtype=f32", "given twice"},
      {"dense@nowhere", "unknown tier 'nowhere'"},
      {"dense@fast@fast", "more than one"},
      {"dense+dense", "more than one codec"},
      {"+", "stage name"},
  });
  auto good = make_kv_pipeline(" dense : dtype = bf16 , block = 32 ");
  ASSERT_TRUE(good) << good.status().message();
  EXPECT_EQ(good->describe(), "dense:dtype=bf16,block=32,rot=none");
}

TEST(KvStore, MemoryIsWhatWasAllocated) {
  auto pipeline = make_kv_pipeline("dense:dtype=f16");
  ASSERT_TRUE(pipeline);
  KvStore store({2, 2, 128, 128, 1000}, *pipeline);
  std::vector<float> kv(size_t(130) * 2 * 128, 0.5f);
  for (int layer = 0; layer < 2; ++layer) store.append(layer, kv.data(), kv.data(), 130);
  const KvMemory memory = store.memory();
  EXPECT_EQ(memory.sealed_blocks, 2u * 2u * 2u);                 // 2 full blocks × 2 layers × 2 heads
  EXPECT_EQ(memory.sealed_bytes, 8u * 64u * 256u * 2u);          // K+V of 64 tokens × 128 dims in FP16
  EXPECT_EQ(memory.open_bytes, 4u * 64u * 256u * 2u);            // 2 layers × 2 heads, FP16, full size
  EXPECT_EQ(store.open_tokens(0), 2);
}

}  // namespace
}  // namespace slimkv
