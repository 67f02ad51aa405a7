// The mixture-of-experts kernels (backend/cuda/expert_routing.h) against plain references: the routing
// against the CPU's route_to_experts (model/expert_routing.h), on router logits drawn from a few values
// so that rows hold many equal scores (the lower expert first among equals, as the CPU and torch.topk);
// the plan of places against the counting sort of expert_plan_reference.h, value for value; the gather
// and the weighted sum against loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/expert_routing.h"
#include "cuda_test_util.h"
#include "expert_plan_reference.h"
#include "model/expert_routing.h"

namespace slimkv::cuda {
namespace {

using MoeKernels = CudaTest;

struct RoutingCase {
  int n, experts, k;
  bool normalize_top_k;
  std::string name() const {
    return str_cat("route(n=", n, ",experts=", experts, ",k=", k, ",normalize=", normalize_top_k, ")");
  }
};

// Logits in steps of 1/4 over [-2, 2] (ties wherever experts > 17), the last row all equal (every
// choice a tie), and row 1 normal values (ties unlikely, close scores likely among many experts).
std::vector<float> router_logits(const RoutingCase& c, std::mt19937& rng) {
  std::uniform_int_distribution<int> step(-8, 8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(size_t(c.n) * size_t(c.experts));
  for (int t = 0; t < c.n; ++t) {
    for (int e = 0; e < c.experts; ++e) {
      float& l = logits[size_t(t) * size_t(c.experts) + size_t(e)];
      l = t == c.n - 1 ? 0.5f : t == 1 ? normal(rng) : float(step(rng)) / 4.0f;
    }
  }
  return logits;
}

TEST_F(MoeKernels, RoutingMatchesTheCpus) {
  const RoutingCase cases[] = {{1, 8, 2, true},    {5, 4, 3, false},    {37, 128, 8, true}, {64, 60, 4, false},
                               {3, 2048, 1, true}, {9, 33, 33, true},   {130, 512, 10, false}, {2, 1, 1, true}};
  for (const RoutingCase& c : cases) {
    SCOPED_TRACE(c.name());
    const unsigned seed = unsigned(c.n * 131 + c.experts * 7 + c.k);
    std::mt19937 rng(seed);
    SCOPED_TRACE(str_cat("seed ", seed));
    std::vector<float> logits = router_logits(c, rng);
    auto logits_device = on_device(logits);
    const size_t choices = size_t(c.n) * size_t(c.k);
    auto expert_of_device = on_device(std::vector<int32_t>(choices, -7));
    auto weight_device = on_device(std::vector<float>(choices, NAN));
    auto plan_device = on_device(std::vector<int32_t>(expert_plan_values(int(choices), c.experts), 0));
    SLIMKV_ASSERT_OK(route_to_experts(logits_device.data(), c.n, c.experts, c.k, c.normalize_top_k,
                                      expert_of_device.data(), weight_device.data(),
                                      expert_plan_at(plan_device.data(), int(choices), c.experts)));
    const std::vector<int32_t> expert_of = on_host(expert_of_device);
    const std::vector<float> weight = on_host(weight_device);
    EXPECT_EQ(on_host(logits_device), logits) << "the logits are left as they were";

    MoeConfig moe;
    moe.num_experts = c.experts;
    moe.experts_per_token = c.k;
    moe.normalize_top_k = c.normalize_top_k;
    std::vector<int> want_expert(choices);
    std::vector<float> want_weight(choices);
    route_to_experts(moe, c.n, logits.data(), want_expert.data(), want_weight.data());
    for (size_t i = 0; i < choices; ++i) {
      ASSERT_EQ(expert_of[i], want_expert[i]) << "row " << i / size_t(c.k) << " choice " << i % size_t(c.k);
      // expf on the GPU, std::exp on the CPU: a few ulp apart.
      ASSERT_NEAR(weight[i], want_weight[i], 1e-6f * std::max(1.0f, want_weight[i])) << "choice " << i;
    }
    EXPECT_EQ(on_host(plan_device), expert_plan_reference(want_expert, c.k, c.experts, 0)) << "the plan";
  }
}

TEST_F(MoeKernels, RoutingRefusesMoreChoicesThanExperts) {
  auto logits = on_device(std::vector<float>(8, 0.0f));
  auto expert_of = on_device(std::vector<int32_t>(8, 0));
  auto weight = on_device(std::vector<float>(8, 0.0f));
  const Status status = route_to_experts(logits.data(), 2, 4, 5, true, expert_of.data(), weight.data(), ExpertRowsPlan{});
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("5 of 4 experts"), std::string::npos) << status.message();
}

struct PlanCase {
  int n, k, experts;
  int favourite;     // -1: each row's k experts drawn at random; else every row's first choice is this expert
  int unrouted_row;  // a row whose choices are all `experts` (route_to_experts' mark of NaN logits), or -1
  std::string name() const {
    return str_cat("plan(n=", n, ",k=", k, ",experts=", experts, ",favourite=", favourite, ",unrouted=", unrouted_row, ")");
  }
};

// Each row's k distinct experts in a random order (the unrouted row's: `experts`, no expert), and
// logits that route to them: the j-th chosen 10 - j, the others 0; NaN throughout the unrouted row.
std::vector<int32_t> random_choices(const PlanCase& c, std::mt19937& rng, std::vector<float>& logits) {
  std::vector<int32_t> expert_of;
  std::vector<int32_t> all(static_cast<size_t>(c.experts));
  std::iota(all.begin(), all.end(), 0);
  logits.assign(size_t(c.n) * size_t(c.experts), 0.0f);
  for (int t = 0; t < c.n; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    if (c.favourite >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), c.favourite));
    float* row = logits.data() + size_t(t) * size_t(c.experts);
    for (int j = 0; j < c.k; ++j) {
      expert_of.push_back(t == c.unrouted_row ? c.experts : all[size_t(j)]);
      row[all[size_t(j)]] = 10.0f - float(j);
    }
    if (t == c.unrouted_row) std::fill(row, row + c.experts, NAN);
  }
  return expert_of;
}

// Decode batches of Qwen3-MoE's shape (128 experts, 8 a row) up to a prefill chunk, one expert chosen by
// every row, a row of no experts, the most experts the routing holds, one expert, no rows. Each twice
// on the same plan: the routing's count of finished CTAs is back to 0 after each launch.
TEST_F(MoeKernels, PlanGroupsTheChoicesByExpertAsTheReference) {
  const PlanCase cases[] = {{1, 8, 128, -1, -1},  {16, 8, 128, -1, -1}, {64, 8, 128, 5, -1}, {512, 8, 128, -1, 3},
                            {3, 2, 4, -1, -1},    {37, 4, 2048, 0, -1},  {1, 1, 1, -1, -1},   {130, 10, 512, 511, 129},
                            {5, 3, 3, -1, 0},     {0, 8, 128, -1, -1}};
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(c.name());
    const unsigned seed = unsigned(c.n * 31 + c.k * 7 + c.experts);
    SCOPED_TRACE(str_cat("seed ", seed));
    std::mt19937 rng(seed);
    std::vector<float> logits;
    const std::vector<int32_t> want_expert = random_choices(c, rng, logits);
    const int choices = c.n * c.k;
    const std::vector<int32_t> want = expert_plan_reference(want_expert, c.k, c.experts);
    std::vector<int32_t> unset = want;  // the count 0, every other value -7: places of no choice stay so
    std::fill(unset.begin() + 1, unset.end(), -7);
    auto values = on_device(unset);
    auto logits_device = on_device(logits.empty() ? std::vector<float>(1, 0.0f) : logits);
    auto expert_of_device = on_device(std::vector<int32_t>(size_t(std::max(choices, 1)), -7));
    auto weight_device = on_device(std::vector<float>(size_t(std::max(choices, 1)), 0.0f));
    for (int launch = 0; launch < 2; ++launch) {
      SCOPED_TRACE(str_cat("launch ", launch));
      SLIMKV_ASSERT_OK(route_to_experts(logits_device.data(), c.n, c.experts, c.k, true, expert_of_device.data(),
                                        weight_device.data(), expert_plan_at(values.data(), choices, c.experts)));
      const std::vector<int32_t> expert_of = on_host(expert_of_device);
      for (int i = 0; i < choices; ++i) ASSERT_EQ(expert_of[size_t(i)], want_expert[size_t(i)]) << "choice " << i;
      const std::vector<int32_t> got = on_host(values);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "value " << i << " of the plan (the count | row_of_place [" << choices
                                   << "] | place_of_choice [" << choices << "] | first_place [" << c.experts + 1
                                   << "] | active_experts)";
      }
    }
  }
}

TEST_F(MoeKernels, GatherCopiesTheRowsAsked) {
  std::mt19937 rng(11);
  const int rows = 9, dim = 70, count = 23;  // rows repeat, some never asked for
  std::vector<float> unused;
  const std::vector<uint16_t> x = random_halves(size_t(rows) * dim, 1.0f, rng, unused);
  std::vector<int32_t> asked(count);
  std::uniform_int_distribution<int32_t> row(0, rows - 1);
  for (int32_t& r : asked) r = row(rng);
  auto x_device = on_device(x);
  auto asked_device = on_device(asked);
  auto grouped_device = on_device(std::vector<uint16_t>(size_t(count) * dim + 5, 0xfbff));  // 5 guard values
  SLIMKV_ASSERT_OK(gather_rows(x_device.data(), dim, asked_device.data(), count, grouped_device.data()));
  const std::vector<uint16_t> grouped = on_host(grouped_device);
  for (int p = 0; p < count; ++p) {
    for (int c = 0; c < dim; ++c) {
      ASSERT_EQ(grouped[size_t(p) * dim + size_t(c)], x[size_t(asked[size_t(p)]) * dim + size_t(c)]) << p << "," << c;
    }
  }
  for (size_t i = size_t(count) * dim; i < grouped.size(); ++i) EXPECT_EQ(grouped[i], 0xfbff) << "guard " << i;
}

TEST_F(MoeKernels, WeightedRowsSumAsTheLoop) {
  std::mt19937 rng(5);
  const int n = 7, k = 3, dim = 100, places = n * k;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> expert_out(size_t(places) * dim), weight(static_cast<size_t>(places)), y(size_t(n) * dim);
  for (float& v : expert_out) v = normal(rng);
  for (float& v : weight) v = std::fabs(normal(rng));
  for (float& v : y) v = normal(rng);
  std::vector<int32_t> position(static_cast<size_t>(places));
  std::iota(position.begin(), position.end(), 0);
  std::shuffle(position.begin(), position.end(), rng);
  auto out_device = on_device(expert_out);
  auto position_device = on_device(position);
  auto weight_device = on_device(weight);
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(str_cat("accumulate ", accumulate));
    auto y_device = on_device(y);
    SLIMKV_ASSERT_OK(add_weighted_rows(out_device.data(), position_device.data(), weight_device.data(), n, k, dim,
                                       y_device.data(), accumulate));
    const std::vector<float> got = on_host(y_device);
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < dim; ++c) {
        double want = accumulate ? y[size_t(t) * dim + size_t(c)] : 0.0;
        for (int j = 0; j < k; ++j) {
          const size_t choice = size_t(t) * k + size_t(j);
          want += double(weight[choice]) * expert_out[size_t(position[choice]) * dim + size_t(c)];
        }
        ASSERT_NEAR(got[size_t(t) * dim + size_t(c)], want, 1e-5 * (1 + std::fabs(want))) << t << "," << c;
      }
    }
  }
}

// A choice of no expert (place -1: its row's logits held a NaN) makes its row NaN, not a silent zero.
TEST_F(MoeKernels, WeightedRowsOfAnUnplacedChoiceAreNaN) {
  const int n = 2, k = 2, dim = 3;
  auto out_device = on_device(std::vector<float>(size_t(n * k * dim), 1.0f));
  auto position_device = on_device(std::vector<int32_t>{0, 1, 2, -1});
  auto weight_device = on_device(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f});
  auto y_device = on_device(std::vector<float>(size_t(n * dim), 0.0f));
  SLIMKV_ASSERT_OK(add_weighted_rows(out_device.data(), position_device.data(), weight_device.data(), n, k, dim,
                                     y_device.data(), false));
  const std::vector<float> y = on_host(y_device);
  for (int c = 0; c < dim; ++c) {
    EXPECT_EQ(y[size_t(c)], 1.0f) << "row 0, column " << c;
    EXPECT_TRUE(std::isnan(y[size_t(dim + c)])) << "row 1, column " << c;
  }
}

}  // namespace
}  // namespace slimkv::cuda
