// The BPE model: a word's characters merged pair by pair in the order of the merge list.
#include <cstdio>
#include <queue>

#include "io/tokenizer_parts.hpp"
#include "meganeura/error.hpp"

namespace mg::io::tokenizer_detail {
namespace {

// The library's cache limits: words of at most this many bytes, at most this many of them.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCachedWords = 10'000;

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

std::optional<std::string> optional_string(const json& model, std::string_view key,
                                           const Source& source) {
  if (!source.find(model, key)) return std::nullopt;
  return source.string(model, key, "model");
}

// Merges are "left right" strings (older files, with an optional "#version" line) or
// [left, right] pairs.
std::vector<std::pair<std::string, std::string>> merge_pairs(const json& merges,
                                                             const Source& source) {
  if (!merges.is_array()) source.fail("model.merges must be a list");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.starts_with("#version")) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        source.fail(where + " " + in_quotes(line) + " is not two tokens separated by one space");
      }
      pairs.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      pairs.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      source.fail(where + " must be \"left right\" or [\"left\", \"right\"], not " + merge.dump());
    }
  }
  return pairs;
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t bytes;  // 0 once merged into the symbol on its left
};

struct Candidate {
  uint32_t rank;
  int32_t pos;
  int32_t id;
};

// Lowest rank first, then leftmost.
struct WorseCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

BpeModel::BpeModel(const json& model, const Source& source) : path_(source.path()) {
  if (!model.is_object()) source.fail("model must be an object");
  if (source.find(model, "type")) {
    const std::string type = source.string(model, "type", "model");
    if (type != "BPE") {
      source.fail("model type " + in_quotes(type) + " is not supported (supported: BPE)");
    }
  }
  if (const json* dropout = source.find(model, "dropout")) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0) {
      source.fail("model.dropout " + dropout->dump() +
                  " is not supported: dropout samples a different tokenization on each call");
    }
  }

  const json& vocab = source.require(model, "vocab", "model");
  if (!vocab.is_object()) source.fail("model.vocab must be an object of token: id");
  vocab_.reserve(vocab.size());
  tokens_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      source.fail("model.vocab[" + in_quotes(token) + "] is " + id.dump() + ", not a token id");
    }
    const int32_t value = id.get<int32_t>();
    vocab_[token] = value;
    tokens_[value] = token;
    max_id_ = std::max<int64_t>(max_id_, value);
  }

  unk_token_ = optional_string(model, "unk_token", source);
  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", source);
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", source);
  fuse_unk_ = source.boolean(model, "fuse_unk", false, "model");
  byte_fallback_ = source.boolean(model, "byte_fallback", false, "model");
  ignore_merges_ = source.boolean(model, "ignore_merges", false, "model");
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    byte_tokens_[byte] = token_id(name).value_or(-1);
  }

  const std::vector<std::pair<std::string, std::string>> pairs =
      merge_pairs(source.require(model, "merges", "model"), source);
  const size_t prefix_bytes = continuing_subword_prefix_ ? continuing_subword_prefix_->size() : 0;
  merges_.reserve(pairs.size());
  for (size_t rank = 0; rank < pairs.size(); ++rank) {
    // Named references, not a structured binding: clang before 16 cannot capture those.
    const std::string& left = pairs[rank].first;
    const std::string& right = pairs[rank].second;
    const auto id_of = [&](const std::string& token) {
      const std::optional<int32_t> id = token_id(token);
      if (!id) {
        source.fail("model.merges[" + std::to_string(rank) + "] " + in_quotes(left + " " + right) +
                    " refers to token " + in_quotes(token) + ", which is not in the vocabulary");
      }
      return *id;
    };
    const int32_t left_id = id_of(left);
    const int32_t right_id = id_of(right);
    // The merged token drops the right part's continuing-subword prefix.
    const int32_t merged_id = id_of(left + right.substr(std::min(prefix_bytes, right.size())));
    merges_[pair_key(left_id, right_id)] = {static_cast<uint32_t>(rank), merged_id};
  }
}

std::optional<int32_t> BpeModel::token_id(std::string_view token) const {
  const auto found = vocab_.find(token);
  if (found == vocab_.end()) return std::nullopt;
  return found->second;
}

const std::string* BpeModel::token_text(int32_t id) const {
  const auto found = tokens_.find(id);
  return found == tokens_.end() ? nullptr : &found->second;
}

const BpeModel::MergeResult* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto found = merges_.find(pair_key(left, right));
  return found == merges_.end() ? nullptr : &found->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const std::optional<int32_t> id = token_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    const std::lock_guard lock(cache_mutex_);
    const auto found = cache_.find(word);
    if (found != cache_.end()) {
      ids.insert(ids.end(), found->second.begin(), found->second.end());
      return;
    }
  }
  std::vector<int32_t> merged = merge_word(word);
  ids.insert(ids.end(), merged.begin(), merged.end());
  if (cacheable) {
    const std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kMaxCachedWords) cache_.emplace(word, std::move(merged));
  }
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, size_t bytes) {
    const auto count = static_cast<int32_t>(symbols.size());
    if (count > 0) symbols.back().next = count;
    symbols.push_back({id, count - 1, -1, static_cast<uint32_t>(bytes)});
  };

  // Characters outside the vocabulary become their "<0xAB>" byte tokens, or the unknown token
  // (one for a run of them with fuse_unk), or nothing.
  int32_t unknown_id = -1;  // the pending unknown token, -1 when none
  size_t unknown_bytes = 0;
  std::string decorated;
  for (size_t pos = 0; pos < word.size();) {
    const size_t end = pos + utf8_length(static_cast<unsigned char>(word[pos]));
    const size_t bytes = end - pos;
    std::string_view piece = word.substr(pos, bytes);
    const bool add_prefix = pos > 0 && continuing_subword_prefix_;
    const bool add_suffix = end == word.size() && end_of_word_suffix_;
    if (add_prefix || add_suffix) {
      decorated = add_prefix ? *continuing_subword_prefix_ : "";
      decorated += piece;
      if (add_suffix) decorated += *end_of_word_suffix_;
      piece = decorated;
    }
    pos = end;

    if (const std::optional<int32_t> id = token_id(piece)) {
      if (unknown_id >= 0) {
        add(unknown_id, unknown_bytes);
        unknown_id = -1;
      }
      add(*id, bytes);
      continue;
    }
    if (byte_fallback_ && std::all_of(piece.begin(), piece.end(), [&](char byte) {
          return byte_tokens_[static_cast<unsigned char>(byte)] >= 0;
        })) {
      for (const char byte : piece) add(byte_tokens_[static_cast<unsigned char>(byte)], 1);
      continue;
    }
    if (!unk_token_) continue;
    const std::optional<int32_t> unk_id = token_id(*unk_token_);
    if (!unk_id) {
      throw Error("tokenizer " + path_.string() + ": model.unk_token " + in_quotes(*unk_token_) +
                  " is not in the vocabulary, and the text needs it");
    }
    if (unknown_id >= 0 && fuse_unk_) {
      unknown_bytes += bytes;
    } else {
      if (unknown_id >= 0) add(unknown_id, unknown_bytes);
      unknown_id = *unk_id;
      unknown_bytes = bytes;
    }
  }
  if (unknown_id >= 0) add(unknown_id, unknown_bytes);

  std::priority_queue<Candidate, std::vector<Candidate>, WorseCandidate> queue;
  const auto count = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < count; ++i) {
    if (const MergeResult* merge = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({merge->rank, i, merge->id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.bytes == 0 || current.next == -1) continue;
    const Symbol right = symbols[current.next];
    // Entries whose pair has changed since they were queued are stale.
    const MergeResult* merge = find_merge(current.id, right.id);
    if (!merge || merge->id != top.id) continue;

    symbols[current.next].bytes = 0;
    current.id = top.id;
    current.bytes += right.bytes;
    current.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (current.prev >= 0) {
      if (const MergeResult* left = find_merge(symbols[current.prev].id, current.id)) {
        queue.push({left->rank, current.prev, left->id});
      }
    }
    if (current.next >= 0) {
      if (const MergeResult* next = find_merge(current.id, symbols[current.next].id)) {
        queue.push({next->rank, top.pos, next->id});
      }
    }
  }

  std::vector<int32_t> ids;
  for (const Symbol& symbol : symbols) {
    if (symbol.bytes != 0) ids.push_back(symbol.id);
  }
  return ids;
}

}  // namespace mg::io::tokenizer_detail
