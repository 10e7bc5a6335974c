#include "io/tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <unordered_set>

#include "io/json_limits.hpp"
#include "io/tokenizer_parts.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace tokenizer_detail {

void Source::fail(const std::string& problem) const {
  throw Error("tokenizer " + path_.string() + ": " + problem);
}

const json* Source::find(const json& object, std::string_view key) const {
  if (!object.is_object()) return nullptr;
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return nullptr;
  return &*found;
}

const json& Source::require(const json& object, std::string_view key,
                            std::string_view where) const {
  const std::string name = std::string(where) + "." + std::string(key);
  if (!object.is_object()) fail(std::string(where) + " must be an object");
  const json* value = find(object, key);
  if (!value) fail(name + " is missing");
  return *value;
}

std::string Source::string(const json& object, std::string_view key, std::string_view where) const {
  const json& value = require(object, key, where);
  if (!value.is_string()) {
    fail(std::string(where) + "." + std::string(key) + " must be a string, not " + value.dump());
  }
  return value.get<std::string>();
}

bool Source::boolean(const json& object, std::string_view key, bool fallback,
                     std::string_view where) const {
  const json* value = find(object, key);
  if (!value) return fallback;
  if (!value->is_boolean()) {
    fail(std::string(where) + "." + std::string(key) + " must be true or false, not " +
         value->dump());
  }
  return value->get<bool>();
}

int64_t Source::integer(const json& object, std::string_view key, std::string_view where) const {
  const json& value = require(object, key, where);
  if (!value.is_number_integer()) {
    fail(std::string(where) + "." + std::string(key) + " must be an integer, not " + value.dump());
  }
  return value.get<int64_t>();
}

std::string Source::type(const json& config, std::string_view where) const {
  if (!config.is_object()) fail(std::string(where) + " must be an object with a \"type\"");
  return string(config, "type", where);
}

std::string in_quotes(std::string_view text) {
  return json(std::string(text)).dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  // What is looked for and what decoding gives: the content, normalized for normalized tokens.
  std::string text;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Finds the longest added token starting at a position (leftmost-longest, as the library's
// Aho-Corasick matcher): a byte trie.
class TokenTrie {
 public:
  void add(std::string_view text, int32_t id) {
    int32_t node = 0;
    for (const char c : text) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t child = child_of(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].id = id;
    first_bytes_[static_cast<unsigned char>(text[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // The id of the longest token at `pos` (and its end), or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t& end) const {
    if (!first_bytes_[static_cast<unsigned char>(text[pos])]) return -1;
    int32_t node = 0, found = -1;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child_of(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].id >= 0) {
        found = nodes_[node].id;
        end = i + 1;
      }
    }
    return found;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t id = -1;
  };
  int32_t child_of(int32_t node, unsigned char byte) const {
    for (const auto& [edge, child] : nodes_[node].children) {
      if (edge == byte) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_bytes_{};
};

// A stretch of the text: an added token's id, or text for the pre-tokenizer and model.
struct Segment {
  std::string text;
  int32_t id = -1;
  bool at_text_start = false;
};

// The regex crate's Unicode \w, which the library's single_word check uses.
bool is_word_character(char32_t c) {
  static const Regex word(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])");
  std::string text;
  append_utf8(text, c);
  size_t begin = 0, end = 0;
  return word.search(text, 0, begin, end);
}

size_t last_character_start(std::string_view text, size_t end) {
  size_t pos = end - 1;
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

struct Pipeline {
  std::filesystem::path path;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::unordered_map<int32_t, AddedToken> added_tokens;
  StringMap<int32_t> added_ids;
  std::unordered_set<std::string> special_contents;
  TokenTrie raw_tokens;         // normalized: false, matched in the text as given
  TokenTrie normalized_tokens;  // normalized: true, matched in normalized text
  int64_t vocab_size = 0;

  void add_tokens(const json& list, const Source& source);
  void split_on_added(const Segment& segment, const TokenTrie& trie,
                      std::vector<Segment>& out) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
};

// As the library does, ids come from the vocabulary where the content is there, else count on
// from the number of tokens in the model; the "id" fields are not read.
void Pipeline::add_tokens(const json& list, const Source& source) {
  if (!list.is_array()) source.fail("added_tokens must be a list");
  auto next_id = static_cast<int32_t>(model->size());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json& entry = list[i];
    AddedToken token;
    token.content = source.string(entry, "content", where);
    if (token.content.empty()) continue;
    token.special = source.boolean(entry, "special", false, where);
    token.single_word = source.boolean(entry, "single_word", false, where);
    token.lstrip = source.boolean(entry, "lstrip", false, where);
    token.rstrip = source.boolean(entry, "rstrip", false, where);
    token.normalized = source.boolean(entry, "normalized", !token.special, where);
    token.text = token.content;
    if (token.normalized && normalizer) normalizer->normalize(token.text);
    if (const auto found = added_ids.find(token.content); found != added_ids.end()) {
      token.id = found->second;
    } else if (const std::optional<int32_t> id = model->token_id(token.content)) {
      token.id = *id;
    } else {
      token.id = next_id++;
    }
    added_ids[token.content] = token.id;
    if (token.special) special_contents.insert(token.content);
    added_tokens[token.id] = std::move(token);
  }
  vocab_size = model->max_id() + 1;
  for (const auto& [id, token] : added_tokens) {
    vocab_size = std::max<int64_t>(vocab_size, int64_t{id} + 1);
    if (!token.text.empty()) {
      (token.normalized ? normalized_tokens : raw_tokens).add(token.text, id);
    }
  }
}

// The library's AddedVocabulary::find_matches: non-overlapping leftmost-longest matches, each
// kept only if its single_word condition holds, widened over whitespace by lstrip and rstrip.
void Pipeline::split_on_added(const Segment& segment, const TokenTrie& trie,
                              std::vector<Segment>& out) const {
  const std::string_view text = segment.text;
  const auto add_text = [&](size_t begin, size_t end) {
    if (begin < end) {
      out.push_back(
          {std::string(text.substr(begin, end - begin)), -1, segment.at_text_start && begin == 0});
    }
  };
  if (trie.empty()) {
    add_text(0, text.size());
    return;
  }
  size_t done = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t match_end = 0;
    const int32_t id = trie.longest_at(text, pos, match_end);
    if (id < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = match_end;
    pos = match_end;
    const AddedToken& token = added_tokens.at(id);
    if (token.single_word) {
      const bool word_before =
          start > 0 && is_word_character(utf8_at(text, last_character_start(text, start)));
      const bool word_after = stop < text.size() && is_word_character(utf8_at(text, stop));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t space_start = start;
      while (space_start > 0) {
        const size_t previous = last_character_start(text, space_start);
        if (!is_white_space(utf8_at(text, previous))) break;
        space_start = previous;
      }
      // Spaces an earlier token took with its rstrip stay with it.
      start = std::max(space_start, done);
    }
    if (token.rstrip) {
      while (stop < text.size() && is_white_space(utf8_at(text, stop))) {
        stop += utf8_length(static_cast<unsigned char>(text[stop]));
      }
    }
    add_text(done, start);
    out.push_back({std::string(text.substr(start, stop - start)), id, false});
    done = std::max(done, stop);
  }
  add_text(done, text.size());
}

std::vector<int32_t> Pipeline::encode(std::string_view text, bool add_special_tokens) const {
  if (const std::optional<size_t> invalid = find_invalid_utf8(text)) {
    throw Error("text to encode with tokenizer " + path.string() + " is not valid UTF-8 (byte " +
                std::to_string(*invalid) + ")");
  }
  std::vector<Segment> raw;
  split_on_added({std::string(text), -1, true}, raw_tokens, raw);
  std::vector<Segment> segments;
  for (Segment& segment : raw) {
    if (segment.id >= 0) {
      segments.push_back(std::move(segment));
      continue;
    }
    if (normalizer) normalizer->normalize(segment.text);
    split_on_added(segment, normalized_tokens, segments);
  }

  std::vector<int32_t> ids;
  std::vector<Piece> pieces;
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    pieces.assign(1, {segment.text, segment.at_text_start});
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
    for (const Piece& piece : pieces) model->tokenize(piece.text, ids);
  }
  if (add_special_tokens && post_processor) post_processor->add_special_tokens(ids);
  return ids;
}

std::string Pipeline::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* text = nullptr;
    if (const auto added = added_tokens.find(id); added != added_tokens.end()) {
      text = &added->second.text;
    } else {
      text = model->token_text(id);
    }
    if (!text || (skip_special_tokens && special_contents.contains(*text))) continue;
    tokens.push_back(*text);
  }
  if (decoder) decoder->decode_chain(tokens);
  std::string decoded;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 && !decoder) decoded += ' ';
    decoded += tokens[i];
  }
  return decoded;
}

}  // namespace tokenizer_detail

using tokenizer_detail::json;
using tokenizer_detail::Pipeline;
using tokenizer_detail::Source;

Tokenizer::Tokenizer(std::shared_ptr<const Pipeline> pipeline) : pipeline_(std::move(pipeline)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  const Source source(tokenizer_json);
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) {
    throw Error("tokenizer " + tokenizer_json.string() +
                (std::filesystem::exists(tokenizer_json) ? " cannot be read" : " does not exist"));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json root = parse_json(text, "tokenizer " + tokenizer_json.string());
  if (!root.is_object()) source.fail("the file must hold a JSON object");
  if (source.find(root, "version")) {
    const std::string version = source.string(root, "version", "tokenizer");
    if (version != "1.0")
      source.fail("version " + tokenizer_detail::in_quotes(version) + " is not 1.0");
  }

  auto pipeline = std::make_shared<Pipeline>();
  pipeline->path = tokenizer_json;
  try {
    const json null;
    const auto section = [&](std::string_view key) -> const json& {
      const json* value = source.find(root, key);
      return value ? *value : null;
    };
    pipeline->model = std::make_unique<tokenizer_detail::BpeModel>(
        source.require(root, "model", "tokenizer"), source);
    pipeline->normalizer = parse_normalizer(section("normalizer"), source, "normalizer");
    pipeline->pre_tokenizer =
        parse_pre_tokenizer(section("pre_tokenizer"), source, "pre_tokenizer");
    pipeline->post_processor =
        parse_post_processor(section("post_processor"), source, "post_processor");
    pipeline->decoder = parse_decoder(section("decoder"), source, "decoder");
    if (const json* added = source.find(root, "added_tokens")) {
      pipeline->add_tokens(*added, source);
    } else {
      pipeline->vocab_size = pipeline->model->max_id() + 1;
    }
  } catch (const json::exception& error) {
    source.fail(std::string("unexpected JSON content: ") + error.what());
  }
  return Tokenizer(std::move(pipeline));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return pipeline_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return pipeline_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const {
  return pipeline_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (const auto found = pipeline_->added_ids.find(token); found != pipeline_->added_ids.end()) {
    return found->second;
  }
  return pipeline_->model->token_id(token);
}

std::string Tokenizer::token_text(int32_t id) const {
  if (const auto found = pipeline_->added_tokens.find(id); found != pipeline_->added_tokens.end()) {
    return found->second.content;
  }
  if (const std::string* text = pipeline_->model->token_text(id)) return *text;
  throw Error("tokenizer " + pipeline_->path.string() + " has no token with id " +
              std::to_string(id) + " (vocabulary size " + std::to_string(vocab_size()) + ")");
}

bool Tokenizer::is_special(int32_t id) const {
  const auto found = pipeline_->added_tokens.find(id);
  return found != pipeline_->added_tokens.end() && found->second.special;
}

const std::filesystem::path& Tokenizer::path() const {
  return pipeline_->path;
}

namespace {

bool ends_incomplete(const std::string& text) {
  return text.ends_with("\xEF\xBF\xBD");
}

}  // namespace

TokenStreamDecoder::TokenStreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string TokenStreamDecoder::push(int32_t id) {
  if (prefix_.empty() && !ids_.empty()) {
    std::string prefix = tokenizer_.decode(ids_, skip_special_tokens_);
    if (!ends_incomplete(prefix)) {
      prefix_ = std::move(prefix);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_.size() || ends_incomplete(text)) return {};
  if (!text.starts_with(prefix_)) {
    throw Error("token stream of tokenizer " + tokenizer_.path().string() + ": token " +
                std::to_string(id) + " changed text already returned (" +
                tokenizer_detail::in_quotes(prefix_) + " became " +
                tokenizer_detail::in_quotes(text) + ")");
  }
  std::string new_text = text.substr(prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return new_text;
}

std::string TokenStreamDecoder::finish() {
  const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
  std::string rest;
  if (text.size() > prefix_.size() && text.starts_with(prefix_)) rest = text.substr(prefix_.size());
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace mg::io
