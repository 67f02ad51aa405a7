// Fuzzes Tokenizer::from_json with arbitrary bytes. When a document loads, it must encode and decode
// fixed texts (including invalid UTF-8), the input bytes themselves, and arbitrary ids without a
// crash, leak or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json_text(reinterpret_cast<const char*>(data), size);
  slimkv::Expected<slimkv::Tokenizer> loaded = slimkv::Tokenizer::from_json(json_text, "<fuzz>");
  if (!loaded.has_value()) return 0;
  const slimkv::Tokenizer& tokenizer = *loaded;

  const std::string_view texts[] = {
      "",
      "Hello world! It's 2024, y'all.",
      "  leading\ttabs\r\n\r\nand   spaces  ",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E e\xCC\x81 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
      "<s><|endoftext|></s> [CLS] <unk>",
      "bad \xFF\xFE utf8 \xC3 \xED\xA0\x80 \xF0\x9F\x98",
      std::string_view(json_text).substr(0, 512),
  };
  for (const std::string_view text : texts) {
    for (const bool add_special_tokens : {true, false}) {
      const std::vector<int32_t> ids = tokenizer.encode(text, add_special_tokens);
      for (const bool skip : {false, true}) (void)tokenizer.decode(ids, skip);
      slimkv::StreamingDecoder stream(tokenizer);
      for (const int32_t id : ids) (void)stream.push(id);
      (void)stream.finish();
    }
  }
  // Ids that may not exist, negative ids, and every id near the ends of the vocabulary.
  std::vector<int32_t> ids = {-1, 0, 1, 2, 3, 2147483647};
  const int64_t vocab_size = tokenizer.vocab_size();
  for (int64_t id = vocab_size - 4; id < vocab_size + 2; ++id) {
    if (id >= 0 && id <= 2147483647) ids.push_back(static_cast<int32_t>(id));
  }
  (void)tokenizer.decode(ids, false);
  (void)tokenizer.decode(ids, true);
  for (const int32_t id : ids) (void)tokenizer.is_special(id);
  (void)tokenizer.token_id("a");
  return 0;
}
