#include "kv/stage_options.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace slimkv {

const std::string* StageOptions::find(std::string_view key) {
  known_.emplace_back(key);
  for (const auto& [k, v] : stage_.options) {
    if (k == key) return &v;
  }
  return nullptr;
}

void StageOptions::fail(std::string_view key, const std::string& value, const std::string& expected) {
  if (!status_.is_ok()) return;  // keep the first error
  status_ = error("KV spec '", spec_, "': ", stage_.name, " option ", key, "=", value, " is invalid: expected ",
                  expected);
}

int StageOptions::integer(std::string_view key, int default_value, std::initializer_list<int> allowed,
                          int min_value, int max_value) {
  const std::string* value = find(key);
  if (!value) return default_value;
  int parsed = 0;
  const char* end = value->data() + value->size();
  const auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
  std::string expected;
  if (allowed.size()) {
    for (int a : allowed) expected += (expected.empty() ? "one of " : ", ") + std::to_string(a);
  } else {
    expected = str_cat("an integer in [", min_value, ", ", max_value, "]");
  }
  const bool in_set = allowed.size() ? std::find(allowed.begin(), allowed.end(), parsed) != allowed.end()
                                     : parsed >= min_value && parsed <= max_value;
  if (ec != std::errc() || ptr != end || !in_set) {
    fail(key, *value, expected);
    return default_value;
  }
  return parsed;
}

double StageOptions::number(std::string_view key, double default_value, double min_value, double max_value) {
  const std::string* value = find(key);
  if (!value) return default_value;
  char* end = nullptr;
  const double parsed = std::strtod(value->c_str(), &end);
  if (end != value->c_str() + value->size() || !(parsed >= min_value && parsed <= max_value)) {
    fail(key, *value, str_cat("a number in [", min_value, ", ", max_value, "]"));
    return default_value;
  }
  return parsed;
}

std::string StageOptions::choice(std::string_view key, std::string_view default_value,
                                 std::initializer_list<std::string_view> allowed) {
  const std::string* value = find(key);
  if (!value) return std::string(default_value);
  if (std::find(allowed.begin(), allowed.end(), *value) == allowed.end()) {
    std::string expected;
    for (std::string_view a : allowed) expected += str_cat(expected.empty() ? "one of " : ", ", a);
    fail(key, *value, expected);
    return std::string(default_value);
  }
  return *value;
}

std::string StageOptions::text(std::string_view key, std::string_view default_value) {
  const std::string* value = find(key);
  return value ? *value : std::string(default_value);
}

Status StageOptions::finish() const {
  SLIMKV_RETURN_IF_ERROR(status_);
  for (const auto& [key, value] : stage_.options) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
      std::string known;
      for (const std::string& k : known_) known += (known.empty() ? "" : ", ") + k;
      return error("KV spec '", spec_, "': ", stage_.name, " has no option '", key, "'",
                   known.empty() ? std::string(" (it takes none)") : str_cat(" (known: ", known, ")"));
    }
  }
  return Status::ok();
}

}  // namespace slimkv
