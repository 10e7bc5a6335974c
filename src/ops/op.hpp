#pragma once
// The op contract (DESIGN.md): every op family file under src/ops/ registers, per op, its shape
// inference, its f64 reference evaluation and its vector-Jacobian product written as graph
// construction. Lowering to kernels lives beside the kernel archetypes in
// src/backends/vulkan/kernels/ (one table entry per op), so that this layer stays free of device
// concerns.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/graph.hpp"
#include "ops/host_tensor.hpp"

namespace mg {

struct OpDef {
  std::string_view name;  // an op::* constant (ir/op_names.hpp)
  // Result type from the node's inputs and attributes (node.type is not yet set). Throws
  // mg::Error through op_error() when the inputs do not fit.
  std::function<TensorType(const Graph& graph, const Node& node)> infer;
  // f64 reference: inputs in node order, result of node.type's shape.
  std::function<HostTensor(const Node& node, const std::vector<const HostTensor*>& inputs)>
      reference;
  // Gradients with respect to each input given the gradient of the result, appended to the
  // graph; kNoValue for inputs that take none. Empty for ops that pass no gradient. The node
  // must be copied before appending (appending may move the node list).
  std::function<std::vector<ValueId>(Graph& graph, ValueId self, ValueId grad)> vjp;
};

// Ops whose result is a view of their first input's memory: no launch, shared storage.
bool is_view_op(std::string_view op);

// Throws mg::Error if `name` names no op.
const OpDef& op_def(std::string_view name);
const OpDef* find_op(std::string_view name);
std::vector<std::string> op_names();

// Throws mg::Error "<op>(<input types>) {attrs}: <problem>".
[[noreturn]] void op_error(const Graph& graph, const Node& node, const std::string& problem);

// Normalises a possibly negative axis against `rank`; throws through op_error when out of range.
int64_t normalize_axis(const Graph& graph, const Node& node, int64_t axis, int64_t rank);

// Sums `grad` over the broadcast axes so that it takes `target` shape (VJP of broadcasting).
ValueId reduce_to_shape(Graph& graph, ValueId grad, const Shape& target);

// One registration function per op family file.
using OpRegistrar = void (*)(std::vector<OpDef>& registry);
void register_leaf_ops(std::vector<OpDef>& registry);
void register_elementwise_ops(std::vector<OpDef>& registry);
void register_matmul_ops(std::vector<OpDef>& registry);
void register_reduce_ops(std::vector<OpDef>& registry);
void register_shape_ops(std::vector<OpDef>& registry);
void register_conv_ops(std::vector<OpDef>& registry);
void register_winograd_ops(std::vector<OpDef>& registry);
void register_half_gemm_ops(std::vector<OpDef>& registry);
void register_pool_ops(std::vector<OpDef>& registry);
void register_norm_ops(std::vector<OpDef>& registry);
void register_attention_ops(std::vector<OpDef>& registry);
void register_loss_ops(std::vector<OpDef>& registry);

}  // namespace mg
