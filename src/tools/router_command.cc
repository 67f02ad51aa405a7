// slimkv router --prefill URL[,URL...] --decode URL[,URL...] [--host 127.0.0.1] [--port 8000] [--api-key K]
// The front of disaggregated serving (docs/disaggregated.md): serve's OpenAI API over prefill and decode
// workers (`slimkv serve --role prefill|decode`). Exits 0 after SIGINT/SIGTERM.
#include "slimkv/router.h"
#include "tools/commands.h"

namespace slimkv {

CommandRunner add_router_command(CLI::App& app) {
  auto config = std::make_shared<RouterConfig>();
  CLI::App* command = app.add_subcommand("router", "Route OpenAI API requests over prefill and decode workers");
  command->add_option("--prefill", config->prefill_urls, "prefill workers: http://HOST:PORT, comma-separated")
      ->required()->delimiter(',');
  command->add_option("--decode", config->decode_urls, "decode workers: http://HOST:PORT, comma-separated")
      ->required()->delimiter(',');
  command->add_option("--host", config->host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  command->add_option("--port", config->port, "port to listen on (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  command->add_option("--api-key", config->api_key, "require 'Authorization: Bearer KEY' on /v1/ endpoints");
  command->add_option("--max-retries", config->max_retries,
                      "re-dispatches of one request after worker failures, before a 502")
      ->check(CLI::Range(0, 100))->capture_default_str();
  command->add_option("--connect-timeout-s", config->connect_timeout_s, "seconds to connect to a worker")
      ->check(CLI::Range(0.01, 600.0))->capture_default_str();
  command->add_option("--read-timeout-s", config->read_timeout_s,
                      "seconds a worker may stay silent mid-answer before it counts as failed")
      ->check(CLI::Range(0.01, 3600.0))->capture_default_str();
  command->add_option("--kv-timeout-s", config->kv_timeout_s, "seconds a decode worker waits for a request's KV")
      ->check(CLI::Range(0.01, 3600.0))->capture_default_str();
  command->add_option("--health-interval-s", config->health_interval_s,
                      "seconds between probes of every worker's /health (load; down workers come back)")
      ->check(CLI::Range(0.05, 3600.0))->capture_default_str();
  command->add_option("--http-threads", config->http_threads, "HTTP threads: one per open client connection")
      ->check(CLI::Range(8, 65536))->capture_default_str();
  return [config]() -> Status { return run_router(*config); };
}

}  // namespace slimkv
