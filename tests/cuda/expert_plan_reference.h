// The plain reference of the experts' plan (backend/cuda/expert_routing.h ExpertRowsPlan, which
// route_to_experts writes): a counting sort in a loop. Shared by the plan's test and the grouped GEMV's (expert_gemv_test.cc), which
// multiplies by a plan made here.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/expert_routing.h"

namespace slimkv::cuda {

// The plan's values as expert_plan_at lays them out: the routing's count (0 after a launch) |
// row_of_place [choices] | place_of_choice [choices] | first_place [experts + 1] | active_experts
// [expert_slots]. Places past the routed choices (a choice of no expert has none) are left as `unset`.
inline std::vector<int32_t> expert_plan_reference(const std::vector<int32_t>& expert_of, int k, int experts,
                                                  int32_t unset = -7) {
  const int choices = int(expert_of.size());
  std::vector<int32_t> values(expert_plan_values(choices, experts), unset);
  const ExpertRowsPlan plan = expert_plan_at(values.data(), choices, experts);
  *plan.finished_ctas = 0;
  std::vector<int32_t> count(size_t(experts), 0);
  for (int32_t e : expert_of) {
    if (e >= 0 && e < experts) ++count[size_t(e)];
  }
  int place = 0, slot = 0;
  for (int e = 0; e < experts; ++e) {
    plan.first_place[e] = place;
    if (count[size_t(e)] > 0) plan.active_experts[slot++] = e;
    place += count[size_t(e)];
  }
  plan.first_place[experts] = place;
  for (; slot < expert_slots(choices, experts); ++slot) plan.active_experts[slot] = -1;
  std::vector<int32_t> next(plan.first_place, plan.first_place + experts);
  for (int i = 0; i < choices; ++i) {  // choices in order: each expert's rows ascending
    const int32_t e = expert_of[size_t(i)];
    if (e < 0 || e >= experts) {
      plan.place_of_choice[i] = -1;
      continue;
    }
    const int32_t p = next[size_t(e)]++;
    plan.row_of_place[p] = i / k;
    plan.place_of_choice[i] = p;
  }
  return values;
}

}  // namespace slimkv::cuda
