#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace mg::io {

// A 5x7 pixel font, enough for chart labels without a font library. Row r of a glyph is
// rows[r]; bit 4 is the leftmost column.
inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 7;
// Horizontal distance between characters, including one column of spacing.
inline constexpr int kGlyphAdvance = kGlyphWidth + 1;

using GlyphRows = std::array<uint8_t, kGlyphHeight>;

// Covers digits, letters, space and .-%:/()_,+=; any other character draws as '?'.
const GlyphRows& glyph(char c);

inline int text_width(std::string_view text, int scale) {
  return text.empty() ? 0 : (static_cast<int>(text.size()) * kGlyphAdvance - 1) * scale;
}

}  // namespace mg::io
