#include "runtime/device_values.hpp"

#include <cstring>

#include "ir/half.hpp"
#include "meganeura/error.hpp"

namespace mg {

std::vector<float> host_values(DType dtype, const std::byte* data, size_t count) {
  std::vector<float> values(count);
  const size_t width = dtype_bytes(dtype);
  for (size_t i = 0; i < count; ++i) {
    const std::byte* element = data + i * width;
    switch (dtype) {
      case DType::f32:
        std::memcpy(&values[i], element, 4);
        break;
      case DType::f16: {
        uint16_t bits = 0;
        std::memcpy(&bits, element, 2);
        values[i] = f16_value(bits);
        break;
      }
      case DType::i32: {
        int32_t integer = 0;
        std::memcpy(&integer, element, 4);
        values[i] = static_cast<float>(integer);
        break;
      }
      case DType::u32: {
        uint32_t integer = 0;
        std::memcpy(&integer, element, 4);
        values[i] = static_cast<float>(integer);
        break;
      }
      case DType::bf16: {
        // A bfloat16 is the upper half of the f32 of its value.
        uint16_t bits = 0;
        std::memcpy(&bits, element, 2);
        const uint32_t widened = uint32_t{bits} << 16;
        std::memcpy(&values[i], &widened, 4);
        break;
      }
    }
  }
  return values;
}

}  // namespace mg
