#include "tokenizer/post_processor.h"

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace slimkv {
namespace {

using json_field::Json;

constexpr int kMaxNesting = 32;

class ByteLevelPostProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>& /*ids*/, bool /*add_special_tokens*/) const override {}
};

// HF's TemplateProcessing for a single sequence: the template's pieces in order, $A standing for
// the sequence and every special token for its ids (special tokens only with add_special_tokens).
class TemplatePostProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int32_t> special_ids;
  };
  explicit TemplatePostProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (const Piece& piece : pieces_) {
      if (piece.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else if (add_special_tokens) {
        out.insert(out.end(), piece.special_ids.begin(), piece.special_ids.end());
      }
    }
    ids = std::move(out);
  }

 private:
  std::vector<Piece> pieces_;
};

// RobertaProcessing and BertProcessing: [cls] ids [sep].
class ClsSepPostProcessor final : public PostProcessor {
 public:
  ClsSepPostProcessor(int32_t cls_id, int32_t sep_id) : cls_id_(cls_id), sep_id_(sep_id) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), cls_id_);
    ids.push_back(sep_id_);
  }

 private:
  int32_t cls_id_;
  int32_t sep_id_;
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> stages) : stages_(std::move(stages)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& stage : stages_) stage->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> stages_;
};

// ["token", id] as Roberta/Bert write cls and sep.
Expected<int32_t> token_pair_id(const Json& spec, std::string_view key, const std::string& path) {
  const std::string field = json_field::member_path(path, key);
  const Json* value = json_field::find(spec, key);
  if (value == nullptr || !value->is_array() || value->size() != 2 || !(*value)[0].is_string()) {
    return error(field, ": expected [\"token\", id]");
  }
  return json_field::as_token_id((*value)[1], json_field::element_path(field, 1));
}

Expected<std::unique_ptr<PostProcessor>> parse_template(const Json& spec, const std::string& path) {
  // special_tokens: {"name": {"id": "name", "ids": [..], "tokens": [..]}}
  std::map<std::string, std::vector<int32_t>> special_ids;
  const std::string specials_path = json_field::member_path(path, "special_tokens");
  if (const Json* specials = json_field::find(spec, "special_tokens"); specials != nullptr && !specials->is_null()) {
    if (!specials->is_object()) {
      return error(specials_path, ": expected an object, found ", json_field::describe(*specials));
    }
    for (auto it = specials->begin(); it != specials->end(); ++it) {
      const std::string entry_path = json_field::member_path(specials_path, "\"" + it.key() + "\"");
      SLIMKV_RETURN_IF_ERROR(json_field::expect_object(it.value(), entry_path));
      SLIMKV_ASSIGN_OR_RETURN(const std::string name, json_field::required_string(it.value(), "id", entry_path));
      const Json* ids = json_field::find(it.value(), "ids");
      if (ids == nullptr || !ids->is_array()) return error(json_field::member_path(entry_path, "ids"), ": expected an array of ids");
      std::vector<int32_t> values;
      for (size_t i = 0; i < ids->size(); ++i) {
        SLIMKV_ASSIGN_OR_RETURN(const int32_t id, json_field::as_token_id((*ids)[i], json_field::element_path(json_field::member_path(entry_path, "ids"), i)));
        values.push_back(id);
      }
      special_ids[name] = std::move(values);
    }
  }

  const std::string single_path = json_field::member_path(path, "single");
  const Json* single = json_field::find(spec, "single");
  if (single == nullptr) return error(single_path, ": missing (expected the template for one sequence)");
  // The template is a list of pieces; HF also accepts a string such as "<s> $A" when building one.
  std::vector<std::pair<std::string, bool>> names;  // (special token name, is_sequence)
  auto add_string_piece = [&](const std::string& word, const std::string& where) -> Status {
    const size_t colon = word.rfind(':');  // "$A:0", "[CLS]:1": the type id after ':' is not needed
    const std::string name = colon == std::string::npos || colon == 0 ? word : word.substr(0, colon);
    if (name == "$" || name == "$A" || name == "$a") {
      names.emplace_back("", true);
    } else if (name == "$B" || name == "$b") {
      return error(where, ": the single-sequence template uses $B");
    } else {
      names.emplace_back(name, false);
    }
    return Status::ok();
  };
  if (single->is_string()) {
    std::istringstream words(single->get<std::string>());
    std::string word;
    while (words >> word) SLIMKV_RETURN_IF_ERROR(add_string_piece(word, single_path));
  } else if (single->is_array()) {
    for (size_t i = 0; i < single->size(); ++i) {
      const Json& piece = (*single)[i];
      const std::string piece_path = json_field::element_path(single_path, i);
      if (piece.is_string()) {
        SLIMKV_RETURN_IF_ERROR(add_string_piece(piece.get<std::string>(), piece_path));
        continue;
      }
      if (const Json* sequence = json_field::find(piece, "Sequence")) {
        SLIMKV_ASSIGN_OR_RETURN(const std::string id, json_field::required_string(*sequence, "id", json_field::member_path(piece_path, "Sequence")));
        if (id != "A") return error(json_field::member_path(piece_path, "Sequence.id"), ": the single-sequence template uses \"", id, "\" (expected \"A\")");
        names.emplace_back("", true);
      } else if (const Json* special = json_field::find(piece, "SpecialToken")) {
        SLIMKV_ASSIGN_OR_RETURN(const std::string id, json_field::required_string(*special, "id", json_field::member_path(piece_path, "SpecialToken")));
        names.emplace_back(id, false);
      } else {
        return error(piece_path, ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, found ", json_field::describe(piece));
      }
    }
  } else {
    return error(single_path, ": expected an array of template pieces, found ", json_field::describe(*single));
  }
  std::vector<TemplatePostProcessor::Piece> pieces;
  for (const auto& [name, is_sequence] : names) {
    if (is_sequence) {
      pieces.push_back({true, {}});
      continue;
    }
    auto it = special_ids.find(name);
    if (it == special_ids.end()) {
      return error(single_path, ": special token \"", name, "\" is not defined in ", specials_path);
    }
    pieces.push_back({false, it->second});
  }
  return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(pieces)));
}

Expected<std::unique_ptr<PostProcessor>> parse(const Json& spec, const std::string& path, int depth) {
  if (spec.is_null()) return std::unique_ptr<PostProcessor>();
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(spec, path));
  if (depth > kMaxNesting) return error(path, ": post-processors nested deeper than ", kMaxNesting);
  SLIMKV_ASSIGN_OR_RETURN(const std::string type, json_field::required_string(spec, "type", path));
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new ByteLevelPostProcessor());
  if (type == "TemplateProcessing") return parse_template(spec, path);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    SLIMKV_ASSIGN_OR_RETURN(const int32_t cls, token_pair_id(spec, "cls", path));
    SLIMKV_ASSIGN_OR_RETURN(const int32_t sep, token_pair_id(spec, "sep", path));
    return std::unique_ptr<PostProcessor>(new ClsSepPostProcessor(cls, sep));
  }
  if (type == "Sequence") {
    const std::string list_path = json_field::member_path(path, "processors");
    const Json* list = json_field::find(spec, "processors");
    if (list == nullptr || !list->is_array()) {
      return error(list_path, ": expected an array of post-processors, found ",
                   list == nullptr ? std::string("nothing") : json_field::describe(*list));
    }
    std::vector<std::unique_ptr<PostProcessor>> stages;
    for (size_t i = 0; i < list->size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(auto stage, parse((*list)[i], json_field::element_path(list_path, i), depth + 1));
      if (stage) stages.push_back(std::move(stage));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(stages)));
  }
  return error(json_field::member_path(path, "type"), ": unsupported post-processor \"", type,
               "\" (supported: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence)");
}

}  // namespace

Expected<std::unique_ptr<PostProcessor>> parse_post_processor(const Json& spec, const std::string& path) {
  return parse(spec, path, 0);
}

}  // namespace slimkv
