// Checkpoints as `meganeura infer` and `--resume` read them: the file, its "meganeura" metadata
// and every field of it.
#include "fuzz_input.hpp"
#include "io/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = mg::fuzz::write_input("checkpoint.safetensors", data, size);
  mg::fuzz::expect_loaded_or_one_line_error([&] {
    const mg::io::Checkpoint checkpoint = mg::io::load_checkpoint(path);
    mg::io::check_same_model(checkpoint.model_config, checkpoint.optimizer, path);
  });
  return 0;
}
