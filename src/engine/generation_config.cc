// generation_config.json: its text to GenerationDefaults (declared in slimkv/engine.h), in a file of
// its own so that the fuzzer (fuzz/generation_config_fuzz.cc) links it without the engine.
#include <nlohmann/json.hpp>

#include "slimkv/engine.h"
#include "slimkv/untrusted_text.h"
#include "util/json_error.h"

namespace slimkv {

Expected<GenerationDefaults> parse_generation_config(const std::string& text, const std::string& path,
                                                     const std::vector<int64_t>& config_eos_token_ids) {
  GenerationDefaults defaults;
  defaults.eos_token_ids = config_eos_token_ids;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::error(json_syntax_error(path, text, e.byte, e.what()));
  } catch (const std::exception& e) {  // e.g. out of memory
    return error(path, ": cannot parse JSON: ", e.what());
  }
  if (!json.is_object()) return error(path, ": is a JSON ", json.type_name(), ", expected an object");
  if (json.contains("eos_token_id")) {
    const auto& eos = json["eos_token_id"];
    if (eos.is_number_integer()) {
      defaults.eos_token_ids = {eos.get<int64_t>()};
    } else if (eos.is_array()) {
      defaults.eos_token_ids.clear();
      for (const auto& id : eos) {
        if (!id.is_number_integer()) return error(path, ": eos_token_id must hold integers, found ", id.dump());
        defaults.eos_token_ids.push_back(id.get<int64_t>());
      }
    } else if (!eos.is_null()) {
      return error(path, ": eos_token_id must be an integer or a list, found ", quote_untrusted(eos.dump()));
    }
  }
  const auto do_sample = json.find("do_sample");
  if (do_sample != json.end() && !do_sample->is_boolean() && !do_sample->is_null()) {
    return error(path, ": do_sample must be true or false, found ", quote_untrusted(do_sample->dump()));
  }
  if (do_sample != json.end() && do_sample->is_boolean() && do_sample->get<bool>()) {
    // Ranges checked here (a double cast to int out of range is undefined), naming the key.
    const auto number = [&](const char* key, double fallback, double low, double high) -> Expected<double> {
      const auto it = json.find(key);
      if (it == json.end() || it->is_null()) return fallback;
      if (!it->is_number()) return error(path, ": ", key, " must be a number, found ", quote_untrusted(it->dump()));
      const double value = it->get<double>();
      if (!(value >= low && value <= high)) {
        return error(path, ": ", key, " must be in [", low, ", ", high, "], found ", it->dump());
      }
      return value;
    };
    SLIMKV_ASSIGN_OR_RETURN(const double temperature, number("temperature", 1.0, 0.0, 1e6));
    SLIMKV_ASSIGN_OR_RETURN(const double top_k, number("top_k", 50, 0, 1 << 30));
    SLIMKV_ASSIGN_OR_RETURN(const double top_p, number("top_p", 1.0, 0.0, 1.0));
    defaults.temperature = float(temperature);
    defaults.top_k = int(top_k);
    defaults.top_p = float(top_p);
  }
  return defaults;
}

}  // namespace slimkv
