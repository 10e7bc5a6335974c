#pragma once
// Conversions between stored tensor bytes and floats: what model builders read out of weight
// files and what save_model_folder writes into them.
#include <cstddef>
#include <span>
#include <vector>

#include "io/safetensors.hpp"

namespace mg::io {

// The values of a stored tensor as floats, in row-major order. F32 is copied; F16 and BF16 widen
// exactly; F64 rounds to the nearest f32. Integer and BOOL tensors (e.g. torchvision's I64
// num_batches_tracked) convert exactly: a value f32 cannot hold (beyond +-2^24) or a BOOL byte
// other than 0 or 1 throws mg::Error naming the tensor, as does a byte count that does not match
// the shape.
std::vector<float> tensor_as_f32(const TensorView& view);

// `values` stored as `dtype`: f32 as is, f16 and bf16 rounded to nearest, ties to even (overflow
// gives infinity, NaN stays a quiet NaN). Throws mg::Error for other dtypes.
std::vector<std::byte> f32_to_bytes(std::span<const float> values, DType dtype);

}  // namespace mg::io
