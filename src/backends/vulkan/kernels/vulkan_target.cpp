#include "backends/vulkan/kernels/vulkan_target.hpp"

#include "backends/vulkan/kernels/conv_weight_grad.hpp"
#include "backends/vulkan/kernels/fusion.hpp"
#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/gemm_workgroup.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "backends/vulkan/kernels/split_k_rule.hpp"

namespace mg::vulkan {

bool VulkanTarget::cooperative_matrices() const {
  return kernels::use_coop_gemm(traits());
}

bool VulkanTarget::is_pointwise_op(std::string_view op) const {
  return kernels::is_pointwise_op(op);
}

bool VulkanTarget::workgroup_gemm_suits(int64_t m, int64_t n, int64_t k,
                                        target::OperandsIn operands) const {
  return kernels::workgroup_gemm_suits(m, n, k, traits(), operands);
}

bool VulkanTarget::workgroup_gemm_takes_f16_product(const Graph& graph, const Node& node) const {
  return kernels::workgroup_gemm_takes_f16_product(graph, node, traits());
}

bool VulkanTarget::workgroup_gemm_writes_half_result(const Graph& graph, const Node& node) const {
  return kernels::workgroup_gemm_writes_half_result(graph, node, traits());
}

bool VulkanTarget::product_takes_epilogue(const Graph& graph, const Node& node) const {
  return kernels::stores_f32_product(graph, node, traits());
}

bool VulkanTarget::subgroup_gemm_takes_product(int64_t m, int64_t n, int64_t k,
                                               bool b_transposed) const {
  return kernels::use_coop_gemm(traits()) &&
         kernels::coop_gemm_suits(m, m * n * k, k, b_transposed, traits()) &&
         !kernels::workgroup_gemm_suits(m, n, k, traits(), target::OperandsIn::f32);
}

bool VulkanTarget::images_side_by_side_suit(int64_t m, int64_t k, int64_t batch,
                                            int64_t plane) const {
  return kernels::images_side_by_side_suit(m, k, batch, plane, traits());
}

bool VulkanTarget::half_columns_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const {
  return kernels::half_columns_suit(m, k, batch, plane, traits());
}

bool VulkanTarget::half_images_suit(int64_t m, int64_t k, int64_t batch, int64_t plane) const {
  return kernels::half_images_suit(m, k, batch, plane, traits());
}

int64_t VulkanTarget::gemm_k_splits(const target::GemmProduct& product) const {
  return kernels::gemm_k_splits(product, traits());
}

int64_t VulkanTarget::attention_head_multiple() const {
  return kernels::attention_head_multiple(traits());
}

bool VulkanTarget::attention_gradient_scales_itself(const Graph& graph, const Node& node) const {
  return kernels::attention_gradient_scales_itself(graph, node, traits());
}

bool VulkanTarget::direct_weight_gradient_suits(const ConvGeometry& g) const {
  return kernels::direct_weight_gradient_suits(g, traits());
}

int64_t VulkanTarget::direct_weight_gradient_splits(const ConvGeometry& g) const {
  return kernels::direct_weight_gradient_splits(g, traits());
}

bool VulkanTarget::winograd_weight_gradient_suits(const ConvGeometry& g) const {
  return kernels::winograd_weight_gradient_suits(g, traits());
}

int64_t VulkanTarget::winograd_weight_gradient_outputs(const ConvGeometry& g) const {
  return kernels::winograd_weight_gradient_outputs(g, traits());
}

bool VulkanTarget::winograd_convolution_suits(const ConvGeometry& g, bool data_gradient) const {
  return kernels::winograd_convolution_suits(g, data_gradient, traits());
}

std::vector<target::Launch> VulkanTarget::lower(const Graph& graph, size_t* fused_away) const {
  std::vector<target::Launch> launches;
  for (kernels::Launch& launch : kernels::lower_graph(graph, traits(), fused_away)) {
    target::Launch planned{.label = launch.label,
                           .kernel = launch.kernel,
                           .operands = launch.operands,
                           .groups = launch.groups};
    planned.code = std::make_shared<const GlslKernel>(std::move(launch));
    launches.push_back(std::move(planned));
  }
  return launches;
}

const kernels::Launch& glsl_launch(const target::Launch& launch) {
  const auto* glsl = dynamic_cast<const GlslKernel*>(launch.code.get());
  if (glsl == nullptr) throw Error("internal: " + launch.label + " was not lowered to GLSL");
  return glsl->launch;
}

}  // namespace mg::vulkan
