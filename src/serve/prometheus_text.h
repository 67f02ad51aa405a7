// Prometheus's text exposition format (version 0.0.4): HELP/TYPE headers, samples with labels,
// histograms with cumulative buckets. Every sample carries the same leading labels (model_name for the
// server, none for the router). Used by serve's /metrics and the router's.
#pragma once

#include <sstream>
#include <string>

#include "slimkv/scheduler.h"

namespace slimkv {

// A label value with Prometheus's escapes (backslash, double quote, newline).
std::string prometheus_escaped(const std::string& value);

class PrometheusText {
 public:
  // `common_labels`: written first in every sample, e.g. model_name="x" ("" for none).
  explicit PrometheusText(std::string common_labels = "") : common_(std::move(common_labels)) {}

  // A metric of one sample.
  void metric(const std::string& name, const char* type, const char* help, double value, const std::string& labels = "");
  void header(const std::string& name, const char* type, const char* help);
  void sample(const std::string& name, double value, const std::string& labels = "");
  void histogram(const std::string& name, const char* help, const LatencyHistogram& histogram);
  std::string text() const { return out_.str(); }

 private:
  std::string common_;
  std::ostringstream out_;
};

}  // namespace slimkv
