// slimkv serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv SPEC] [--device cpu|cuda[:N]] [--threads N]
//              [--api-key KEY] [--max-model-len N] [--max-num-seqs N] [--kv-cache-bytes N]
//              [--served-model-name NAME] [--role both|prefill|decode] [--kv-port N] [--kv-bandwidth-gbps X]
//              [--kv-transport auto|tcp]
// An OpenAI-compatible server with continuous batching (docs/serving.md). Exits 0 after SIGINT/SIGTERM.
#include "slimkv/server.h"
#include "tools/commands.h"

namespace slimkv {

CommandRunner add_serve_command(CLI::App& app) {
  struct Options {
    CommonOptions common;
    ServerConfig server;
    int max_num_seqs = 16;
    size_t kv_cache_bytes = 0;
    size_t host_kv_bytes = size_t(4) << 30;
    size_t kv_buffer_bytes = size_t(4) << 30;
    int prefill_chunk_tokens = 512;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  options->common.add_to(*command);
  command->add_option("--host", options->server.host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  command->add_option("--port", options->server.port, "port to listen on (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  command->add_option("--api-key", options->server.api_key, "require 'Authorization: Bearer KEY' on /v1/ endpoints");
  command->add_option("--served-model-name", options->server.served_model_name,
                      "the model's name in the API (default: the model directory's name)");
  command->add_option("--max-model-len", options->server.max_model_len,
                      "prompt + generated tokens at most (default: the model's context)")->check(CLI::Range(2, 1 << 30));
  command->add_option("--max-num-seqs", options->max_num_seqs, "requests running at once (more wait in a queue)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  command->add_option("--kv-cache-bytes", options->kv_cache_bytes,
                      "memory for KV blocks, all requests together (0: max-num-seqs full contexts, within 90% of free memory)")
      ->capture_default_str();
  command->add_option("--host-kv-bytes", options->host_kv_bytes,
                      "host memory for the KV of preempted requests (beyond it they are recomputed)")->capture_default_str();
  command->add_option("--role", options->server.role,
                      "both: the colocated server; prefill: also prefills for decode workers (POST /internal/v1/prefill) "
                      "and streams them the KV; decode: also generates from KV streams (requests with kv_transfer)")
      ->check(CLI::IsMember({"both", "prefill", "decode"}))->capture_default_str();
  command->add_option("--kv-port", options->server.kv_port,
                      "decode: the port the KV stream listens on (default: the HTTP port + 1; 0: any free port, printed)")
      ->check(CLI::Range(0, 65535));
  command->add_option("--kv-bandwidth-gbps", options->server.kv_bandwidth_gbps,
                      "prefill: cap on the rate of the KV streams it sends, in Gbit/s (token bucket; 0: none)")
      ->check(CLI::Range(0.0, 1e6))->capture_default_str();
  command->add_option("--kv-transport", options->server.kv_transport,
                      "prefill/decode: auto (CUDA IPC when both workers are on one GPU and no --kv-bandwidth-gbps is set, "
                      "NCCL when they are on two GPUs and both have NCCL, else TCP) or tcp")
      ->check(CLI::IsMember({"auto", "tcp"}))->capture_default_str();
  command->add_option("--kv-unclaimed-bytes", options->server.kv_unclaimed_bytes,
                      "decode: bytes of received KV streams waiting for their request, at most (the oldest are dropped)")
      ->capture_default_str();
  command->add_option("--kv-buffer-bytes", options->kv_buffer_bytes,
                      "prefill/decode: KV transfer buffers kept for the next transfers, bytes at most (freed after a "
                      "minute unused; 0: a fresh buffer per transfer)")
      ->capture_default_str();
  command->add_option("--prefill-chunk-tokens", options->prefill_chunk_tokens,
                      "prompts run in chunks of this many tokens (a step: one chunk's worth beside a decode token of every other sequence)")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();

  return [options]() -> Status {
    EngineConfig engine = options->common.engine_config();
    engine.max_sequences = options->max_num_seqs;
    engine.kv_cache_bytes = options->kv_cache_bytes;
    engine.prefill_chunk_tokens = options->prefill_chunk_tokens;
    engine.transfer_buffer_bytes = options->kv_buffer_bytes;
    SchedulerConfig scheduler;
    scheduler.max_running = options->max_num_seqs;
    scheduler.host_kv_bytes = options->host_kv_bytes;
    return run_server(engine, scheduler, options->server);
  };
}

}  // namespace slimkv
