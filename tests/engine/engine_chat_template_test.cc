// Engine::apply_chat_template: the model folder's template (chat_template.jinja) is loaded with the
// engine and rendered through it; a model without one says so (the server's 400). The renderer itself
// is held to transformers' renders in tests/tokenizer/chat_template_fixtures_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv {
namespace {

namespace fs = std::filesystem;
const fs::path kModel = fs::path(slimkv::test::source_dir()) / "models/slimkv-llama-15m";

TEST(EngineChatTemplate, TheModelFoldersTemplateRendersThroughTheEngine) {
  const fs::path dir = fs::temp_directory_path() / "slimkv_engine_chat_template";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kModel)) fs::create_symlink(entry.path(), dir / entry.path().filename());
  std::ofstream(dir / "chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  auto engine = Engine::load({.model_dir = dir.string(), .threads = 1});
  ASSERT_TRUE(engine) << engine.status().message();
  ASSERT_TRUE((*engine)->has_chat_template());
  const nlohmann::ordered_json messages = {{{"role", "system"}, {"content", " Be brief. "}},
                                           {{"role", "user"}, {"content", "Hi"}}};
  auto text = (*engine)->apply_chat_template(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text) << text.status().message();
  EXPECT_EQ(*text, "<|begin_of_text|><|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
  fs::remove_all(dir);
}

TEST(EngineChatTemplate, AModelWithoutATemplateSaysSo) {
  auto engine = Engine::load({.model_dir = kModel.string(), .threads = 1});
  ASSERT_TRUE(engine) << engine.status().message();
  EXPECT_FALSE((*engine)->has_chat_template());
  auto text = (*engine)->apply_chat_template(nlohmann::ordered_json::array(), true);
  ASSERT_FALSE(text);
  EXPECT_NE(text.status().message().find("chat template"), std::string::npos) << text.status().message();
}

}  // namespace
}  // namespace slimkv
