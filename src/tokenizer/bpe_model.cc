#include "tokenizer/bpe_model.h"

#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>

#include "tokenizer/utf8.h"

namespace slimkv {

using json_field::Json;

// Words already tokenized, shared by all threads that encode with this model. Like HF's cache it
// holds at most kCapacity words, each shorter than kMaxWordBytes, and stops growing when full.
struct BpeModel::WordCache {
  static constexpr size_t kCapacity = 10'000;
  static constexpr size_t kMaxWordBytes = 256;
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

BpeModel::BpeModel() : cache_(std::make_unique<WordCache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

namespace {

Expected<std::pair<std::string, std::string>> parse_merge(const Json& entry, const std::string& path) {
  if (entry.is_string()) {
    const std::string& line = entry.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return error(path, ": expected \"left right\" (two tokens separated by one space), found \"", line, "\"");
    }
    return std::make_pair(line.substr(0, space), line.substr(space + 1));
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return error(path, ": expected \"left right\" or [\"left\", \"right\"], found ", json_field::describe(entry));
}

}  // namespace

Expected<BpeModel> BpeModel::from_json(const Json& spec, const std::string& path) {
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(spec, path));
  BpeModel model;

  // --- options ---
  const Json* dropout = json_field::find(spec, "dropout");
  if (dropout != nullptr && !dropout->is_null()) {
    if (!dropout->is_number()) {
      return error(json_field::member_path(path, "dropout"), ": expected a number or null, found ",
                   json_field::describe(*dropout));
    }
    const double p = dropout->get<double>();
    if (p != 0.0) {
      return error(json_field::member_path(path, "dropout"), ": BPE dropout ", p,
                   " is not supported (it makes encoding random; inference needs null or 0)");
    }
  }
  SLIMKV_ASSIGN_OR_RETURN(model.unk_token_, json_field::optional_string(spec, "unk_token", path));
  SLIMKV_ASSIGN_OR_RETURN(auto prefix, json_field::optional_string(spec, "continuing_subword_prefix", path));
  SLIMKV_ASSIGN_OR_RETURN(auto suffix, json_field::optional_string(spec, "end_of_word_suffix", path));
  model.continuing_subword_prefix_ = prefix.value_or("");
  model.end_of_word_suffix_ = suffix.value_or("");
  SLIMKV_ASSIGN_OR_RETURN(model.fuse_unk_, json_field::optional_bool(spec, "fuse_unk", path, false));
  SLIMKV_ASSIGN_OR_RETURN(model.byte_fallback_, json_field::optional_bool(spec, "byte_fallback", path, false));
  SLIMKV_ASSIGN_OR_RETURN(model.ignore_merges_, json_field::optional_bool(spec, "ignore_merges", path, false));

  // --- vocab: token -> id, ids unique ---
  const std::string vocab_path = json_field::member_path(path, "vocab");
  const Json* vocab = json_field::find(spec, "vocab");
  if (vocab == nullptr) return error(vocab_path, ": missing (expected an object of token: id)");
  if (!vocab->is_object()) return error(vocab_path, ": expected an object of token: id, found ", json_field::describe(*vocab));
  model.vocab_.reserve(vocab->size());
  model.vocab_by_id_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    SLIMKV_ASSIGN_OR_RETURN(const int32_t id, json_field::as_token_id(it.value(), json_field::member_path(vocab_path, "\"" + it.key() + "\"")));
    auto [existing, inserted] = model.vocab_by_id_.emplace(id, it.key());
    if (!inserted) {
      return error(vocab_path, ": id ", id, " is given to both \"", existing->second, "\" and \"", it.key(),
                   "\" (expected each id once)");
    }
    model.vocab_.emplace(it.key(), id);
    if (id > model.max_id_) model.max_id_ = id;
  }

  // --- merges: (left id, right id) -> (rank, merged id); a later duplicate wins, as in HF ---
  const std::string merges_path = json_field::member_path(path, "merges");
  const Json* merges = json_field::find(spec, "merges");
  if (merges == nullptr) return error(merges_path, ": missing (expected an array of merges)");
  if (!merges->is_array()) return error(merges_path, ": expected an array of merges, found ", json_field::describe(*merges));
  model.merges_.reserve(merges->size());
  // slimkv's extension: explicit ranks, equal for merges that tie (see bpe_model.h).
  const std::string ranks_path = json_field::member_path(path, "merge_ranks");
  const Json* ranks = json_field::find(spec, "merge_ranks");
  if (ranks != nullptr && !(ranks->is_array() && ranks->size() == merges->size())) {
    return error(ranks_path, ": expected an array of one rank per merge (", merges->size(), "), found ",
                 json_field::describe(*ranks));
  }
  const size_t prefix_size = model.continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& entry = (*merges)[i];
    const std::string entry_path = json_field::element_path(merges_path, i);
    if (entry.is_string() && entry.get_ref<const std::string&>().starts_with("#version")) continue;
    SLIMKV_ASSIGN_OR_RETURN(const auto pair, parse_merge(entry, entry_path));
    const auto& [left, right] = pair;
    auto left_it = model.vocab_.find(left);
    if (left_it == model.vocab_.end()) return error(entry_path, ": token \"", left, "\" is not in ", vocab_path);
    auto right_it = model.vocab_.find(right);
    if (right_it == model.vocab_.end()) return error(entry_path, ": token \"", right, "\" is not in ", vocab_path);
    if (right.size() < prefix_size) {
      return error(entry_path, ": token \"", right, "\" is shorter than continuing_subword_prefix");
    }
    const std::string merged = left + right.substr(prefix_size);
    auto merged_it = model.vocab_.find(merged);
    if (merged_it == model.vocab_.end()) {
      return error(entry_path, ": merged token \"", merged, "\" is not in ", vocab_path);
    }
    if (ranks != nullptr) {
      const Json& given = (*ranks)[i];
      if (!given.is_number_unsigned() || given.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())) {
        return error(json_field::element_path(ranks_path, i), ": expected a rank (an integer 0 .. 2147483647), found ",
                     json_field::describe(given));
      }
      rank = static_cast<int32_t>(given.get<uint64_t>());
    }
    model.merges_[pair_key(left_it->second, right_it->second)] = Merge{rank, merged_it->second};
    ++rank;
  }

  if (model.unk_token_) model.unk_id_ = model.token_id(*model.unk_token_);
  if (model.byte_fallback_) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      model.byte_token_ids_[b] = model.token_id(name);
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::token_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::token_text(int32_t id) const {
  auto it = vocab_by_id_.find(id);
  return it == vocab_by_id_.end() ? nullptr : &it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // Llama-3: a word that is a token is taken whole
    if (auto id = token_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < WordCache::kMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->words.find(word);
    if (it != cache_->words.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() < WordCache::kCapacity) {
      cache_->words.emplace(std::string(word), std::vector<int32_t>(ids.begin() + static_cast<ptrdiff_t>(first), ids.end()));
    }
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  // Symbols form a doubly linked list over the vector; merged-away symbols are marked dead.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, true});
  };

  // 1. One symbol per character (HF: with prefix/suffix, then byte fallback, then unk).
  // The unk id waiting to be emitted (fused runs of unknown characters emit one), or -1. A plain int
  // rather than std::optional: GCC 12 reports optional<int> here as maybe-uninitialized.
  constexpr int32_t kNone = -1;
  int32_t pending_unk = kNone;
  std::string with_affixes;
  for (size_t pos = 0; pos < word.size();) {
    const size_t size = utf8::sequence_size(static_cast<unsigned char>(word[pos]));
    const size_t end = std::min(word.size(), pos + size);
    std::string_view piece = word.substr(pos, end - pos);
    const bool is_first = pos == 0;
    const bool is_last = end == word.size();
    pos = end;
    if ((!is_first && !continuing_subword_prefix_.empty()) || (is_last && !end_of_word_suffix_.empty())) {
      with_affixes.clear();
      if (!is_first) with_affixes.append(continuing_subword_prefix_);
      with_affixes.append(piece);
      if (is_last) with_affixes.append(end_of_word_suffix_);
      piece = with_affixes;
    }
    if (auto id = token_id(piece)) {
      if (pending_unk != kNone) {
        add(pending_unk);
        pending_unk = kNone;
      }
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes_known = true;
      for (const char c : piece) all_bytes_known = all_bytes_known && byte_token_ids_[static_cast<uint8_t>(c)].has_value();
      if (all_bytes_known) {
        // As in HF, a pending unk is not flushed first.
        for (const char c : piece) add(*byte_token_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_token_ && unk_id_) {
      if (pending_unk != kNone && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token the character is dropped, as in HF. (HF fails the whole encode when
    // unk_token names a token missing from the vocabulary; here the character is dropped.)
  }
  if (pending_unk != kNone) add(pending_unk);

  // 2. Merge the lowest-rank adjacent pair (leftmost first) until none applies.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left_pos) {
    const int32_t right_pos = symbols[static_cast<size_t>(left_pos)].next;
    if (right_pos < 0) return;
    auto it = merges_.find(pair_key(symbols[static_cast<size_t>(left_pos)].id, symbols[static_cast<size_t>(right_pos)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left_pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids.push_back(s.id);
  }
}

}  // namespace slimkv
