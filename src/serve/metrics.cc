#include "serve/metrics.h"

#include <cstdio>
#include <sstream>

namespace slimkv {
namespace {

// A label value with Prometheus's escapes (backslash, double quote, newline).
std::string escaped(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

class Exposition {
 public:
  explicit Exposition(const MetricsLabels& labels) : model_(R"(model_name=")" + escaped(labels.model_name) + '"') {}

  void metric(const std::string& name, const char* type, const char* help, double value, const std::string& labels = "") {
    header(name, type, help);
    sample(name, value, labels);
  }
  void header(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double value, const std::string& labels = "") {
    out_ << name << '{' << model_ << (labels.empty() ? "" : ",") << labels << "} " << number(value) << '\n';
  }
  void histogram(const std::string& name, const char* help, const LatencyHistogram& histogram) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < histogram.counts.size(); ++i) {
      cumulative += histogram.counts[i];
      const std::string bound = i < histogram.upper_bounds_s.size() ? number(histogram.upper_bounds_s[i]) : "+Inf";
      sample(name + "_bucket", double(cumulative), R"(le=")" + bound + '"');
    }
    sample(name + "_sum", histogram.sum_s);
    sample(name + "_count", double(histogram.count));
  }
  std::string text() const { return out_.str(); }

 private:
  std::string model_;
  std::ostringstream out_;
};

}  // namespace

std::string prometheus_text(const SchedulerStats& stats, const MetricsLabels& labels) {
  Exposition out(labels);
  out.metric("slimkv:num_requests_running", "gauge", "Requests holding a sequence in the engine.", stats.running);
  out.metric("slimkv:num_requests_waiting", "gauge", "Requests waiting to run, preempted ones included.", stats.waiting);
  out.metric("slimkv:kv_cache_usage_perc", "gauge", "Fraction of the KV block budget in use (1 = full).", stats.kv.usage());
  out.metric("slimkv:prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(stats.prompt_tokens_total));
  out.metric("slimkv:generation_tokens_total", "counter", "Tokens generated.", double(stats.generation_tokens_total));
  out.metric("slimkv:num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.", double(stats.preemptions_total));
  out.header("slimkv:request_success_total", "counter", "Requests finished, by finish reason.");
  const char* reasons[] = {"stop", "length", "abort", "error"};  // vLLM's words; abort = cancelled
  for (size_t i = 0; i < 4; ++i) {
    out.sample("slimkv:request_success_total", double(stats.requests_finished_total[i]),
               std::string(R"(finished_reason=")") + reasons[i] + '"');
  }
  out.histogram("slimkv:time_to_first_token_seconds", "Time from a request's arrival to its first token.",
                stats.time_to_first_token);
  out.histogram("slimkv:inter_token_latency_seconds", "Time between two tokens of a request.", stats.inter_token_latency);
  out.histogram("slimkv:e2e_request_latency_seconds", "Time from a request's arrival to its end.", stats.e2e_request_latency);

  // slimkv's own: where the KV lives and how compact it is.
  const double block_bytes = double(stats.kv.bytes_per_block);
  out.header("slimkv:kv_cache_capacity_bytes", "gauge", "Memory for KV blocks, per tier.");
  out.sample("slimkv:kv_cache_capacity_bytes", double(stats.kv.total_blocks) * block_bytes, R"(tier=")" + labels.device + '"');
  out.header("slimkv:kv_cache_used_bytes", "gauge",
             "KV memory in use, per tier (host_preempted: the KV of requests preempted to host memory).");
  out.sample("slimkv:kv_cache_used_bytes", double(stats.kv.total_blocks - stats.kv.free_blocks) * block_bytes,
             R"(tier=")" + labels.device + '"');
  out.sample("slimkv:kv_cache_used_bytes", double(stats.host_kv_bytes), R"(tier="host_preempted")");
  out.metric("slimkv:kv_cache_bytes_per_token", "gauge", "KV memory one token takes, every layer and head (the codec's sealed size).",
             stats.kv.block_tokens ? block_bytes / stats.kv.block_tokens : 0.0);
  out.metric("slimkv:kv_cache_info", "gauge", "The KV spec the engine runs (value 1).", 1.0,
             R"(kv_spec=")" + escaped(labels.kv_spec) + R"(",device=")" + escaped(labels.device) + '"');
  out.metric("slimkv:num_preemptions_recomputed_total", "counter",
             "Preemptions whose KV did not fit host memory and was recomputed.", double(stats.preemptions_recomputed_total));
  out.metric("slimkv:num_requests_preempted_in_host", "gauge", "Waiting requests whose KV is in host memory.",
             stats.preempted_in_host);
  return out.text();
}

}  // namespace slimkv
