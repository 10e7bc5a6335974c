// Safetensors files as a model folder's weights are read: mapped, every tensor's bytes touched.
#include "fuzz_input.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = mg::fuzz::write_input("model.safetensors", data, size);
  mg::fuzz::expect_loaded_or_one_line_error([&] {
    const mg::io::MappedSafetensors file = mg::io::MappedSafetensors::open(path, "weights");
    volatile uint8_t sum = 0;
    for (const mg::io::TensorView& tensor : file.tensors()) {
      for (std::byte b : tensor.bytes) sum = sum + static_cast<uint8_t>(b);
    }
  });
  return 0;
}
