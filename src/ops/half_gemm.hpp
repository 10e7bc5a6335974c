#pragma once
// The f16 ops that passes write (ops/half_gemm.cpp): round_to_f16 (round_to_bf16 in bf16
// precision), widen_f16 (widen_bf16) and half_matmul, the operands and product of a matmul on
// workgroup-scope cooperative matrices (passes/workgroup_gemm.cpp), the conversions around f32
// kernels for f16 tensors (passes/half_storage.cpp) and around activations stored in 16 bits
// (passes/half_activations.cpp); sum_to_f16, the rounded sum of an f16 product's split-K partial
// results (passes/split_k.cpp).
#include <string_view>

#include "ir/half.hpp"
#include "ops/op.hpp"

namespace mg {

// Whether `op` is one of those: each reads and writes its f16 values as they are, so the f16
// storage pass leaves it as it is.
bool is_pass_written_f16_op(std::string_view op);

// The op that rounds f32 values into a tensor of 16-bit `format` (round_to_f16, round_to_bf16),
// and the one that widens them back (widen_f16, widen_bf16).
std::string_view rounding_op(DType format);
std::string_view widening_op(DType format);

}  // namespace mg
