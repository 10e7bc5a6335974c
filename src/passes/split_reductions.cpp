// Two-step sums: a `sum` or `mean` whose reduced axes lie on both sides of a kept axis (the bias
// and batch-norm gradients of a convolution, a batch norm's statistics: [N, C, H, W] reduced over
// N, H and W) has few outputs, each a long strided row, and the row-reduction kernel gives each
// output one workgroup. The Fashion-MNIST CNN's 16-channel bias gradient over 64 x 28 x 28 thus
// runs on 16 compute units of a large GPU, a large part of its training step. The pass reduces
// the reduced axes after the last such kept axis first (one contiguous row per output, 64 x 16 of
// them there), then the rest: two dispatches that both spread over the GPU.
//
// A cross-entropy loss over many long rows (a language model's [tokens, vocabulary] logits)
// likewise: its scalar kernel is one workgroup, which would walk every logit alone. It becomes
// the per_row form (each row's term and count, one row a segment across the GPU) and a sum.
//
// The max of a few long contiguous rows (over trailing axes: attention's per-head max |dO|,
// [B, H, S, D] over S and D) likewise leaves most of the GPU idle, each row read by one
// workgroup at one compute unit's bandwidth. Viewed as [rows, chunks, chunk], each chunk's
// maximum is taken first, then each row's. Sums of that shape are chunked only from a longer
// row: clipping's gradient norm sums each parameter's squares in one, and those of a model's
// many small parameters run side by side, filling the GPU together, but a large one (a language
// model's embedding, 28M elements) would go on alone at one compute unit's bandwidth long after
// the others are done.
#include <algorithm>
#include <optional>

#include "ir/op_names.hpp"
#include "meganeura/ops.hpp"
#include "ops/shape_rules.hpp"
#include "passes/passes.hpp"
#include "passes/rebuild.hpp"

namespace mg::passes {
namespace {

// Sums with at least this many outputs already fill a GPU with workgroups.
constexpr int64_t kManyOutputs = 1024;
// The first step's rows must be long enough to be worth a workgroup each.
constexpr int64_t kMinInnerRow = 128;
// Below this many logits one workgroup computes a cross-entropy loss as fast as two launches.
constexpr int64_t kParallelLossLogits = 65536;
// Contiguous rows of a max are chunked where there are at most kFewRows of them, each at least
// kLongRow long, into the longest chunks of kLongestChunk elements or fewer that divide them
// (at least kMinInnerRow: rows of no such divisor stay whole).
constexpr int64_t kFewRows = 64;
constexpr int64_t kLongRow = 16384;
constexpr int64_t kLongestChunk = 1024;
// The shortest rows of a sum that are chunked likewise (1 MiB of f32).
constexpr int64_t kLongSumRow = 262144;

bool splits_cross_entropy(const Graph& graph, const Node& node) {
  if (node.op != op::cross_entropy || node.attrs.get_int("per_row", 0) != 0 ||
      node.type.dtype != DType::f32)
    return false;
  const Shape& logits = graph.type(node.inputs[0]).shape;
  return logits[0] >= 2 && logits[0] * logits[1] >= kParallelLossLogits;
}

// The mean of the counted rows' terms: their column sums' ratio, dividing by at least 1 as the
// scalar form does.
ValueId per_row_cross_entropy(Graph& target, Node node) {
  node.attrs.set("per_row", int64_t{1});
  const Tensor terms(&target, target.add(node.op, node.inputs, node.attrs));
  const Tensor sums = sum(terms, {0});
  const Tensor count = maximum(slice(sums, 0, 1, 2), full(target, {1}, 1.0));
  return reshape(slice(sums, 0, 0, 1) / count, {}).id();
}

struct SplitSum {
  std::vector<int64_t> inner_axes;  // summed first (keepdims), then every axis of the node
};

std::optional<SplitSum> split_of(const Graph& graph, const Node& node) {
  if ((node.op != op::sum && node.op != op::mean) || node.type.dtype != DType::f32 ||
      !node.attrs.has("axes"))
    return std::nullopt;
  const Shape& shape = graph.type(node.inputs[0]).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> axes = node.attrs.get_ints("axes");
  if (axes.empty()) return std::nullopt;  // every axis: no kept axis to split around
  for (int64_t& axis : axes) {
    if (axis < 0) axis += rank;
  }
  std::sort(axes.begin(), axes.end());
  const auto reduced = [&](int64_t axis) {
    return std::binary_search(axes.begin(), axes.end(), axis);
  };
  // The last kept axis with a reduced axis before it; the reduced axes after it come first.
  int64_t boundary = -1;
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (!reduced(axis) && axes.front() < axis && axes.back() > axis) boundary = axis;
  }
  if (boundary < 0) return std::nullopt;
  SplitSum split;
  int64_t inner = 1, outputs = 1;
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (reduced(axis) && axis > boundary) {
      split.inner_axes.push_back(axis);
      inner *= shape[static_cast<size_t>(axis)];
    }
    if (!reduced(axis)) outputs *= shape[static_cast<size_t>(axis)];
  }
  if (outputs >= kManyOutputs || inner < kMinInnerRow) return std::nullopt;
  return split;
}

// The input of a max or sum viewed as [kept axes..., chunks, chunk], or nothing where it is not
// such a reduction.
std::optional<Shape> chunked_shape_of(const Graph& graph, const Node& node) {
  if ((node.op != op::max && node.op != op::sum) || node.type.dtype != DType::f32)
    return std::nullopt;
  const Shape& shape = graph.type(node.inputs[0]).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> axes = normalize_axes(graph, node, node.attrs.get_ints("axes", {}), rank);
  std::sort(axes.begin(), axes.end());
  const int64_t reduced = static_cast<int64_t>(axes.size());
  int64_t rows = 1, length = 1;
  for (int64_t axis = 0; axis < rank; ++axis) {
    const bool is_reduced = axis >= rank - reduced;
    if (is_reduced && axes[static_cast<size_t>(axis - (rank - reduced))] != axis)
      return std::nullopt;  // the reduced axes are not the trailing ones
    (is_reduced ? length : rows) *= shape[static_cast<size_t>(axis)];
  }
  if (rows > kFewRows || length < (node.op == op::max ? kLongRow : kLongSumRow))
    return std::nullopt;
  for (int64_t chunk = kLongestChunk; chunk >= kMinInnerRow; --chunk) {
    if (length % chunk != 0) continue;
    Shape chunked(shape.begin(), shape.end() - reduced);
    chunked.push_back(length / chunk);
    chunked.push_back(chunk);
    return chunked;
  }
  return std::nullopt;
}

// `node` as the max (or sum) of each chunk of its input viewed as `chunked_shape`
// (chunked_shape_of), then of each row's chunk results, reshaped to its own shape.
ValueId reduce_chunks(Graph& target, const Node& node, const Shape& chunked_shape) {
  const int64_t kept = static_cast<int64_t>(chunked_shape.size()) - 2;
  const ValueId chunks = reshape(Tensor(&target, node.inputs[0]), chunked_shape).id();
  const ValueId per_chunk = target.add(
      node.op, {chunks}, {{"axes", std::vector<int64_t>{kept + 1}}, {"keepdims", int64_t{0}}});
  const ValueId per_row = target.add(
      node.op, {per_chunk}, {{"axes", std::vector<int64_t>{kept}}, {"keepdims", int64_t{0}}});
  return reshape(Tensor(&target, per_row), node.type.shape).id();
}

// The count of leading axes [0, count) that `node` sums without keeping them, or nothing when it
// is not such a sum (an empty axes list sums every axis and counts too).
std::optional<int64_t> leading_sum_axes(const Graph& graph, const Node& node) {
  if (node.op != op::sum || node.attrs.get_int("keepdims", 0) != 0) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(graph.type(node.inputs[0]).shape.size());
  std::vector<int64_t> axes = node.attrs.get_ints("axes", {});
  if (axes.empty()) return rank;
  for (int64_t& axis : axes) {
    if (axis < 0) axis += rank;
  }
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] != static_cast<int64_t>(i)) return std::nullopt;
  }
  return static_cast<int64_t>(axes.size());
}

}  // namespace

Graph merge_leading_sums(Graph graph, std::vector<ValueId>* remap) {
  std::vector<int64_t> uses(graph.size(), 0);
  for (const Node& node : graph.nodes()) {
    for (ValueId input : node.inputs) ++uses[input];
  }
  for (const auto& [name, id] : graph.outputs()) ++uses[id];
  for (const auto& [leaf, value] : graph.updates()) ++uses[value];
  // A Winograd filter transform that sums its partial products itself, taking them from the sum
  // it reads.
  const auto absorbs_its_sum = [&](const Node& old) {
    if (old.op != op::winograd_weight_grad) return false;
    const ValueId sum_id = old.inputs[0];
    const Node& sum = graph.node(sum_id);
    return leading_sum_axes(graph, sum) == 1 && uses[sum_id] == 1 &&
           graph.type(sum.inputs[0]).shape.size() == 4;
  };
  // The leading axes that an f32 sum of leading axes and the one such sum it reads alone sum
  // together, or nothing.
  const auto merged_axes = [&](const Node& old) -> std::optional<int64_t> {
    const std::optional<int64_t> outer = leading_sum_axes(graph, old);
    if (!outer || old.type.dtype != DType::f32) return std::nullopt;
    const ValueId inner_id = old.inputs[0];
    const std::optional<int64_t> inner = leading_sum_axes(graph, graph.node(inner_id));
    if (!inner || uses[inner_id] != 1) return std::nullopt;
    return *inner + *outer;
  };
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(),
                   [&](const Node& node) { return absorbs_its_sum(node) || merged_axes(node); }))
    return unchanged(std::move(graph), remap);
  std::vector<bool> keep(graph.size(), true);
  std::vector<ValueId> merged_remap;
  Graph merged = rebuild(
      graph, keep,
      [&](Graph& target, ValueId old_id, Node node) {
        const Node& old = graph.node(old_id);
        if (absorbs_its_sum(old)) {
          node.inputs = {target.node(node.inputs[0]).inputs[0]};
          return target.add_typed(std::move(node));
        }
        const std::optional<int64_t> count = merged_axes(old);
        if (!count) return target.add_typed(std::move(node));
        std::vector<int64_t> axes(static_cast<size_t>(*count));
        for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
        // The inner sum, now unused, goes with the dead-code pass below.
        const ValueId source = target.node(node.inputs[0]).inputs[0];
        return target.add(op::sum, {source}, {{"axes", axes}, {"keepdims", int64_t{0}}});
      },
      &merged_remap);
  std::vector<ValueId> dead_code_remap;
  Graph result = eliminate_dead_code(std::move(merged), &dead_code_remap);
  if (remap) *remap = compose(merged_remap, dead_code_remap);
  return result;
}

Graph split_reductions(Graph graph, std::vector<ValueId>* remap) {
  std::vector<bool> keep(graph.size(), true);
  return rebuild(
      std::move(graph), keep,
      [](Graph& target, ValueId, Node node) {
        if (splits_cross_entropy(target, node)) return per_row_cross_entropy(target, node);
        if (const std::optional<Shape> chunked = chunked_shape_of(target, node))
          return reduce_chunks(target, node, *chunked);
        const std::optional<SplitSum> split = split_of(target, node);
        if (!split) return target.add_typed(std::move(node));
        // A mean's first step is a mean too: every inner row has the same length, so the mean
        // of their means is the whole mean.
        const ValueId inner = target.add(node.op, node.inputs,
                                         {{"axes", split->inner_axes}, {"keepdims", int64_t{1}}});
        node.inputs = {inner};
        return target.add_typed(std::move(node));
      },
      remap);
}

}  // namespace mg::passes
