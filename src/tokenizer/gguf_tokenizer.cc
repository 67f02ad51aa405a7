#include "tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>

#include "tokenizer/utf8.h"

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

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
constexpr int64_t kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4;

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

// What both kinds of vocabulary share: tokens by id, their types, and the parts of tokenizer.json they
// make (the vocabulary, the added tokens, the post-processor).
struct Vocabulary {
  const std::vector<std::string>* tokens = nullptr;
  std::vector<int64_t> types;  // one per token (absent key: all normal)
  Json vocab = Json::object();
  Json added = Json::array();
  Json post_processor;
};

// `user_defined_normalized`: whether user-defined tokens are matched in the normalized text (as the
// byte-level converter derived them) or in the raw text (SentencePiece: llama.cpp matches them raw).
// `add_bos_default`: llama.cpp's default for add_bos_token when the key is absent.
Expected<Vocabulary> read_vocabulary(const GgufFile& file, bool user_defined_normalized, bool add_bos_default) {
  Vocabulary v;
  SLIMKV_ASSIGN_OR_RETURN(v.tokens, file.get_strings("tokenizer.ggml.tokens"));
  const std::vector<std::string>& tokens = *v.tokens;
  v.types.assign(tokens.size(), kTokenNormal);
  if (file.find("tokenizer.ggml.token_type")) {
    SLIMKV_ASSIGN_OR_RETURN(const std::vector<int64_t>* types, file.get_ints("tokenizer.ggml.token_type"));
    if (types->size() != tokens.size()) {
      return error(file.path(), ": metadata 'tokenizer.ggml.token_type' has ", types->size(), " entries, expected one per token (",
                   tokens.size(), ")");
    }
    v.types = *types;
  }
  std::set<std::string_view> seen;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& token = tokens[id];
    if (!seen.insert(token).second) {
      return error(file.path(), ": metadata 'tokenizer.ggml.tokens' holds \"", token, "\" twice (second at id ", id, ")");
    }
    // llama.cpp matches control, unknown and user-defined tokens inside text (as HF does the added
    // tokens of Llama's tokenizer.json, <unk> included).
    const int64_t type = v.types[id];
    if (type == kTokenControl || type == kTokenUnknown || type == kTokenUserDefined) {
      v.added.push_back({{"id", id}, {"content", token}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                         {"normalized", type == kTokenUserDefined && user_defined_normalized},
                         {"special", type != kTokenUserDefined}});
    }
    v.vocab[token] = id;
  }
  SLIMKV_ASSIGN_OR_RETURN(const int64_t bos, optional_id(file, "tokenizer.ggml.bos_token_id", tokens.size()));
  SLIMKV_ASSIGN_OR_RETURN(const int64_t eos, optional_id(file, "tokenizer.ggml.eos_token_id", tokens.size()));
  SLIMKV_ASSIGN_OR_RETURN(const bool add_bos, flag(file, "tokenizer.ggml.add_bos_token", add_bos_default && bos >= 0));
  SLIMKV_ASSIGN_OR_RETURN(const bool add_eos, flag(file, "tokenizer.ggml.add_eos_token", false));
  if ((add_bos && bos < 0) || (add_eos && eos < 0)) {
    return error(file.path(), ": metadata 'tokenizer.ggml.add_", add_bos && bos < 0 ? "bos" : "eos",
                 "_token' is true, but the file names no such token id");
  }
  v.post_processor = add_bos || add_eos ? post_processor(tokens, add_bos ? bos : -1, add_eos ? eos : -1) : Json(nullptr);
  return v;
}

Json bpe_model(Vocabulary& v, Json unk_token, bool byte_fallback, bool ignore_merges, Json merges) {
  return Json{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", std::move(unk_token)},
              {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", byte_fallback},
              {"byte_fallback", byte_fallback}, {"ignore_merges", ignore_merges}, {"vocab", std::move(v.vocab)},
              {"merges", std::move(merges)}};
}

Expected<std::string> dump(const Json& tokenizer, const GgufFile& file) {
  try {
    return tokenizer.dump();
  } catch (const Json::type_error& e) {  // a token or merge that is not UTF-8
    return error(file.path(), ": metadata 'tokenizer.ggml.tokens' or 'tokenizer.ggml.merges' holds text that is not UTF-8 (",
                 e.what(), ")");
  }
}

// ---------------------------------------------------------------------------------------------
// "gpt2": byte-level BPE with the file's merges and a pre-tokenizer named by tokenizer.ggml.pre.
// ---------------------------------------------------------------------------------------------

Expected<std::string> byte_level_tokenizer_json(const GgufFile& file) {
  const std::vector<std::string> no_merges;  // a vocabulary of single bytes needs none
  const std::vector<std::string>* merges = &no_merges;
  if (file.find("tokenizer.ggml.merges")) {
    SLIMKV_ASSIGN_OR_RETURN(merges, file.get_strings("tokenizer.ggml.merges"));
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
  SLIMKV_ASSIGN_OR_RETURN(Vocabulary v, read_vocabulary(file, /*user_defined_normalized=*/true, /*add_bos_default=*/false));

  Json pre_tokenizer = byte_level(true);
  if (!pre->split.empty()) {
    pre_tokenizer = Json{{"type", "Sequence"},
                         {"pretokenizers",
                          {Json{{"type", "Split"}, {"pattern", {{"Regex", pre->split}}}, {"behavior", "Isolated"},
                                {"invert", false}},
                           byte_level(false)}}};
  }
  const Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", v.added},
      {"normalizer", pre->nfc ? Json{{"type", "NFC"}} : Json(nullptr)},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", v.post_processor},
      {"decoder", byte_level(true)},
      {"model", bpe_model(v, nullptr, /*byte_fallback=*/false, pre->ignore_merges, *merges)},
  };
  return dump(tokenizer, file);
}

// ---------------------------------------------------------------------------------------------
// "llama": SentencePiece. llama.cpp (llm_tokenizer_spm) splits the text into UTF-8 characters and
// repeatedly merges the adjacent pair whose concatenation is the vocabulary entry of highest score
// (leftmost on ties); a character no entry covers becomes its <0xNN> byte tokens, else <unk>. Spaces
// are ▁, with one prepended to each run of text when add_space_prefix (llama.cpp's default).
// tokenizer.json's BPE says the same with merges ranked by that score: every split of every entry
// into two entries, best score first, which is how transformers writes Llama's and Gemma's
// tokenizer.json (convert_slow_tokenizer's SentencePieceExtractor). A list's order alone would rank
// merges of equal score one before the other and apply the first everywhere before the second;
// SentencePiece and llama.cpp take the leftmost of them, so equal scores get equal ranks
// ("merge_ranks", bpe_model.h), which BpeModel applies leftmost first.
// ---------------------------------------------------------------------------------------------

struct ScoredMerges {
  Json merges = Json::array();  // ["left", "right"], best score first
  Json ranks = Json::array();   // one per merge: how many distinct better scores there are
};

Expected<ScoredMerges> merges_by_score(const GgufFile& file, const std::vector<std::string>& tokens) {
  SLIMKV_ASSIGN_OR_RETURN(const std::vector<double>* scores, file.get_reals("tokenizer.ggml.scores"));
  if (scores->size() != tokens.size()) {
    return error(file.path(), ": metadata 'tokenizer.ggml.scores' has ", scores->size(),
                 " entries, expected one per token (", tokens.size(), ")");
  }
  std::unordered_map<std::string_view, size_t> ids;
  ids.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) ids.emplace(tokens[id], id);
  struct Merge {
    double score;
    size_t merged_id;
    size_t split;  // bytes in the left part
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string_view token = tokens[id];
    if (!utf8::is_valid(token)) {
      return error(file.path(), ": metadata 'tokenizer.ggml.tokens' entry ", id, " is not UTF-8");
    }
    for (size_t split = utf8::decode_at(token, 0).size_bytes; split < token.size();
         split += utf8::decode_at(token, split).size_bytes) {
      if (ids.count(token.substr(0, split)) && ids.count(token.substr(split))) {
        merges.push_back({(*scores)[id], id, split});
      }
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  ScoredMerges scored;
  int64_t rank = -1;
  for (size_t i = 0; i < merges.size(); ++i) {
    const Merge& merge = merges[i];
    const std::string& token = tokens[merge.merged_id];
    scored.merges.push_back(Json::array({token.substr(0, merge.split), token.substr(merge.split)}));
    if (i == 0 || merge.score != merges[i - 1].score) ++rank;
    scored.ranks.push_back(rank);
  }
  return scored;
}

Expected<std::string> sentencepiece_tokenizer_json(const GgufFile& file) {
  SLIMKV_ASSIGN_OR_RETURN(Vocabulary v, read_vocabulary(file, /*user_defined_normalized=*/false, /*add_bos_default=*/true));
  SLIMKV_ASSIGN_OR_RETURN(ScoredMerges merges, merges_by_score(file, *v.tokens));
  SLIMKV_ASSIGN_OR_RETURN(const bool add_space_prefix, flag(file, "tokenizer.ggml.add_space_prefix", true));
  Json unk_token = nullptr;
  SLIMKV_ASSIGN_OR_RETURN(const int64_t unk, optional_id(file, "tokenizer.ggml.unknown_token_id", v.tokens->size()));
  if (unk >= 0) unk_token = (*v.tokens)[size_t(unk)];
  for (size_t id = 0; id < v.types.size() && unk < 0; ++id) {
    if (v.types[id] == kTokenUnknown) unk_token = (*v.tokens)[id];
  }

  const Json spaces = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}};
  const Json normalizer =
      add_space_prefix ? Json{{"type", "Sequence"}, {"normalizers", {Json{{"type", "Prepend"}, {"prepend", "▁"}}, spaces}}}
                       : spaces;
  Json decoders = {Json{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                   Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}};
  if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", v.added},
      {"normalizer", normalizer},
      {"pre_tokenizer", nullptr},
      {"post_processor", v.post_processor},
      {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
      {"model", bpe_model(v, unk_token, /*byte_fallback=*/true, /*ignore_merges=*/false, std::move(merges.merges))},
  };
  tokenizer["model"]["merge_ranks"] = std::move(merges.ranks);
  return dump(tokenizer, file);
}

}  // namespace

Expected<std::string> gguf_tokenizer_json(const GgufFile& file) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string model, file.get_string("tokenizer.ggml.model"));
  if (model == "gpt2") return byte_level_tokenizer_json(file);
  if (model == "llama") return sentencepiece_tokenizer_json(file);
  return error(file.path(), ": metadata 'tokenizer.ggml.model' is \"", model,
               "\"; slimkv reads GGUF tokenizers of model \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)");
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
