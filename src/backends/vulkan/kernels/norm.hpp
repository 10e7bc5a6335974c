#pragma once
// Normalisations that evaluate neighbouring pointwise DAGs in their own launch (fusion.cpp): the
// DAG that computes their input (a residual add and the split-K sum before it, a gradient summed
// from two paths) and the DAG that is their result's only reader (the residual gradient added to
// a norm's input gradient), so that neither takes a launch, and a barrier, of its own.
#include <optional>
#include <string_view>

#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"

namespace mg::kernels {

// layer_norm, rms_norm, group_norm, batch_norm and their gradients.
bool is_norm_op(std::string_view op);

// The input that a normalisation's prologue computes: x for a norm, grad_out for a gradient.
size_t norm_prologue_input(const Node& node);

struct NormFusion {
  // The DAG whose result is input norm_prologue_input, evaluated wherever the kernel reads that
  // input; with prologue_written the kernel also writes the DAG's result (other nodes read it).
  std::optional<PointwiseDag> prologue;
  bool prologue_written = false;
  // The DAG that the norm's result feeds, evaluated as the kernel stores each element, its input
  // epilogue_input being the norm's result; the kernel writes the DAG's result instead.
  std::optional<PointwiseDag> epilogue;
  size_t epilogue_input = 0;
};

// Storage buffers that the launch of norm node `id` with `fusion` binds.
uint32_t norm_fusion_bindings(const Graph& graph, ValueId id, const NormFusion& fusion);

Launch norm_with_fusion(const Graph& graph, ValueId id, const NormFusion& fusion,
                        const DeviceTraits& device);

}  // namespace mg::kernels
