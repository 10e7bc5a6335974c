#pragma once
// The stages of a Hugging Face tokenizer pipeline (see tokenizer.hpp), each read from its
// tokenizer.json section and behaving as the `tokenizers` library's type of the same name.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mg::io::tokenizer_detail {

using nlohmann::json;

// The tokenizer.json being read, for errors ("tokenizer PATH: problem") and typed fields. `where`
// names the section, e.g. "model" or "pre_tokenizer.pretokenizers[1]".
class Source {
 public:
  explicit Source(std::filesystem::path path) : path_(std::move(path)) {}
  [[noreturn]] void fail(const std::string& problem) const;
  const std::filesystem::path& path() const { return path_; }

  // nullptr when the key is absent or null.
  const json* find(const json& object, std::string_view key) const;
  const json& require(const json& object, std::string_view key, std::string_view where) const;
  std::string string(const json& object, std::string_view key, std::string_view where) const;
  bool boolean(const json& object, std::string_view key, bool fallback,
               std::string_view where) const;
  int64_t integer(const json& object, std::string_view key, std::string_view where) const;
  // The "type" of a stage's object.
  std::string type(const json& config, std::string_view where) const;

 private:
  std::filesystem::path path_;
};

// A list of stages ("normalizers", "pretokenizers", "decoders", "processors" of a Sequence),
// each read by `parse`.
template <typename Stage, typename Parse>
std::vector<std::unique_ptr<Stage>> parse_stage_list(const json& config, std::string_view key,
                                                     const Source& source, const std::string& where,
                                                     Parse parse) {
  const std::string list_where = where + "." + std::string(key);
  const json& list = source.require(config, key, where);
  if (!list.is_array()) source.fail(list_where + " must be a list");
  std::vector<std::unique_ptr<Stage>> stages;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string stage_where = list_where + "[" + std::to_string(i) + "]";
    std::unique_ptr<Stage> stage = parse(list[i], source, stage_where);
    if (!stage) source.fail(stage_where + " is null");
    stages.push_back(std::move(stage));
  }
  return stages;
}

// A string in double quotes with JSON escapes, so that messages stay on one line.
std::string in_quotes(std::string_view text);

// ---- UTF-8 (tokenizer_text.cpp). Functions taking valid text assume it has been checked.
size_t utf8_length(unsigned char lead);
char32_t utf8_at(std::string_view valid_text, size_t pos);
void append_utf8(std::string& out, char32_t c);
// Byte offset of the first invalid sequence, or nullopt for valid UTF-8.
std::optional<size_t> find_invalid_utf8(std::string_view bytes);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Unicode's White_Space property, which Rust's char::is_whitespace tests.
bool is_white_space(char32_t c);

// GPT-2's byte-to-unicode map: the UTF-8 text of the character standing for each byte, and the
// reverse (-1 for characters that stand for no byte).
const std::array<std::string, 256>& byte_level_chars();
int byte_level_byte(char32_t c);

// ---- Patterns (tokenizer_text.cpp)
struct Match {
  size_t begin;
  size_t end;
  bool is_match;
};

// A PCRE2 regex compiled once (JIT where available) in UTF mode with Unicode properties, with the
// tokenizers library's Oniguruma meanings of \s, \w and \h.
class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message and the offset.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // The first match starting at or after `from` (lookbehind sees text before it).
  bool search(std::string_view text, size_t from, size_t& begin, size_t& end) const;

 private:
  void* code_;
};

// What a split or replacement looks for: a literal string or a regex.
class Pattern {
 public:
  static Pattern literal(std::string text);
  static Pattern regex(std::string_view source);  // throws as Regex
  // Contiguous pieces covering `text`, each flagged as a match or not, as the library's
  // Pattern::find_matches (empty text gives one empty non-match).
  std::vector<Match> find_matches(std::string_view text) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// {"String": "..."} or {"Regex": "..."}.
Pattern parse_pattern(const json& config, const Source& source, std::string_view where);

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
SplitBehavior parse_split_behavior(const json& config, const Source& source,
                                   std::string_view where);
// The [begin, end) ranges kept when splitting on `matches` with `behavior`.
std::vector<std::pair<size_t, size_t>> split_ranges(const std::vector<Match>& matches,
                                                    SplitBehavior behavior);

// ---- Normalizers and pre-tokenizers (tokenizer_pretokenize.cpp)

// A stretch of text between added tokens, or a part of one after pre-tokenization.
// at_text_start: it begins at the start of the text being encoded (Metaspace's "first").
struct Piece {
  std::string text;
  bool at_text_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces the pieces by their parts; parts that come out empty are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// A string field holding exactly one character, e.g. Metaspace's "replacement".
std::string single_character(const json& config, std::string_view key, const Source& source,
                             const std::string& where);

// Metaspace's fields, shared by its pre-tokenizer and its decoder.
enum class PrependScheme { always, first, never };
struct MetaspaceSettings {
  std::string replacement;
  PrependScheme scheme = PrependScheme::always;
  bool split = true;
};
MetaspaceSettings parse_metaspace_settings(const json& config, const Source& source,
                                           const std::string& where);

// nullptr for a null section.
std::unique_ptr<Normalizer> parse_normalizer(const json& config, const Source& source,
                                             const std::string& where);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& config, const Source& source,
                                                  const std::string& where);

// ---- Decoders and post-processors (tokenizer_decode.cpp)

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens of a single sequence.
  virtual void add_special_tokens(std::vector<int32_t>& ids) const = 0;
};

std::unique_ptr<Decoder> parse_decoder(const json& config, const Source& source,
                                       const std::string& where);
std::unique_ptr<PostProcessor> parse_post_processor(const json& config, const Source& source,
                                                    const std::string& where);

// ---- The BPE model (tokenizer_bpe.cpp)

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
template <typename Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel(const json& model, const Source& source);
  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;
  std::optional<int32_t> token_id(std::string_view token) const;
  const std::string* token_text(int32_t id) const;
  int64_t max_id() const { return max_id_; }
  size_t size() const { return vocab_.size(); }

 private:
  struct MergeResult {
    uint32_t rank;
    int32_t id;
  };
  std::vector<int32_t> merge_word(std::string_view word) const;
  const MergeResult* find_merge(int32_t left, int32_t right) const;

  std::filesystem::path path_;
  StringMap<int32_t> vocab_;
  std::unordered_map<int32_t, std::string> tokens_;
  std::unordered_map<uint64_t, MergeResult> merges_;
  std::optional<std::string> unk_token_;
  std::optional<std::string> continuing_subword_prefix_;
  std::optional<std::string> end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_tokens_{};  // id of "<0xAB>" per byte, -1 where absent
  int64_t max_id_ = -1;

  // Words seen before, as the library caches them: short words only, and no more than a
  // fixed number, so that a long input cannot grow it without bound.
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace mg::io::tokenizer_detail
