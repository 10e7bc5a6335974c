// UTF-8, GPT-2's byte-level alphabet, and the patterns tokenizer stages split and replace with.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <stdexcept>

#include "io/tokenizer_parts.hpp"
#include "meganeura/error.hpp"

namespace mg::io::tokenizer_detail {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

char32_t utf8_at(std::string_view valid_text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(valid_text[pos + i]); };
  const unsigned char lead = byte(0);
  switch (utf8_length(lead)) {
    case 1:
      return lead;
    case 2:
      return (char32_t(lead & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3:
      return (char32_t(lead & 0x0F) << 12) | (char32_t(byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return (char32_t(lead & 0x07) << 18) | (char32_t(byte(1) & 0x3F) << 12) |
             (char32_t(byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

namespace {

// Length of the well-formed character at `pos`, or 0 with `invalid` set to the length of the
// maximal subpart that is not (Unicode's "substitution of maximal subparts", which Rust follows).
size_t valid_length_at(std::string_view bytes, size_t pos, size_t& invalid) {
  const auto at = [&](size_t i) -> int {
    return pos + i < bytes.size() ? static_cast<unsigned char>(bytes[pos + i]) : -1;
  };
  const int lead = at(0);
  if (lead < 0x80) return 1;
  const auto continuation = [](int b) { return b >= 0x80 && b <= 0xBF; };
  size_t length = 0;
  int second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  } else {
    invalid = 1;
    return 0;
  }
  const int second = at(1);
  if (second < second_low || second > second_high) {
    invalid = 1;
    return 0;
  }
  for (size_t i = 2; i < length; ++i) {
    if (!continuation(at(i))) {
      invalid = i;
      return 0;
    }
  }
  return length;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view bytes) {
  for (size_t pos = 0; pos < bytes.size();) {
    size_t invalid = 0;
    const size_t length = valid_length_at(bytes, pos, invalid);
    if (length == 0) return pos;
    pos += length;
  }
  return std::nullopt;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    size_t invalid = 0;
    const size_t length = valid_length_at(bytes, pos, invalid);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      out += "\xEF\xBF\xBD";
      pos += invalid;
    }
  }
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

// Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F-0xA0, 0xAD)
// take the code points from 256 up, in byte order.
std::array<char32_t, 256> byte_level_code_points() {
  std::array<char32_t, 256> code_points{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    code_points[b] = printable ? char32_t(b) : next++;
  }
  return code_points;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> result;
    const std::array<char32_t, 256> code_points = byte_level_code_points();
    for (int b = 0; b < 256; ++b) append_utf8(result[b], code_points[b]);
    return result;
  }();
  return chars;
}

int byte_level_byte(char32_t c) {
  static const std::array<int16_t, 324> bytes = [] {
    std::array<int16_t, 324> result;
    result.fill(-1);
    const std::array<char32_t, 256> code_points = byte_level_code_points();
    for (int b = 0; b < 256; ++b) result[code_points[b]] = static_cast<int16_t>(b);
    return result;
  }();
  return c < bytes.size() ? bytes[c] : -1;
}

namespace {

// Oniguruma (the library's regex engine) gives \s, \w and \h Unicode meanings that PCRE2's
// differ from: PCRE2's \s also takes U+180E, its \w lacks marks, and its \h is horizontal space
// where Oniguruma's is a hex digit. These are the Oniguruma sets, to write inside a class.
std::string_view oniguruma_class_set(char escape) {
  switch (escape) {
    case 's':
      return "\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
             "\\x{205F}\\x{3000}";
    case 'w':
      return "\\p{L}\\p{M}\\p{N}\\p{Pc}";
    case 'h':
      return "0-9a-fA-F";
    default:
      return {};
  }
}

std::string translate_oniguruma(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escape = pattern[i + 1];
      const char lower = static_cast<char>(escape | 0x20);
      const std::string_view set = oniguruma_class_set(lower);
      if (escape == 'Q') {
        const size_t end = pattern.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i, stop - i));
        i = stop - 1;
      } else if (!set.empty() && !in_class) {
        out += escape == lower ? "[" : "[^";
        out += set;
        out += ']';
        ++i;
      } else if (!set.empty() && escape == lower) {
        out += set;
        ++i;
      } else {
        // A negated class inside a class keeps PCRE2's meaning: it has no written-out form.
        out += c;
        out += escape;
        ++i;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread match state: one match pair is all we read, and the JIT gets a larger stack than
// its default so that long runs of whitespace under lookahead cannot exhaust it.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (!data || !context || !jit_stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Regex::Regex(std::string_view pattern) {
  const std::string translated = translate_oniguruma(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // Oniguruma's default (Ruby) syntax makes ^ and $ line anchors.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!code) {
    throw std::invalid_argument(pcre2_message(error) + " at offset " + std::to_string(offset));
  }
  // Without JIT support PCRE2 interprets the pattern, which gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::search(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  thread_local MatchScratch scratch;
  // Texts are checked for valid UTF-8 once, before any stage sees them.
  const int result =
      pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                  text.size(), from, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
  if (result == PCRE2_ERROR_NOMATCH) return false;
  // 0 means the match has more groups than the match data holds; the whole match is there.
  if (result < 0) throw Error("tokenizer regex failed on the text: " + pcre2_message(result));
  const PCRE2_SIZE* pairs = pcre2_get_ovector_pointer(scratch.data);
  begin = pairs[0];
  end = pairs[1];
  return true;
}

Pattern Pattern::literal(std::string text) {
  Pattern pattern;
  pattern.literal_ = std::move(text);
  return pattern;
}

Pattern Pattern::regex(std::string_view source) {
  Pattern pattern;
  pattern.regex_ = std::make_shared<const Regex>(source);
  return pattern;
}

std::vector<Match> Pattern::find_matches(std::string_view text) const {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Match> matches;
  size_t previous = 0;
  const auto add = [&](size_t begin, size_t end) {
    if (previous != begin) matches.push_back({previous, begin, false});
    matches.push_back({begin, end, true});
    previous = end;
  };
  if (regex_) {
    // Oniguruma's find_iter: an empty match right where the last match ended is skipped by
    // moving one character on.
    size_t search_from = 0;
    std::optional<size_t> last_match_end;
    size_t begin = 0, end = 0;
    while (search_from <= text.size() && regex_->search(text, search_from, begin, end)) {
      if (begin == end && last_match_end == end) {
        search_from += search_from < text.size()
                           ? utf8_length(static_cast<unsigned char>(text[search_from]))
                           : 1;
        continue;
      }
      search_from = end;
      last_match_end = end;
      add(begin, end);
    }
  } else {
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      add(pos, pos + literal_.size());
    }
  }
  if (previous != text.size()) matches.push_back({previous, text.size(), false});
  return matches;
}

Pattern parse_pattern(const json& config, const Source& source, std::string_view where) {
  const std::string context(where);
  if (!config.is_object() || config.size() != 1) {
    source.fail(context + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const bool is_regex = config.contains("Regex");
  if (!is_regex && !config.contains("String")) {
    source.fail(context + " must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const std::string text = source.string(config, is_regex ? "Regex" : "String", where);
  if (text.empty()) source.fail(context + " is empty");
  if (!is_regex) return Pattern::literal(text);
  try {
    return Pattern::regex(text);
  } catch (const std::invalid_argument& error) {
    source.fail(context + " regex " + in_quotes(text) + " does not compile: " + error.what());
  }
}

SplitBehavior parse_split_behavior(const json& config, const Source& source,
                                   std::string_view where) {
  const std::string name = source.string(config, "behavior", where);
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  source.fail(std::string(where) + ".behavior " + in_quotes(name) +
              " is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

std::vector<std::pair<size_t, size_t>> split_ranges(const std::vector<Match>& matches,
                                                    SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> ranges;
  ranges.reserve(matches.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Match& match : matches) ranges.emplace_back(match.begin, match.end);
      break;
    case SplitBehavior::removed:
      for (const Match& match : matches) {
        if (!match.is_match) ranges.emplace_back(match.begin, match.end);
      }
      break;
    case SplitBehavior::contiguous:
      for (const Match& match : matches) {
        if (match.is_match == previous_match && !ranges.empty()) {
          ranges.back().second = match.end;
        } else {
          ranges.emplace_back(match.begin, match.end);
        }
        previous_match = match.is_match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Match& match : matches) {
        if (match.is_match && !previous_match && !ranges.empty()) {
          ranges.back().second = match.end;
        } else {
          ranges.emplace_back(match.begin, match.end);
        }
        previous_match = match.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto match = matches.rbegin(); match != matches.rend(); ++match) {
        if (match->is_match && !previous_match && !ranges.empty()) {
          ranges.back().first = match->begin;
        } else {
          ranges.emplace_back(match->begin, match->end);
        }
        previous_match = match->is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
  }
  return ranges;
}

}  // namespace mg::io::tokenizer_detail
