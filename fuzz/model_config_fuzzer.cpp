// A model folder's config.json, opened as `train --model DIR` and `generate` open a folder (next
// to a valid, empty weights file, so that the config is what is fuzzed).
#include "fuzz_input.hpp"
#include "io/model_folder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool weights_written = [] {
    const uint8_t empty_weights[] = {8,   0,   0,   0,   0,   0,   0,   0,
                                     '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    mg::fuzz::write_input("model.safetensors", empty_weights, sizeof empty_weights);
    return true;
  }();
  (void)weights_written;
  mg::fuzz::write_input("config.json", data, size);
  mg::fuzz::expect_loaded_or_one_line_error([&] {
    const mg::io::ModelFolder folder = mg::io::ModelFolder::open(mg::fuzz::scratch_folder());
    (void)folder.config().dump();
  });
  return 0;
}
