#include "slimkv/eval_results.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace slimkv {

nlohmann::json row_to_json(const ResultRow& row) {
  nlohmann::json out = {{"spec", row.spec}, {"task", row.task}, {"metric", row.metric}, {"value", row.value}};
  if (row.length) out["length"] = *row.length;
  if (row.depth) out["depth"] = *row.depth;
  if (row.layer) out["layer"] = *row.layer;
  if (row.placement) out["placement"] = *row.placement;
  if (row.tier) out["tier"] = *row.tier;
  return out;
}

namespace {

// Metrics that are already a comparison with the reference get no delta column of their own.
bool is_relative_to_reference(const std::string& metric) {
  return metric == "kld" || metric == "kld_p99" || metric == "top1" || metric == "rel_l2" || metric == "recall";
}

// Fractions (accuracies) change by points; everything else by percent.
bool is_fraction(const std::string& metric) { return metric == "accuracy" || metric == "ratio_fp16"; }

std::string format_value(double value) {
  char text[32];
  const double magnitude = std::fabs(value);
  if (value == 0.0 || (magnitude >= 0.01 && magnitude < 1e5)) {
    std::snprintf(text, sizeof text, magnitude >= 100 ? "%.1f" : "%.4g", value);
  } else {
    std::snprintf(text, sizeof text, "%.3g", value);
  }
  return text;
}

std::string format_delta(const std::string& metric, double value, double reference) {
  char text[40];
  if (is_fraction(metric)) {
    std::snprintf(text, sizeof text, " (%+.3g)", value - reference);
  } else if (reference != 0.0) {
    std::snprintf(text, sizeof text, " (%+.2f%%)", 100.0 * (value - reference) / reference);
  } else {
    return "";
  }
  return text;
}

struct Column {
  std::string task, metric, placement, tier;
  auto operator<=>(const Column&) const = default;
  std::string title() const {
    std::string title = task + " " + metric;
    if (!placement.empty()) title += " (q " + placement + ")";
    if (!tier.empty()) title += " [" + tier + "]";
    return title;
  }
};

}  // namespace

std::string results_markdown(const EvalResults& results, const std::vector<std::string>& specs,
                             const std::string& reference_spec) {
  // Columns in the order their first row was added: tasks in the order they ran.
  std::vector<Column> columns;
  std::map<std::pair<std::string, Column>, double> cell;
  for (const ResultRow& row : results.rows()) {
    if (!row.is_overall()) continue;
    const Column column{row.task, row.metric, row.placement.value_or(""), row.tier.value_or("")};
    if (std::find(columns.begin(), columns.end(), column) == columns.end()) columns.push_back(column);
    cell[{row.spec, column}] = row.value;
  }
  std::string out = "| spec |";
  for (const Column& column : columns) out += " " + column.title() + " |";
  out += "\n|---|";
  for (size_t i = 0; i < columns.size(); ++i) out += "---|";
  out += "\n";
  for (const std::string& spec : specs) {
    out += "| `" + spec + "` |";
    for (const Column& column : columns) {
      const auto found = cell.find({spec, column});
      if (found == cell.end()) {
        out += " |";
        continue;
      }
      out += " " + format_value(found->second);
      const auto reference = cell.find({reference_spec, column});
      if (spec != reference_spec && reference != cell.end() && !is_relative_to_reference(column.metric)) {
        out += format_delta(column.metric, found->second, reference->second);
      }
      out += " |";
    }
    out += "\n";
  }
  return out;
}

}  // namespace slimkv
