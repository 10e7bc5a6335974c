#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "io/safetensors.hpp"

namespace mg::io::testing {

// A tensor of seeded random, finite, mostly non-zero values of any supported dtype.
inline TensorRecord random_tensor(const std::string& name, DType dtype, const Shape& shape,
                                  std::mt19937& random) {
  size_t count = 1;
  for (int64_t dim : shape) count *= static_cast<size_t>(dim);
  TensorRecord tensor{name, dtype, shape,
                      std::vector<std::byte>(count * safetensors_dtype_bytes(dtype))};
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  for (size_t i = 0; i < count; ++i) {
    std::byte* out = tensor.bytes.data() + i * safetensors_dtype_bytes(dtype);
    if (dtype == DType::f32) {
      const float value = real(random);
      std::memcpy(out, &value, 4);
    } else if (dtype == DType::bf16) {
      const float value = real(random);
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const auto high = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out, &high, 2);
    } else if (dtype == DType::f16) {
      // Sign, an exponent that keeps the value normal and finite, random mantissa.
      const auto bits = static_cast<uint16_t>(((random() & 1) << 15) | ((5 + random() % 16) << 10) |
                                              (random() & 0x3FF));
      std::memcpy(out, &bits, 2);
    } else if (dtype == DType::i32) {
      const auto value = static_cast<int32_t>(random());
      std::memcpy(out, &value, 4);
    } else {
      const auto value = static_cast<uint32_t>(random());
      std::memcpy(out, &value, 4);
    }
  }
  return tensor;
}

// Decodes element i of a tensor to double, as Python's struct module would.
inline double element_value(const TensorRecord& tensor, size_t i) {
  const std::byte* in = tensor.bytes.data() + i * safetensors_dtype_bytes(tensor.dtype);
  switch (tensor.dtype) {
    case DType::f32: {
      float value;
      std::memcpy(&value, in, 4);
      return value;
    }
    case DType::bf16: {
      uint16_t high;
      std::memcpy(&high, in, 2);
      const uint32_t bits = uint32_t{high} << 16;
      float value;
      std::memcpy(&value, &bits, 4);
      return value;
    }
    case DType::f16: {
      uint16_t bits;
      std::memcpy(&bits, in, 2);
      const int exponent = (bits >> 10) & 0x1F;
      const double mantissa = (bits & 0x3FF) / 1024.0;
      const double magnitude =
          exponent == 0 ? std::ldexp(mantissa, -14) : std::ldexp(1.0 + mantissa, exponent - 15);
      return (bits & 0x8000) ? -magnitude : magnitude;
    }
    case DType::i32: {
      int32_t value;
      std::memcpy(&value, in, 4);
      return value;
    }
    case DType::u32: {
      uint32_t value;
      std::memcpy(&value, in, 4);
      return value;
    }
  }
  return 0;
}

}  // namespace mg::io::testing
