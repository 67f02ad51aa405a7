#include <cctype>

#include "slimkv/kv_config.h"
#include "slimkv/untrusted_text.h"

namespace slimkv {
std::vector<std::string_view> split_spec_text(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

namespace {

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

Expected<KvStage> parse_stage(std::string_view text, std::string_view spec) {
  text = trim(text);
  KvStage stage;
  const size_t colon = text.find(':');
  stage.name = std::string(trim(text.substr(0, colon)));
  if (!is_name(stage.name)) {
    return error("KV spec '", spec, "': expected a stage name (letters, digits, '_' or '-') but found '",
                 stage.name, "'");
  }
  if (colon == std::string_view::npos) return stage;
  for (std::string_view option : split_spec_text(text.substr(colon + 1), ',')) {
    const size_t eq = option.find('=');
    const std::string_view key = trim(option.substr(0, eq));
    if (eq == std::string_view::npos || !is_name(key)) {
      return error("KV spec '", spec, "': option '", trim(option), "' of stage '", stage.name,
                   "' is not of the form key=value");
    }
    const std::string_view value = trim(option.substr(eq + 1));
    if (value.empty()) return error("KV spec '", spec, "': option '", key, "' of stage '", stage.name, "' has no value");
    for (const auto& [seen, unused] : stage.options) {
      if (seen == key) return error("KV spec '", spec, "': option '", key, "' given twice for stage '", stage.name, "'");
    }
    stage.options.emplace_back(std::string(key), std::string(value));
  }
  return stage;
}

}  // namespace

Expected<KvConfig> parse_kv_spec(std::string_view spec) {
  KvConfig config;
  config.spec = std::string(spec);
  // Control characters are refused, not skipped as whitespace: a spec holding one came from a broken
  // script or a hostile client, and echoing it raw in later errors would reach the terminal.
  for (size_t i = 0; i < spec.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(spec[i]);
    if ((c < 0x20 && c != ' ') || c == 0x7F) {
      return error("KV spec ", quote_untrusted(spec), ": control character ", quote_untrusted(spec.substr(i, 1)),
                   " at byte ", i, " (a spec is printable text, e.g. 'hack:bits=2,pi=64')");
    }
  }
  if (trim(spec).empty()) return error("KV spec is empty: expected e.g. 'dense' or 'hack:bits=2,pi=64'");
  const size_t at = spec.find('@');
  if (at != std::string_view::npos) {
    if (spec.find('@', at + 1) != std::string_view::npos) return error("KV spec '", spec, "': more than one '@tier'");
    SLIMKV_ASSIGN_OR_RETURN(config.tier, parse_stage(spec.substr(at + 1), spec));
  }
  for (std::string_view part : split_spec_text(spec.substr(0, at), '+')) {
    SLIMKV_ASSIGN_OR_RETURN(KvStage stage, parse_stage(part, spec));
    config.stages.push_back(std::move(stage));
  }
  return config;
}

}  // namespace slimkv
