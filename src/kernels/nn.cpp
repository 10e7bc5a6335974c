// Neural-network archetypes that are not plain pointwise, layout, reduction or GEMM kernels:
// convolution, pooling, normalisation, attention, losses. Filled in per op family.
#include "kernels/lowering.hpp"

namespace mg::kernels {

std::vector<LoweringEntry> nn_lowerings() {
  return {};
}

}  // namespace mg::kernels
