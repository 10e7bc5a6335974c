#include "backends/vulkan/kernels/fusion.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <optional>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/gemm_epilogue.hpp"
#include "backends/vulkan/kernels/norm.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "backends/vulkan/parallel_for.hpp"
#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg::kernels {
namespace {

// The root of the DAG that `value` is computed in: following `fused_into`, which names the
// node a value is computed in (kNoValue where it has a kernel of its own).
ValueId root_of(const std::vector<ValueId>& fused_into, ValueId value) {
  while (fused_into[value] != kNoValue) value = fused_into[value];
  return value;
}

// Whether `value` is computed in the DAG whose result is `root` (the root itself included).
bool in_dag(const std::vector<ValueId>& fused_into, ValueId value, ValueId root) {
  return value == root || (fused_into[value] != kNoValue && root_of(fused_into, value) == root);
}

// Whether `value` is computed in one of the DAGs whose results are `roots`.
bool in_any_dag(const std::vector<ValueId>& fused_into, ValueId value,
                const std::vector<ValueId>& roots) {
  return std::any_of(roots.begin(), roots.end(),
                     [&](ValueId root) { return in_dag(fused_into, value, root); });
}

// Adds node `id` and, recursively, the producers computed in the same DAG to `dag` (each once,
// however many of its nodes read it), those `written_beside` as its extra outputs; returns the
// argument index that refers to `id`'s result. The DAGs whose results are `inlined` (small
// per-channel DAGs that a larger one evaluates again per element, inline_small_dags) are
// appended too, writing nothing: their own launches write their values.
int append_fused(const Graph& graph, ValueId id, const std::vector<ValueId>& fused_into,
                 const std::vector<bool>& written_beside, PointwiseDag& dag,
                 std::map<ValueId, int>& argument_of, const std::vector<ValueId>& inlined = {},
                 const Shape* view = nullptr) {
  if (auto it = argument_of.find(id); it != argument_of.end()) return it->second;
  const Node& node = graph.node(id);
  const bool exported = !in_any_dag(fused_into, id, inlined);
  PointwiseStatement statement{node.op, node.attrs, {}};
  for (ValueId input : node.inputs) {
    const bool fused = fused_into[input] != kNoValue && in_dag(fused_into, input, dag.output);
    // Reshapes keep each element's flat index: one that the DAG computes through (a split-K
    // sum's, or one prepending unit axes to a pointwise value of the DAG) reads its source's
    // value at the same element, and so does a reshape of an inlined DAG's result.
    ValueId source = input;
    while (graph.node(source).op == op::reshape) source = graph.node(source).inputs[0];
    // A sum of split partial results fused into its reader: the DAG reads the partials and
    // sums them itself (pointwise_launch: an input with more elements than the result), and
    // writes the sum beside its result where others read it (an identity statement).
    if (fused && !is_pointwise_op(graph.node(source).op)) {
      const ValueId sum = source;
      const ValueId partials = graph.node(sum).inputs[0];
      auto it = argument_of.find(partials);
      if (it == argument_of.end()) {
        dag.inputs.push_back(partials);
        it = argument_of.emplace(partials, static_cast<int>(dag.inputs.size() - 1)).first;
      }
      if (!written_beside[sum]) {
        statement.arguments.push_back(it->second);
        continue;
      }
      auto kept = argument_of.find(sum);
      if (kept == argument_of.end()) {
        dag.statements.push_back({std::string(op::cast), {}, {it->second}});
        dag.extra_outputs.push_back({sum, dag.statements.size() - 1});
        kept = argument_of.emplace(sum, -static_cast<int>(dag.statements.size())).first;
      }
      statement.arguments.push_back(kept->second);
      continue;
    }
    if (fused || in_any_dag(fused_into, source, inlined)) {
      if (fused && source != input) dag.through_unit_axes = true;
      statement.arguments.push_back(
          append_fused(graph, source, fused_into, written_beside, dag, argument_of, inlined, view));
    } else {
      auto it = argument_of.find(input);
      if (it == argument_of.end()) {
        dag.inputs.push_back(input);
        it = argument_of.emplace(input, static_cast<int>(dag.inputs.size() - 1)).first;
        // Read in an inlined DAG at the larger DAG's elements: broadcast as its result is read.
        if (!exported && view && graph.type(input).elements() == element_count(*view))
          dag.viewed_as.emplace(input, *view);
      }
      statement.arguments.push_back(it->second);
    }
  }
  dag.statements.push_back(std::move(statement));
  if (written_beside[id] && exported) dag.extra_outputs.push_back({id, dag.statements.size() - 1});
  const int reference = -static_cast<int>(dag.statements.size());
  argument_of[id] = reference;
  return reference;
}

// Sibling DAGs computed in a later DAG's kernel, by the later one's root (lower_graph).
using Siblings = std::map<ValueId, std::vector<ValueId>>;

// Makes `dag`'s input `argument` a statement of its own too, an identity ahead of the others,
// whose value a kernel can then export; returns that statement.
size_t input_as_statement(PointwiseDag& dag, int argument) {
  for (PointwiseStatement& statement : dag.statements) {
    for (int& reference : statement.arguments) {
      if (reference < 0) --reference;
    }
  }
  for (PointwiseExtraOutput& extra : dag.extra_outputs) ++extra.statement;
  dag.statements.insert(dag.statements.begin(), {std::string(op::cast), {}, {argument}});
  return 0;
}

// The pointwise DAG whose result is `root`, with the siblings it computes beside it and the
// `inlined` DAGs it evaluates again.
PointwiseDag dag_of(const Graph& graph, ValueId root, const std::vector<ValueId>& fused_into,
                    const std::vector<bool>& written_beside, const Siblings* siblings = nullptr,
                    const std::vector<ValueId>& inlined = {}, const Shape* view = nullptr) {
  PointwiseDag dag;
  dag.output = root;
  std::map<ValueId, int> argument_of;
  if (siblings) {
    if (auto it = siblings->find(root); it != siblings->end()) {
      for (ValueId sibling : it->second)
        append_fused(graph, sibling, fused_into, written_beside, dag, argument_of, inlined, view);
    }
  }
  // Last, as the last statement is the result.
  append_fused(graph, root, fused_into, written_beside, dag, argument_of, inlined, view);
  return dag;
}

// Storage buffers a pointwise launch of `dag` binds: its inputs but uniform constants, its
// extra outputs and its result.
uint32_t pointwise_bindings(const Graph& graph, const PointwiseDag& dag) {
  uint32_t bindings = 1 + static_cast<uint32_t>(dag.extra_outputs.size());
  for (ValueId input : dag.inputs)
    if (!graph.node(input).is_uniform_constant()) ++bindings;
  return bindings;
}

// The DAG rooted at `root` with the product of matmul `product` (which feeds it, possibly through
// fused producers) as an input, the values `written_beside` as its extra outputs.
MatmulEpilogue epilogue_for(const Graph& graph, ValueId root, ValueId product,
                            const std::vector<ValueId>& fused_into,
                            const std::vector<bool>& written_beside) {
  MatmulEpilogue epilogue;
  epilogue.dag = dag_of(graph, root, fused_into, written_beside);
  epilogue.product_input = static_cast<size_t>(
      std::find(epilogue.dag.inputs.begin(), epilogue.dag.inputs.end(), product) -
      epilogue.dag.inputs.begin());
  return epilogue;
}

// Whether every node that reads `value`, directly or through views, other than `first` comes
// after `root`, the node whose launch writes it, or is computed in the DAG whose result is `dag`
// (`root` unless given; with `fused_into`, views in that DAG being the links of a fused split-K
// sum). A companion op (is_companion_op) may run in its producer's launch, before its own
// place, so it never counts as coming after.
bool readers_follow(const Graph& graph, const std::vector<std::vector<ValueId>>& consumer_lists,
                    ValueId value, ValueId first, ValueId root,
                    const std::vector<ValueId>* fused_into = nullptr, ValueId dag = kNoValue) {
  const ValueId members = dag == kNoValue ? root : dag;
  for (ValueId reader : consumer_lists[value]) {
    if (reader == first) continue;
    if (is_companion_op(graph.node(reader).op)) return false;
    if (is_view_op(graph.node(reader).op)) {
      if (!readers_follow(graph, consumer_lists, reader, first, root, fused_into, dag))
        return false;
    } else if (reader <= root && !(fused_into && in_dag(*fused_into, reader, members))) {
      return false;
    }
  }
  return true;
}

// Whether a node outside the DAG whose result is `root` reads `value`, directly or through
// views that are not links of that DAG, or the graph keeps such a view.
bool read_outside(const Graph& graph, const std::vector<std::vector<ValueId>>& consumer_lists,
                  const std::vector<ValueId>& fused_into, const std::vector<bool>& observed,
                  ValueId value, ValueId root) {
  for (ValueId reader : consumer_lists[value]) {
    if (is_view_op(graph.node(reader).op)) {
      if (observed[reader] ||
          read_outside(graph, consumer_lists, fused_into, observed, reader, root))
        return true;
    } else if (!in_dag(fused_into, reader, root)) {
      return true;
    }
  }
  return false;
}

// The most partial results a pointwise kernel sums in place of a split-K sum's launch.
constexpr int64_t kMostFusedPartials = 32;

// The buffers an attention forward binds at most: q, k, v and a mask, its output, its log-sum-exp
// (`lse`), the transposed copy of its output (`copy`), and where it computes its queries' index
// chain (q then unread) the chain's input and positions.
constexpr uint32_t attention_bindings(bool lse, bool copy, bool chain) {
  return 5 + (lse ? 1 : 0) + (copy ? 1 : 0) + (chain ? 2 : 0);
}

// Whether `id` is a sum of f32 partial results over their leading axis (split-K's, ops/k_split.hpp)
// that a pointwise reader can sum itself.
bool is_partial_sum(const Graph& graph, ValueId id) {
  const Node& node = graph.node(id);
  if (node.op != op::sum || node.type.dtype != DType::f32 ||
      node.attrs.get_int("keepdims", 0) != 0 ||
      node.attrs.get_ints("axes", {}) != std::vector<int64_t>{0})
    return false;
  const Shape& partials = graph.type(node.inputs[0]).shape;
  return partials.size() == node.type.shape.size() + 1 && partials[0] <= kMostFusedPartials &&
         node.type.elements() > 0;
}

// Whether `dag` reads partial results it sums (an input with more elements than its result).
bool sums_partials(const Graph& graph, const PointwiseDag& dag) {
  const int64_t count = graph.type(dag.output).elements();
  return std::any_of(dag.inputs.begin(), dag.inputs.end(),
                     [&](ValueId input) { return graph.type(input).elements() > count; });
}

std::string fused_label(const Graph& graph, const PointwiseDag& dag) {
  return "fused " + std::to_string(dag.statements.size()) + " ops -> " + graph.node(dag.output).op +
         " %" + std::to_string(dag.output);
}

}  // namespace

std::vector<Launch> lower_graph(const Graph& graph, const DeviceTraits& device,
                                size_t* fused_away) {
  // Uses of each value as an input (a node reading it twice counts twice), and the nodes that
  // read it, each once, in order.
  std::vector<int> consumers(graph.size(), 0);
  std::vector<std::vector<ValueId>> consumer_lists(graph.size());
  for (size_t i = 0; i < graph.size(); ++i) {
    const ValueId id = static_cast<ValueId>(i);
    for (ValueId input : graph.nodes()[i].inputs) {
      ++consumers[input];
      if (consumer_lists[input].empty() || consumer_lists[input].back() != id)
        consumer_lists[input].push_back(id);
    }
  }
  std::vector<bool> observed(graph.size(), false);  // outputs and assignments need their bytes
  for (const auto& [name, id] : graph.outputs()) observed[id] = true;
  // A leaf's new value is written over the leaf only by a pointwise launch (the planner's
  // choose_in_place), so an epilogue does not move into a DAG that computes one (below).
  std::vector<bool> updates(graph.size(), false);
  for (const auto& [leaf, value] : graph.updates()) observed[value] = updates[value] = true;
  // The value that `value` reshapes (through any reshapes), and whether each of those reshapes is
  // read once and not kept.
  const auto through_reshapes = [&](ValueId value) {
    bool alone = true;
    while (graph.node(value).op == op::reshape) {
      alone = alone && !observed[value] && consumers[value] == 1;
      value = graph.node(value).inputs[0];
    }
    return std::pair{value, alone};
  };
  // Whether every reader of `value`, through reshapes, is one that `accepts`, and neither the
  // value nor those reshapes are kept.
  const auto readers_all = [&](ValueId value, const auto& accepts) {
    std::vector<ValueId> values{value};
    for (size_t v = 0; v < values.size(); ++v) {
      if (observed[values[v]]) return false;
      for (ValueId reader : consumer_lists[values[v]]) {
        if (graph.node(reader).op == op::reshape)
          values.push_back(reader);
        else if (!accepts(reader))
          return false;
      }
    }
    return true;
  };

  // The consumer whose kernel computes each value, kNoValue for a value with a kernel (or no
  // kernel) of its own; following it from a value leads to the root of the DAG it belongs to.
  std::vector<ValueId> fused_into(graph.size(), kNoValue);
  const auto is_fused = [&](ValueId id) { return fused_into[id] != kNoValue; };
  const auto dag_root = [&](ValueId id) {
    while (is_fused(id)) id = fused_into[id];
    return id;
  };
  const bool fusion_enabled = !device.switches.no_fusion;
  // A reshape that only prepends unit axes to a pointwise value, which one pointwise node of the
  // reshape's shape alone reads: the value joins that node's DAG through it (a linear layer's
  // bias add over [rows, width] and the activation or residual add over [1, rows, width] that a
  // model's batch axis gives), since every element keeps its flat index and the value's own
  // inputs broadcast from the right as they would to the reshape's shape.
  const auto joins_through_unit_axes = [&](ValueId reshape) {
    const Node& node = graph.node(reshape);
    if (node.op != op::reshape || observed[reshape] || consumers[reshape] != 1 ||
        node.type.dtype != DType::f32)
      return false;
    const Shape& before = graph.type(node.inputs[0]).shape;
    const Shape& after = node.type.shape;
    if (after.size() < before.size() ||
        !std::equal(before.begin(), before.end(),
                    after.end() - static_cast<ptrdiff_t>(before.size())) ||
        std::any_of(after.begin(), after.end() - static_cast<ptrdiff_t>(before.size()),
                    [](int64_t extent) { return extent != 1; }))
      return false;
    const Node& reader = graph.node(consumer_lists[reshape].front());
    return is_pointwise_op(reader.op) && reader.type.shape == after;
  };
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      // f16 (bf16) values fuse only as their rounding into their one reader (a widening): the
      // passes that store them leave no other pointwise op on them.
      if (!is_pointwise_op(node.op) || observed[i] || consumers[i] != 1 ||
          (node.type.dtype != DType::f32 && !is_half_rounding_op(node.op))) {
        continue;
      }
      const ValueId consumer = consumer_lists[i].front();
      // A widening of an f16 (bf16) value read from memory fuses into a consumer it broadcasts into
      // (a bias): the DAG reads that input at broadcast indices and converts it there, with
      // nothing else computed again per element.
      const bool broadcast_widening =
          is_half_widening_op(node.op) && fused_into[node.inputs[0]] != static_cast<ValueId>(i);
      if (is_pointwise_op(graph.node(consumer).op) &&
          (graph.node(consumer).type.shape == node.type.shape || broadcast_widening)) {
        fused_into[i] = consumer;
      } else if (node.type.dtype == DType::f32 && joins_through_unit_axes(consumer)) {
        fused_into[i] = consumer;
        fused_into[consumer] = consumer_lists[consumer].front();
      }
    }
  }

  // A fused kernel binds every distinct input of its DAG plus its result; when a consumer would
  // exceed the device's binding limit, its largest fused producers become kernels of their own.
  std::vector<uint32_t> bound_inputs(graph.size(), 1);
  const uint32_t input_limit = std::max<uint32_t>(2, device.max_storage_buffers) - 1;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.op == op::reshape && is_fused(static_cast<ValueId>(i))) {
      bound_inputs[i] = is_fused(node.inputs[0]) ? bound_inputs[node.inputs[0]] : 1;
      continue;
    }
    if (!is_pointwise_op(node.op)) continue;
    uint32_t count = 0;
    for (ValueId input : node.inputs) count += is_fused(input) ? bound_inputs[input] : 1;
    while (count > input_limit) {
      ValueId largest = kNoValue;
      for (ValueId input : node.inputs) {
        if (is_fused(input) &&
            (largest == kNoValue || bound_inputs[input] > bound_inputs[largest])) {
          largest = input;
        }
      }
      fused_into[largest] = kNoValue;
      // A reshape keeps no launch of its own: the value it views takes one instead.
      if (graph.node(largest).op == op::reshape)
        fused_into[graph.node(largest).inputs[0]] = kNoValue;
      count = count - bound_inputs[largest] + 1;
    }
    bound_inputs[i] = count;
  }

  // Matmul epilogues: a matmul's product with one pointwise consumer of its shape is handed to
  // the DAG that consumer belongs to, which the GEMM then evaluates in its store. A DAG takes
  // one product. Split-K partial results (k_splits) take none: a chain belongs after their sum.
  std::map<ValueId, MatmulEpilogue> epilogue_of_root;
  std::vector<bool> in_epilogue(graph.size(), false);
  if (fusion_enabled && !device.switches.no_epilogue_fusion) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      if (!stores_f32_product(graph, node, device) || node.attrs.has("k_splits") || observed[i] ||
          consumers[i] != 1 || node.type.dtype != DType::f32) {
        continue;
      }
      const Node& consumer = graph.node(consumer_lists[i].front());
      if (!is_pointwise_op(consumer.op) || !(consumer.type.shape == node.type.shape)) continue;
      const ValueId root = dag_root(consumer_lists[i].front());
      if (epilogue_of_root.count(root)) continue;
      MatmulEpilogue epilogue = epilogue_for(graph, root, static_cast<ValueId>(i), fused_into,
                                             std::vector<bool>(graph.size()));
      // The GEMMs' epilogues read and write f32 only, and index inputs by the product's axes.
      if (converts_half(epilogue.dag) || epilogue.dag.through_unit_axes) continue;
      if (matmul_epilogue_bindings(graph, epilogue) > device.max_storage_buffers) continue;
      epilogue_of_root.emplace(root, std::move(epilogue));
      in_epilogue[i] = true;
    }
  }

  // An elementwise value that the graph keeps (an output, a state update) or that several nodes
  // read is computed inside the kernel of its first consumer, when that one is elementwise of its
  // shape, and written there as an extra output for the rest: Adam's moments feed the
  // parameter's update (one kernel instead of three, the moments not read back), a bias add
  // feeds its activation and the backward (of a GELU or SiLU; ReLU's reads its output). Every
  // other reader must come after the kernel that writes it. A matmul epilogue's root joins its
  // consumer's DAG the same way, the epilogue moving there (matmul + bias + GELU in one GEMM that
  // also writes the pre-activation), but a DAG that is already an epilogue takes no other; the
  // merged kernel stays within the device's storage buffers. Values are taken from the last, so
  // that a value's consumers have found their DAGs (and its root its place) before it.
  std::vector<bool> written_beside(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = graph.size(); i-- > 0;) {
      const Node& node = graph.nodes()[i];
      const ValueId id = static_cast<ValueId>(i);
      // An f16 (bf16) value joins as its rounding, which its first reader widens (the half
      // activations pass gives each reader a widening of its own): written beside in 16 bits.
      const bool rounded = is_half_rounding_op(node.op) && !consumer_lists[i].empty() &&
                           is_half_widening_op(graph.node(consumer_lists[i].front()).op);
      if (!is_pointwise_op(node.op) || (node.type.dtype != DType::f32 && !rounded) ||
          is_fused(id) || consumer_lists[i].empty()) {
        continue;
      }
      const ValueId first = consumer_lists[i].front();
      const Node& consumer = graph.node(first);
      if (!is_pointwise_op(consumer.op) || !(consumer.type.shape == node.type.shape)) continue;
      const ValueId root = dag_root(first);
      if (epilogue_of_root.count(root) != 0 ||
          !readers_follow(graph, consumer_lists, id, first, root, &fused_into)) {
        continue;
      }
      fused_into[i] = first;
      written_beside[i] =
          observed[i] || read_outside(graph, consumer_lists, fused_into, observed, id, root);
      if (auto epilogue = epilogue_of_root.find(id); epilogue != epilogue_of_root.end()) {
        const ValueId product = epilogue->second.dag.inputs[epilogue->second.product_input];
        MatmulEpilogue moved = epilogue_for(graph, root, product, fused_into, written_beside);
        const bool computes_update =
            updates[root] ||
            std::any_of(moved.dag.extra_outputs.begin(), moved.dag.extra_outputs.end(),
                        [&](const PointwiseExtraOutput& extra) { return updates[extra.value]; });
        if (!converts_half(moved.dag) && !moved.dag.through_unit_axes &&
            !sums_partials(graph, moved.dag) && !computes_update &&
            matmul_epilogue_bindings(graph, moved) <= device.max_storage_buffers) {
          epilogue_of_root.erase(epilogue);
          epilogue_of_root.emplace(root, std::move(moved));
          continue;
        }
      } else if (pointwise_bindings(graph, dag_of(graph, root, fused_into, written_beside)) <=
                 device.max_storage_buffers) {
        continue;
      }
      fused_into[i] = kNoValue;
      written_beside[i] = false;
    }
  }

  // Siblings: a pointwise DAG whose result no elementwise node of its shape reads (the SwiGLU
  // backward's gradient of the up projection, which only products read) is computed in the
  // kernel of the next DAG of its shape that reads one of its inputs or of the values it writes
  // beside (the gate's gradient, from the same incoming gradient), and written there beside that
  // DAG's result: one launch instead of two, and the shared input, a split-K sum, then has all
  // its readers in one kernel (below). Its readers must follow the later DAG; where that DAG
  // reads one of its values (a batch norm's per-channel A = rstd * weight, which the DAG of B
  // writes beside and C's reads), the merged kernel computes it once for both. Either DAG may
  // end in a rounding to f16 (products that read f16 operands: passes/half_products.cpp), which
  // the merged kernel then writes in f16.
  const auto f32_or_rounded = [&](ValueId value) {
    return graph.type(value).dtype == DType::f32 || is_half_rounding_op(graph.node(value).op);
  };
  Siblings siblings_of;
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      const ValueId id = static_cast<ValueId>(i);
      if (!is_pointwise_op(node.op) || !f32_or_rounded(id) || is_fused(id) ||
          consumer_lists[i].empty() || epilogue_of_root.count(id) != 0 ||
          siblings_of.count(id) != 0)
        continue;
      const PointwiseDag dag = dag_of(graph, id, fused_into, written_beside);
      ValueId later = kNoValue;
      std::vector<ValueId> shared = dag.inputs;
      for (const PointwiseExtraOutput& extra : dag.extra_outputs) shared.push_back(extra.value);
      for (ValueId value : shared) {
        for (ValueId reader : consumer_lists[value]) {
          if (!is_pointwise_op(graph.node(reader).op)) continue;
          const ValueId root = dag_root(reader);
          if (root > id && graph.type(root).shape == node.type.shape && f32_or_rounded(root) &&
              epilogue_of_root.count(root) == 0 && (later == kNoValue || root < later))
            later = root;
        }
      }
      if (later == kNoValue) continue;
      // The later DAG may read the earlier one's values: once merged it computes them in
      // registers (append_fused), but not a view of one, which it would read from the memory
      // that its own launch writes.
      const PointwiseDag later_dag = dag_of(graph, later, fused_into, written_beside, &siblings_of);
      const bool reads_a_view_of_it =
          std::any_of(later_dag.inputs.begin(), later_dag.inputs.end(), [&](ValueId input) {
            if (!is_view_op(graph.node(input).op)) return false;
            while (is_view_op(graph.node(input).op)) input = graph.node(input).inputs[0];
            return in_dag(fused_into, input, id);
          });
      if (reads_a_view_of_it) continue;
      fused_into[i] = later;
      // The merged kernel writes the earlier DAG's result and values where something outside it
      // reads them or the graph keeps them; one that only the later DAG read is left in registers.
      std::vector<std::pair<ValueId, bool>> was_written{{id, written_beside[i]}};
      for (const PointwiseExtraOutput& extra : dag.extra_outputs)
        was_written.emplace_back(extra.value, written_beside[extra.value]);
      for (const auto& [value, unused] : was_written)
        written_beside[value] = observed[value] || read_outside(graph, consumer_lists, fused_into,
                                                                observed, value, later);
      siblings_of[later].push_back(id);
      bool follow = readers_follow(graph, consumer_lists, id, kNoValue, later, &fused_into);
      for (const PointwiseExtraOutput& extra : dag.extra_outputs)
        follow = follow &&
                 readers_follow(graph, consumer_lists, extra.value, kNoValue, later, &fused_into);
      if (follow && pointwise_bindings(graph, dag_of(graph, later, fused_into, written_beside,
                                                     &siblings_of)) <= device.max_storage_buffers)
        continue;
      fused_into[i] = kNoValue;
      for (const auto& [value, written] : was_written) written_beside[value] = written;
      siblings_of[later].pop_back();
      if (siblings_of[later].empty()) siblings_of.erase(later);
    }
  }
  const auto dag_at = [&](ValueId root) {
    return dag_of(graph, root, fused_into, written_beside, &siblings_of);
  };

  // Split-K sums: a sum of partial results whose first reader (through reshapes) is
  // elementwise of its shape (a residual add, SwiGLU's product, the optimizer's update) is
  // summed inside that reader's kernel, which reads the partials, instead of in a launch of its
  // own before it; where the graph keeps the sum or other nodes read it too (after that kernel),
  // the kernel writes it beside its result. Not into a matmul's epilogue, which reads one
  // product. After the DAGs above have found their roots, which the other readers must follow.
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const ValueId sum = static_cast<ValueId>(i);
      if (!is_partial_sum(graph, sum) || consumer_lists[i].empty()) continue;
      std::vector<ValueId> chain{sum};  // the sum and the reshapes its first readers are
      bool shared = observed[i] || consumers[i] != 1;
      ValueId reader = consumer_lists[i].front();
      while (graph.node(reader).op == op::reshape && !consumer_lists[reader].empty()) {
        chain.push_back(reader);
        shared = shared || observed[reader] || consumers[reader] != 1;
        reader = consumer_lists[reader].front();
      }
      const Node& reader_node = graph.node(reader);
      if (!is_pointwise_op(reader_node.op) ||
          !(reader_node.type.shape == graph.type(chain.back()).shape))
        continue;
      const ValueId root = dag_root(reader);
      if (epilogue_of_root.count(root) != 0 ||
          (shared && !readers_follow(graph, consumer_lists, sum, reader, root, &fused_into)))
        continue;
      for (ValueId link : chain) fused_into[link] = reader;
      written_beside[i] =
          observed[i] || read_outside(graph, consumer_lists, fused_into, observed, sum, root);
      if (pointwise_bindings(graph, dag_at(root)) > device.max_storage_buffers) {
        for (ValueId link : chain) fused_into[link] = kNoValue;
        written_beside[i] = false;
      }
    }
  }

  // Normalisation prologues and epilogues (norm.hpp): a norm whose input (x, or a gradient's
  // grad_out) is the root of a pointwise DAG of f32 values, and the norm its first reader,
  // evaluates that DAG wherever it reads the input and writes its result where others read it
  // too (they must follow the norm, whose launch comes later than the DAG's would): a residual add
  // with the split-K sum before it, the gradient of a norm's output summed from q, k and v. A
  // norm whose result only a pointwise node of its shape reads evaluates that node's DAG as it
  // stores each element (the residual gradient added to a norm's input gradient); every other
  // input of that DAG must be computed before the norm's launch, which comes earlier than the
  // DAG's would (not by it: the prologue's result is no such input). Neither DAG takes a launch,
  // nor a barrier before it.
  std::map<ValueId, NormFusion> norm_fusion_of;
  std::vector<bool> in_norm_fusion(graph.size(), false);
  if (fusion_enabled && !device.switches.no_norm_fusion) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      const ValueId id = static_cast<ValueId>(i);
      if (!is_norm_op(node.op) || node.type.dtype != DType::f32) continue;
      NormFusion fusion;
      const ValueId input = node.inputs[norm_prologue_input(node)];
      const Node& input_node = graph.node(input);
      if (is_pointwise_op(input_node.op) && input_node.type.dtype == DType::f32 &&
          !is_fused(input) && !in_norm_fusion[input] && epilogue_of_root.count(input) == 0 &&
          consumer_lists[input].front() == id &&
          readers_follow(graph, consumer_lists, input, id, id)) {
        PointwiseDag dag = dag_at(input);
        if (dag.extra_outputs.empty()) {
          fusion.prologue_written = observed[input] || consumer_lists[input].size() > 1;
          fusion.prologue = std::move(dag);
        }
      }
      if (!observed[i] && consumers[i] == 1) {
        const ValueId reader = consumer_lists[i].front();
        const ValueId root = dag_root(reader);
        const Node& reader_node = graph.node(reader);
        // A DAG that only a reduction reads is that reduction's prologue (below), which writes
        // nothing: a normalised input's product with the gradient, summed for the weight's.
        const auto reduced = [&] {
          if (observed[root] || consumers[root] != 1) return false;
          const std::string& op = graph.node(consumer_lists[root].front()).op;
          return op == op::sum || op == op::mean || op == op::max;
        };
        // Its DAG may read f16 (bf16) values and round its result to them (half activations).
        const DType root_dtype = graph.type(root).dtype;
        if (is_pointwise_op(reader_node.op) && reader_node.type.shape == node.type.shape &&
            (root_dtype == DType::f32 || is_half_dtype(root_dtype)) &&
            epilogue_of_root.count(root) == 0 && !in_norm_fusion[root] && !reduced()) {
          PointwiseDag dag = dag_at(root);
          // Not the prologue's result, which the same launch computes.
          const bool inputs_ready =
              std::all_of(dag.inputs.begin(), dag.inputs.end(), [&](ValueId dag_input) {
                return dag_input <= id && !(fusion.prologue && dag_input == input);
              });
          if (inputs_ready) {
            fusion.epilogue_input = static_cast<size_t>(
                std::find(dag.inputs.begin(), dag.inputs.end(), id) - dag.inputs.begin());
            fusion.epilogue = std::move(dag);
          }
        }
      }
      if (!fusion.prologue && !fusion.epilogue) continue;
      if (norm_fusion_bindings(graph, id, fusion) > device.max_storage_buffers) continue;
      if (fusion.prologue) in_norm_fusion[input] = true;
      if (fusion.epilogue) in_norm_fusion[fusion.epilogue->output] = true;
      norm_fusion_of.emplace(id, std::move(fusion));
    }
  }

  // Reduction prologues: a sum, mean or max whose input (through reshapes) is the root of a
  // pointwise DAG that nothing else reads evaluates that DAG as it reads each element, so the
  // DAG's result is neither written nor read back (a batch norm's variance,
  // mean(square(x - mean)); the gradient norm's sum(square(g)); attention's max |dO|). The DAG's
  // values written beside it (a batch norm's incoming gradient, which its bias gradient and dx read
  // too) are written by the reduction, whose launch comes later than the DAG's would: their other
  // readers must follow the reduction. Where the reduction's rows are fewer than the compute units,
  // its few workgroups would read and write every element alone: then only a DAG with one input of
  // its size and nothing written beside, whose bytes the reduction would read anyway.
  std::map<ValueId, ReductionPrologue> prologue_of;
  std::vector<bool> in_prologue(graph.size(), false), in_sibling(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      // A split-K sum that a reader sums itself, or an index chain's link, is not a launch.
      const bool is_max = node.op == op::max;
      if ((node.op != op::sum && node.op != op::mean && !is_max) || node.type.dtype != DType::f32 ||
          is_fused(static_cast<ValueId>(i)) || is_partial_sum(graph, static_cast<ValueId>(i)))
        continue;
      const auto [producer, alone] = through_reshapes(node.inputs[0]);
      const Node& root = graph.node(producer);
      if (!alone || !is_pointwise_op(root.op) || root.type.dtype != DType::f32 ||
          observed[producer] || consumers[producer] != 1 || is_fused(producer) ||
          epilogue_of_root.count(producer) != 0 || in_norm_fusion[producer])
        continue;
      PointwiseDag dag = dag_at(producer);
      const int64_t count = root.type.elements();
      int64_t full_inputs = 0;
      for (ValueId input : dag.inputs) full_inputs += graph.type(input).elements() == count;
      const int64_t rows = node.type.elements();
      const bool few_rows = rows < device.compute_units;
      bool extras_follow = true;
      for (const PointwiseExtraOutput& extra : dag.extra_outputs) {
        extras_follow =
            extras_follow && readers_follow(graph, consumer_lists, extra.value, kNoValue,
                                            static_cast<ValueId>(i), &fused_into, producer);
      }
      // A max writes nothing beside (its siblings would be sums of other rows' values).
      if (!extras_follow || sums_partials(graph, dag) || dag.through_unit_axes ||
          (is_max && !dag.extra_outputs.empty()) ||
          pointwise_bindings(graph, dag) > device.max_storage_buffers ||
          (few_rows && (full_inputs > 1 || !dag.extra_outputs.empty())))
        continue;
      in_prologue[producer] = true;
      prologue_of.emplace(static_cast<ValueId>(i), ReductionPrologue{std::move(dag)});
    }
    // Siblings: a later sum or mean over the same rows of a value the prologue's DAG writes
    // beside (a batch norm's bias gradient, the sum of the gradient whose product with the
    // normalised input the prologue sums) is computed in the same launch from the value in
    // registers: that value is not read back, and one launch goes.
    const auto same_rows = [&](const Node& a, const Node& b) {
      return graph.type(a.inputs[0]).shape == graph.type(b.inputs[0]).shape &&
             a.type.shape == b.type.shape &&
             a.attrs.get_ints("axes", {}) == b.attrs.get_ints("axes", {}) &&
             a.attrs.get_int("keepdims", 0) == b.attrs.get_int("keepdims", 0);
    };
    // Whether reduction `reader`'s prologue only widens an f16 (bf16) value (the half activations
    // pass gives each reduction a widening of its own): as a sibling it reads that value
    // widened by the other prologue instead.
    const auto only_widens = [&](ValueId reader) {
      auto it = prologue_of.find(reader);
      return it != prologue_of.end() && it->second.sibling == kNoValue &&
             it->second.dag.statements.size() == 1 &&
             is_half_widening_op(it->second.dag.statements[0].op);
    };
    // The first such sum or mean reading `value` (through reshapes), or kNoValue; with
    // `widening`, `value` is a widening of an f16 value and the reader's prologue may be it.
    const auto sibling_reading = [&](ValueId value, ValueId reduction, bool widening) {
      std::vector<ValueId> readers = consumer_lists[value];
      for (size_t r = 0; r < readers.size(); ++r) {
        const ValueId reader = readers[r];
        const Node& node = graph.node(reader);
        if (node.op == op::reshape) {
          readers.insert(readers.end(), consumer_lists[reader].begin(),
                         consumer_lists[reader].end());
          continue;
        }
        if ((node.op == op::sum || node.op == op::mean) && node.type.dtype == DType::f32 &&
            reader > reduction && !is_fused(reader) && !is_partial_sum(graph, reader) &&
            (prologue_of.count(reader) == 0 || (widening && only_widens(reader))) &&
            !in_sibling[reader] && same_rows(node, graph.node(reduction)))
          return reader;
      }
      return kNoValue;
    };
    // The first such sum or mean reading a widening of f16 `value` that its own prologue
    // widens, which then reads the value widened by `reduction`'s prologue instead: its own
    // widening (still marked as in a prologue) is no launch either.
    const auto sibling_reading_widened = [&](ValueId value, ValueId reduction) {
      for (ValueId widening : consumer_lists[value]) {
        if (!is_half_widening_op(graph.node(widening).op) || observed[widening]) continue;
        const ValueId reader = sibling_reading(widening, reduction, true);
        if (reader == kNoValue) continue;
        prologue_of.erase(reader);
        return reader;
      }
      return kNoValue;
    };
    for (auto& [reduction, prologue] : prologue_of) {
      for (const PointwiseExtraOutput& extra : prologue.dag.extra_outputs) {
        const ValueId reader = is_half_dtype(graph.type(extra.value).dtype)
                                   ? sibling_reading_widened(extra.value, reduction)
                                   : sibling_reading(extra.value, reduction, false);
        if (reader == kNoValue) continue;
        prologue.sibling = reader;
        prologue.sibling_statement = extra.statement;
        in_sibling[reader] = true;
        break;
      }
      // Or one over an input the DAG reads element for element (a one-pass batch norm's mean
      // beside its mean of squares), or over its widening where it is f16 and the DAG widens it,
      // which the launch then reads once for both.
      const Shape& rows_shape = graph.type(prologue.dag.output).shape;
      for (size_t k = 0; k < prologue.dag.inputs.size() && prologue.sibling == kNoValue; ++k) {
        const ValueId input = prologue.dag.inputs[k];
        if (graph.type(input).shape != rows_shape) continue;
        if (graph.type(input).dtype == DType::f32) {
          const ValueId reader = sibling_reading(input, reduction, false);
          if (reader == kNoValue) continue;
          prologue.sibling = reader;
          prologue.sibling_statement = input_as_statement(prologue.dag, static_cast<int>(k));
          in_sibling[reader] = true;
          continue;
        }
        const auto widening_statement =
            std::find_if(prologue.dag.statements.begin(), prologue.dag.statements.end(),
                         [&](const PointwiseStatement& statement) {
                           return is_half_widening_op(statement.op) &&
                                  statement.arguments == std::vector<int>{static_cast<int>(k)};
                         });
        if (!is_half_dtype(graph.type(input).dtype) ||
            widening_statement == prologue.dag.statements.end())
          continue;
        const ValueId reader = sibling_reading_widened(input, reduction);
        if (reader == kNoValue) continue;
        prologue.sibling = reader;
        prologue.sibling_statement =
            static_cast<size_t>(widening_statement - prologue.dag.statements.begin());
        in_sibling[reader] = true;
      }
    }
  }

  // Values another launch writes beside its own result (is_companion_op): the
  // backward's log-sum-exp from its attention forward, dV and the scores' gradient beside dK,
  // the grad_out tiles beside the input tiles of a Winograd weight gradient.
  std::map<ValueId, std::vector<ValueId>> companions_of;
  std::vector<bool> written_by_producer(graph.size(), false);
  if (fusion_enabled) {
    // Only these ops hand a companion's value to their launch; the rest are not asked.
    std::vector<ValueId> producers;
    for (size_t i = 0; i < graph.size(); ++i) {
      const std::string& op = graph.nodes()[i].op;
      if (is_companion_producer_op(op)) {
        producers.push_back(static_cast<ValueId>(i));
        continue;
      }
      if (!is_companion_op(op)) continue;
      for (const ValueId producer : producers) {
        const ValueId companion = static_cast<ValueId>(i);
        if (!can_write_companion(graph, producer, companion, device)) continue;
        std::vector<ValueId>& written = companions_of[producer];
        const bool op_taken = std::any_of(written.begin(), written.end(), [&](ValueId other) {
          return graph.node(other).op == op;
        });
        if (op_taken) continue;
        written.push_back(companion);
        written_by_producer[i] = true;
        break;
      }
    }
  }

  // A split attention's join (attention_combine) whose every reader, through reshapes, is a
  // product that joins the slices itself as it loads A (joined_split_attention), and that writes
  // no log-sum-exp for a backward, needs no launch: the forward at inference.
  std::vector<bool> joined_in_products(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const ValueId combine = static_cast<ValueId>(i);
      if (graph.nodes()[i].op != op::attention_combine || companions_of.count(combine) != 0 ||
          consumer_lists[i].empty())
        continue;
      joined_in_products[i] = readers_all(combine, [&](ValueId reader) {
        return joined_split_attention(graph, graph.node(reader), device) == combine;
      });
    }
  }

  // Index chains (index_chain.cpp): a transpose or rope takes the links before it that only it
  // reads, through reshapes, transposes, one rope and a split-K sum whose partials it then reads
  // itself; a concat takes them through its last part that has such links, reading the other
  // parts from memory. From the last node, so that a chain's root is its last link.
  std::map<ValueId, std::vector<ValueId>> chain_of_root;
  std::vector<bool> in_chain(graph.size(), false);
  if (fusion_enabled) {
    // Links are transposes, ropes, reshapes and sums: never matmul epilogues or companions.
    const auto available = [&](ValueId value) {
      return !observed[value] && consumers[value] == 1 && !is_fused(value);
    };
    const auto starts_chain = [&](ValueId value) {
      return available(value) &&
             (is_index_chain_link(graph.node(value)) || is_partial_sum(graph, value));
    };
    for (size_t i = graph.size(); i-- > 0;) {
      const Node& node = graph.nodes()[i];
      const bool concat = is_index_chain_concat(node);
      if (in_chain[i] || !(is_index_chain_root(node) || concat)) continue;
      std::vector<ValueId> links;
      bool rope = node.op == op::rope;
      ValueId value = node.inputs[0];
      if (concat) {
        const auto part = std::find_if(node.inputs.rbegin(), node.inputs.rend(), starts_chain);
        if (part == node.inputs.rend()) continue;
        value = *part;
      }
      while (available(value)) {
        const Node& link = graph.node(value);
        if (is_partial_sum(graph, value)) {
          links.push_back(value);
          break;
        }
        if (!is_index_chain_link(link) || (link.op == op::rope && rope)) break;
        rope = rope || link.op == op::rope;
        links.push_back(value);
        value = link.inputs[0];
      }
      // Reshapes alone save no launch.
      if (std::none_of(links.begin(), links.end(),
                       [&](ValueId link) { return !is_view_op(graph.node(link).op); }))
        continue;
      for (ValueId link : links) in_chain[link] = true;
      std::reverse(links.begin(), links.end());
      chain_of_root.emplace(static_cast<ValueId>(i), std::move(links));
    }
  }

  // Small DAGs evaluated again where they are read (a batch norm's per-channel scale, the
  // coefficients of its gradient): a plain elementwise launch at least kInlineRatio times larger
  // that reads the result of a DAG of at most kMostInlinedElements elements and
  // kMostInlinedStatements statements (directly, or through reshapes of one shape, which then
  // broadcasts that DAG's inputs), whose inputs have its element count or one element and are not
  // all leaves (a DAG over parameters alone waits for nothing, and at inference runs once in the
  // setup), evaluates that DAG's statements at each of its elements from those inputs instead of
  // reading its result, and so no longer waits for its launch: a batch norm's normalisation then
  // waits for its statistics alone. The DAGs it reads are taken too. The small DAG keeps its
  // launch where anything else reads its value (the backward, the running statistics) and has
  // none otherwise.
  // MEGANEURA_INLINE_SMALL_DAGS=0 turns it off.
  constexpr int64_t kMostInlinedElements = 4096, kMostInlinedStatements = 32, kInlineRatio = 64;
  std::map<ValueId, std::pair<std::vector<ValueId>, Shape>> inlined_of;
  std::vector<bool> inlined_away(graph.size(), false);
  // A pointwise node that is the root of its DAG and whose launch no other decision took.
  const auto plain_root = [&](ValueId id) {
    const size_t i = static_cast<size_t>(id);
    return is_pointwise_op(graph.node(id).op) && !is_fused(id) && !in_epilogue[i] &&
           epilogue_of_root.count(id) == 0 && !written_by_producer[i] && !in_chain[i] &&
           chain_of_root.count(id) == 0 && !in_prologue[i] && !in_sibling[i] &&
           !in_norm_fusion[i] && !joined_in_products[i];
  };
  if (fusion_enabled && device.switches.inline_small_dags) {
    const auto small = [&](ValueId id) {
      const TensorType& type = graph.type(id);
      if (!plain_root(id) || type.dtype != DType::f32 || type.elements() > kMostInlinedElements)
        return false;
      const PointwiseDag dag = dag_of(graph, id, fused_into, written_beside);
      // Over leaves alone its launch waits for nothing (and at inference moves to the setup).
      const bool computed = std::any_of(dag.inputs.begin(), dag.inputs.end(), [&](ValueId input) {
        return !graph.node(input).is_leaf();
      });
      return computed && dag.statements.size() <= kMostInlinedStatements && !converts_half(dag) &&
             !dag.through_unit_axes &&
             std::all_of(dag.inputs.begin(), dag.inputs.end(), [&](ValueId input) {
               const TensorType& input_type = graph.type(input);
               return input_type.dtype == DType::f32 &&
                      (input_type.elements() == type.elements() || input_type.elements() == 1);
             });
    };
    for (size_t i = 0; i < graph.size(); ++i) {
      const ValueId root = static_cast<ValueId>(i);
      if (!plain_root(root)) continue;
      const int64_t elements = graph.type(root).elements();
      const PointwiseDag plain = dag_at(root);
      if (plain.through_unit_axes) continue;
      std::vector<ValueId> roots;
      std::optional<Shape> view;
      // The values the DAG reads, then those the DAGs it takes read (`nested`: read inside an
      // inlined DAG, at its own elements).
      std::vector<std::pair<ValueId, bool>> frontier;
      for (ValueId input : plain.inputs) frontier.emplace_back(input, false);
      for (size_t f = 0; f < frontier.size(); ++f) {
        const auto [value, nested] = frontier[f];
        const ValueId source = through_reshapes(value).first;
        if (std::find(roots.begin(), roots.end(), source) != roots.end() || !small(source) ||
            graph.type(source).elements() * kInlineRatio > elements)
          continue;
        const Shape& read_as = graph.type(value).shape;
        if (nested ? source != value || (view && element_count(*view) != element_count(read_as))
                   : view && *view != read_as)
          continue;
        if (!view) view = read_as;
        roots.push_back(source);
        for (ValueId input : dag_of(graph, source, fused_into, written_beside).inputs)
          frontier.emplace_back(input, true);
      }
      if (roots.empty()) continue;
      const PointwiseDag dag =
          dag_of(graph, root, fused_into, written_beside, &siblings_of, roots, &*view);
      // An input of the taken DAGs that the larger one also reads as it is would need two
      // broadcasts of one binding.
      const bool clash = std::any_of(dag.viewed_as.begin(), dag.viewed_as.end(), [&](auto& entry) {
        return std::find(plain.inputs.begin(), plain.inputs.end(), entry.first) !=
               plain.inputs.end();
      });
      if (clash || pointwise_bindings(graph, dag) > device.max_storage_buffers) continue;
      inlined_of.emplace(root, std::make_pair(std::move(roots), std::move(*view)));
    }
    // From the last, so that a taken DAG that reads another is decided first. A taken DAG has
    // no launch where its result and the values it writes beside are read only inside it, by
    // DAGs that take it, or by taken DAGs without launches.
    for (size_t i = graph.size(); i-- > 0;) {
      const ValueId id = static_cast<ValueId>(i);
      const auto taken_by = [&](ValueId root) {
        auto it = inlined_of.find(root);
        return it != inlined_of.end() && std::find(it->second.first.begin(), it->second.first.end(),
                                                   id) != it->second.first.end();
      };
      if (siblings_of.count(id) != 0 ||
          std::none_of(inlined_of.begin(), inlined_of.end(),
                       [&](const auto& entry) { return taken_by(entry.first); }))
        continue;
      const auto accepts = [&](ValueId reader) {
        const ValueId root = dag_root(reader);
        return in_dag(fused_into, reader, id) || taken_by(root) || inlined_away[root];
      };
      // The DAG's result and the values it writes beside.
      bool everywhere = readers_all(id, accepts);
      for (const PointwiseExtraOutput& extra :
           dag_of(graph, id, fused_into, written_beside).extra_outputs)
        everywhere = everywhere && readers_all(extra.value, accepts);
      inlined_away[i] = everywhere;
    }
  }

  // A transpose that no index chain took.
  const auto free_transpose = [&](ValueId id) {
    return graph.node(id).op == op::transpose && !in_chain[static_cast<size_t>(id)] &&
           chain_of_root.count(id) == 0;
  };
  // One of those that keeps the innermost axis in place, so that the elements it moves stay side
  // by side in rows of that axis (whole vec4s where its length is a multiple of four).
  const auto keeps_innermost = [&](ValueId id) {
    if (!free_transpose(id)) return false;
    const std::vector<int64_t>& permutation = graph.node(id).attrs.get_ints("permutation");
    return !permutation.empty() &&
           permutation.back() == static_cast<int64_t>(permutation.size()) - 1;
  };
  // Whether `reader` is elementwise over `elements` elements and in a DAG of that size that a
  // plain elementwise launch or a reduction's prologue evaluates (or, a sibling sum's widening,
  // none), which can then read its input from memory at any index (the transposed loads below).
  std::vector<bool> taken_inline(graph.size(), false);
  for (const auto& [root, taken] : inlined_of) {
    for (ValueId id : taken.first) taken_inline[static_cast<size_t>(id)] = true;
  }
  const auto read_by_plain_dag = [&](ValueId reader, int64_t elements) {
    if (!is_pointwise_op(graph.node(reader).op) || graph.type(reader).elements() != elements)
      return false;
    const ValueId root = dag_root(reader);
    const size_t r = static_cast<size_t>(root);
    if (graph.type(root).elements() != elements || taken_inline[r] || inlined_away[r]) return false;
    if (plain_root(root)) return true;
    if (!in_prologue[r]) return false;
    ValueId reduction = consumer_lists[root].front();
    while (graph.node(reduction).op == op::reshape) reduction = consumer_lists[reduction].front();
    return prologue_of.count(reduction) != 0 || in_sibling[static_cast<size_t>(reduction)];
  };
  const bool loads_through = fusion_enabled && device.switches.transposed_loads;
  // Each value that a DAG reads from a transpose's memory (through reshapes), and how.
  std::map<ValueId, TransposedRead> loaded_through;
  const auto load_views_through = [&](ValueId value, TransposedRead read) {
    std::vector<ValueId> views{value};
    for (size_t v = 0; v < views.size(); ++v) {
      loaded_through.emplace(views[v], read);
      for (ValueId reader : consumer_lists[views[v]])
        if (graph.node(reader).op == op::reshape) views.push_back(reader);
    }
  };

  // Transposed stores: an elementwise DAG whose result a transpose reads (through reshapes), one
  // that keeps_innermost (a batch norm's gradient moved to the batch's images side by side for the
  // product after it), writes the transpose's value itself, each element (in vec4s where the
  // innermost axis is a multiple of four long) where the transpose moves it: the transpose has no
  // launch, nor the barrier before it, and the values are not read back. Where other elementwise
  // DAGs read the result too (a ReLU's output, rounded to f16, moved for the next product and read
  // by the ReLU's gradient), only the moved value is stored, and they read each element where it
  // went (with the transposed loads). A product whose result the transpose alone reads does the
  // same from its GEMM's store where not only elementwise DAGs read the transpose (attention
  // projections moved head-major).
  // MEGANEURA_TRANSPOSED_STORES=0 turns it off.
  std::map<ValueId, ValueId> moved_to;
  std::vector<bool> stored_by_producer(graph.size(), false);
  if (fusion_enabled && device.switches.transposed_stores) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      const ValueId transpose = static_cast<ValueId>(i);
      if (!keeps_innermost(transpose)) continue;
      const auto [source, alone] = through_reshapes(node.inputs[0]);
      const size_t s = static_cast<size_t>(source);
      const Node& producer = graph.node(source);
      const bool product = (stores_f32_product(graph, producer, device) &&
                            !producer.attrs.has("k_splits") && !in_epilogue[s]) ||
                           epilogue_of_root.count(source) != 0;
      if (!alone || observed[s] || !(plain_root(source) || product) || inlined_away[s] ||
          moved_to.count(source) != 0 || graph.type(source).dtype != node.type.dtype)
        continue;
      const int64_t elements = graph.type(source).elements();
      const bool read_elsewhere = consumers[s] != 1;
      // A product stores the moved value where its transpose alone reads it and something other
      // than elementwise DAGs reads the transpose; elementwise readers read through it instead
      // (the transposed loads below), and the product keeps its plain store.
      if (product &&
          (read_elsewhere || (loads_through && readers_all(transpose, [&](ValueId reader) {
                                return read_by_plain_dag(reader, elements);
                              }))))
        continue;
      if (read_elsewhere && (!loads_through || !readers_all(source, [&](ValueId reader) {
            return reader == transpose || read_by_plain_dag(reader, elements);
          })))
        continue;
      moved_to.emplace(source, transpose);
      stored_by_producer[i] = true;
      if (read_elsewhere) load_views_through(source, {transpose, true});
    }
  }

  // Attention forwards fused with what is around them (AttentionForwardFusion). Over whole key
  // streams, one whose output a transpose reads, moving the heads after the queries (before the
  // output projection), writes the transpose's value itself (writes_heads_last): in place of its
  // own output where the transpose alone reads that (at inference), else beside it (a training
  // step's forward, whose output its backward reads as well): the transpose has no launch, nor
  // the barrier before it (MEGANEURA_TRANSPOSED_STORES=0 turns this off too). A forward without a
  // log-sum-exp for a backward (at inference) whose queries are an index chain's value (heads
  // apart, the rotation) computes that chain as it loads them, so it no longer waits for the
  // chain's launch, which goes where nothing else reads the queries (MEGANEURA_QUERY_CHAINS=0
  // turns this off). Not a chain that sums a projection's split-K partials: the forward's few
  // workgroups would load every partial of their queries, where the chain's own launch spreads
  // those loads over many (SmolVLA's flow steps, 50 queries a head, ran slower so).
  std::map<ValueId, AttentionForwardFusion> forward_fusion_of;
  std::vector<bool> queries_in_attention(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const ValueId forward = static_cast<ValueId>(i);
      const Node& node = graph.nodes()[i];
      if (node.op != op::scaled_dot_product_attention) continue;
      const bool writes_lse = companions_of.count(forward) != 0;
      AttentionForwardFusion fusion;
      if (device.switches.transposed_stores) {
        for (const ValueId reader : consumer_lists[i]) {
          if (!free_transpose(reader) || stored_by_producer[static_cast<size_t>(reader)] ||
              !writes_heads_last(graph, forward, reader))
            continue;
          const bool keeps_output = writes_lse || observed[i] || consumers[i] != 1;
          if (device.max_storage_buffers >= attention_bindings(writes_lse, keeps_output, false)) {
            fusion.heads_last = reader;
            fusion.keeps_output = keeps_output;
          }
          break;
        }
      }
      const ValueId queries = node.inputs[0];
      const auto chain = chain_of_root.find(queries);
      // A concat's chain reads more buffers than the two the forward binds for its queries.
      if (!writes_lse && device.switches.query_chains && chain != chain_of_root.end() &&
          !is_partial_sum(graph, chain->second.front()) &&
          !is_index_chain_concat(graph.node(queries)) &&
          device.max_storage_buffers >=
              attention_bindings(false, fusion.heads_last != kNoValue && fusion.keeps_output,
                                 true)) {
        fusion.query_chain = queries;
        fusion.query_links = chain->second;
      }
      if (fusion.heads_last == kNoValue && fusion.query_chain == kNoValue) continue;
      if (fusion.heads_last != kNoValue)
        stored_by_producer[static_cast<size_t>(fusion.heads_last)] = true;
      forward_fusion_of.emplace(forward, std::move(fusion));
    }
    // A chain whose every reader computes it has no launch.
    for (const auto& [forward, fusion] : forward_fusion_of) {
      if (fusion.query_chain == kNoValue) continue;
      queries_in_attention[static_cast<size_t>(fusion.query_chain)] =
          readers_all(fusion.query_chain, [&](ValueId reader) {
            auto it = forward_fusion_of.find(reader);
            return it != forward_fusion_of.end() && it->second.query_chain == fusion.query_chain;
          });
    }
  }

  // Transposed loads: a transpose that keeps_innermost, whose readers (through reshapes) are all
  // elementwise DAGs of its size that read_by_plain_dag (a product over the batch's images side by
  // side moved back to one image after another, which a batch norm's sums and normalisation
  // read), has no launch: those launches read the transpose's input where the transpose took each
  // element. Neither the barrier before the transpose nor the moved values' bytes are left.
  // MEGANEURA_TRANSPOSED_LOADS=0 turns it off.
  std::vector<bool> loaded_by_readers(graph.size(), false);
  if (loads_through) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const ValueId transpose = static_cast<ValueId>(i);
      if (!keeps_innermost(transpose) || stored_by_producer[i] || consumer_lists[i].empty())
        continue;
      const int64_t elements = graph.type(transpose).elements();
      if (!readers_all(transpose,
                       [&](ValueId reader) { return read_by_plain_dag(reader, elements); }))
        continue;
      loaded_by_readers[i] = true;
      load_views_through(transpose, {transpose, false});
    }
  }

  // The nodes with launches of their own, which are lowered below.
  std::vector<ValueId> lowered;
  std::vector<bool> has_launch(graph.size(), false);
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.is_leaf() || is_view_op(node.op) || is_fused(static_cast<ValueId>(i)) ||
        in_epilogue[i] || written_by_producer[i] || in_chain[i] || in_prologue[i] ||
        in_sibling[i] || in_norm_fusion[i] || joined_in_products[i] || inlined_away[i] ||
        stored_by_producer[i] || loaded_by_readers[i] || queries_in_attention[i]) {
      continue;
    }
    lowered.push_back(static_cast<ValueId>(i));
    has_launch[i] = true;
  }

  // Scatters into their target's memory: a scatter_add whose target has launches of its own and
  // no other reader (the output projection's weight gradient that an embedding tied to it
  // scatters its rows into, autodiff) has those launches write the scatter's result instead, and
  // adds its rows there: no copy of the target, whose memory goes.
  std::map<ValueId, ValueId> scattered_into;
  std::vector<bool> scatters_into_target(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      if (node.op != op::scatter_add || !has_launch[i]) continue;
      const ValueId target = node.inputs[0];
      const size_t t = static_cast<size_t>(target);
      if (has_launch[t] && !observed[t] && consumers[t] == 1 && node.inputs[1] != target &&
          node.inputs[2] != target) {
        scattered_into.emplace(target, static_cast<ValueId>(i));
        scatters_into_target[i] = true;
      }
    }
  }

  if (fused_away) {
    *fused_away = scattered_into.size() +
                  std::count_if(fused_into.begin(), fused_into.end(),
                                [](ValueId consumer) { return consumer != kNoValue; }) +
                  epilogue_of_root.size() + prologue_of.size() +
                  std::count(in_norm_fusion.begin(), in_norm_fusion.end(), true) +
                  std::count(in_sibling.begin(), in_sibling.end(), true) +
                  std::count(written_by_producer.begin(), written_by_producer.end(), true) +
                  std::count(joined_in_products.begin(), joined_in_products.end(), true) +
                  std::count(inlined_away.begin(), inlined_away.end(), true) +
                  std::count(stored_by_producer.begin(), stored_by_producer.end(), true) +
                  std::count(loaded_by_readers.begin(), loaded_by_readers.end(), true) +
                  std::count(queries_in_attention.begin(), queries_in_attention.end(), true);
    for (const auto& [root, links] : chain_of_root)
      *fused_away +=
          static_cast<size_t>(std::count_if(links.begin(), links.end(), [&](ValueId link) {
            return !is_view_op(graph.node(link).op);
          }));
  }
  // Every decision is made above; what is left, each launch's kernel source, depends on its node
  // alone, so the nodes are lowered side by side and their launches joined in graph order.
  const auto one = [](Launch launch) {
    std::vector<Launch> launches;
    launches.push_back(std::move(launch));
    return launches;
  };
  // `dag`, reading the values that live in a transpose's memory (loaded_through) from there.
  const auto loading_through = [&](PointwiseDag dag) {
    for (ValueId input : dag.inputs) {
      if (auto it = loaded_through.find(input); it != loaded_through.end())
        dag.read_through.emplace(input, it->second);
    }
    return dag;
  };
  const auto launches_of = [&](ValueId id) -> std::vector<Launch> {
    const Node& node = graph.node(id);
    if (scatters_into_target[static_cast<size_t>(id)])
      return one(scatter_add_rows_launch(graph, id, device));
    if (auto it = prologue_of.find(id); it != prologue_of.end()) {
      ReductionPrologue prologue = it->second;
      prologue.dag = loading_through(std::move(prologue.dag));
      return one(reduction_with_prologue(graph, id, prologue, device));
    }
    if (auto it = norm_fusion_of.find(id); it != norm_fusion_of.end())
      return one(norm_with_fusion(graph, id, it->second, device));
    if (auto it = chain_of_root.find(id); it != chain_of_root.end())
      return one(index_chain_launch(graph, id, it->second, device));
    if (auto it = companions_of.find(id); it != companions_of.end()) {
      const auto fused = forward_fusion_of.find(id);
      return lower_with_companions(graph, id, it->second, device,
                                   fused != forward_fusion_of.end() ? &fused->second : nullptr);
    }
    if (auto it = forward_fusion_of.find(id); it != forward_fusion_of.end())
      return lower_attention_forward(graph, id, it->second, device);
    const auto moved = moved_to.find(id);
    const ValueId moved_value = moved != moved_to.end() ? moved->second : kNoValue;
    const std::string moved_label =
        moved_value != kNoValue ? " + transpose %" + std::to_string(moved_value) : "";
    if (auto it = epilogue_of_root.find(id); it != epilogue_of_root.end()) {
      const MatmulEpilogue& epilogue = it->second;
      const ValueId product = epilogue.dag.inputs[epilogue.product_input];
      const std::string label = std::string(graph.node(product).op) + " %" +
                                std::to_string(product) + " + " + fused_label(graph, epilogue.dag) +
                                moved_label;
      return lower_matmul_with_epilogue(graph, product, &epilogue, moved_value, device, label);
    }
    if (stores_f32_product(graph, node, device) && moved_value != kNoValue)
      return lower_matmul_with_epilogue(
          graph, id, nullptr, moved_value, device,
          std::string(node.op) + " %" + std::to_string(id) + moved_label);
    if (auto it = inlined_of.find(id); it != inlined_of.end() || moved != moved_to.end()) {
      PointwiseDag dag = loading_through(
          it != inlined_of.end() ? dag_of(graph, id, fused_into, written_beside, &siblings_of,
                                          it->second.first, &it->second.second)
                                 : dag_at(id));
      std::string label = fused_label(graph, dag);
      if (moved != moved_to.end()) {
        dag.moved_to = moved->second;
        label += " + transpose %" + std::to_string(moved->second);
      }
      return one(pointwise_launch(graph, dag, device, std::move(label)));
    }
    // A DAG launch where producers fuse in, siblings join it or it reads through a transpose.
    const bool evaluates_dag =
        is_pointwise_op(node.op) &&
        (siblings_of.count(id) != 0 ||
         std::any_of(node.inputs.begin(), node.inputs.end(), [&](ValueId input) {
           return fused_into[input] == id || loaded_through.count(input) != 0;
         }));
    if (!evaluates_dag) return lower_node(graph, id, device);
    const PointwiseDag dag = loading_through(dag_at(id));
    return one(pointwise_launch(graph, dag, device, fused_label(graph, dag)));
  };
  std::vector<std::vector<Launch>> launches_by_node(lowered.size());
  std::vector<std::exception_ptr> errors(lowered.size());
  // Enough nodes a thread that starting it pays (the Fashion-MNIST programs stay on one).
  constexpr size_t kNodesPerWorker = 64;
  vulkan::parallel_for(
      lowered.size(),
      [&](size_t k) {
        try {
          launches_by_node[k] = launches_of(lowered[k]);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      },
      lowered.size() / kNodesPerWorker + 1);
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  std::vector<Launch> launches;
  for (std::vector<Launch>& node_launches : launches_by_node) {
    for (Launch& launch : node_launches) {
      for (Operand& operand : launch.operands) {
        if (auto it = scattered_into.find(operand.value); it != scattered_into.end())
          operand.value = it->second;
      }
      launches.push_back(std::move(launch));
    }
  }
  return launches;
}

}  // namespace mg::kernels
