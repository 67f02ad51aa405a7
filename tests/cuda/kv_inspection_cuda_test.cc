// slimkv/kv_inspection.h on device "cuda" (what the Python module's session.kv reads there): a host copy
// of the GPU's KV through the transfer format. Dense blocks hold the K/V the GPU computed in FP16 (the
// CPU engine's within the two devices' arithmetic), hack's blocks decode as the CPU's hack blocks do, the
// copy is a snapshot, @offload's blocks are read from the host tier, and zack is read at its per-head ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cuda_test_util.h"
#include "slimkv/kv_inspection.h"
#include "util/half.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string kBundled = slimkv::test::source_dir() + "/models/slimkv-llama-15m";
constexpr int kTokens = 150;  // two sealed blocks of 64, 22 open tokens

using KvInspectionCudaTest = CudaTest;

// An engine on `device` with one session that has run kTokens tokens.
struct Ran {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Session> session;
};
Ran run(const std::string& device, const std::string& kv) {
  Ran out;
  Expected<std::unique_ptr<Engine>> engine = Engine::load({.model_dir = kBundled, .kv_spec = kv, .device = device,
                                                           .threads = 2, .max_sequences = 2});
  EXPECT_TRUE(engine) << kv << " on " << device << ": " << engine.status().message();
  if (!engine) return out;
  out.engine = engine.take();
  out.session = out.engine->new_session();
  std::vector<int32_t> ids(kTokens);
  for (int i = 0; i < kTokens; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % 4000);
  const auto logits = out.session->prefill(ids);
  EXPECT_TRUE(logits) << logits.status().message();
  return out;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// The largest relative L2 distance, over every layer, KV head and block (sealed, then the open tokens),
// between the K/V of `got` and `want`; both must hold the same tokens (and, with one codec, the same
// block bytes: dense is FP16 on the GPU, FP32 on the CPU).
double largest_distance(const KvSnapshot& got, const KvSnapshot& want) {
  double largest = 0;
  const KvLayout layout = kv_layout(want);
  const bool same_codec = kv_layout(got).codec == layout.codec;
  for (int l = 0; l < layout.num_layers; ++l) {
    for (int g = 0; g < layout.num_kv_heads; ++g) {
      const KvHeadLayout head = *kv_head_layout(want, l, g);
      const KvHeadLayout other = *kv_head_layout(got, l, g);
      EXPECT_EQ(other.sealed_blocks, head.sealed_blocks);
      EXPECT_EQ(other.open_tokens, head.open_tokens);
      if (same_codec) {
        EXPECT_EQ(other.block_bytes, head.block_bytes);
      }
      std::vector<float> gk, gv, wk, wv;
      for (int b = 0; b <= head.sealed_blocks; ++b) {
        const bool open = b == head.sealed_blocks;
        EXPECT_TRUE(open ? read_open_kv(got, l, g, gk, gv) : decode_kv_block(got, l, g, b, gk, gv));
        EXPECT_TRUE(open ? read_open_kv(want, l, g, wk, wv) : decode_kv_block(want, l, g, b, wk, wv));
        if (gk.size() != wk.size() || gv.size() != wv.size()) {
          ADD_FAILURE() << "layer " << l << " head " << g << " block " << b << ": sizes differ";
          return INFINITY;
        }
        largest = std::max({largest, relative_l2(gk, wk), relative_l2(gv, wv)});
      }
    }
  }
  return largest;
}

TEST_F(KvInspectionCudaTest, DenseBlocksHoldTheKvTheGpuComputed) {
  Ran gpu = run("cuda", "dense"), cpu = run("cpu", "dense");
  ASSERT_TRUE(gpu.session && cpu.session);
  auto gpu_kv = kv_snapshot(*gpu.engine, *gpu.session);
  auto cpu_kv = kv_snapshot(*cpu.engine, *cpu.session);
  ASSERT_TRUE(gpu_kv) << gpu_kv.status().message();
  ASSERT_TRUE(cpu_kv) << cpu_kv.status().message();
  EXPECT_TRUE(gpu_kv->copied_from_gpu());
  const KvLayout layout = kv_layout(*gpu_kv);
  EXPECT_EQ(layout.num_layers, 8);
  EXPECT_EQ(layout.block_tokens, 64);
  EXPECT_TRUE(layout.codec.starts_with("dense:dtype=f16")) << layout.codec;
  const KvHeadLayout head = *kv_head_layout(*gpu_kv, 7, 1);
  EXPECT_EQ(head.sealed_blocks, 2);
  EXPECT_EQ(head.open_tokens, kTokens - 128);

  // The GPU keeps FP16: every value read back is one exactly.
  std::vector<float> k, v;
  ASSERT_TRUE(decode_kv_block(*gpu_kv, 7, 1, 1, k, v));
  for (float x : k) ASSERT_EQ(fp16_to_float(float_to_fp16(x)), x);
  ASSERT_TRUE(read_open_kv(*gpu_kv, 7, 1, k, v));
  for (float x : v) ASSERT_EQ(fp16_to_float(float_to_fp16(x)), x);
  // And they are the CPU engine's FP32 K/V within FP16 and the GPU's arithmetic.
  const double distance = largest_distance(*gpu_kv, *cpu_kv);
  std::printf("dense: GPU blocks vs CPU blocks, largest relative L2 %.2e\n", distance);
  EXPECT_LT(distance, 2e-2);

  // A copy: the session's next token changes the GPU, not the snapshot; a new snapshot has it.
  ASSERT_TRUE(gpu.session->decode(17));
  EXPECT_EQ(kv_head_layout(*gpu_kv, 0, 0)->open_tokens, kTokens - 128);
  EXPECT_EQ(kv_head_layout(*kv_snapshot(*gpu.engine, *gpu.session), 0, 0)->open_tokens, kTokens - 127);
  auto selection = kv_last_selection(*gpu_kv, 0, 0);
  ASSERT_TRUE(selection);
  EXPECT_TRUE(selection->all);  // no selector: every token
  EXPECT_NE(decode_kv_block(*gpu_kv, 8, 0, 0, k, v).message().find("layer 8 is out of range"), std::string::npos);
  EXPECT_NE(decode_kv_block(*gpu_kv, 0, 0, 2, k, v).message().find("block 2 is out of range"), std::string::npos);
}

TEST_F(KvInspectionCudaTest, HackBlocksDecodeAsTheCpuHackBlocks) {
  Ran gpu = run("cuda", "hack:bits=2"), cpu = run("cpu", "hack:bits=2"), dense = run("cpu", "dense");
  ASSERT_TRUE(gpu.session && cpu.session && dense.session);
  auto gpu_kv = kv_snapshot(*gpu.engine, *gpu.session);
  ASSERT_TRUE(gpu_kv) << gpu_kv.status().message();
  EXPECT_EQ(kv_layout(*gpu_kv).codec, kv_layout(*kv_snapshot(*cpu.engine, *cpu.session)).codec);
  EXPECT_TRUE(kv_layout(*gpu_kv).rotated);
  // The same codec over K/V computed in FP16 instead of FP32: the same codes nearly everywhere.
  const double to_cpu = largest_distance(*gpu_kv, *kv_snapshot(*cpu.engine, *cpu.session));
  std::printf("hack:bits=2: GPU blocks vs CPU blocks, largest relative L2 %.2e\n", to_cpu);
  EXPECT_LT(to_cpu, 0.15);
}

TEST_F(KvInspectionCudaTest, OffloadBlocksAreReadFromTheHostTier) {
  Ran offload = run("cuda", "dense@offload"), gpu = run("cuda", "dense");
  ASSERT_TRUE(offload.session && gpu.session);
  auto kv = kv_snapshot(*offload.engine, *offload.session);
  ASSERT_TRUE(kv) << kv.status().message();
  EXPECT_TRUE(kv_layout(*kv).spec.find("@offload") != std::string::npos) << kv_layout(*kv).spec;
  const double distance = largest_distance(*kv, *kv_snapshot(*gpu.engine, *gpu.session));
  std::printf("dense@offload vs dense on the GPU: largest relative L2 %.2e\n", distance);
  EXPECT_LT(distance, 1e-3);
}

// ZACK's per-head ranks (transfer format version 2): the GPU's copy holds each head at the dims the CPU's
// zack stage keeps for the same spec and model.
TEST_F(KvInspectionCudaTest, ZackIsReadAtTheRanksTheCpuKeeps) {
  const Ran gpu = run("cuda", "zack:rate=0.5"), cpu = run("cpu", "zack:rate=0.5");
  ASSERT_TRUE(gpu.session && cpu.session);
  const Expected<KvSnapshot> on_gpu = kv_snapshot(*gpu.engine, *gpu.session), on_cpu = kv_snapshot(*cpu.engine, *cpu.session);
  ASSERT_TRUE(on_gpu) << on_gpu.status().message();
  ASSERT_TRUE(on_cpu) << on_cpu.status().message();
  const KvLayout layout = kv_layout(*on_gpu);
  int reduced = 0;
  for (int l = 0; l < layout.num_layers; ++l) {
    for (int g = 0; g < layout.num_kv_heads; ++g) {
      const Expected<KvHeadLayout> a = kv_head_layout(*on_gpu, l, g), b = kv_head_layout(*on_cpu, l, g);
      ASSERT_TRUE(a && b);
      EXPECT_EQ(a->k_dim, b->k_dim) << "layer " << l << " KV head " << g;
      EXPECT_EQ(a->v_dim, b->v_dim) << "layer " << l << " KV head " << g;
      EXPECT_EQ(a->sealed_blocks, 2);
      EXPECT_EQ(a->open_tokens, kTokens - 128);
      reduced += a->k_dim + a->v_dim < 2 * 128;
    }
  }
  std::printf("zack:rate=0.5 on the GPU, read back: %d of %d heads below full width\n", reduced,
              layout.num_layers * layout.num_kv_heads);
  EXPECT_GT(reduced, 0);
}

}  // namespace
}  // namespace slimkv::cuda
