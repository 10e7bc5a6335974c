// Audio files (WAV and the other formats libsndfile reads), resampled to 16 kHz as Whisper's
// features are.
#include "data/audio.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = mg::fuzz::write_input("sound.wav", data, size);
  mg::fuzz::expect_loaded_or_one_line_error([&] { mg::data::read_audio(path); });
  return 0;
}
