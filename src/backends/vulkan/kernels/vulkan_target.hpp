#pragma once
// The Vulkan backend's target (target::Target): its kernels' selection rules and its lowering,
// for a device described by DeviceTraits (the runtime fills them from the device it opened:
// backends/vulkan/runtime/device_target.hpp; tests describe devices they do not have).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"
#include "target/target.hpp"

namespace mg::vulkan {

class VulkanTarget final : public target::Target {
 public:
  explicit VulkanTarget(target::DeviceTraits traits) : Target(std::move(traits)) {}

  bool cooperative_matrices() const override;
  bool is_pointwise_op(std::string_view op) const override;
  bool workgroup_gemm_suits(int64_t m, int64_t n, int64_t k,
                            target::OperandsIn operands) const override;
  bool workgroup_gemm_takes_f16_product(const Graph& graph, const Node& node) const override;
  bool workgroup_gemm_writes_half_result(const Graph& graph, const Node& node) const override;
  bool product_takes_epilogue(const Graph& graph, const Node& node) const override;
  bool subgroup_gemm_takes_product(int64_t m, int64_t n, int64_t k,
                                   bool b_transposed) const override;
  bool images_side_by_side_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const override;
  bool half_columns_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const override;
  bool half_images_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const override;
  int64_t gemm_k_splits(const target::GemmProduct& product) const override;
  int64_t attention_head_multiple() const override;
  bool attention_gradient_scales_itself(const Graph& graph, const Node& node) const override;
  bool direct_weight_gradient_suits(const ConvGeometry& g) const override;
  int64_t direct_weight_gradient_splits(const ConvGeometry& g) const override;
  bool winograd_weight_gradient_suits(const ConvGeometry& g) const override;
  int64_t winograd_weight_gradient_outputs(const ConvGeometry& g) const override;
  bool winograd_convolution_suits(const ConvGeometry& g, bool data_gradient) const override;
  std::vector<target::Launch> lower(const Graph& graph,
                                    size_t* fused_away = nullptr) const override;
};

// A launch's GLSL and compile options, behind target::Launch::code.
struct GlslKernel final : target::KernelCode {
  explicit GlslKernel(kernels::Launch launch) : launch(std::move(launch)) {}
  kernels::Launch launch;
};

// The GLSL launch of a launch that VulkanTarget::lower made; throws mg::Error for any other.
const kernels::Launch& glsl_launch(const target::Launch& launch);

}  // namespace mg::vulkan
