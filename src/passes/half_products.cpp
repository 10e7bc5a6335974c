// Half products (passes.hpp): in fast precision the subgroup-scope GEMM on cooperative matrices
// rounds its f32 operands to f16 as it loads them. Where an operand of a product can be stored
// in f16 for nothing, it is (round_to_f16) and the product becomes a half_matmul, which loads
// that operand in half the bytes and converts nothing, the other operand as before where it
// cannot: a weight the program never updates, whose rounding is a launch that the plan moves to
// setup, and a value that an elementwise kernel or a normalisation computes and only such
// products read, whose rounding fuses into that kernel's store. Every product reads the values
// it read before, rounded as the GEMM rounded them. A frozen weight is then stored twice, in f32
// (the parameter) and in f16 (the setup's result). In bf16 precision, whose GEMMs round their
// operands to bfloat16, the operands are stored in bfloat16 alike.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "ir/op_names.hpp"
#include "ops/half_gemm.hpp"
#include "ops/op.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"
#include "passes/value_readers.hpp"

namespace mg::passes {
namespace {

class HalfProducts {
 public:
  HalfProducts(const Graph& graph, const target::Target& device)
      : graph_(graph), device_(device), values_(graph), updated_(graph.size(), false) {
    for (const auto& [leaf, value] : graph.updates()) updated_[leaf] = true;
  }

  // The products to rewrite, each with which of its two operands it reads in f16 (bit 0: A,
  // bit 1: B; 0: not rewritten), and the values those operands round (what they view), by the
  // graph's ids.
  struct Choice {
    std::vector<uint8_t> half_inputs;
    std::vector<bool> rounded;
  };
  Choice choose() const {
    const size_t size = graph_.size();
    std::vector<bool> candidate(size, false), operand(size, false);
    for (size_t i = 0; i < size; ++i) {
      const ValueId id = static_cast<ValueId>(i);
      candidate[i] = is_candidate_product(graph_.node(id));
      operand[i] = may_round_for_nothing(id);
    }
    // A candidate product reads an operand in f16 where that operand rounds for nothing and lies
    // in whole units of 8 halves; a computed operand rounds for nothing only if every kernel
    // that reads it is a product that reads it so. Dropping one may drop others.
    const auto half_inputs_of = [&](ValueId product) {
      uint8_t mask = 0;
      if (!candidate[product]) return mask;
      const Node& node = graph_.node(product);
      for (size_t j = 0; j < 2; ++j)
        if (operand[values_.storage_source(node.inputs[j])] && in_units(node, j))
          mask |= static_cast<uint8_t>(1u << j);
      return mask;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < size; ++i) {
        const ValueId id = static_cast<ValueId>(i);
        if (!operand[i] || is_fixed(id)) continue;
        const std::vector<ValueId> readers = values_.kernel_readers(id);
        const bool read_in_f16 = std::all_of(readers.begin(), readers.end(), [&](ValueId reader) {
          const Node& node = graph_.node(reader);
          const uint8_t mask = half_inputs_of(reader);
          for (size_t j = 0; j < node.inputs.size(); ++j)
            if (values_.storage_source(node.inputs[j]) == id && (j > 1 || !(mask & (1u << j))))
              return false;
          return mask != 0;
        });
        if (!read_in_f16) {
          operand[i] = false;
          changed = true;
        }
      }
    }
    Choice choice{std::vector<uint8_t>(size, 0), std::vector<bool>(size, false)};
    for (size_t i = 0; i < size; ++i) {
      const ValueId id = static_cast<ValueId>(i);
      choice.half_inputs[i] = half_inputs_of(id);
      for (size_t j = 0; j < 2; ++j)
        if (choice.half_inputs[i] & (1u << j))
          choice.rounded[values_.storage_source(graph_.node(id).inputs[j])] = true;
    }
    return choice;
  }

 private:
  bool is_candidate_product(const Node& node) const {
    const std::optional<WholeProduct> product = whole_f32_product(graph_, node);
    return product && device_.subgroup_gemm_takes_product(product->m, product->n, product->k,
                                                          product->transpose_b);
  }

  // Whether operand `j` of candidate product `node` lies in whole units of 8 halves along its
  // contiguous extent, which the GEMM then loads 16 bytes at a time, whatever the other extents
  // (SmolVLA's 50 action rows).
  bool in_units(const Node& node, size_t j) const {
    const WholeProduct product = *whole_f32_product(graph_, node);
    return (j == 0 ? product.a_run() : product.b_run()) % 8 == 0;
  }

  // A parameter, state or constant that no assignment updates.
  bool is_fixed(ValueId value) const {
    const Node& node = graph_.node(value);
    return (node.op == op::parameter || node.op == op::state || node.op == op::constant) &&
           !updated_[value];
  }

  // Whether `value` could be stored in f16 where it is made, before its readers are checked.
  bool may_round_for_nothing(ValueId value) const {
    const Node& node = graph_.node(value);
    if (is_fixed(value)) return true;
    if (node.is_leaf() || is_view_op(node.op) || values_.kept(value) ||
        node.type.dtype != DType::f32)
      return false;
    return device_.is_pointwise_op(node.op) || node.op == op::layer_norm || node.op == op::rms_norm;
  }

  const Graph& graph_;
  const target::Target& device_;
  const ValueReaders values_;
  std::vector<bool> updated_;
};

// The f16 operand of a product in `target` for f32 `value`: the rounding of the value its views
// read (made where that value is), seen through the same views; one view chain for all of its
// readers.
ValueId half_operand(Graph& target, ValueId value, std::unordered_map<ValueId, ValueId>& halves) {
  if (auto it = halves.find(value); it != halves.end()) return it->second;
  // Copies: adding nodes may move the graph's nodes.
  const Node view = target.node(value);
  const ValueId half =
      target.add(view.op, {half_operand(target, view.inputs[0], halves)}, view.attrs);
  halves.emplace(value, half);
  return half;
}

}  // namespace

Graph half_products(Graph graph, const target::Target& device, DType format,
                    std::vector<ValueId>* remap) {
  const std::string_view rounding = rounding_op(format);
  const auto [half_inputs, is_rounded] = HalfProducts(graph, device).choose();
  if (std::none_of(half_inputs.begin(), half_inputs.end(), [](uint8_t mask) { return mask != 0; }))
    return unchanged(std::move(graph), remap);
  std::unordered_map<ValueId, ValueId> halves;  // f32 value in the target -> its f16 operand
  const std::vector<bool> keep(graph.size(), true);
  std::vector<ValueId> rewritten, pruned;
  Graph result = rebuild(
      std::move(graph), keep,
      [&](Graph& target, ValueId old_id, Node node) {
        if (is_rounded[old_id]) {
          // Rounded where it is made, before any of its readers: fusion merges kernels whose
          // readers all follow them (two gradients of one SwiGLU into one launch).
          const ValueId value = target.add_typed(std::move(node));
          halves.emplace(value, target.add(rounding, {value}));
          return value;
        }
        const uint8_t mask = half_inputs[old_id];
        if (mask == 0) return target.add_typed(std::move(node));
        std::vector<ValueId> operands = node.inputs;
        for (size_t j = 0; j < 2; ++j)
          if (mask & (1u << j)) operands[j] = half_operand(target, operands[j], halves);
        return target.add(op::half_matmul, std::move(operands), node.attrs);
      },
      remap ? &rewritten : nullptr);
  // The f32 views that only the products read.
  result = eliminate_dead_code(std::move(result), remap ? &pruned : nullptr);
  if (remap) *remap = compose(rewritten, pruned);
  return result;
}

}  // namespace mg::passes
