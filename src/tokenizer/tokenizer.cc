#include "slimkv/tokenizer.h"

#include <nlohmann/json.hpp>

#include "tensor/gguf.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/text_piece.h"
#include "tokenizer/utf8.h"
#include "util/mapped_file.h"
#include "util/json_error.h"

namespace slimkv {

using json_field::Json;

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ============================================================================================
// Loading
// ============================================================================================

Expected<Tokenizer> Tokenizer::load(const std::string& tokenizer_json_path) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(tokenizer_json_path));
  return from_json(text, tokenizer_json_path);
}

Expected<Tokenizer> Tokenizer::load_for_model(const std::string& model) {
  if (has_gguf_magic(model)) return load_gguf_tokenizer(model);
  return load(model + "/tokenizer.json");
}

namespace {

const Json& member_or_null(const Json& object, std::string_view key) {
  static const Json kNull;
  const Json* value = json_field::find(object, key);
  return value == nullptr ? kNull : *value;
}

// The stages of a tokenizer, built from the parsed file before they move into a Tokenizer.
struct TokenizerParts {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<AddedVocabulary> added_vocabulary;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
};

Expected<TokenizerParts> parse_parts(const Json& root) {
  if (!root.is_object()) return error("expected a JSON object at the top level, found ", json_field::describe(root));
  for (const char* unsupported : {"truncation", "padding"}) {
    const Json& value = member_or_null(root, unsupported);
    if (!value.is_null()) {
      return error(unsupported, ": must be null (", unsupported,
                   " changes what encode returns and is not supported; the engine limits lengths itself)");
    }
  }
  TokenizerParts parts;

  const Json* model = json_field::find(root, "model");
  if (model == nullptr || model->is_null()) return error("model: missing (expected the BPE model object)");
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(*model, "model"));
  SLIMKV_ASSIGN_OR_RETURN(const auto model_type, json_field::optional_string(*model, "type", "model"));
  if (model_type && *model_type != "BPE") {
    return error("model.type: unsupported model \"", *model_type,
                 "\" (only BPE is supported; WordPiece, Unigram and WordLevel are not)");
  }
  if (!model_type && json_field::find(*model, "merges") == nullptr) {
    return error("model.type: missing, and the model has no merges (only BPE models are supported)");
  }
  SLIMKV_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::from_json(*model, "model"));
  parts.model = std::make_unique<BpeModel>(std::move(bpe));

  SLIMKV_ASSIGN_OR_RETURN(parts.normalizer, parse_normalizer(member_or_null(root, "normalizer"), "normalizer"));
  SLIMKV_ASSIGN_OR_RETURN(parts.pre_tokenizer, parse_pre_tokenizer(member_or_null(root, "pre_tokenizer"), "pre_tokenizer"));
  SLIMKV_ASSIGN_OR_RETURN(parts.post_processor, parse_post_processor(member_or_null(root, "post_processor"), "post_processor"));
  SLIMKV_ASSIGN_OR_RETURN(parts.decoder, parse_decoder(member_or_null(root, "decoder"), "decoder"));
  SLIMKV_ASSIGN_OR_RETURN(AddedVocabulary added,
                          AddedVocabulary::from_json(json_field::find(root, "added_tokens"), "added_tokens",
                                                     *parts.model, parts.normalizer.get()));
  parts.added_vocabulary = std::make_unique<AddedVocabulary>(std::move(added));
  return parts;
}

}  // namespace

Expected<Tokenizer> Tokenizer::from_json(const std::string& json_text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    return Status::error(json_syntax_error(source, json_text, e.byte, e.what()));
  } catch (const Json::exception& e) {
    return error(source, ": invalid JSON: ", e.what());
  } catch (const std::exception& e) {  // e.g. out of memory
    return error(source, ": cannot parse JSON: ", e.what());
  }
  Expected<TokenizerParts> parts = Status::error("unset");
  try {
    parts = parse_parts(root);
  } catch (const std::exception& e) {  // defensive: nothing in parse_parts is expected to throw
    return error(source, ": cannot read tokenizer: ", e.what());
  }
  if (!parts.has_value()) return parts.status().with_context(source);
  Tokenizer tokenizer;
  tokenizer.normalizer_ = std::move(parts->normalizer);
  tokenizer.pre_tokenizer_ = std::move(parts->pre_tokenizer);
  tokenizer.model_ = std::move(parts->model);
  tokenizer.added_vocabulary_ = std::move(parts->added_vocabulary);
  tokenizer.post_processor_ = std::move(parts->post_processor);
  tokenizer.decoder_ = std::move(parts->decoder);
  return tokenizer;
}

// ============================================================================================
// Encoding and decoding
// ============================================================================================

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  // HF only sees valid strings; invalid bytes become U+FFFD first (see the header).
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::make_valid_utf8(text);
    text = repaired;
  }
  std::vector<TextPiece> pieces;
  added_vocabulary_->split_and_normalize(text, normalizer_.get(), pieces);
  if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const TextPiece& piece : pieces) {
    if (piece.token_id >= 0) {
      ids.push_back(piece.token_id);
    } else {
      model_->tokenize(piece.text, ids);
    }
  }
  if (post_processor_) post_processor_->process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* text = added_vocabulary_->token_text(id);
    if (text == nullptr) text = model_->token_text(id);
    if (text == nullptr) continue;  // unknown id: skipped, as in HF
    if (skip_special_tokens && added_vocabulary_->is_special_text(*text)) continue;
    tokens.push_back(*text);
  }
  if (decoder_) decoder_->decode_chain(tokens);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!decoder_ && i > 0) out.push_back(' ');  // HF joins with spaces when there is no decoder
    out.append(tokens[i]);
  }
  return out;
}

int64_t Tokenizer::vocab_size() const {
  return static_cast<int64_t>(std::max(model_->max_id(), added_vocabulary_->max_id())) + 1;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto id = added_vocabulary_->token_id(token)) return id;
  return model_->token_id(token);
}

bool Tokenizer::is_special(int32_t id) const { return added_vocabulary_->is_special_id(id); }

std::optional<std::string> Tokenizer::token_text(int32_t id) const {
  const std::string* text = added_vocabulary_->token_text(id);
  if (text == nullptr) text = model_->token_text(id);
  if (text == nullptr) return std::nullopt;
  return *text;
}

}  // namespace slimkv
