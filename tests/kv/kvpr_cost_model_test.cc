// KVPR's split (kv/tier/kvpr_cost_model.h): the closed form against a sweep of every l on Eq. 10,
// over machines and models where recomputation pays, barely pays, or does not.
#include <gtest/gtest.h>

#include "kv/tier/kvpr_cost_model.h"

namespace slimkv {
namespace {

using Overlap = KvprCostModel::Overlap;

// A model of hidden size h and kv_dim (GQA when below h), FP16, on a link and a GPU.
KvprCostModel model(double h, double kv_dim, double link_gb_s, double tflop_s, Overlap overlap) {
  return {link_gb_s * 1e9, tflop_s * 1e12, h * 2, 2 * kv_dim * 2, 2 * h * 2 * kv_dim, overlap};
}

TEST(KvprCostModel, ClosedFormMatchesTheSweep) {
  for (Overlap overlap : {Overlap::kXFirst, Overlap::kXResident, Overlap::kPipelined}) {
    for (const KvprCostModel& m : {model(4096, 4096, 54, 700, overlap),     // Llama-2-7B-like MHA, H100 PCIe 5
                                   model(4096, 4096, 25, 300, overlap),     // slower link and GPU
                                   model(4096, 1024, 54, 700, overlap),     // Llama-3-8B GQA
                                   model(4096, 4096, 1000, 10, overlap),    // compute far slower than the link
                                   model(4096, 4096, 54, 40, overlap)}) {   // compute a little slower
      for (long s : {0L, 1L, 7L, 100L, 4096L, 32768L}) {
        const long closed = m.best_split(s), swept = m.best_split_by_sweep(s);
        EXPECT_NEAR(m.layer_seconds(closed, s), m.layer_seconds(swept, s), 1e-15) << "s " << s;
      }
    }
  }
}

TEST(KvprCostModel, SplitsWhereRecomputationPays) {
  const KvprCostModel mha = model(4096, 4096, 54, 700, Overlap::kXFirst);
  const long s = 32768, l = mha.best_split(s);
  EXPECT_GT(l, 0);
  EXPECT_LT(l, s);
  EXPECT_LT(mha.layer_seconds(l, s), mha.layer_seconds(0, s));  // better than offloading everything
  // GQA with X crossing the link: X (h values) is larger than K and V (2·kv_dim): offload wins.
  EXPECT_EQ(model(4096, 1024, 54, 700, Overlap::kXFirst).best_split(s), 0);
  EXPECT_EQ(model(4096, 1024, 54, 700, Overlap::kPipelined).best_split(s), 0);
  EXPECT_GT(model(4096, 1024, 54, 700, Overlap::kXResident).best_split(s), 0);
  // Pipelined on a fast GPU, MHA: the link's side falls until every token is recomputed.
  EXPECT_EQ(model(4096, 4096, 54, 700, Overlap::kPipelined).best_split(s), s);
  const KvprCostModel slow_gpu = model(4096, 4096, 54, 40, Overlap::kPipelined);
  EXPECT_GT(slow_gpu.best_split(s), 0);
  EXPECT_LT(slow_gpu.best_split(s), s);
}

}  // namespace
}  // namespace slimkv
