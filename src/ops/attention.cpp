#include "ops/op.hpp"

namespace mg {

void register_attention_ops(std::vector<OpDef>&) {}

}  // namespace mg
