// A window into the forward pass for tools that measure or calibrate (slimkv eval's fidelity task,
// slimkv calibrate): the model calls it at fixed points of every layer, with that layer's buffers.
// It only reads; the forward pass is the same with or without one.
#pragma once

namespace slimkv {

struct ForwardObserver {
  virtual ~ForwardObserver() = default;

  // After projection and RoPE, before the KV store sees them, for the n tokens of this call:
  // q [n, num_heads, head_dim], k and v [n, num_kv_heads, head_dim].
  virtual void on_qkv(int /*layer*/, const float* /*q*/, const float* /*k*/, const float* /*v*/, int /*n*/) {}

  // The attention output before o_proj: [n, num_heads, head_dim].
  virtual void on_attention_output(int /*layer*/, const float* /*out*/, int /*n*/) {}

  // A sparse layer's routing (Qwen3-MoE): each token's probabilities over the experts, the softmax of
  // the router's logits [n, num_experts], of which it takes the experts_per_token largest.
  virtual void on_routing(int /*layer*/, const float* /*probabilities*/, int /*n*/) {}
};

}  // namespace slimkv
