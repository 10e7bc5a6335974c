#pragma once
// Greedy pointwise fusion: an elementwise node whose only consumer is an elementwise node of the
// same shape is computed inside that consumer's kernel instead of in its own dispatch. Chains
// such as the optimizer update (a dozen elementwise ops per parameter) become one kernel. A value
// that is kept or read by several nodes can join its first consumer's kernel, which writes it as
// an extra output for the rest.
// Matmul epilogues: a matmul whose only consumer is elementwise of its shape runs that
// consumer's fused chain (bias, activation, residual add) in the GEMM's store. Reduction
// prologues: a sum or mean evaluates the elementwise chain that only it reads as it reads it. Some
// values are written by another node's launch beside its own result (kernels::is_companion_op): the
// attention forward writes the log-sum-exp its backward needs, dK's launch can write dV, and
// a Winograd weight gradient's input tiles launch writes its grad_out tiles. A scatter_add's
// target that only the scatter reads is written by its own launches straight into the scatter's
// result (a tied embedding's gradient scattered into the output projection's).
#include <vector>

#include "backends/vulkan/kernels/lowering.hpp"

namespace mg::kernels {

// Launches for every non-leaf, non-view node in order; fused producers emit nothing (the
// lowering of VulkanTarget::lower). MEGANEURA_NO_FUSION=1 turns all fusion off (companions
// included), MEGANEURA_NO_EPILOGUE_FUSION=1 only the matmul epilogues, MEGANEURA_NO_NORM_FUSION=1
// only the normalisations' prologues and epilogues. `fused_away` receives how many dispatches
// fusion saved.
std::vector<Launch> lower_graph(const Graph& graph, const DeviceTraits& device,
                                size_t* fused_away = nullptr);

}  // namespace mg::kernels
