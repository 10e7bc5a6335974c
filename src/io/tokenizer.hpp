#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mg::io {

namespace tokenizer_detail {
struct Pipeline;
}

// A Hugging Face tokenizer read from the tokenizer.json that the `tokenizers` library writes:
// a BPE model (byte-level like GPT-2 and SmolLM2, or Llama-style with byte fallback) with its
// normalizer, pre-tokenizer, added tokens, post-processor and decoder. encode and decode give
// the ids and text the library gives; docs/TOKENIZER.md lists what is supported. Copies share
// one pipeline (and its word cache); all methods may be called from several threads.
class Tokenizer {
 public:
  // Throws mg::Error naming the file and the problem: missing file, not JSON, an unsupported
  // model, normalizer, pre-tokenizer, post-processor or decoder (named), merges that refer to
  // tokens outside the vocabulary, a regex PCRE2 cannot compile.
  static Tokenizer load(const std::filesystem::path& tokenizer_json);

  // Throws mg::Error if `text` is not valid UTF-8. add_special_tokens applies the
  // post-processor (e.g. Llama's BOS); without one it changes nothing.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids without a token (past the vocabulary or in a gap) are skipped, as the library does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // including added tokens (max id + 1)
  std::optional<int32_t> token_id(std::string_view token) const;  // vocab or added token
  std::string token_text(int32_t id) const;  // the raw token string; throws mg::Error if none
  bool is_special(int32_t id) const;

  const std::filesystem::path& path() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::Pipeline> pipeline);
  std::shared_ptr<const tokenizer_detail::Pipeline> pipeline_;
};

// Streams text as tokens arrive: push(id) returns the text that became complete (a multi-byte
// UTF-8 character split over tokens is held back until whole), as the library's DecodeStream
// does: it decodes the last few ids together so that decoders which look at neighbours (a
// Metaspace word start, byte fallback) give the same text as decoding everything at once.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  // The text still held back (an unfinished character decodes to U+FFFD); resets the stream.
  std::string finish();

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace mg::io
