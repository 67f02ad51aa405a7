#include "serve/prometheus_text.h"

#include <cstdio>

namespace slimkv {
namespace {

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

}  // namespace

std::string prometheus_escaped(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void PrometheusText::metric(const std::string& name, const char* type, const char* help, double value,
                            const std::string& labels) {
  header(name, type, help);
  sample(name, value, labels);
}

void PrometheusText::header(const std::string& name, const char* type, const char* help) {
  out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

void PrometheusText::sample(const std::string& name, double value, const std::string& labels) {
  out_ << name << '{' << common_ << (common_.empty() || labels.empty() ? "" : ",") << labels << "} " << number(value)
       << '\n';
}

void PrometheusText::histogram(const std::string& name, const char* help, const LatencyHistogram& histogram) {
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

}  // namespace slimkv
