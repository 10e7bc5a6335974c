// Normalizers and pre-tokenizers: what happens to text before the BPE model sees its words.
#include <algorithm>

#include "io/tokenizer_parts.hpp"

namespace mg::io::tokenizer_detail {
namespace {

// ---- Normalizers

class NormalizerSequence : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> stages)
      : stages_(std::move(stages)) {}
  void normalize(std::string& text) const override {
    for (const auto& stage : stages_) stage->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::string replaced;
    replaced.reserve(text.size());
    for (const Match& match : pattern_.find_matches(text)) {
      if (match.is_match) {
        replaced += content_;
      } else {
        replaced.append(text, match.begin, match.end - match.begin);
      }
    }
    text = std::move(replaced);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Removes White_Space characters at either end.
class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end && is_white_space(utf8_at(text, begin))) {
        begin += utf8_length(static_cast<unsigned char>(text[begin]));
      }
    }
    if (right_) {
      while (end > begin) {
        size_t last = end - 1;
        while ((static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
        if (!is_white_space(utf8_at(text, last))) break;
        end = last;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

// ---- Pre-tokenizers

// Replaces every piece by the non-empty [begin, end) ranges `ranges_of(text)` gives.
template <typename RangesOf>
void split_pieces(std::vector<Piece>& pieces, RangesOf ranges_of) {
  std::vector<Piece> parts;
  parts.reserve(pieces.size());
  for (const Piece& piece : pieces) {
    for (const auto& [begin, end] : ranges_of(piece.text)) {
      if (begin == end) continue;
      parts.push_back({piece.text.substr(begin, end - begin), piece.at_text_start && begin == 0});
    }
  }
  pieces = std::move(parts);
}

void split_pieces(std::vector<Piece>& pieces, const Pattern& pattern, SplitBehavior behavior,
                  bool invert = false) {
  split_pieces(pieces, [&](const std::string& text) {
    std::vector<Match> matches = pattern.find_matches(text);
    if (invert) {
      for (Match& match : matches) match.is_match = !match.is_match;
    }
    return split_ranges(matches, behavior);
  });
}

class PreTokenizerSequence : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> stages)
      : stages_(std::move(stages)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& stage : stages_) stage->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

// GPT-2's: optionally a space before each piece, the GPT-2 regex, then each byte as its
// byte-level character.
class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    static const Pattern gpt2 = Pattern::regex(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
    if (add_prefix_space_) {
      for (Piece& piece : pieces) {
        if (piece.text.front() != ' ') piece.text.insert(0, " ");
      }
    }
    if (use_regex_) split_pieces(pieces, gpt2, SplitBehavior::isolated);
    const std::array<std::string, 256>& chars = byte_level_chars();
    for (Piece& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (const char byte : piece.text) mapped += chars[static_cast<unsigned char>(byte)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

// Each number character (Unicode N*) apart, or each run of them.
class Digits : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    static const Pattern number = Pattern::regex(R"(\p{N})");
    split_pieces(pieces, number, individual_ ? SplitBehavior::isolated : SplitBehavior::contiguous);
  }

 private:
  bool individual_;
};

class Split : public PreTokenizer {
 public:
  Split(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// SentencePiece's: spaces become the replacement character ("▁"), which also starts the piece
// (always, or only at the start of the text), and each word begins at one.
class Metaspace : public PreTokenizer {
 public:
  explicit Metaspace(MetaspaceSettings settings)
      : replacement_(std::move(settings.replacement)),
        scheme_(settings.scheme),
        split_(settings.split),
        split_pattern_(Pattern::literal(replacement_)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts_with_replacement = replaced.starts_with(replacement_);
      if (!starts_with_replacement && (scheme_ == PrependScheme::always ||
                                       (scheme_ == PrependScheme::first && piece.at_text_start))) {
        replaced.insert(0, replacement_);
      }
      piece.text = std::move(replaced);
    }
    if (split_) split_pieces(pieces, split_pattern_, SplitBehavior::merged_with_next);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Pattern split_pattern_;
};

}  // namespace

std::string single_character(const json& config, std::string_view key, const Source& source,
                             const std::string& where) {
  const std::string text = source.string(config, key, where);
  if (text.empty() || find_invalid_utf8(text) ||
      utf8_length(static_cast<unsigned char>(text[0])) != text.size()) {
    source.fail(where + "." + std::string(key) + " must be one character, not " + in_quotes(text));
  }
  return text;
}

MetaspaceSettings parse_metaspace_settings(const json& config, const Source& source,
                                           const std::string& where) {
  MetaspaceSettings settings;
  settings.replacement = single_character(config, "replacement", source, where);
  if (source.find(config, "prepend_scheme")) {
    const std::string text = source.string(config, "prepend_scheme", where);
    if (text == "always") {
      settings.scheme = PrependScheme::always;
    } else if (text == "first") {
      settings.scheme = PrependScheme::first;
    } else if (text == "never") {
      settings.scheme = PrependScheme::never;
    } else {
      source.fail(where + ".prepend_scheme " + in_quotes(text) +
                  " is not one of always, first, never");
    }
  }
  // Files written before prepend_scheme existed say add_prefix_space instead.
  if (!source.boolean(config, "add_prefix_space", true, where)) {
    settings.scheme = PrependScheme::never;
  }
  settings.split = source.boolean(config, "split", true, where);
  return settings;
}

std::unique_ptr<Normalizer> parse_normalizer(const json& config, const Source& source,
                                             const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = source.type(config, where);
  if (type == "Sequence") {
    return std::make_unique<NormalizerSequence>(
        parse_stage_list<Normalizer>(config, "normalizers", source, where, parse_normalizer));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(source.string(config, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<Replace>(
        parse_pattern(source.require(config, "pattern", where), source, where + ".pattern"),
        source.string(config, "content", where));
  }
  if (type == "Strip") {
    return std::make_unique<Strip>(source.boolean(config, "strip_left", true, where),
                                   source.boolean(config, "strip_right", true, where));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    source.fail(where + " type " + in_quotes(type) +
                " is not supported: Unicode normalization needs tables Meganeura does not ship");
  }
  source.fail(where + " type " + in_quotes(type) +
              " is not supported (supported: Sequence, Prepend, Replace, Strip)");
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& config, const Source& source,
                                                  const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = source.type(config, where);
  if (type == "Sequence") {
    return std::make_unique<PreTokenizerSequence>(parse_stage_list<PreTokenizer>(
        config, "pretokenizers", source, where, parse_pre_tokenizer));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(source.boolean(config, "add_prefix_space", true, where),
                                       source.boolean(config, "use_regex", true, where));
  }
  if (type == "Digits") {
    return std::make_unique<Digits>(source.boolean(config, "individual_digits", false, where));
  }
  if (type == "Split") {
    return std::make_unique<Split>(
        parse_pattern(source.require(config, "pattern", where), source, where + ".pattern"),
        parse_split_behavior(config, source, where),
        source.boolean(config, "invert", false, where));
  }
  if (type == "Metaspace") {
    return std::make_unique<Metaspace>(parse_metaspace_settings(config, source, where));
  }
  source.fail(where + " type " + in_quotes(type) +
              " is not supported (supported: Sequence, ByteLevel, Digits, Split, Metaspace)");
}

}  // namespace mg::io::tokenizer_detail
