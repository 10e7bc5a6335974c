#include "ops/op.hpp"

namespace mg {

void register_pool_ops(std::vector<OpDef>&) {}

}  // namespace mg
