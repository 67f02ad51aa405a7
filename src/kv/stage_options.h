// Reads the options of one KV spec stage. Each option is declared once, where the stage is built, with
// its default and allowed values; `finish()` reports the first bad value or any option no one read
// (a typo), quoting the whole spec and listing the options the stage knows.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/kv_config.h"

namespace slimkv {

// The parts of spec text between separators, empty ones included ("a,,b" by ',': "a", "", "b").
std::vector<std::string_view> split_spec_text(std::string_view s, char sep);

class StageOptions {
 public:
  StageOptions(const KvStage& stage, std::string_view spec) : stage_(stage), spec_(spec) {}

  // An integer option; `allowed` empty means any value in [min_value, max_value].
  int integer(std::string_view key, int default_value, std::initializer_list<int> allowed,
              int min_value = 0, int max_value = 1 << 30);
  // A real number in [min_value, max_value].
  double number(std::string_view key, double default_value, double min_value, double max_value);
  // One of a fixed set of words.
  std::string choice(std::string_view key, std::string_view default_value,
                     std::initializer_list<std::string_view> allowed);
  // Free text (a file name, say).
  std::string text(std::string_view key, std::string_view default_value);

  Status finish() const;

 private:
  const std::string* find(std::string_view key);
  void fail(std::string_view key, const std::string& value, const std::string& expected);

  const KvStage& stage_;
  std::string_view spec_;
  std::vector<std::string> known_;
  Status status_;
};

}  // namespace slimkv
