// What `slimkv eval` measured: one long table of rows {spec, task, metric, value} plus the grid keys
// a row belongs to (length, depth, layer, placement, tier), so that every task is read and plotted the
// same way. A row with no grid key is the task's overall figure for that spec.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace slimkv {

struct ResultRow {
  std::string spec, task, metric;
  double value = 0.0;
  std::optional<int> length;             // tokens in the prompt (passkey, kvret)
  std::optional<double> depth;           // where the needle sits, 0..1 of the filler (passkey)
  std::optional<int> layer;              // per-layer figures (fidelity, memory)
  std::optional<std::string> placement;  // "after" / "before": where the question is (passkey, kvret)
  std::optional<std::string> tier;       // where the bytes live (memory)

  bool is_overall() const { return !length && !depth && !layer; }
};

class EvalResults {
 public:
  // Adds an overall row and returns it, to set grid keys: add(...).layer = 3.
  ResultRow& add(std::string spec, std::string task, std::string metric, double value) {
    ResultRow& row = rows_.emplace_back();
    row.spec = std::move(spec), row.task = std::move(task), row.metric = std::move(metric), row.value = value;
    return row;
  }
  const std::vector<ResultRow>& rows() const { return rows_; }

 private:
  std::vector<ResultRow> rows_;
};

nlohmann::json row_to_json(const ResultRow& row);

// The Markdown table of results.md: one row per spec, one column per overall (task, metric,
// placement, tier), each non-reference value followed by its change against the reference spec.
std::string results_markdown(const EvalResults& results, const std::vector<std::string>& specs,
                             const std::string& reference_spec);

}  // namespace slimkv
