// Image files as `meganeura infer CHECKPOINT IMAGE...` and image folders read them (PNG, JPEG,
// BMP, GIF, TGA, PGM), converted to gray and resized as the classifier takes them.
#include "fuzz_input.hpp"
#include "io/image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = mg::fuzz::write_input("picture", data, size);
  mg::fuzz::expect_loaded_or_one_line_error(
      [&] { mg::io::resize(mg::io::to_gray(mg::io::read_image(path)), 28, 28); });
  return 0;
}
