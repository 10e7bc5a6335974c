#pragma once
// IEEE 754 binary16 (f16) on the host: the rounding every f16 value of a graph goes through (the
// reference interpreter rounds f16-typed results, the runtime rounds what it uploads into f16
// tensors) and the bit patterns the device stores; and bfloat16's bit patterns (weight files,
// kernels rewritten for bfloat16 operands).
#include <bit>
#include <cstdint>

#include "meganeura/types.hpp"

namespace mg {

// `value` rounded to the nearest f16 (ties to even; infinity past the largest finite half, NaN
// kept).
double round_to_f16(double value);

// The f16 bit pattern of `value` rounded as round_to_f16 does (any NaN becomes a quiet NaN).
uint16_t f16_bits(double value);

// The value an f16 bit pattern holds.
float f16_value(uint16_t bits);

// `value` rounded to the nearest bfloat16 (8 significant bits, f32's exponent range; ties to
// even; infinity past the largest finite bfloat16, NaN kept).
double round_to_bf16(double value);

// `value` as a tensor of `dtype` holds it: rounded by round_to_f16 or round_to_bf16 for the
// 16-bit formats, as it is otherwise.
double round_to_dtype(DType dtype, double value);

// The bfloat16 bit pattern of `value`: rounded to nearest, ties to even (infinity past the
// largest finite bfloat16); a NaN stays a quiet NaN. Inline, for layers that do not link the IR
// (weight files).
inline uint16_t bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // Truncating a NaN could leave an all-zero fraction, which would read as infinity.
  if (value != value) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  // Adding just under half of the dropped range, plus the kept lowest bit, rounds to nearest with
  // ties to even; a carry into the exponent is the correct next value (infinity past the top).
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace mg
