#pragma once
// round_to_f16 and half_matmul (ops/half_gemm.cpp): the f16 operands and f32 product of a matmul
// on workgroup-scope cooperative matrices (passes/workgroup_gemm.cpp).
#include "ops/op.hpp"

namespace mg {

// `value` rounded to the nearest f16 (ties to even; infinity past the largest finite half).
double round_to_f16(double value);

}  // namespace mg
