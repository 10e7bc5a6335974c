#pragma once
// Bounds on JSON read from users' files. Parsing is iterative, but copying, comparing and printing
// a parsed value recurse once per level, so nesting is checked before parsing; and quoted input in
// an error line is cut short so that the line stays one readable line. Header-only, so that every
// layer that reads JSON (io, models, cli) can use it without linking another.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "meganeura/error.hpp"

namespace mg::io {

// Files such as config.json and tokenizer.json nest a handful of levels; this leaves room.
inline constexpr int kMaxJsonNesting = 64;

// `text` with line breaks as spaces, cut to `max_chars` with "..." after the cut.
inline std::string shortened(std::string_view text, size_t max_chars = 80) {
  std::string out(text.substr(0, std::min(text.size(), max_chars)));
  std::replace_if(
      out.begin(), out.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  if (text.size() > max_chars) out += "...";
  return out;
}

// A parsed value as JSON text for an error line, cut short.
inline std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80) {
  return shortened(value.dump(), max_chars);
}

// The deepest nesting of objects and arrays in `text` (strings skipped), counting no further than
// limit + 1.
inline int json_nesting(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// Throws mg::Error "<what> nests JSON deeper than N levels" when it does.
inline void check_json_nesting(std::string_view text, int limit, const std::string& what) {
  if (json_nesting(text, limit) > limit) {
    throw Error(what + " nests JSON deeper than " + std::to_string(limit) +
                " levels; it is corrupt or not the file expected");
  }
}

// Parses `text` after checking its nesting; throws mg::Error naming `what` and the parser's
// one-line reason.
inline nlohmann::json parse_json(std::string_view text, const std::string& what,
                                 int max_nesting = kMaxJsonNesting) {
  check_json_nesting(text, max_nesting, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw Error(what + " is not valid JSON: " + shortened(std::string_view(error.what()), 160));
  }
}

}  // namespace mg::io
