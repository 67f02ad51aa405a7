// Qwen3-MoE's router (transformers' Qwen3MoeSparseMoeBlock): per row, a softmax over the router's
// logits, the experts_per_token largest probabilities (the lower expert first among equals, as
// torch.topk), rescaled to sum to 1 where normalize_top_k. The CPU's forward pass routes with it, and
// the GPU's routing kernel (backend/cuda/expert_routing.h) is held to it.
#pragma once

#include "model/model_config.h"

namespace slimkv {

// router: [n, num_experts] the router's logits, turned into probabilities in place.
// expert_of, expert_weight: [n, experts_per_token] each row's experts, the most probable first, and the
// weights their outputs are summed with.
void route_to_experts(const MoeConfig& moe, int n, float* router, int* expert_of, float* expert_weight);

}  // namespace slimkv
