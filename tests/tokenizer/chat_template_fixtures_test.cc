// Real models' chat templates rendered by slimkv must equal transformers' renders byte for byte
// (tests/data/chat_templates/chat_fixtures.json, made by scripts/render_chat_fixtures.py), and a
// conversation transformers refused must be refused too, with the template's own message when
// the template raised it.
#include <gtest/gtest.h>

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/chat/chat_template.h"
#include "util/mapped_file.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kDataDir = slimkv::test::source_dir() + "/tests/data/chat_templates/";

// "2026-11-26T10:52:01" as a std::tm (the clock the fixture was rendered at).
std::tm parse_now(const std::string& text) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  std::time_t t = timegm(&tm);  // normalises tm_wday/tm_yday
  gmtime_r(&t, &tm);
  return tm;
}

TEST(ChatTemplateFixtures, RendersEqualTransformers) {
  Expected<std::string> text = read_text_file(kDataDir + "chat_fixtures.json");
  ASSERT_TRUE(text.has_value()) << text.status().message();
  const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(*text);
  std::map<std::string, std::string> sources;
  std::map<std::string, std::pair<int, int>> passed_per_template;  // passed, total
  int passed = 0, total = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>() + " / " + c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const std::string file = c["template"];
    if (!sources.count(file)) {
      Expected<std::string> source = read_text_file(kDataDir + file);
      ASSERT_TRUE(source.has_value()) << source.status().message();
      sources[file] = *source;
    }
    auto token = [&](const char* key) {
      return c[key].is_null() ? std::optional<std::string>() : std::optional<std::string>(c[key].get<std::string>());
    };
    Expected<ChatTemplate> chat = ChatTemplate::from_source(sources[file], token("bos_token"), token("eos_token"));
    ASSERT_TRUE(chat.has_value()) << chat.status().message();
    const std::tm now = parse_now(c["now"]);
    chat->set_clock([now] { return now; });
    const Expected<std::string> rendered = chat->render(c["messages"], c["add_generation_prompt"], c["extra"]);
    ++total;
    ++passed_per_template[file].second;
    bool ok = false;
    if (c.contains("expected")) {
      if (!rendered.has_value()) {
        ADD_FAILURE() << name << ": transformers rendered it, slimkv failed: " << rendered.status().message();
      } else if (*rendered != c["expected"].get<std::string>()) {
        ADD_FAILURE() << name << ": render differs\n--- transformers:\n" << c["expected"].get<std::string>()
                      << "\n--- slimkv:\n" << *rendered;
      } else {
        ok = true;
      }
    } else {
      const std::string expected_error = c["error"];
      if (rendered.has_value()) {
        ADD_FAILURE() << name << ": transformers refused (" << expected_error << "), slimkv rendered:\n" << *rendered;
      } else if (c["error_type"] == "TemplateError" &&
                 rendered.status().message().find(expected_error) == std::string::npos) {
        // raise_exception()'s message is the template's own: it must come through unchanged.
        ADD_FAILURE() << name << ": refusal message differs: transformers '" << expected_error << "', slimkv '"
                      << rendered.status().message() << "'";
      } else {
        ok = true;
      }
    }
    if (ok) {
      ++passed;
      ++passed_per_template[file].first;
    }
  }
  for (const auto& [file, counts] : passed_per_template) {
    std::printf("  %-52s %3d/%d\n", file.c_str(), counts.first, counts.second);
  }
  std::printf("chat template fixtures (%s): %d/%d cases equal\n", fixture["renderer"].get<std::string>().c_str(), passed,
              total);
  EXPECT_GT(total, 200);
}

}  // namespace
}  // namespace slimkv
