// A Fashion-MNIST split (idx images and labels, gzip or plain): the first byte says where the
// input splits into the two files.
#include "data/fashion_mnist.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t split = std::min<size_t>(size - 1, data[0] * 4u);
  mg::fuzz::write_input("t10k-labels-idx1-ubyte.gz", data + 1, split);
  mg::fuzz::write_input("t10k-images-idx3-ubyte.gz", data + 1 + split, size - 1 - split);
  mg::fuzz::expect_loaded_or_one_line_error(
      [&] { mg::data::load_fashion_mnist(mg::fuzz::scratch_folder(), "test"); });
  return 0;
}
