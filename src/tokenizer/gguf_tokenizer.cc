#include "tokenizer/gguf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

namespace slimkv {
namespace {

// nlohmann::json, not ordered_json: its objects are maps (ordered_json inserts in linear time, which
// is quadratic over a 128k-token vocabulary); only arrays need their order here.
using Json = nlohmann::json;

// The split regexes of the pre-tokenizers llama.cpp names in tokenizer.ggml.pre (llama-vocab.cpp),
// as their Hugging Face tokenizer.json files write them.
constexpr std::string_view kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

struct GgufPreTokenizer {
  std::string_view name;   // tokenizer.ggml.pre
  std::string_view split;  // a Split regex before ByteLevel; empty: ByteLevel's own (GPT-2) regex
  bool nfc;                // an NFC normalizer first (Qwen2's tokenizer.json has one)
  bool ignore_merges;      // a word that is itself a token is not merged (Llama 3)
};
constexpr GgufPreTokenizer kPreTokenizers[] = {
    {"llama-bpe", kLlama3Split, false, true},
    {"qwen2", kQwen2Split, true, false},
    {"gpt-2", "", false, false},
    {"default", "", false, false},
};

constexpr int64_t kTokenControl = 3, kTokenUserDefined = 4;

Json byte_level(bool use_regex) {
  return Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// TemplateProcessing that adds BOS before / EOS after the text (add_bos_token / add_eos_token).
Json post_processor(const std::vector<std::string>& tokens, int64_t bos, int64_t eos) {
  Json single = Json::array(), special = Json::object();
  const auto add = [&](int64_t id) {
    const std::string& text = tokens[size_t(id)];
    single.push_back({{"SpecialToken", {{"id", text}, {"type_id", 0}}}});
    special[text] = {{"id", text}, {"ids", {id}}, {"tokens", {text}}};
  };
  if (bos >= 0) add(bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (eos >= 0) add(eos);
  return Json{{"type", "TemplateProcessing"}, {"single", single}, {"pair", single}, {"special_tokens", special}};
}

// An optional bool key (absent: `fallback`).
Expected<bool> flag(const GgufFile& file, const std::string& key, bool fallback) {
  const GgufValue* value = file.find(key);
  if (!value) return fallback;
  if (value->type != GgufValueType::kBool) {
    return error(file.path(), ": metadata '", key, "': expected a bool, found ", gguf_value_type_name(value->type));
  }
  return value->integer != 0;
}

Expected<int64_t> optional_id(const GgufFile& file, const std::string& key, size_t vocab_size) {
  if (!file.find(key)) return int64_t(-1);
  SLIMKV_ASSIGN_OR_RETURN(const int64_t id, file.get_int(key));
  if (id < 0 || size_t(id) >= vocab_size) {
    return error(file.path(), ": metadata '", key, "' is ", id, ", expected an id below the ", vocab_size, " tokens");
  }
  return id;
}

}  // namespace

Expected<std::string> gguf_tokenizer_json(const GgufFile& file) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string model, file.get_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return error(file.path(), ": metadata 'tokenizer.ggml.model' is \"", model,
                 "\"; slimkv reads GGUF tokenizers of model \"gpt2\" (byte-level BPE) only",
                 model == "llama" ? " (SentencePiece files: use the model's tokenizer.json)" : "");
  }
  SLIMKV_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, file.get_strings("tokenizer.ggml.tokens"));
  const std::vector<std::string> no_merges;  // a vocabulary of single bytes needs none
  const std::vector<std::string>* merges = &no_merges;
  if (file.find("tokenizer.ggml.merges")) {
    SLIMKV_ASSIGN_OR_RETURN(merges, file.get_strings("tokenizer.ggml.merges"));
  }
  const std::vector<int64_t> no_types;
  const std::vector<int64_t>* types = &no_types;
  if (file.find("tokenizer.ggml.token_type")) {
    SLIMKV_ASSIGN_OR_RETURN(types, file.get_ints("tokenizer.ggml.token_type"));
    if (types->size() != tokens->size()) {
      return error(file.path(), ": metadata 'tokenizer.ggml.token_type' has ", types->size(), " entries, expected one per token (",
                   tokens->size(), ")");
    }
  }
  std::string pre_name = "default";
  if (file.find("tokenizer.ggml.pre")) {
    SLIMKV_ASSIGN_OR_RETURN(pre_name, file.get_string("tokenizer.ggml.pre"));
  }
  const GgufPreTokenizer* pre = nullptr;
  std::string known;
  for (const GgufPreTokenizer& entry : kPreTokenizers) {
    if (entry.name == pre_name) pre = &entry;
    known += str_cat(known.empty() ? "" : ", ", entry.name);
  }
  if (!pre) {
    return error(file.path(), ": metadata 'tokenizer.ggml.pre' is \"", pre_name, "\"; slimkv knows the pre-tokenizers ",
                 known);
  }

  Json vocab = Json::object(), added = Json::array();
  std::set<std::string_view> seen;
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& token = (*tokens)[id];
    if (!seen.insert(token).second) {
      return error(file.path(), ": metadata 'tokenizer.ggml.tokens' holds \"", token, "\" twice (second at id ", id, ")");
    }
    const int64_t type = types->empty() ? 1 : (*types)[id];
    if (type == kTokenControl || type == kTokenUserDefined) {
      added.push_back({{"id", id}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", type == kTokenUserDefined}, {"special", type == kTokenControl}});
    }
    vocab[token] = id;
  }
  SLIMKV_ASSIGN_OR_RETURN(const int64_t bos, optional_id(file, "tokenizer.ggml.bos_token_id", tokens->size()));
  SLIMKV_ASSIGN_OR_RETURN(const int64_t eos, optional_id(file, "tokenizer.ggml.eos_token_id", tokens->size()));
  SLIMKV_ASSIGN_OR_RETURN(const bool add_bos, flag(file, "tokenizer.ggml.add_bos_token", false));
  SLIMKV_ASSIGN_OR_RETURN(const bool add_eos, flag(file, "tokenizer.ggml.add_eos_token", false));
  if ((add_bos && bos < 0) || (add_eos && eos < 0)) {
    return error(file.path(), ": metadata 'tokenizer.ggml.add_", add_bos && bos < 0 ? "bos" : "eos",
                 "_token' is true, but the file names no such token id");
  }

  Json pre_tokenizer = byte_level(true);
  if (!pre->split.empty()) {
    pre_tokenizer = Json{{"type", "Sequence"},
                         {"pretokenizers",
                          {Json{{"type", "Split"}, {"pattern", {{"Regex", pre->split}}}, {"behavior", "Isolated"},
                                {"invert", false}},
                           byte_level(false)}}};
  }
  Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", pre->nfc ? Json{{"type", "NFC"}} : Json(nullptr)},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", add_bos || add_eos ? post_processor(*tokens, add_bos ? bos : -1, add_eos ? eos : -1)
                                            : Json(nullptr)},
      {"decoder", byte_level(true)},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", pre->ignore_merges}, {"vocab", vocab}, {"merges", *merges}}},
  };
  try {
    return tokenizer.dump();
  } catch (const Json::type_error& e) {  // a token or merge that is not UTF-8
    return error(file.path(), ": metadata 'tokenizer.ggml.tokens' or 'tokenizer.ggml.merges' holds text that is not UTF-8 (",
                 e.what(), ")");
  }
}

Expected<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
  SLIMKV_ASSIGN_OR_RETURN(const std::string json, gguf_tokenizer_json(file));
  return Tokenizer::from_json(json, path + " (its tokenizer.ggml metadata)");
}

Expected<std::string> gguf_chat_template(const GgufFile& file) {
  if (!file.find("tokenizer.chat_template")) return std::string();
  return file.get_string("tokenizer.chat_template");
}

}  // namespace slimkv
