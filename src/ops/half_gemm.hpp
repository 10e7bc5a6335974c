#pragma once
// The f16 ops that passes write (ops/half_gemm.cpp): round_to_f16, widen_f16 and half_matmul,
// the operands and product of a matmul on workgroup-scope cooperative matrices
// (passes/workgroup_gemm.cpp) and the conversions around f32 kernels for f16 tensors
// (passes/f16_storage.cpp).
#include "ir/half.hpp"
#include "ops/op.hpp"
