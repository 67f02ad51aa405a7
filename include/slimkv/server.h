// slimkv serve: an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models,
// /health, /tokenize, /detokenize, /metrics) over a Scheduler. docs/serving.md is its manual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "slimkv/engine.h"
#include "slimkv/scheduler.h"
#include "slimkv/status.h"

namespace slimkv {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (the one taken is printed)
  std::string api_key;            // "": no authentication
  std::string served_model_name;  // "": the model directory's name
  int max_model_len = 0;          // prompt + generated tokens at most; 0: the model's context
  size_t max_body_bytes = size_t(32) << 20;
  // HTTP worker threads. cpp-httplib holds one thread per open connection for as long as it streams,
  // and a queued request holds one too: 0 sizes the pool for every running request plus three times as
  // many waiting ones, and 64 more for keep-alive connections and metrics scrapes (at least 128).
  int http_threads = 0;
  // Disaggregated serving (docs/disaggregated.md): "both" (the colocated server), "prefill" (also answers
  // POST /internal/v1/prefill: prefill a request and stream its KV to a decode worker) or "decode" (also
  // takes completion requests with "kv_transfer": generate from a KV stream received on kv_port).
  std::string role = "both";
  int kv_port = -1;              // decode: the KV stream's port; -1: the HTTP port + 1; 0: any free port
  double kv_bandwidth_gbps = 0;  // prefill: token-bucket cap on the KV stream it sends (Gbit/s); 0: none
  // "auto": CUDA IPC between a prefill and a decode worker on one GPU (docs/kv_stream_protocol.md,
  // "CUDA IPC") when the prefill worker has no bandwidth cap; NCCL between workers on two GPUs when both
  // can ("NCCL", paced by the cap); else TCP. "tcp": always TCP.
  std::string kv_transport = "auto";
  // decode: KV streams received whole but not yet claimed by their request hold at most this many bytes
  // (the oldest are dropped, counted in /metrics); each is also dropped after 120 s.
  uint64_t kv_unclaimed_bytes = uint64_t(1) << 30;
};

// Listens at once (answering /health with 503 while the engine loads), loads the engine, serves until
// SIGINT or SIGTERM, then shuts down gracefully: new requests get 503, accepted ones run to their end,
// and it returns ok. Errors: the address cannot be bound, or the engine does not load.
Status run_server(const EngineConfig& engine_config, const SchedulerConfig& scheduler_config,
                  const ServerConfig& server_config);

}  // namespace slimkv
