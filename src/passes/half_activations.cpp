// Half activations (passes.hpp): where products already multiply f16 operands, the large values
// between them (a network's activations and their gradients) are stored in f16, as mixed
// precision training stores them, so the elementwise kernels and reductions that dominate a
// convolutional network's memory traffic move half the bytes. A value is stored in f16 where
// every kernel that writes or reads it converts in registers: its producer is an elementwise
// kernel (round_to_f16 fused as it stores) or a product on cooperative matrices (f16_result), and
// each reader an elementwise kernel or a reduction (widen_f16 fused as it loads), a rounding to
// f16 (which then reads the f16 value itself), Winograd's tile transforms that store f16 points
// (which read the f16 value), or a move whose result is stored in f16 alike: a transpose, or
// Winograd's output transform (f16 products give an f16 image).
// Outputs, assignments, values no kernel would write to memory (an elementwise value that one
// kernel reads is computed there) and a bias added to a matmul's product (which the GEMM adds in
// f32 as it stores the product) keep f32.
// In bfloat16 (bf16 precision, whose products take bfloat16 operands: f16 would lose f32's
// range), values are stored as bfloat16 bit patterns where an elementwise kernel writes them
// (round_to_bf16 fused) or a product of bfloat16 operands on cooperative matrices (bf16_result),
// and the readers are those of f16 values, Winograd's tile transforms storing bfloat16 points
// and moves whose results are stored in bfloat16.
#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "ir/op_names.hpp"
#include "ops/half_gemm.hpp"
#include "ops/op.hpp"
#include "ops/winograd.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"
#include "passes/value_readers.hpp"

namespace mg::passes {
namespace {

// Values smaller than this stay f32: the bytes they would save are not worth a rounding.
constexpr int64_t kMinHalfElements = int64_t{1} << 16;

bool is_reduction(const Node& node) {
  return (node.op == op::sum || node.op == op::mean || node.op == op::max) &&
         node.type.dtype == DType::f32;
}

// Winograd's tile transforms of f32 values into f16 points (`f16`, else bfloat16 ones), which
// read an input in that format as well.
bool is_half_tiles(const Node& node, bool f16) {
  return (node.op == op::winograd_tiles || node.op == op::winograd_grad_tiles) &&
         (f16 ? winograd::f16_result(node.attrs) : winograd::bf16_result(node.attrs));
}

// Ops that move a value stored in 16 bits into a result stored in that format.
bool is_half_move(const Node& node) {
  return node.op == op::transpose || node.op == op::winograd_output;
}

class HalfActivations {
 public:
  HalfActivations(const Graph& graph, const target::Target& device, DType storage)
      : graph_(graph), device_(device), values_(graph), f16_(storage == DType::f16) {}

  // Which values to store in f16, by the source graph's ids.
  std::vector<bool> choose() {
    std::vector<bool> half(graph_.size(), false);
    for (size_t i = 0; i < graph_.size(); ++i) {
      const ValueId id = static_cast<ValueId>(i);
      const Node& node = graph_.node(id);
      if (node.is_leaf() || is_view_op(node.op) || node.type.dtype != DType::f32 ||
          values_.kept(id))
        continue;
      // A move of a value stored in 16 bits stores its result so (its readers were checked).
      if (is_half_move(node)) {
        half[i] = half[values_.storage_source(node.inputs[0])];
        continue;
      }
      if (node.type.elements() < kMinHalfElements || !writes_half(node) || !readers_convert(id))
        continue;
      const std::vector<ValueId> readers = values_.kernel_readers(id);
      if (device_.is_pointwise_op(node.op) &&
          (computed_where_read(id, readers) || completes_a_product(node)))
        continue;
      // Per-image products that only sums read (weight gradients over a batch) stay f32.
      if (node.op == op::half_matmul &&
          std::all_of(readers.begin(), readers.end(),
                      [&](ValueId reader) { return is_reduction(graph_.node(reader)); }))
        continue;
      half[i] = true;
    }
    return half;
  }

 private:
  // Whether elementwise `value` is computed in the one kernel that reads it, where fusion puts
  // it: its readers are elementwise of its shape and each leads, through values that one
  // elementwise node of the same shape reads, to the same node (a sigmoid that SiLU's gradient
  // reads twice), or it has one reader.
  bool computed_where_read(ValueId value, const std::vector<ValueId>& readers) const {
    if (readers.size() < 2) return true;
    const Shape& shape = graph_.type(value).shape;
    const auto joins = [&](ValueId node) {
      return device_.is_pointwise_op(graph_.node(node).op) && graph_.type(node).shape == shape;
    };
    ValueId end = kNoValue;
    for (ValueId reader : readers) {
      if (!joins(reader)) return false;
      while (!values_.kept(reader) && values_.readers(reader).size() == 1 &&
             joins(values_.readers(reader)[0]))
        reader = values_.readers(reader)[0];
      if (end != kNoValue && reader != end) return false;
      end = reader;
    }
    return true;
  }

  // Whether elementwise `node` reads a product that nothing else reads and whose GEMM computes
  // it as it stores the product (an epilogue: a bias add), in f32.
  bool completes_a_product(const Node& node) const {
    return std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId input) {
      const Node& product = graph_.node(input);
      return (product.op == op::matmul || product.op == op::half_matmul) &&
             device_.product_takes_epilogue(graph_, product) &&
             values_.readers(input).size() == 1 && !values_.kept(input);
    });
  }

  // Whether `node`'s kernel can round its f32 result to 16 bits as it stores it: a product only
  // into its operands' format, the storage's.
  bool writes_half(const Node& node) const {
    if (node.op == op::half_matmul)
      return graph_.type(node.inputs[0]).dtype == (f16_ ? DType::f16 : DType::bf16) &&
             !node.attrs.has("k_splits") && device_.workgroup_gemm_writes_half_result(graph_, node);
    return device_.is_pointwise_op(node.op) && node.op != op::widen_f16 &&
           node.op != op::widen_bf16 && node.op != op::cast;
  }

  // Whether every reader of `value` converts it in registers.
  bool readers_convert(ValueId value) const {
    for (ValueId reader : values_.kernel_readers(value)) {
      const Node& node = graph_.node(reader);
      if (is_half_move(node)) {
        if (values_.kept(reader) || !readers_convert(reader)) return false;
      } else if (!device_.is_pointwise_op(node.op) && !is_reduction(node) &&
                 !is_half_tiles(node, f16_)) {
        return false;
      }
    }
    return true;
  }

  const Graph& graph_;
  const target::Target& device_;
  const ValueReaders values_;
  const bool f16_;  // else bfloat16
};

class Rewrite {
 public:
  Rewrite(std::vector<bool> half, const target::Target& device, DType storage)
      : half_(std::move(half)),
        device_(device),
        f16_(storage == DType::f16),
        rounding_(rounding_op(storage)),
        widening_(widening_op(storage)) {}

  ValueId operator()(Graph& target, ValueId old_id, Node node) {
    // A view of a value stored in 16 bits is that view of the 16-bit value too.
    if (is_view_op(node.op) && half_of_.count(node.inputs[0])) {
      const ValueId f16_input = half_of_.at(node.inputs[0]);
      const ValueId f16_view = target.add(node.op, {f16_input}, node.attrs);
      const ValueId f32_view = target.add_typed(std::move(node));
      half_of_[f32_view] = f16_view;
      return f32_view;
    }
    // A rounding of a value stored in its format is that value.
    if (node.op == rounding_ && half_of_.count(node.inputs[0])) return half_of_.at(node.inputs[0]);
    // Tile transforms read the 16-bit value and store points in its dtype.
    if (is_half_tiles(node, f16_) && half_of_.count(node.inputs[0])) {
      Attrs attrs;
      for (const auto& [name, value] : node.attrs.items())
        if (name != winograd::kF16ResultAttribute && name != winograd::kBf16ResultAttribute)
          attrs.set(name, value);
      return target.add(node.op, {half_of_.at(node.inputs[0])}, std::move(attrs));
    }
    if (device_.is_pointwise_op(node.op) || is_reduction(node)) {
      // Each reader widens for itself, fused into its kernel: a widening shared by several
      // would be a launch of its own that writes the value in f32 again.
      std::unordered_map<ValueId, ValueId> own_widening;
      for (ValueId& input : node.inputs) {
        auto it = half_of_.find(input);
        if (it == half_of_.end()) continue;
        auto [widening, inserted] = own_widening.try_emplace(input, kNoValue);
        if (inserted) widening->second = target.add(widening_, {it->second});
        input = widening->second;
      }
    }
    if (half_[old_id]) return store_half(target, std::move(node));
    return target.add_typed(std::move(node));
  }

 private:
  // `node` computed in f32 and stored in f16; returns the f32 value the graph keeps for it
  // (a widening that no rewritten reader reads, which dead-code elimination then drops).
  ValueId store_half(Graph& target, Node node) {
    ValueId f16_value = kNoValue;
    if (node.op == op::half_matmul) {
      Attrs attrs = node.attrs;
      attrs.set(f16_ ? "f16_result" : "bf16_result", int64_t{1});
      f16_value = target.add(op::half_matmul, node.inputs, std::move(attrs));
    } else if (is_half_move(node)) {
      f16_value = target.add(node.op, {half_of_.at(node.inputs[0])}, node.attrs);
    } else {
      f16_value = target.add(rounding_, {target.add_typed(std::move(node))});
    }
    const ValueId f32_value = target.add(widening_, {f16_value});
    half_of_[f32_value] = f16_value;
    return f32_value;
  }

  const std::vector<bool> half_;
  const target::Target& device_;
  const bool f16_;                                // else bfloat16
  const std::string_view rounding_, widening_;    // the storage format's conversions
  std::unordered_map<ValueId, ValueId> half_of_;  // f32 value in the target -> its 16-bit value
};

}  // namespace

Graph half_activations(Graph graph, const target::Target& device, DType storage,
                       std::vector<ValueId>* remap) {
  if (storage != DType::f16 && storage != DType::bf16)
    throw std::logic_error("half_activations stores activations in f16 or bf16");
  std::vector<bool> half = HalfActivations(graph, device, storage).choose();
  if (std::none_of(half.begin(), half.end(), [](bool chosen) { return chosen; }))
    return unchanged(std::move(graph), remap);
  std::vector<ValueId> rewritten, pruned;
  Rewrite rewrite(std::move(half), device, storage);
  const std::vector<bool> keep(graph.size(), true);
  Graph result = rebuild(
      std::move(graph), keep,
      [&rewrite](Graph& target, ValueId old_id, Node node) {
        return rewrite(target, old_id, std::move(node));
      },
      remap ? &rewritten : nullptr);
  result = eliminate_dead_code(std::move(result), remap ? &pruned : nullptr);
  if (remap) *remap = compose(rewritten, pruned);
  return result;
}

}  // namespace mg::passes
