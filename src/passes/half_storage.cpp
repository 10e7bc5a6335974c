// The half storage pass (passes.hpp): f16 and bf16 tensors are stored in 16 bits and computed in
// f32. The f32 kernels read a widening (widen_f16, widen_bf16) of each 16-bit input and their
// 16-bit results are written as a rounding (round_to_f16, round_to_bf16) of the f32 result, which
// is what the reference interpreter computes (every such value rounded to its format); a
// transpose moves 16-bit values as they are, im2col moves f16 values itself, Winograd's tile and
// output transforms convert 16-bit values themselves, and Winograd's transforms asked for 16-bit
// points round them themselves. A 2-D matmul of two 16-bit operands into a result of
// their format that runs on cooperative matrices multiplies the stored values directly
// (half_matmul with f16_result or bf16_result), as PyTorch's f16 and bf16 GEMMs do.
#include <algorithm>
#include <unordered_map>

#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "ops/half_gemm.hpp"
#include "ops/winograd.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

bool involves(const Graph& graph, const Node& node, bool (*matches)(DType)) {
  if (matches(node.type.dtype)) return true;
  for (ValueId input : node.inputs)
    if (matches(graph.type(input).dtype)) return true;
  return false;
}

class HalfStorage {
 public:
  explicit HalfStorage(const target::Target& device) : device_(device) {}

  ValueId rewrite(Graph& target, Node node) {
    // A transpose moves its 16-bit values as they are, in half the bytes of f32 ones; im2col
    // moves f16 values too (bfloat16 ones go through f32 here), and Winograd's tile and output
    // transforms widen 16-bit values as they read them and round their 16-bit results as they
    // store them.
    const bool moves_f16 = node.op == op::im2col;
    const bool converts_itself = node.op == op::winograd_tiles ||
                                 node.op == op::winograd_grad_tiles ||
                                 node.op == op::winograd_output;
    // Transforms whose attribute asks for 16-bit points round them as they store them.
    const bool rounds_itself =
        (node.op == op::winograd_tiles || node.op == op::winograd_grad_tiles ||
         node.op == op::winograd_filter) &&
        (winograd::f16_result(node.attrs) || winograd::bf16_result(node.attrs));
    if (node.is_leaf() || is_view_op(node.op) || !involves(target, node, is_half_dtype) ||
        rounds_itself || converts_itself || is_pass_written_f16_op(node.op) ||
        node.op == op::transpose ||
        (moves_f16 && !involves(target, node, [](DType dtype) { return dtype == DType::bf16; })))
      return target.add_typed(std::move(node));
    if (node.op == op::cast) return cast(target, node);
    if (const ValueId product = half_product(target, node); product != kNoValue) return product;
    // A pointwise op widens its 16-bit inputs itself, fused into its kernel: a widening of its
    // own for each of them. One widening shared with other readers would be a launch of its own
    // that writes the value again in f32.
    const bool pointwise = device_.is_pointwise_op(node.op);
    std::unordered_map<ValueId, ValueId> own_widening;
    std::vector<ValueId> inputs;
    for (ValueId input : node.inputs) {
      const DType dtype = target.type(input).dtype;
      const bool in_memory = is_half_dtype(dtype) && target.node(input).op != op::constant;
      if (!pointwise || !in_memory) {
        inputs.push_back(as_f32(target, input));
        continue;
      }
      auto [it, inserted] = own_widening.try_emplace(input, kNoValue);
      if (inserted) it->second = target.add(widening_op(dtype), {input});
      inputs.push_back(it->second);
    }
    const ValueId computed = target.add(node.op, std::move(inputs), node.attrs);
    return is_half_dtype(node.type.dtype) ? target.add(rounding_op(node.type.dtype), {computed})
                                          : computed;
  }

 private:
  // `value` in f32: widened once however many kernels other than pointwise ones read it; a
  // 16-bit constant becomes the f32 constant of its (already rounded) values, which needs no
  // launch.
  ValueId as_f32(Graph& target, ValueId value) {
    const DType dtype = target.type(value).dtype;
    if (!is_half_dtype(dtype)) return value;
    auto [it, inserted] = widened_.try_emplace(value, kNoValue);
    if (!inserted) return it->second;
    const Node& node = target.node(value);
    const TensorType type{DType::f32, node.type.shape};
    if (node.op == op::constant && node.is_uniform_constant()) {
      it->second = target.constant(round_to_dtype(dtype, node.attrs.get_float("value")), type);
    } else if (node.op == op::constant) {
      std::vector<double> values = *node.data;
      for (double& element : values) element = round_to_dtype(dtype, element);
      it->second = target.constant(std::move(values), type);
    } else {
      it->second = target.add(widening_op(dtype), {value});
    }
    return it->second;
  }

  ValueId cast(Graph& target, const Node& node) {
    const ValueId source = node.inputs[0];
    const DType from = target.type(source).dtype, to = node.type.dtype;
    if (from == to) return source;
    const ValueId wide =
        is_half_dtype(from) || from == DType::f32
            ? as_f32(target, source)
            : target.add(op::cast, {source}, {{"dtype", std::string(dtype_name(DType::f32))}});
    if (is_half_dtype(to)) return target.add(rounding_op(to), {wide});
    return to == DType::f32 ? wide : target.add(op::cast, {wide}, node.attrs);
  }

  // A product of two f16 matrices into an f16 result on cooperative matrices (the workgroup GEMM,
  // else the subgroup-scope one, which read f16 operands and store f16 results), or of two bf16
  // matrices in bf16 precision: into a bf16 result on the workgroup GEMM (on a device with its
  // bfloat16 matrices), else on the subgroup GEMM, which reads them into an f32 result that a
  // rounding then stores; kNoValue where the node is not such a product or the session runs none
  // of those kernels.
  ValueId half_product(Graph& target, const Node& node) {
    const DType dtype = node.type.dtype;
    if (node.op != op::matmul || node.attrs.has("k_splits") || node.type.rank() != 2 ||
        !is_half_dtype(dtype))
      return kNoValue;
    const TensorType& a = target.type(node.inputs[0]);
    const TensorType& b = target.type(node.inputs[1]);
    if (a.rank() != 2 || b.rank() != 2 || a.dtype != dtype || b.dtype != dtype) return kNoValue;
    const bool on_workgroups = device_.workgroup_gemm_takes_f16_product(target, node);
    // The subgroup GEMM's size rule (coop_gemm_suits) sends small f32 products to gemm.comp;
    // f16 ones would pay two widenings and a rounding there, more than the product itself, so
    // they all stay on cooperative matrices.
    if (!on_workgroups && !device_.cooperative_matrices()) return kNoValue;
    Attrs attrs = node.attrs;
    if (dtype == DType::f16 || on_workgroups) {
      attrs.set(dtype == DType::bf16 ? "bf16_result" : "f16_result", int64_t{1});
      return target.add(op::half_matmul, node.inputs, std::move(attrs));
    }
    if (!device_.traits().bf16_operands) return kNoValue;
    return target.add(op::round_to_bf16,
                      {target.add(op::half_matmul, node.inputs, std::move(attrs))});
  }

  const target::Target& device_;
  std::unordered_map<ValueId, ValueId> widened_;
};

}  // namespace

Graph half_storage(Graph graph, const target::Target& device, std::vector<ValueId>* remap) {
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(),
                   [](const Node& node) { return is_half_dtype(node.type.dtype); }))
    return unchanged(std::move(graph), remap);
  HalfStorage pass(device);
  const std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [&pass](Graph& target, ValueId, Node node) { return pass.rewrite(target, std::move(node)); },
      remap);
}

}  // namespace mg::passes
