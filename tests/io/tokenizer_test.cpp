#include "io/tokenizer.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "scratch_dir.hpp"

namespace mg::io {
namespace {

using Ids = std::vector<int32_t>;
using testing::expect_error;

// The hand-made fixtures (tests/fixtures/tokenizer/make_small_fixtures.py). In the byte-level
// ones, the 256 byte tokens come first in GPT-2's order: printable ASCII byte b is id b - 33,
// the space ("Ġ") is 220 and the newline ("Ċ") 198.
std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests/fixtures/tokenizer" / name;
}

Tokenizer load(const std::string& name) {
  return Tokenizer::load(fixture(name + ".json"));
}

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

// Texts every byte-level or byte-fallback tokenizer must give back unchanged.
const std::vector<std::string> kRoundTripTexts = {
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "naïve café, Ünïcödé — “quotes” and ‘apostrophes’",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵",
    "日本語のテキストと中文文本，한국어 텍스트",
    "mixed   runs\t\tof\n\n\nwhitespace  \r\n  and trailing   ",
    "   leading spaces",
    "digits 0123456789 and ١٢٣ and ½ and 10,000.5",
    "symbols: <>{}[]()!@#$%^&*_+=~`|\\/?;:'\"",
    "I'm sure they've said you'll see it's done, we'd",
    "\x01\x02 control \x7f bytes",
    "",
    " ",
};

TEST(Tokenizer, Gpt2ByteLevelEncodesByMergeRank) {
  const Tokenizer tokenizer = load("gpt2_small");
  EXPECT_EQ(tokenizer.vocab_size(), 270);
  // "hello" merges h+e, l+l, he+ll, hell+o; " world" Ġ+w, o+r, Ġw+or, Ġwor+l, Ġworl+d.
  EXPECT_EQ(tokenizer.encode("hello world"), (Ids{261, 266}));
  // No "t he" merge; " hello" has no merge with the space.
  EXPECT_EQ(tokenizer.encode("the hello"), (Ids{83, 257, 220, 261}));
  // Equal ranks merge leftmost first.
  EXPECT_EQ(tokenizer.encode("lll"), (Ids{259, 75}));
  EXPECT_EQ(tokenizer.encode("llll"), (Ids{259, 259}));
  // Whitespace before a word goes with it; the rest of a run stays apart (\s+(?!\S)).
  EXPECT_EQ(tokenizer.encode("a   b"), (Ids{64, 267, 220, 65}));
  EXPECT_EQ(tokenizer.encode("a\nb"), (Ids{64, 198, 65}));
  // Contractions split off; numbers keep their leading space.
  EXPECT_EQ(tokenizer.encode("I'm 42"), (Ids{40, 6, 76, 220, 19, 17}));
  // UTF-8 bytes C3 A9 are the byte-level characters of ids 127 and 102.
  EXPECT_EQ(tokenizer.encode("é"), (Ids{127, 102}));
  EXPECT_EQ(tokenizer.encode(""), Ids{});
}

TEST(Tokenizer, Gpt2AddedTokenSplitsTheText) {
  const Tokenizer tokenizer = load("gpt2_small");
  const Ids ids = tokenizer.encode("hello<|endoftext|> the");
  EXPECT_EQ(ids, (Ids{261, 269, 258}));
  EXPECT_EQ(tokenizer.decode(ids), "hello<|endoftext|> the");
  EXPECT_EQ(tokenizer.decode(ids, /*skip_special_tokens=*/true), "hello the");
  EXPECT_EQ(tokenizer.token_id("<|endoftext|>"), 269);
  EXPECT_EQ(tokenizer.token_id("Ġthe"), 258);
  EXPECT_EQ(tokenizer.token_id("nope"), std::nullopt);
  EXPECT_EQ(tokenizer.token_text(266), "Ġworld");
  EXPECT_TRUE(tokenizer.is_special(269));
  EXPECT_FALSE(tokenizer.is_special(258));
  // The ByteLevel post-processor adds nothing.
  EXPECT_EQ(tokenizer.encode("hello", /*add_special_tokens=*/true), (Ids{261}));
  expect_error([&] { tokenizer.token_text(5000); }, {"gpt2_small.json", "5000"});
}

TEST(Tokenizer, DigitsThenByteLevelAsSmolLM2) {
  const Tokenizer tokenizer = load("digits_small");
  EXPECT_EQ(tokenizer.vocab_size(), 264);
  // Digits split one by one before the regex, so the space before them is a word of its own and
  // the "1 2" merge never applies.
  EXPECT_EQ(tokenizer.encode("<|im_start|>user 12"), (Ids{1, 262, 223, 19, 20}));
  EXPECT_EQ(tokenizer.encode("user12<|im_end|>"), (Ids{262, 19, 20, 2}));
  // Any Unicode number is a digit: ARABIC-INDIC DIGIT THREE is bytes D9 A3.
  EXPECT_EQ(tokenizer.encode("x  \u0663"), (Ids{90, 263, 152, 99}));
  EXPECT_EQ(tokenizer.decode(Ids{1, 262, 223, 19, 20}), "<|im_start|>user 12");
}

TEST(Tokenizer, LlamaMetaspaceWithByteFallback) {
  const Tokenizer tokenizer = load("llama_small");
  // Prepend and Replace make "▁hello▁world", one word for the model.
  EXPECT_EQ(tokenizer.encode("hello world"), (Ids{271, 276}));
  // The template adds BOS.
  EXPECT_EQ(tokenizer.encode("hello world", true), (Ids{1, 271, 276}));
  // "é" is not in the vocabulary: its bytes <0xC3> <0xA9> are (3 + byte).
  EXPECT_EQ(tokenizer.encode("hé"), (Ids{259, 260, 198, 172}));
  EXPECT_EQ(tokenizer.decode(Ids{259, 260, 198, 172}), "hé");
  // Three spaces: "▁▁" merges after the rest of the word, leftmost first.
  EXPECT_EQ(tokenizer.encode("  hello"), (Ids{277, 271}));
  EXPECT_EQ(tokenizer.decode(Ids{277, 271}), "  hello");
  // Special tokens are not normalized, so no "▁" before them.
  const Ids ids = tokenizer.encode("<s>hello</s>");
  EXPECT_EQ(ids, (Ids{1, 271, 2}));
  EXPECT_EQ(tokenizer.decode(ids), "<s> hello</s>");
  EXPECT_EQ(tokenizer.decode(ids, true), "hello");
  // A byte run that is not UTF-8 decodes to one U+FFFD per byte.
  EXPECT_EQ(tokenizer.decode(Ids{260, 198, 263}), "h\uFFFDo");
}

class TokenizerVariant : public testing::ScratchDirTest {
 protected:
  Tokenizer load_variant(const std::string& name, const nlohmann::json& config) {
    testing::write_text(path(name), config.dump());
    return Tokenizer::load(path(name));
  }
};

TEST_F(TokenizerVariant, UnknownCharactersWithoutByteFallback) {
  nlohmann::json config = read_json(fixture("llama_small.json"));
  config["model"]["byte_fallback"] = false;
  // "▁h☃☃e": the snowmen are one <unk> when fused, one each otherwise; without an unknown token
  // they vanish and h, e merge.
  EXPECT_EQ(load_variant("fused.json", config).encode("h☃☃e"), (Ids{259, 260, 0, 261}));
  config["model"]["fuse_unk"] = false;
  EXPECT_EQ(load_variant("unfused.json", config).encode("h☃☃e"), (Ids{259, 260, 0, 0, 261}));
  config["model"]["unk_token"] = nullptr;
  EXPECT_EQ(load_variant("dropped.json", config).encode("h☃☃e"), (Ids{259, 267}));
  config["model"]["unk_token"] = "<absent>";
  const Tokenizer absent = load_variant("absent.json", config);
  EXPECT_EQ(absent.encode("hello"), (Ids{271}));
  expect_error([&] { absent.encode("h☃"); }, {"absent.json", "model.unk_token \"<absent>\""});
}

TEST(Tokenizer, MetaspaceAndAddedTokenOptions) {
  const Tokenizer tokenizer = load("metaspace_small");
  EXPECT_EQ(tokenizer.vocab_size(), 10);
  // "▁ab▁ab" splits before each "▁"; "▁ a" outranks "a b", so "▁ab" never forms.
  EXPECT_EQ(tokenizer.encode("ab ab"), (Ids{5, 3, 5, 3}));
  // lstrip and rstrip take the spaces around <sep>; "first" prepends "▁" only at the text's start.
  const Ids ids = tokenizer.encode("ab  <sep>  ab");
  EXPECT_EQ(ids, (Ids{5, 3, 8, 6}));
  EXPECT_EQ(tokenizer.decode(ids), "ab<sep>ab");
  EXPECT_EQ(tokenizer.decode(ids, true), "abab");
  // single_word: "cat" only where no word character touches it.
  EXPECT_EQ(tokenizer.encode("cat abc"), (Ids{9, 5, 3, 4}));
  EXPECT_EQ(tokenizer.decode(Ids{9, 5, 3, 4}), "cat abc");
  EXPECT_EQ(tokenizer.encode("cat's"), (Ids{9, 0, 0}));
  // Inside "concat" it is not a token: o, n and t are unknown (unfused).
  EXPECT_EQ(tokenizer.encode("concat"), (Ids{1, 4, 0, 0, 4, 2, 0}));
  EXPECT_FALSE(tokenizer.is_special(9));
  EXPECT_TRUE(tokenizer.is_special(8));
}

TEST(Tokenizer, SplitRegexWithIgnoreMerges) {
  const Tokenizer tokenizer = load("split_small");
  // Whole words in the vocabulary skip the merges.
  EXPECT_EQ(tokenizer.encode("hello world"), (Ids{256, 257}));
  EXPECT_EQ(tokenizer.encode(" wor"), (Ids{258, 78, 81}));
  // Numbers go in groups of at most three; (?i:...) takes "'M".
  EXPECT_EQ(tokenizer.encode("12345"), (Ids{16, 17, 18, 19, 20}));
  EXPECT_EQ(tokenizer.encode("I'M"), (Ids{40, 6, 44}));
}

// A tokenizer with one Split pre-tokenizer and a vocabulary of whole pieces (ignore_merges), so
// that the ids show where Split cut the text; anything else is one <unk> (id 0).
class SplitTest : public testing::ScratchDirTest {
 protected:
  Ids split(const nlohmann::json& pattern, const std::string& behavior, const std::string& text,
            const std::vector<std::string>& pieces, bool invert = false) {
    nlohmann::json vocab = {{"<unk>", 0}};
    for (const std::string& piece : pieces) vocab[piece] = static_cast<int>(vocab.size());
    const nlohmann::json config = {
        {"model",
         {{"type", "BPE"},
          {"vocab", vocab},
          {"merges", nlohmann::json::array()},
          {"ignore_merges", true},
          {"unk_token", "<unk>"},
          {"fuse_unk", true}}},
        {"pre_tokenizer",
         {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}}}};
    testing::write_text(path("split.json"), config.dump());
    return Tokenizer::load(path("split.json")).encode(text);
  }
};

TEST_F(SplitTest, EachBehaviorCutsAsTheLibraryDocuments) {
  const nlohmann::json dash = {{"String", "-"}};
  const std::string text = "the-final--countdown";
  const std::vector<std::string> pieces = {"the",  "-",      "final",  "--",        "countdown",
                                           "the-", "final-", "-final", "-countdown"};
  // Ids: the 1, - 2, final 3, -- 4, countdown 5, the- 6, final- 7, -final 8, -countdown 9.
  EXPECT_EQ(split(dash, "Removed", text, pieces), (Ids{1, 3, 5}));
  EXPECT_EQ(split(dash, "Isolated", text, pieces), (Ids{1, 2, 3, 2, 2, 5}));
  EXPECT_EQ(split(dash, "MergedWithPrevious", text, pieces), (Ids{6, 7, 2, 5}));
  EXPECT_EQ(split(dash, "MergedWithNext", text, pieces), (Ids{1, 8, 2, 9}));
  EXPECT_EQ(split(dash, "Contiguous", text, pieces), (Ids{1, 2, 3, 4, 5}));
  // Inverted, the words are the matches: Removed keeps only the dashes.
  EXPECT_EQ(split(dash, "Removed", text, pieces, /*invert=*/true), (Ids{2, 2, 2}));
}

TEST_F(SplitTest, RegexClassesMeanWhatOnigurumaMeans) {
  // U+180E (MONGOLIAN VOWEL SEPARATOR) is not White_Space, so not \s.
  EXPECT_EQ(split({{"Regex", R"(\s+)"}}, "Removed", "a\u180Eb c", {"a\u180Eb", "c"}), (Ids{1, 2}));
  // \w takes combining marks (U+0301 after "e").
  EXPECT_EQ(split({{"Regex", R"(\w+)"}}, "Isolated", "e\u0301x y", {"e\u0301x", " ", "y"}),
            (Ids{1, 2, 3}));
  // \h is a hex digit.
  EXPECT_EQ(split({{"Regex", R"(\h+)"}}, "Isolated", "beef cake", {"beef", " ", "ca", "k", "e"}),
            (Ids{1, 2, 3, 4, 5}));
  // ^ anchors lines.
  EXPECT_EQ(split({{"Regex", "^ +"}}, "Removed", "a\n b", {"a\n", "b"}), (Ids{1, 2}));
}

TEST(Tokenizer, DecodeOfEncodeGivesTheTextBack) {
  for (const std::string name : {"gpt2_small", "digits_small", "llama_small", "split_small"}) {
    const Tokenizer tokenizer = load(name);
    for (const std::string& text : kRoundTripTexts) {
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text) << name << ": " << text;
    }
  }
}

TEST(Tokenizer, RandomUnicodeRoundTrips) {
  // Code points from every plane that UTF-8 can carry, surrogates excluded, seeded.
  std::mt19937 random(7);
  std::uniform_int_distribution<int> plane(0, 3);
  const Tokenizer byte_level = load("digits_small");
  const Tokenizer fallback = load("llama_small");
  for (int text_index = 0; text_index < 200; ++text_index) {
    std::string text;
    for (int i = 0; i < 20; ++i) {
      const char32_t limits[] = {0x80, 0x800, 0x10000, 0x110000};
      char32_t c = std::uniform_int_distribution<uint32_t>(1, limits[plane(random)] - 1)(random);
      if (c >= 0xD800 && c < 0xE000) c = ' ';
      if (c < 0x80) {
        text += static_cast<char>(c);
      } else if (c < 0x800) {
        text += static_cast<char>(0xC0 | (c >> 6));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        text += static_cast<char>(0xE0 | (c >> 12));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        text += static_cast<char>(0xF0 | (c >> 18));
        text += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      }
    }
    EXPECT_EQ(byte_level.decode(byte_level.encode(text)), text);
    EXPECT_EQ(fallback.decode(fallback.encode(text)), text);
  }
}

TEST(Tokenizer, StreamHoldsSplitCharactersBack) {
  const Tokenizer tokenizer = load("gpt2_small");
  const std::string text = "héllo 😀 world";
  const Ids ids = tokenizer.encode(text);
  TokenStreamDecoder stream(tokenizer);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string piece = stream.push(id);
    // Never half a character.
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(piece)), piece);
    EXPECT_EQ(piece.find("\uFFFD"), std::string::npos) << "piece " << piece;
    streamed += piece;
  }
  streamed += stream.finish();
  EXPECT_EQ(streamed, text);

  // The emoji's four bytes arrive one token each: nothing until the last.
  TokenStreamDecoder emoji(tokenizer);
  const Ids bytes = tokenizer.encode("😀");
  ASSERT_EQ(bytes.size(), 4u);
  EXPECT_EQ(emoji.push(bytes[0]), "");
  EXPECT_EQ(emoji.push(bytes[1]), "");
  EXPECT_EQ(emoji.push(bytes[2]), "");
  EXPECT_EQ(emoji.push(bytes[3]), "😀");
  // An unfinished character comes out as U+FFFD when the stream ends.
  EXPECT_EQ(emoji.push(bytes[0]), "");
  EXPECT_EQ(emoji.finish(), "\uFFFD");
}

TEST(Tokenizer, StreamKeepsSpacesBetweenMetaspaceWords) {
  const Tokenizer tokenizer = load("llama_small");
  TokenStreamDecoder stream(tokenizer);
  // Alone each decodes without its space (the Strip decoder); in a stream the second keeps it.
  EXPECT_EQ(stream.push(271), "hello");
  EXPECT_EQ(stream.push(276), " world");
  // Byte-fallback bytes of "é" (C3 A9) wait for each other.
  EXPECT_EQ(stream.push(198), "");
  EXPECT_EQ(stream.push(172), "é");
  EXPECT_EQ(stream.finish(), "");
}

// The id of a byte's token in GPT-2's order: the printable ranges first, then the other bytes.
int32_t gpt2_byte_id(int byte) {
  if (byte >= 33 && byte <= 126) return byte - 33;
  if (byte >= 161 && byte <= 172) return byte - 161 + 94;
  if (byte >= 174) return byte - 174 + 106;
  if (byte <= 32) return 188 + byte;
  if (byte <= 160) return 188 + 33 + (byte - 127);
  return 255;  // 173, the last one
}

TEST(Tokenizer, ByteLevelDecodeReplacesInvalidUtf8AsRust) {
  const Tokenizer tokenizer = load("gpt2_small");
  const auto decode = [&](std::initializer_list<int> bytes) {
    Ids ids;
    for (const int byte : bytes) ids.push_back(gpt2_byte_id(byte));
    return tokenizer.decode(ids);
  };
  EXPECT_EQ(decode({0x20, 0x0A, 0xC2, 0xAD}), " \n\u00AD");
  // One U+FFFD for each maximal invalid part: a truncated sequence is one, a surrogate's or an
  // overlong form's bytes are one each.
  EXPECT_EQ(decode({0xE2, 0x82, 'A'}), "\uFFFDA");
  EXPECT_EQ(decode({0xF0, 0x9F, 0x98}), "\uFFFD");
  EXPECT_EQ(decode({0xED, 0xA0, 0x80}), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(decode({0xC0, 0xAF, 'x'}), "\uFFFD\uFFFDx");
}

TEST(Tokenizer, SkipsIdsWithoutTokensWhenDecoding) {
  const Tokenizer tokenizer = load("gpt2_small");
  EXPECT_EQ(tokenizer.decode(Ids{261, 100000, -3, 266}), "hello world");
}

class TokenizerErrors : public testing::ScratchDirTest {
 protected:
  std::filesystem::path write(const std::string& name, const nlohmann::json& config) {
    testing::write_text(path(name), config.dump());
    return path(name);
  }
  nlohmann::json gpt2() { return read_json(fixture("gpt2_small.json")); }
};

TEST_F(TokenizerErrors, MissingFileAndNotJsonNameTheFile) {
  expect_error([&] { Tokenizer::load(path("absent/tokenizer.json")); },
               {path("absent/tokenizer.json").string(), "does not exist"});
  testing::write_text(path("broken.json"), "{\"model\": [1, 2,");
  expect_error([&] { Tokenizer::load(path("broken.json")); }, {"broken.json", "is not valid JSON"});
}

TEST_F(TokenizerErrors, UnsupportedStagesAreNamed) {
  nlohmann::json config = gpt2();
  config["model"]["type"] = "WordPiece";
  expect_error([&] { Tokenizer::load(write("model.json", config)); },
               {"model.json", "model type \"WordPiece\" is not supported"});
  config = gpt2();
  config["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error([&] { Tokenizer::load(write("pre.json", config)); },
               {"pre.json", "pre_tokenizer type \"Whitespace\" is not supported"});
  config = gpt2();
  config["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
  expect_error([&] { Tokenizer::load(write("norm.json", config)); },
               {"norm.json", "normalizer.normalizers[0] type \"NFKC\" is not supported"});
  config = gpt2();
  config["decoder"] = {{"type", "CTC"}};
  expect_error([&] { Tokenizer::load(write("dec.json", config)); },
               {"dec.json", "decoder type \"CTC\" is not supported"});
  config = gpt2();
  config["model"]["dropout"] = 0.1;
  expect_error([&] { Tokenizer::load(write("dropout.json", config)); },
               {"dropout.json", "model.dropout"});
}

TEST_F(TokenizerErrors, MergesOutsideTheVocabularyAreNamed) {
  nlohmann::json config = gpt2();
  config["model"]["merges"].push_back("hello zz");
  expect_error([&] { Tokenizer::load(write("merges.json", config)); },
               {"merges.json", "model.merges[13]", "\"zz\"", "not in the vocabulary"});
  config = gpt2();
  config["model"]["merges"].push_back("a b c");
  expect_error([&] { Tokenizer::load(write("three.json", config)); },
               {"three.json", "model.merges[13]", "not two tokens"});
}

TEST_F(TokenizerErrors, BadRegexAndBadTextAreNamed) {
  nlohmann::json config = gpt2();
  config["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"Regex", "(unclosed"}}},
                             {"behavior", "Isolated"},
                             {"invert", false}};
  expect_error([&] { Tokenizer::load(write("regex.json", config)); },
               {"regex.json", "pre_tokenizer.pattern", "does not compile"});
  const Tokenizer tokenizer = load("gpt2_small");
  expect_error([&] { tokenizer.encode("ok \xC3("); }, {"not valid UTF-8", "byte 3"});
}

}  // namespace
}  // namespace mg::io
