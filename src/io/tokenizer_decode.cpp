// Decoders (token strings back to text) and post-processors (the special tokens a sequence gets).
#include <charconv>

#include "io/tokenizer_parts.hpp"

namespace mg::io::tokenizer_detail {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// ---- Decoders

class DecoderSequence : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> stages)
      : stages_(std::move(stages)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& stage : stages_) stage->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

// Byte-level characters back to bytes, all tokens into one string. A token with a character
// outside the alphabet (an added token such as "<|im_start|>" is inside it; one with a real space
// is not) keeps its own bytes.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t start = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size();
           pos += utf8_length(static_cast<unsigned char>(token[pos]))) {
        const int byte = byte_level_byte(utf8_at(token, pos));
        if (byte < 0) {
          all_mapped = false;
          break;
        }
        bytes += static_cast<char>(byte);
      }
      if (!all_mapped) {
        bytes.resize(start);
        bytes += token;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// The replacement character becomes a space, except in the first token where the pre-tokenizer
// added it.
class MetaspaceDecoder : public Decoder {
 public:
  explicit MetaspaceDecoder(MetaspaceSettings settings) : settings_(std::move(settings)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    const std::string& replacement = settings_.replacement;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool drop = i == 0 && settings_.scheme != PrependScheme::never;
      std::string decoded;
      const std::string& token = tokens[i];
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement.size(), replacement) == 0) {
          if (!drop) decoded += ' ';
          pos += replacement.size();
        } else {
          decoded += token[pos++];
        }
      }
      tokens[i] = std::move(decoded);
    }
  }

 private:
  MetaspaceSettings settings_;
};

// Runs of "<0xAB>" tokens back to the bytes they stand for; a run that is not valid UTF-8 becomes
// one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> decoded;
    decoded.reserve(tokens.size());
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (find_invalid_utf8(pending)) {
        for (size_t i = 0; i < pending.size(); ++i) decoded.emplace_back(kReplacementCharacter);
      } else {
        decoded.push_back(pending);
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      if (const std::optional<char> byte = byte_token(token)) {
        pending += *byte;
        continue;
      }
      flush();
      decoded.push_back(std::move(token));
    }
    flush();
    tokens = std::move(decoded);
  }

 private:
  static std::optional<char> byte_token(const std::string& token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
    unsigned value = 0;
    const auto [end, error] = std::from_chars(token.data() + 3, token.data() + 5, value, 16);
    if (error != std::errc() || end != token.data() + 5) return std::nullopt;
    return static_cast<char>(value);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string fused;
    for (const std::string& token : tokens) fused += token;
    tokens.assign(1, std::move(fused));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      for (size_t pos = 0; pos < token.size();
           pos += utf8_length(static_cast<unsigned char>(token[pos]))) {
        starts.push_back(pos);
      }
      const auto is_content = [&](size_t index) {
        const size_t end = index + 1 == starts.size() ? token.size() : starts[index + 1];
        return std::string_view(token).substr(starts[index], end - starts[index]) == content_;
      };
      size_t first = 0;
      while (first < start_ && first < starts.size() && is_content(first)) ++first;
      size_t last = starts.size();
      for (size_t removed = 0; removed < stop_ && last > first && is_content(last - 1); ++removed) {
        --last;
      }
      const size_t begin = first < starts.size() ? starts[first] : token.size();
      const size_t end = last < starts.size() ? starts[last] : token.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::string replaced;
      for (const Match& match : pattern_.find_matches(token)) {
        if (match.is_match) {
          replaced += content_;
        } else {
          replaced.append(token, match.begin, match.end - match.begin);
        }
      }
      token = std::move(replaced);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// The original BPE's end-of-word suffix (e.g. "</w>") becomes a space, except in the last token.
class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view replacement = i + 1 == tokens.size() ? "" : " ";
      std::string& token = tokens[i];
      std::string replaced;
      size_t from = 0;
      for (size_t pos = token.find(suffix_); pos != std::string::npos;
           pos = token.find(suffix_, from)) {
        replaced.append(token, from, pos - from);
        replaced += replacement;
        from = pos + suffix_.size();
      }
      replaced.append(token, from);
      token = std::move(replaced);
    }
  }

 private:
  std::string suffix_;
};

// ---- Post-processors

class PostProcessorSequence : public PostProcessor {
 public:
  explicit PostProcessorSequence(std::vector<std::unique_ptr<PostProcessor>> stages)
      : stages_(std::move(stages)) {}
  void add_special_tokens(std::vector<int32_t>& ids) const override {
    for (const auto& stage : stages_) stage->add_special_tokens(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> stages_;
};

// ByteLevel's post-processing only trims offsets, which ids do not have.
class NoSpecialTokens : public PostProcessor {
 public:
  void add_special_tokens(std::vector<int32_t>&) const override {}
};

// The single-sequence template: special tokens' ids around the sequence ("$A").
class Template : public PostProcessor {
 public:
  // A piece without ids stands for the sequence itself.
  explicit Template(std::vector<std::optional<std::vector<int32_t>>> pieces)
      : pieces_(std::move(pieces)) {}
  void add_special_tokens(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> result;
    for (const auto& piece : pieces_) {
      const std::vector<int32_t>& part = piece ? *piece : ids;
      result.insert(result.end(), part.begin(), part.end());
    }
    ids = std::move(result);
  }

 private:
  std::vector<std::optional<std::vector<int32_t>>> pieces_;
};

std::vector<int32_t> integer_list(const json& list, const Source& source,
                                  const std::string& where) {
  if (!list.is_array()) source.fail(where + " must be a list of ids");
  std::vector<int32_t> ids;
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      source.fail(where + " holds " + id.dump() + ", which is not a token id");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

std::unique_ptr<PostProcessor> parse_template(const json& config, const Source& source,
                                              const std::string& where) {
  const json& single = source.require(config, "single", where);
  if (!single.is_array()) source.fail(where + ".single must be a list");
  const json* special_tokens = source.find(config, "special_tokens");
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_where = where + ".single[" + std::to_string(i) + "]";
    const json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      pieces.emplace_back(std::nullopt);
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name = source.string(piece["SpecialToken"], "id", piece_where);
      if (!special_tokens || !special_tokens->contains(name)) {
        source.fail(piece_where + " names special token " + in_quotes(name) +
                    ", which special_tokens does not list");
      }
      const std::string token_where = where + ".special_tokens." + name;
      pieces.emplace_back(integer_list(source.require((*special_tokens)[name], "ids", token_where),
                                       source, token_where + ".ids"));
    } else {
      source.fail(piece_where + " must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  return std::make_unique<Template>(std::move(pieces));
}

// RobertaProcessing and BertProcessing: [cls] sequence [sep], each given as [token, id].
std::unique_ptr<PostProcessor> parse_cls_sep(const json& config, const Source& source,
                                             const std::string& where) {
  const auto id_of = [&](std::string_view key) {
    const json& pair = source.require(config, key, where);
    const std::string pair_where = where + "." + std::string(key);
    if (!pair.is_array() || pair.size() != 2) source.fail(pair_where + " must be [token, id]");
    return integer_list(json::array({pair[1]}), source, pair_where);
  };
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  pieces.emplace_back(id_of("cls"));
  pieces.emplace_back(std::nullopt);
  pieces.emplace_back(id_of("sep"));
  return std::make_unique<Template>(std::move(pieces));
}

size_t count(const json& config, std::string_view key, const Source& source,
             const std::string& where) {
  const int64_t value = source.integer(config, key, where);
  if (value < 0) source.fail(where + "." + std::string(key) + " must not be negative");
  return static_cast<size_t>(value);
}

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& config, const Source& source,
                                       const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = source.type(config, where);
  if (type == "Sequence") {
    return std::make_unique<DecoderSequence>(
        parse_stage_list<Decoder>(config, "decoders", source, where, parse_decoder));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(parse_metaspace_settings(config, source, where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(single_character(config, "content", source, where),
                                          count(config, "start", source, where),
                                          count(config, "stop", source, where));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(
        parse_pattern(source.require(config, "pattern", where), source, where + ".pattern"),
        source.string(config, "content", where));
  }
  if (type == "BPEDecoder") {
    return std::make_unique<BpeSuffixDecoder>(source.string(config, "suffix", where));
  }
  source.fail(where + " type " + in_quotes(type) +
              " is not supported (supported: Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, "
              "Strip, Replace, BPEDecoder)");
}

std::unique_ptr<PostProcessor> parse_post_processor(const json& config, const Source& source,
                                                    const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = source.type(config, where);
  if (type == "Sequence") {
    return std::make_unique<PostProcessorSequence>(
        parse_stage_list<PostProcessor>(config, "processors", source, where, parse_post_processor));
  }
  if (type == "ByteLevel") return std::make_unique<NoSpecialTokens>();
  if (type == "TemplateProcessing") return parse_template(config, source, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return parse_cls_sep(config, source, where);
  }
  source.fail(where + " type " + in_quotes(type) +
              " is not supported (supported: Sequence, ByteLevel, TemplateProcessing, "
              "RobertaProcessing, BertProcessing)");
}

}  // namespace mg::io::tokenizer_detail
