// The plain attention every kernel is tested against: causal softmax attention with GQA, accumulated
// in FP64. Readable and obviously correct, not fast.
#pragma once

namespace slimkv {

// q:   [n_queries, num_heads, k_dim]; query i sits at position q_positions[i] and sees keys [0, pos],
//      or with window_tokens > 0 (a sliding-window layer) keys [pos - window_tokens + 1, pos].
// k:   [n_keys, num_kv_heads, k_dim]; v: [n_keys, num_kv_heads, v_dim]; query head h reads KV head
//      h / (num_heads / num_kv_heads).
// out: [n_queries, num_heads, v_dim]. scores are scale · q·k.
void attention_reference(const float* q, int n_queries, const int* q_positions, const float* k, const float* v,
                         int n_keys, int num_heads, int num_kv_heads, int k_dim, int v_dim, float scale,
                         float* out, int window_tokens = 0);

}  // namespace slimkv
