#include "backends/vulkan/kernels/conv_weight_grad.hpp"

#include <algorithm>
#include <string>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "ops/k_split.hpp"
#include "ops/winograd.hpp"

namespace mg::kernels {
namespace {

// The kernel's tile of output and input channels (TILE_O, TILE_C in conv_weight_grad.comp).
constexpr int64_t kChannelTile = 64;
constexpr int64_t kThreads = 256;
// A workgroup takes one kernel row: its thread holds 16 accumulators a column of the row.
constexpr int64_t kMostKernelExtent = 3;
// Output columns a chunk covers at most: wider chunks ran no faster, much narrower ones slower.
constexpr int64_t kMostChunkColumns = 16;
constexpr int64_t kMinChunksPerSplit = 4;
// Workgroups planned a compute unit: one wave of workgroups, one a unit, ran faster than fewer
// or more. Two 256-thread workgroups of the kernel fit a unit, but twice the splits (and partial
// gradients) still ran slower.
constexpr int64_t kWorkgroupsPerUnit = 1;
// The Winograd weight gradient's product runs over the tiles of 2 x 2 outputs: with fewer than
// this its GEMM's K is too short to pay for the transforms.
constexpr int64_t kMinWinogradTiles = 128;
// F(4 x 4, 3 x 3) for the strict weight gradient from this many channels a side (and
// kMinWinogradTiles of its 4 x 4 tiles): faster than F(2 x 2) for U-Net's 320 channels and
// ResNet's 128, slower for ResNet's 256 at 14 x 14 (64 tiles of 4 x 4), a product too short in
// K.
constexpr int64_t kMinWinograd4Channels = 128;
// The Winograd forward's and data gradient's products run over the channels, the tiles being
// their columns: ResNet's 512 channels at 7 x 7 (64 tiles at batch 4) still run faster than the
// columns; fewer are unmeasured.
constexpr int64_t kMinWinogradConvolutionTiles = 64;

// Shared memory of the kernel over chunks of `columns` output columns: two slots of both tiles
// (rows of TILE + 4 floats) and the staging of a quarter of the results.
int64_t shared_bytes(int64_t columns, const ConvGeometry& g) {
  constexpr int64_t kRowBytes = (kChannelTile + 4) * 4;
  const int64_t image_columns = columns + g.kernel_width - 1;
  const int64_t staging_bytes = kChannelTile / 4 * kChannelTile * g.kernel_width * 4;
  return 2 * (columns + image_columns) * kRowBytes + staging_bytes;
}

// Output columns per chunk: rows split into equal chunks of at most kMostChunkColumns (fewer
// where shared memory is short), so that a 56-wide row takes 4 chunks of 14 and a 20-wide one 2
// of 10, with no padding columns; 0 when not even one column fits.
int64_t chunk_columns(const ConvGeometry& g, const DeviceTraits& device) {
  for (int64_t most = kMostChunkColumns; most >= 1; --most) {
    const int64_t columns = ceil_div(g.out_width, ceil_div(g.out_width, most));
    if (shared_bytes(columns, g) <= device.max_shared_memory_bytes) return columns;
  }
  return 0;
}

// Adjacent channels one fetch unit of a tile `columns` wide loads (GRAD_GROUP / IMAGE_GROUP in
// conv_weight_grad.comp): 4, one vec4 store, where at least 7 / 8 of the threads then have a unit,
// else 1.
int64_t fetch_group(int64_t columns) {
  return 8 * (kChannelTile / 4) * columns >= 7 * kThreads ? 4 : 1;
}

int64_t chunk_count(const ConvGeometry& g, const DeviceTraits& device) {
  return g.batch * g.out_height * ceil_div(g.out_width, chunk_columns(g, device));
}

int64_t workgroups_per_split(const ConvGeometry& g) {
  return ceil_div(g.out_channels, kChannelTile) * ceil_div(g.in_channels, kChannelTile) *
         g.kernel_height;
}

// What F(2 x 2, 3 x 3) computes, on a device whose kernels it has: 3 x 3 taps, stride 1, no
// dilation or groups, a GPU (CPU devices run their own GEMM).
bool winograd_geometry(const ConvGeometry& g, const DeviceTraits& device) {
  return !use_cpu_kernels(device) && g.groups == 1 && g.stride == std::array<int64_t, 2>{1, 1} &&
         g.dilation == std::array<int64_t, 2>{1, 1} && g.kernel_height == winograd::kKernel &&
         g.kernel_width == winograd::kKernel;
}

}  // namespace

bool direct_weight_gradient_suits(const ConvGeometry& g, const DeviceTraits& device) {
  const std::optional<bool> forced = device.switches.direct_weight_grad;
  if (forced == false) return false;
  const bool forced_on = forced == true;
  // With cooperative matrices (fast precision) the columns' f16 GEMM runs as fast and stays, as
  // for the other fast convolutions.
  if (use_cpu_kernels(device) || use_coop_gemm(device) ||
      device.max_workgroup_invocations < kThreads)
    return false;
  if (g.groups != 1 || g.stride != std::array<int64_t, 2>{1, 1} ||
      g.dilation != std::array<int64_t, 2>{1, 1} || g.kernel_height * g.kernel_width < 2 ||
      g.kernel_height > kMostKernelExtent || g.kernel_width > kMostKernelExtent ||
      chunk_columns(g, device) == 0)
    return false;
  if (forced_on) return true;
  // Every ResNet stage runs faster than on the columns where its workgroups nearly fill the
  // compute units; a layer whose channel tiles and splits leave more than 30 % of the units idle
  // (U-Net's 320 channels at 32 x 32, batch 2: 75 workgroups walking 128 chunks each) keeps the
  // columns' GEMM, which split-K spreads.
  const int64_t workgroups = workgroups_per_split(g) * direct_weight_gradient_splits(g, device);
  return g.in_channels >= kChannelTile && g.out_channels >= kChannelTile &&
         10 * workgroups >= 7 * device.compute_units;
}

bool winograd_weight_gradient_suits(const ConvGeometry& g, const DeviceTraits& device) {
  const std::optional<bool> forced = device.switches.winograd_weight_grad;
  if (forced == false || !winograd_geometry(g, device)) return false;
  if (forced == true) return true;
  // Winograd beats the direct kernel from 128 channels a side (ResNet's 128 and 256, U-Net's 320,
  // which the columns run otherwise); the direct kernel is level with it at 64 channels and ahead
  // over the 64 tiles of 512 channels at 7 x 7, a product too short in K. In fast precision,
  // where the 16 products run on cooperative matrices and the direct kernel does not, it beats
  // the columns' f16 GEMM from 64 channels.
  const int64_t tiles = winograd::kF2.tile_count(g.batch, g.out_height, g.out_width);
  const int64_t channels = std::min(g.in_channels, g.out_channels);
  if (channels < kChannelTile || tiles < kMinWinogradTiles) return false;
  return channels >= 2 * kChannelTile || !direct_weight_gradient_suits(g, device);
}

int64_t winograd_weight_gradient_outputs(const ConvGeometry& g, const DeviceTraits& device) {
  if (const std::optional<int64_t> forced = device.switches.winograd_weight_grad_tile)
    return *forced;
  // F(4 x 4)'s transforms scale a tile by up to 100 (input) and 225 (grad_out) before the
  // products, which in fast precision read them as f16: its range and rounding would show there.
  if (use_coop_gemm(device)) return 2;
  const int64_t channels = std::min(g.in_channels, g.out_channels);
  return channels >= kMinWinograd4Channels &&
                 winograd::kF4.tile_count(g.batch, g.out_height, g.out_width) >= kMinWinogradTiles
             ? 4
             : 2;
}

bool winograd_convolution_suits(const ConvGeometry& g, bool data_gradient,
                                const DeviceTraits& device) {
  const std::optional<bool> forced = device.switches.winograd_conv;
  if (forced == false || !winograd_geometry(g, device)) return false;
  // The data gradient pads grad_out by 2 - P.
  if (data_gradient && (g.padding[0] > 2 || g.padding[1] > 2)) return false;
  if (forced == true) return true;
  // Every ResNet-50 3x3 stage and U-Net's 320 channels run faster so than on the columns,
  // forward and data gradient, strict and fast. Fewer than 64 channels are unmeasured.
  const int64_t tiles = data_gradient
                            ? winograd::kF2.tile_count(g.batch, g.in_height, g.in_width)
                            : winograd::kF2.tile_count(g.batch, g.out_height, g.out_width);
  return std::min(g.in_channels, g.out_channels) >= kChannelTile &&
         tiles >= kMinWinogradConvolutionTiles;
}

int64_t direct_weight_gradient_splits(const ConvGeometry& g, const DeviceTraits& device) {
  const int64_t most = std::max<int64_t>(1, chunk_count(g, device) / kMinChunksPerSplit);
  return std::clamp<int64_t>(kWorkgroupsPerUnit * device.compute_units / workgroups_per_split(g), 1,
                             most);
}

void emit_direct_weight_gradient(LoweringContext& context, const ConvGeometry& g,
                                 int64_t k_splits) {
  const Node& node = context.node();
  const int64_t columns = chunk_columns(g, context.device());
  Launch launch;
  launch.label = context.label();
  launch.kernel = "conv_weight_grad";
  launch.files = {kernel_source("conv_weight_grad.comp")};
  launch.defines = {{"BATCH", glsl_uint(g.batch)},
                    {"C", glsl_uint(g.in_channels)},
                    {"O", glsl_uint(g.out_channels)},
                    {"H", glsl_uint(g.in_height)},
                    {"W", glsl_uint(g.in_width)},
                    {"OH", glsl_uint(g.out_height)},
                    {"OW", glsl_uint(g.out_width)},
                    {"KH", glsl_uint(g.kernel_height)},
                    {"KW", glsl_uint(g.kernel_width)},
                    {"PAD_H", std::to_string(g.padding[0])},
                    {"PAD_W", std::to_string(g.padding[1])},
                    {"XT", glsl_uint(columns)},
                    {"GRAD_GROUP", std::to_string(fetch_group(columns))},
                    {"IMAGE_GROUP", std::to_string(fetch_group(columns + g.kernel_width - 1))},
                    {"K_SPLITS", glsl_uint(k_splits)}};
  launch.operands = {{"image", node.inputs[0], false},
                     {"grad_out", node.inputs[1], false},
                     {"grad_weight", context.id(), true}};
  launch.groups = tiled_grid(launch.label, g.in_channels, kChannelTile, g.out_channels,
                             kChannelTile, k_splits * g.kernel_height, context.device());
  context.emit(std::move(launch));
}

}  // namespace mg::kernels
