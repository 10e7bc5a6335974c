// Parity with the Hugging Face `tokenizers` library: tokenizers it trained with the pipelines of
// SmolLM2, GPT-2/Whisper and Llama 2, and the ids and decodes it gave for every line of a corpus
// (tests/fixtures/make_hf_fixtures.py made them; docs/TOKENIZER.md).
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/tokenizer.hpp"

namespace mg::io {
namespace {

using Ids = std::vector<int32_t>;

const std::filesystem::path kFixtures =
    std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests/fixtures/tokenizer";

// The lines of a gzip file, without their '\n'; the text after the last '\n' is not a line.
std::vector<std::string> gzip_lines(const std::filesystem::path& file) {
  gzFile in = gzopen(file.c_str(), "rb");
  if (!in) throw std::runtime_error("cannot open " + file.string());
  std::string text;
  char buffer[1 << 16];
  for (int read; (read = gzread(in, buffer, sizeof(buffer))) > 0;) text.append(buffer, read);
  gzclose(in);
  std::vector<std::string> lines;
  for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos;
       start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  return lines;
}

class TokenizerParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { corpus_ = gzip_lines(kFixtures / "corpus.txt.gz"); }
  static std::vector<std::string> corpus_;
};
std::vector<std::string> TokenizerParity::corpus_;

TEST_P(TokenizerParity, EveryCorpusLineEncodesAndDecodesAsTheLibrary) {
  const std::filesystem::path dir = kFixtures / GetParam();
  const Tokenizer tokenizer = Tokenizer::load(dir / "tokenizer.json");
  const std::vector<std::string> ids_lines = gzip_lines(dir / "ids.jsonl.gz");
  const std::vector<std::string> decoded_lines = gzip_lines(dir / "decoded.jsonl.gz");
  ASSERT_GE(corpus_.size(), 10'000u);
  ASSERT_EQ(ids_lines.size(), corpus_.size());
  ASSERT_EQ(decoded_lines.size(), corpus_.size());

  size_t mismatched = 0;
  for (size_t line = 0; line < corpus_.size(); ++line) {
    const std::string& text = corpus_[line];
    const Ids ids = tokenizer.encode(text);
    const Ids expected_ids = nlohmann::json::parse(ids_lines[line]).get<Ids>();
    const std::string expected_text = nlohmann::json::parse(decoded_lines[line]).get<std::string>();
    // Python's Tokenizer.decode skips special tokens unless told otherwise.
    const std::string decoded = tokenizer.decode(expected_ids, /*skip_special_tokens=*/true);
    if (ids == expected_ids && decoded == expected_text) continue;
    if (mismatched++ == 0) {
      ADD_FAILURE() << GetParam() << " line " << line + 1 << ": " << nlohmann::json(text).dump()
                    << "\n  ids      " << nlohmann::json(ids).dump() << "\n  expected "
                    << nlohmann::json(expected_ids).dump() << "\n  decoded  "
                    << nlohmann::json(decoded).dump() << "\n  expected "
                    << nlohmann::json(expected_text).dump();
    }
  }
  EXPECT_EQ(mismatched, 0u) << "lines that differ from the library's, of " << corpus_.size();
}

// One text with special tokens, encoded with add_special_tokens=True.
TEST_P(TokenizerParity, SpecialTokensInTheTextAsTheLibrary) {
  const std::filesystem::path dir = kFixtures / GetParam();
  const Tokenizer tokenizer = Tokenizer::load(dir / "tokenizer.json");
  std::ifstream in(dir / "special_example.json");
  const nlohmann::json example = nlohmann::json::parse(in);
  const std::string text = example["text"].get<std::string>();
  EXPECT_EQ(tokenizer.encode(text, /*add_special_tokens=*/true), example["ids"].get<Ids>());
}

INSTANTIATE_TEST_SUITE_P(Trained, TokenizerParity,
                         ::testing::Values("smollm2_like", "gpt2_like", "llama_like"));

}  // namespace
}  // namespace mg::io
