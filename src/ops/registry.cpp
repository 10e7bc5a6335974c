#include <algorithm>
#include <unordered_map>

#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg {
namespace {

struct Registry {
  std::vector<OpDef> ops;
  std::unordered_map<std::string_view, size_t> by_name;

  Registry() {
    for (OpRegistrar family :
         {register_leaf_ops, register_elementwise_ops, register_matmul_ops, register_reduce_ops,
          register_shape_ops, register_conv_ops, register_winograd_ops, register_half_gemm_ops,
          register_pool_ops, register_norm_ops, register_attention_ops, register_loss_ops}) {
      family(ops);
    }
    for (size_t i = 0; i < ops.size(); ++i) by_name.emplace(ops[i].name, i);
  }
};

const Registry& registry() {
  static const Registry instance;
  return instance;
}

}  // namespace

const OpDef* find_op(std::string_view name) {
  const Registry& reg = registry();
  auto it = reg.by_name.find(name);
  return it == reg.by_name.end() ? nullptr : &reg.ops[it->second];
}

const OpDef& op_def(std::string_view name) {
  if (const OpDef* def = find_op(name)) return *def;
  throw Error("unknown op '" + std::string(name) + "' (`meganeura inspect --ops` lists them)");
}

bool is_view_op(std::string_view op) {
  return op == op::reshape || op == op::stop_gradient;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpDef& def : registry().ops) names.emplace_back(def.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace mg
