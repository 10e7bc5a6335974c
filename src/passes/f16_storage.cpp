// The f16 storage pass (passes.hpp): f16 tensors are stored in f16 and computed in f32. The f32
// kernels read widen_f16 of each f16 input and their f16 results are written as round_to_f16 of
// the f32 result, which is what the reference interpreter computes (every f16 value rounded to
// f16); a transpose and im2col move f16 values as they are, and Winograd's tile and output
// transforms convert as they read and store. A 2-D matmul of f16 operands into an
// f16 result that runs on cooperative matrices multiplies the f16 values directly (half_matmul with
// f16_result), as PyTorch's f16 GEMM does.
#include <algorithm>
#include <unordered_map>

#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "ops/half_gemm.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

bool involves_f16(const Graph& graph, const Node& node) {
  if (node.type.dtype == DType::f16) return true;
  for (ValueId input : node.inputs)
    if (graph.type(input).dtype == DType::f16) return true;
  return false;
}

class F16Storage {
 public:
  explicit F16Storage(const target::Target& device) : device_(device) {}

  ValueId rewrite(Graph& target, Node node) {
    // A transpose and im2col move their f16 values as they are, in half the bytes of f32 ones;
    // Winograd's tile and output transforms widen f16 values as they read them and round their
    // f16 results as they store them.
    if (node.is_leaf() || is_view_op(node.op) || !involves_f16(target, node) ||
        is_pass_written_f16_op(node.op) || node.op == op::transpose || node.op == op::im2col ||
        node.op == op::winograd_tiles || node.op == op::winograd_grad_tiles ||
        node.op == op::winograd_output)
      return target.add_typed(std::move(node));
    if (node.op == op::cast) return cast(target, node);
    if (const ValueId product = half_product(target, node); product != kNoValue) return product;
    // A pointwise op widens its f16 inputs itself, fused into its kernel: a widening of its own
    // for each of them. One widening shared with other readers would be a launch of its own
    // that writes the value again in f32.
    const bool pointwise = device_.is_pointwise_op(node.op);
    std::unordered_map<ValueId, ValueId> own_widening;
    std::vector<ValueId> inputs;
    for (ValueId input : node.inputs) {
      const bool in_memory =
          target.type(input).dtype == DType::f16 && target.node(input).op != op::constant;
      if (!pointwise || !in_memory) {
        inputs.push_back(as_f32(target, input));
        continue;
      }
      auto [it, inserted] = own_widening.try_emplace(input, kNoValue);
      if (inserted) it->second = target.add(op::widen_f16, {input});
      inputs.push_back(it->second);
    }
    const ValueId computed = target.add(node.op, std::move(inputs), node.attrs);
    return node.type.dtype == DType::f16 ? target.add(op::round_to_f16, {computed}) : computed;
  }

 private:
  // `value` in f32: widened once however many kernels other than pointwise ones read it; an f16
  // constant becomes the f32 constant of its (already rounded) values, which needs no launch.
  ValueId as_f32(Graph& target, ValueId value) {
    if (target.type(value).dtype != DType::f16) return value;
    auto [it, inserted] = widened_.try_emplace(value, kNoValue);
    if (!inserted) return it->second;
    const Node& node = target.node(value);
    const TensorType type{DType::f32, node.type.shape};
    if (node.op == op::constant && node.is_uniform_constant()) {
      it->second = target.constant(round_to_f16(node.attrs.get_float("value")), type);
    } else if (node.op == op::constant) {
      std::vector<double> values = *node.data;
      for (double& element : values) element = round_to_f16(element);
      it->second = target.constant(std::move(values), type);
    } else {
      it->second = target.add(op::widen_f16, {value});
    }
    return it->second;
  }

  ValueId cast(Graph& target, const Node& node) {
    const ValueId source = node.inputs[0];
    const DType from = target.type(source).dtype, to = node.type.dtype;
    if (from == to) return source;
    if (from == DType::f16) {
      const ValueId widened = as_f32(target, source);
      return to == DType::f32 ? widened : target.add(op::cast, {widened}, node.attrs);
    }
    const ValueId wide =
        from == DType::f32
            ? source
            : target.add(op::cast, {source}, {{"dtype", std::string(dtype_name(DType::f32))}});
    return target.add(op::round_to_f16, {wide});
  }

  // A product of f16 matrices into an f16 result on cooperative matrices (the workgroup GEMM,
  // else the subgroup-scope one, which read f16 operands and store f16 results), or kNoValue
  // where the node is not such a product or the session runs no cooperative-matrix GEMM.
  ValueId half_product(Graph& target, const Node& node) {
    if (node.op != op::matmul || node.attrs.has("k_splits") || node.type.rank() != 2 ||
        node.type.dtype != DType::f16)
      return kNoValue;
    if (target.type(node.inputs[0]).rank() != 2 || target.type(node.inputs[1]).rank() != 2)
      return kNoValue;
    const bool on_workgroups = device_.workgroup_gemm_takes_f16_product(target, node);
    // The subgroup GEMM's size rule (coop_gemm_suits) sends small f32 products to gemm.comp;
    // f16 ones would pay two widenings and a rounding there, more than the product itself, so
    // they all stay on cooperative matrices.
    if (!on_workgroups && !device_.cooperative_matrices()) return kNoValue;
    Attrs attrs = node.attrs;
    attrs.set("f16_result", int64_t{1});
    return target.add(op::half_matmul, node.inputs, std::move(attrs));
  }

  const target::Target& device_;
  std::unordered_map<ValueId, ValueId> widened_;
};

}  // namespace

Graph f16_storage(Graph graph, const target::Target& device, std::vector<ValueId>* remap) {
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(),
                   [](const Node& node) { return node.type.dtype == DType::f16; }))
    return unchanged(std::move(graph), remap);
  F16Storage pass(device);
  const std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&pass](Graph& target, ValueId, Node node) { return pass.rewrite(target, std::move(node)); },
      remap);
}

}  // namespace mg::passes
