#include "ir/half.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mg {

namespace {

// `value` rounded to nearest, ties to even, in a binary format of `significant_bits` (the
// implicit one included) whose steps shrink no finer than 2^`smallest_step_exponent` (its
// subnormals'); infinity from `overflow` on (past the largest finite value by half its last
// step); NaN and infinities kept.
double round_to_format(double value, int significant_bits, int smallest_step_exponent,
                       double overflow) {
  if (!std::isfinite(value)) return value;
  const double magnitude = std::fabs(value);
  if (magnitude >= overflow) return std::copysign(std::numeric_limits<double>::infinity(), value);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent - 1), 2^exponent)
  const double step =
      std::ldexp(1.0, std::max(exponent - significant_bits, smallest_step_exponent));
  return std::copysign(std::nearbyint(magnitude / step) * step, value);  // ties to even
}

}  // namespace

// 11 significant bits down to the smallest normal (2^-14), then the subnormals' fixed 2^-24;
// past the largest half (65504) by half its last step, infinity.
double round_to_f16(double value) {
  return round_to_format(value, 11, -24, 65520.0);
}

// 8 significant bits down to the smallest normal (2^-126), then the subnormals' fixed 2^-133;
// past the largest bfloat16, (2 - 2^-7) 2^127, by half its last step (2^120), infinity.
double round_to_bf16(double value) {
  return round_to_format(value, 8, -133, std::ldexp(255.5, 120));
}

double round_to_dtype(DType dtype, double value) {
  if (dtype == DType::f16) return round_to_f16(value);
  if (dtype == DType::bf16) return round_to_bf16(value);
  return value;
}

uint16_t f16_bits(double value) {
  if (std::isnan(value)) return 0x7E00;
  const double rounded = round_to_f16(value);
  const uint16_t sign = std::signbit(rounded) ? 0x8000 : 0;
  const double magnitude = std::fabs(rounded);
  if (std::isinf(magnitude)) return sign | 0x7C00;
  // Below 2^-14 the exponent field is 0 and the fraction counts steps of 2^-24.
  if (magnitude < std::ldexp(1.0, -14))
    return sign | static_cast<uint16_t>(std::ldexp(magnitude, 24));
  int exponent = 0;
  const double fraction = std::frexp(magnitude, &exponent);                  // in [0.5, 1)
  const auto significand = static_cast<uint16_t>(std::ldexp(fraction, 11));  // 1024 .. 2047
  return sign | static_cast<uint16_t>((exponent - 1 + 15) << 10) |
         static_cast<uint16_t>(significand - 1024);
}

float f16_value(uint16_t bits) {
  const float sign = (bits & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1F;
  const int fraction = bits & 0x3FF;
  if (exponent == 0x1F)
    return fraction ? std::numeric_limits<float>::quiet_NaN()
                    : sign * std::numeric_limits<float>::infinity();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(fraction), -24);
  return sign * std::ldexp(static_cast<float>(1024 + fraction), exponent - 25);
}

}  // namespace mg
