// GET /metrics: the scheduler's stats in Prometheus's text exposition format (version 0.0.4), with
// vLLM's metric names under the slimkv: prefix (dashboards and routers read those names), plus
// slimkv's own: KV memory per tier, the KV spec, bytes per token.
#pragma once

#include <string>

#include "slimkv/scheduler.h"
#include "transfer/kv_stream.h"

namespace slimkv {

struct MetricsLabels {
  std::string model_name;  // the served model name (vLLM's model_name label)
  std::string kv_spec;     // Engine::kv_description()
  std::string device;      // "cpu" or "cuda"
};

std::string prometheus_text(const SchedulerStats& stats, const MetricsLabels& labels);
// A decode worker's KV streams waiting for their requests (docs/serving.md's metrics table).
std::string prometheus_text(const KvStreamReceiver::Stats& stats, const MetricsLabels& labels);

}  // namespace slimkv
