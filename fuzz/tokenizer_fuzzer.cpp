// tokenizer.json as a model folder holds it, then one encode and decode of fixed text.
#include "fuzz_input.hpp"
#include "io/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = mg::fuzz::write_input("tokenizer.json", data, size);
  mg::fuzz::expect_loaded_or_one_line_error([&] {
    const mg::io::Tokenizer tokenizer = mg::io::Tokenizer::load(path);
    tokenizer.decode(tokenizer.encode("Hello, world! 12 3 ünïcode"));
  });
  return 0;
}
