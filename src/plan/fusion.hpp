#pragma once
// Greedy pointwise fusion: an elementwise node whose only consumer is an elementwise node of the
// same shape is computed inside that consumer's kernel instead of in its own dispatch. Chains
// such as the optimizer update (a dozen elementwise ops per parameter) become one kernel.
#include <vector>

#include "kernels/lowering.hpp"

namespace mg::plan {

// Launches for every non-leaf, non-view node in order; fused producers emit nothing.
// MEGANEURA_NO_FUSION=1 turns fusion off.
// `fused_away` receives how many dispatches fusion saved.
std::vector<kernels::Launch> lower_graph(const Graph& graph, const kernels::DeviceTraits& device,
                                         size_t* fused_away = nullptr);

}  // namespace mg::plan
