#include "io/tensor_values.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ir/half.hpp"
#include "meganeura/error.hpp"

namespace mg::io {
namespace {

// Every integer of this magnitude or less is an f32; past it f32 skips integers.
constexpr double kLargestExactInteger = 16777216.0;

float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1F;
  const uint32_t fraction = bits & 0x3FF;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | (fraction << 13));
  if (exponent == 0) {
    // Zero and subnormals: fraction steps of 2^-24, exact in f32.
    const float magnitude = std::ldexp(static_cast<float>(fraction), -24);
    return sign ? -magnitude : magnitude;
  }
  // Re-bias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (fraction << 13));
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) return sign | 0x7E00;  // NaN
  // 65520 (0x477FF000) is halfway between the largest half, 65504, and the next step: from there
  // on the value rounds to infinity.
  if (magnitude >= 0x477FF000) return sign | 0x7C00;
  if (magnitude >= 0x38800000) {
    // Normal in f16 (at least 2^-14): re-bias the exponent from 127 to 15, then drop 13 fraction
    // bits rounding to nearest, ties to even.
    const uint32_t rebiased = magnitude - 0x38000000;
    return sign | static_cast<uint16_t>((rebiased + 0x0FFF + ((rebiased >> 13) & 1)) >> 13);
  }
  // Subnormal in f16: a count of 2^-24 steps. Scaling by 2^24 is exact in f32 and nearbyint
  // rounds ties to even; 1024 steps is the smallest normal, whose bit pattern is also 1024.
  const float steps = std::nearbyint(std::ldexp(std::bit_cast<float>(magnitude), 24));
  return sign | static_cast<uint16_t>(steps);
}

template <typename Stored>
Stored load(const std::byte* data, size_t index) {
  Stored value;
  std::memcpy(&value, data + index * sizeof(Stored), sizeof(Stored));
  return value;
}

template <typename Integer>
void integers_to_f32(const TensorView& view, std::vector<float>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    const Integer value = load<Integer>(view.bytes.data(), i);
    const auto wide = static_cast<double>(value);
    if (std::fabs(wide) > kLargestExactInteger) {
      throw Error("tensor '" + view.name + "' holds the " +
                  std::string(stored_dtype_name(view.stored_dtype)) + " value " +
                  std::to_string(value) + " at element " + std::to_string(i) +
                  ", which f32 cannot hold exactly (only integers up to +-2^24); read its bytes "
                  "as integers instead");
    }
    out[i] = static_cast<float>(value);
  }
}

}  // namespace

std::vector<float> tensor_as_f32(const TensorView& view) {
  const std::optional<uint64_t> expected = stored_tensor_bytes(view.shape, view.stored_dtype);
  if (!expected || *expected != view.bytes.size()) {
    throw Error("tensor '" + view.name + "' has shape " + shape_text(view.shape) + " and dtype " +
                std::string(stored_dtype_name(view.stored_dtype)) + " but " +
                std::to_string(view.bytes.size()) + " bytes");
  }
  std::vector<float> out(view.bytes.size() / stored_dtype_bytes(view.stored_dtype));
  const std::byte* data = view.bytes.data();
  switch (view.stored_dtype) {
    case StoredDType::f32:
      if (!out.empty()) std::memcpy(out.data(), data, view.bytes.size());
      break;
    case StoredDType::f64:
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(load<double>(data, i));
      break;
    case StoredDType::f16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(load<uint16_t>(data, i));
      break;
    case StoredDType::bf16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(load<uint16_t>(data, i));
      break;
    case StoredDType::i64:
      integers_to_f32<int64_t>(view, out);
      break;
    case StoredDType::i32:
      integers_to_f32<int32_t>(view, out);
      break;
    case StoredDType::i16:
      integers_to_f32<int16_t>(view, out);
      break;
    case StoredDType::i8:
      integers_to_f32<int8_t>(view, out);
      break;
    case StoredDType::u64:
      integers_to_f32<uint64_t>(view, out);
      break;
    case StoredDType::u32:
      integers_to_f32<uint32_t>(view, out);
      break;
    case StoredDType::u16:
      integers_to_f32<uint16_t>(view, out);
      break;
    case StoredDType::u8:
      integers_to_f32<uint8_t>(view, out);
      break;
    case StoredDType::boolean:
      for (size_t i = 0; i < out.size(); ++i) {
        const auto byte = load<uint8_t>(data, i);
        if (byte > 1) {
          throw Error("tensor '" + view.name + "' is BOOL but element " + std::to_string(i) +
                      " is the byte " + std::to_string(byte) + ", not 0 or 1");
        }
        out[i] = byte;
      }
      break;
  }
  return out;
}

std::vector<std::byte> f32_to_bytes(std::span<const float> values, DType dtype) {
  std::vector<std::byte> bytes;
  if (dtype == DType::f32) {
    bytes.resize(values.size() * sizeof(float));
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (is_half_dtype(dtype)) {
    bytes.resize(values.size() * sizeof(uint16_t));
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t half = dtype == DType::f16 ? f32_to_f16(values[i]) : bf16_bits(values[i]);
      std::memcpy(bytes.data() + i * sizeof(uint16_t), &half, sizeof(uint16_t));
    }
  } else {
    throw Error("cannot store floats as " + std::string(safetensors_dtype_name(dtype)) +
                ": choose F32, F16 or BF16");
  }
  return bytes;
}

}  // namespace mg::io
