#pragma once
// The direct weight gradient of small stride-1 convolutions (conv_weight_grad.comp): every tap
// from one image tile in shared memory, instead of im2col columns (KH * KW copies of the image
// written and read back) and a GEMM over them. Also the rules for Winograd's F(2 x 2, 3 x 3)
// (ops/winograd.hpp), which the im2col pass asks before the columns.
#include <cstdint>

#include "backends/vulkan/kernels/lowering.hpp"
#include "ops/conv_geometry.hpp"

namespace mg::kernels {

// Whether conv2d_grad_weight over geometry `g` runs on the direct kernel on `device`: stride 1,
// no dilation or groups, at most 3 x 3 taps, at least 64 input and output channels (the
// kernel's tile on each side), workgroups (channel tiles x kernel rows x splits) for at least
// 70 % of the compute units, strict precision on a GPU (CPU devices run their own GEMM, the
// fast path its f16 one). MEGANEURA_DIRECT_WEIGHT_GRAD=0 turns it off (the im2col or
// implicit-GEMM route then runs), =1 drops the channel and occupancy minimums (tests).
bool direct_weight_gradient_suits(const ConvGeometry& g, const DeviceTraits& device);

// Its K splits, planned for the device's compute units: one workgroup a unit, each over an
// equal share of the chunks of output rows (at least 4 chunks) for one kernel row.
int64_t direct_weight_gradient_splits(const ConvGeometry& g, const DeviceTraits& device);

// Whether conv2d_grad_weight over geometry `g` runs as Winograd F(2 x 2, 3 x 3) on `device`
// (ops/winograd.hpp; the im2col pass writes it, before the direct kernel's rule): 3 x 3 taps,
// stride 1, no dilation or groups, a GPU (not a CPU device), at least 128 tiles of 2 x 2
// outputs, and at least 128 channels a side, or 64 where the direct kernel does not suit (as in
// fast precision, where the tile products run on cooperative matrices).
// MEGANEURA_WINOGRAD_WEIGHT_GRAD=0 turns it off, =1 drops the size minimums (tests, sweeps).
bool winograd_weight_gradient_suits(const ConvGeometry& g, const DeviceTraits& device);

// The tile side m of the Winograd weight gradient F(m x m, 3 x 3) over geometry `g`, where it
// runs (winograd_weight_gradient_suits): 4 for strict f32 products from 128 channels a side
// with at least 128 tiles of 4 x 4 outputs, else 2 (always in fast precision: with f16
// transformed tiles F(4 x 4)'s error passes the fast path's bound, bench/winograd_f16_error.py).
// MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE=2/4 forces one.
int64_t winograd_weight_gradient_outputs(const ConvGeometry& g, const DeviceTraits& device);

// Whether conv2d over geometry `g` (or, with `data_gradient`, its conv2d_grad_input) runs as
// Winograd F(2 x 2, 3 x 3) on `device` (ops/winograd.hpp; the im2col pass writes it): 3 x 3
// taps, stride 1, no dilation or groups (a data gradient also padding of at most 2), a GPU,
// at least 64 channels a side and 64 tiles of 2 x 2 outputs. MEGANEURA_WINOGRAD_CONV=0 turns
// it off (the columns or the implicit GEMM then run), =1 drops the size minimums.
bool winograd_convolution_suits(const ConvGeometry& g, bool data_gradient,
                                const DeviceTraits& device);

void emit_direct_weight_gradient(LoweringContext& context, const ConvGeometry& g, int64_t k_splits);

}  // namespace mg::kernels
