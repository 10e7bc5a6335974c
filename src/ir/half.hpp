#pragma once
// IEEE 754 binary16 (f16) on the host: the rounding every f16 value of a graph goes through (the
// reference interpreter rounds f16-typed results, the runtime rounds what it uploads into f16
// tensors) and the bit patterns the device stores.
#include <cstdint>

namespace mg {

// `value` rounded to the nearest f16 (ties to even; infinity past the largest finite half, NaN
// kept).
double round_to_f16(double value);

// The f16 bit pattern of `value` rounded as round_to_f16 does (any NaN becomes a quiet NaN).
uint16_t f16_bits(double value);

// The value an f16 bit pattern holds.
float f16_value(uint16_t bits);

}  // namespace mg
