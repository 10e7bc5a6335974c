#pragma once
// The split-K rule of these kernels (split_k_rule.cpp).
#include <cstdint>

#include "backends/vulkan/kernels/lowering.hpp"
#include "target/target.hpp"

namespace mg::kernels {

// The K slices `product` runs fastest on with these kernels on `device` (1: whole), for a K of
// at least kMinKToSplit (ops/k_split.hpp).
int64_t gemm_k_splits(const target::GemmProduct& product, const DeviceTraits& device);

}  // namespace mg::kernels
