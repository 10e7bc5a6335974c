#pragma once
// Tensor values between the host (float, double or int32 spans) and the bytes a device stores
// for a dtype: what Session writes into staging and reads back from it.
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "ir/half.hpp"
#include "meganeura/types.hpp"

namespace mg {

// Writes `values` to `bytes` as the device stores a tensor of `dtype`: f32 as they are, f16 and
// bf16 rounded to the nearest f16 and bfloat16 (ties to even), i32 and u32 truncated toward zero.
// `bytes` holds values.size() * dtype_bytes(dtype) bytes (a run slot's staging, where set_input
// writes without allocating).
template <typename Value>
void store_device_values(DType dtype, std::span<const Value> values, std::byte* bytes) {
  const size_t width = dtype_bytes(dtype);
  const auto store = [&](size_t i, auto element) {
    std::memcpy(bytes + i * width, &element, sizeof(element));
  };
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32:
        store(i, static_cast<float>(values[i]));
        break;
      case DType::f16:
        store(i, f16_bits(static_cast<double>(values[i])));
        break;
      case DType::i32:
        store(i, static_cast<int32_t>(values[i]));
        break;
      case DType::u32:
        store(i, static_cast<uint32_t>(values[i]));
        break;
      case DType::bf16:
        // Rounded from the value itself (a double), so that no f32 rounding comes first.
        store(i, bf16_bits(static_cast<float>(round_to_bf16(static_cast<double>(values[i])))));
        break;
    }
  }
}

template <typename Value>
std::vector<std::byte> device_bytes(DType dtype, std::span<const Value> values) {
  std::vector<std::byte> bytes(values.size() * dtype_bytes(dtype));
  store_device_values(dtype, values, bytes.data());
  return bytes;
}

// The values of `count` elements of `dtype` as the device stored them.
std::vector<float> host_values(DType dtype, const std::byte* data, size_t count);

}  // namespace mg
