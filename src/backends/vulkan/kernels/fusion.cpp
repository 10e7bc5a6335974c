#include "backends/vulkan/kernels/fusion.hpp"

#include <algorithm>
#include <exception>
#include <map>

#include "backends/vulkan/kernels/gemm_epilogue.hpp"
#include "backends/vulkan/kernels/pointwise.hpp"
#include "backends/vulkan/parallel_for.hpp"
#include "ir/op_names.hpp"
#include "ops/op.hpp"

namespace mg::kernels {
namespace {

// Adds node `id` and, recursively, the producers fused into it (`fused_into` names the consumer
// a value is computed in, kNoValue where it has a kernel of its own) to `dag`, those
// `written_beside` as its extra outputs; returns the argument index that refers to `id`'s result.
int append_fused(const Graph& graph, ValueId id, const std::vector<ValueId>& fused_into,
                 const std::vector<bool>& written_beside, PointwiseDag& dag,
                 std::map<ValueId, int>& argument_of) {
  if (auto it = argument_of.find(id); it != argument_of.end()) return it->second;
  const Node& node = graph.node(id);
  PointwiseStatement statement{node.op, node.attrs, {}};
  for (ValueId input : node.inputs) {
    // A sum of split partial results fused into its reader: the DAG reads the partials and
    // sums them itself (pointwise_launch: an input with more elements than the result), and
    // writes the sum beside its result where others read it (an identity statement).
    if (fused_into[input] == id && !is_pointwise_op(graph.node(input).op)) {
      ValueId sum = input;
      while (graph.node(sum).op == op::reshape) sum = graph.node(sum).inputs[0];
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
    if (fused_into[input] == id) {
      statement.arguments.push_back(
          append_fused(graph, input, fused_into, written_beside, dag, argument_of));
    } else {
      auto it = argument_of.find(input);
      if (it == argument_of.end()) {
        dag.inputs.push_back(input);
        it = argument_of.emplace(input, static_cast<int>(dag.inputs.size() - 1)).first;
      }
      statement.arguments.push_back(it->second);
    }
  }
  dag.statements.push_back(std::move(statement));
  if (written_beside[id]) dag.extra_outputs.push_back({id, dag.statements.size() - 1});
  const int reference = -static_cast<int>(dag.statements.size());
  argument_of[id] = reference;
  return reference;
}

// The pointwise DAG whose result is `root`.
PointwiseDag dag_of(const Graph& graph, ValueId root, const std::vector<ValueId>& fused_into,
                    const std::vector<bool>& written_beside) {
  PointwiseDag dag;
  dag.output = root;
  std::map<ValueId, int> argument_of;
  append_fused(graph, root, fused_into, written_beside, dag, argument_of);
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
// after `root`, the node whose launch writes it. A companion op (is_companion_op) may
// run in its producer's launch, before its own place, so it never counts as coming after.
bool readers_follow(const Graph& graph, const std::vector<std::vector<ValueId>>& consumer_lists,
                    ValueId value, ValueId first, ValueId root) {
  for (ValueId reader : consumer_lists[value]) {
    if (reader == first) continue;
    if (is_companion_op(graph.node(reader).op)) return false;
    if (is_view_op(graph.node(reader).op)) {
      if (!readers_follow(graph, consumer_lists, reader, first, root)) return false;
    } else if (reader <= root) {
      return false;
    }
  }
  return true;
}

// The most partial results a pointwise kernel sums in place of a split-K sum's launch.
constexpr int64_t kMostFusedPartials = 32;

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

// Whether `dag` rounds to or widens from f16 (fused conversions of the f16 storage pass).
bool converts_f16(const PointwiseDag& dag) {
  return std::any_of(
      dag.statements.begin(), dag.statements.end(),
      [](const PointwiseStatement& statement) { return is_f16_conversion_op(statement.op); });
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
  for (const auto& [leaf, value] : graph.updates()) observed[value] = true;

  // The consumer whose kernel computes each value, kNoValue for a value with a kernel (or no
  // kernel) of its own; following it from a value leads to the root of the DAG it belongs to.
  std::vector<ValueId> fused_into(graph.size(), kNoValue);
  const auto is_fused = [&](ValueId id) { return fused_into[id] != kNoValue; };
  const auto dag_root = [&](ValueId id) {
    while (is_fused(id)) id = fused_into[id];
    return id;
  };
  const bool fusion_enabled = !device.switches.no_fusion;
  if (fusion_enabled) {
    for (size_t i = 0; i < graph.size(); ++i) {
      const Node& node = graph.nodes()[i];
      // f16 values fuse only as round_to_f16 into their one reader (a widen_f16): the f16
      // storage pass leaves no other pointwise op on f16 values.
      if (!is_pointwise_op(node.op) || observed[i] || consumers[i] != 1 ||
          (node.type.dtype != DType::f32 && node.op != op::round_to_f16)) {
        continue;
      }
      const ValueId consumer = consumer_lists[i].front();
      // A widening of an f16 value read from memory fuses into a consumer it broadcasts into
      // (a bias): the DAG reads that input at broadcast indices and converts it there, with
      // nothing else computed again per element.
      const bool broadcast_widening =
          node.op == op::widen_f16 && fused_into[node.inputs[0]] != static_cast<ValueId>(i);
      if (is_pointwise_op(graph.node(consumer).op) &&
          (graph.node(consumer).type.shape == node.type.shape || broadcast_widening)) {
        fused_into[i] = consumer;
      }
    }
  }

  // A fused kernel binds every distinct input of its DAG plus its result; when a consumer would
  // exceed the device's binding limit, its largest fused producers become kernels of their own.
  std::vector<uint32_t> bound_inputs(graph.size(), 1);
  const uint32_t input_limit = std::max<uint32_t>(2, device.max_storage_buffers) - 1;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
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
      if (node.op != op::matmul || node.attrs.has("k_splits") || observed[i] || consumers[i] != 1 ||
          node.type.dtype != DType::f32) {
        continue;
      }
      const Node& consumer = graph.node(consumer_lists[i].front());
      if (!is_pointwise_op(consumer.op) || !(consumer.type.shape == node.type.shape)) continue;
      const ValueId root = dag_root(consumer_lists[i].front());
      if (epilogue_of_root.count(root)) continue;
      MatmulEpilogue epilogue = epilogue_for(graph, root, static_cast<ValueId>(i), fused_into,
                                             std::vector<bool>(graph.size()));
      // The GEMMs' epilogues read and write f32 only.
      if (converts_f16(epilogue.dag)) continue;
      if (matmul_epilogue_bindings(graph, epilogue) > device.max_storage_buffers) continue;
      epilogue_of_root.emplace(root, std::move(epilogue));
      in_epilogue[i] = true;
    }
  }

  // An elementwise value that the graph keeps (an output, a state update) or that several nodes
  // read is computed inside the kernel of its first consumer, when that one is elementwise of its
  // shape, and written there as an extra output for the rest: Adam's moments feed the
  // parameter's update (one kernel instead of three, the moments not read back), a bias add
  // feeds its activation and the backward. Every other reader must come after the kernel that
  // writes it. A matmul epilogue's root joins its consumer's DAG the same way, the epilogue
  // moving there (matmul + bias + ReLU in one GEMM that also writes the pre-activation), but a
  // DAG that is already an epilogue takes no other; the merged kernel stays within the device's
  // storage buffers. Values are taken from the last, so that a value's consumers have found
  // their DAGs (and its root its place) before it.
  std::vector<bool> written_beside(graph.size(), false);
  if (fusion_enabled) {
    for (size_t i = graph.size(); i-- > 0;) {
      const Node& node = graph.nodes()[i];
      const ValueId id = static_cast<ValueId>(i);
      if (!is_pointwise_op(node.op) || node.type.dtype != DType::f32 || is_fused(id) ||
          consumer_lists[i].empty()) {
        continue;
      }
      const ValueId first = consumer_lists[i].front();
      const Node& consumer = graph.node(first);
      if (!is_pointwise_op(consumer.op) || !(consumer.type.shape == node.type.shape)) continue;
      const ValueId root = dag_root(first);
      if (epilogue_of_root.count(root) != 0 ||
          !readers_follow(graph, consumer_lists, id, first, root)) {
        continue;
      }
      fused_into[i] = first;
      written_beside[i] = observed[i] || consumer_lists[i].size() > 1;
      if (auto epilogue = epilogue_of_root.find(id); epilogue != epilogue_of_root.end()) {
        const ValueId product = epilogue->second.dag.inputs[epilogue->second.product_input];
        MatmulEpilogue moved = epilogue_for(graph, root, product, fused_into, written_beside);
        if (!converts_f16(moved.dag) && !sums_partials(graph, moved.dag) &&
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
          (shared && !readers_follow(graph, consumer_lists, sum, reader, root)))
        continue;
      for (ValueId link : chain) fused_into[link] = reader;
      written_beside[i] = shared;
      if (pointwise_bindings(graph, dag_of(graph, root, fused_into, written_beside)) >
          device.max_storage_buffers) {
        for (ValueId link : chain) fused_into[link] = kNoValue;
        written_beside[i] = false;
      }
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
      ValueId producer = node.inputs[0];
      bool alone = true;
      while (graph.node(producer).op == op::reshape) {
        alone = alone && !observed[producer] && consumers[producer] == 1;
        producer = graph.node(producer).inputs[0];
      }
      const Node& root = graph.node(producer);
      if (!alone || !is_pointwise_op(root.op) || root.type.dtype != DType::f32 ||
          observed[producer] || consumers[producer] != 1 || is_fused(producer) ||
          epilogue_of_root.count(producer) != 0)
        continue;
      PointwiseDag dag = dag_of(graph, producer, fused_into, written_beside);
      const int64_t count = root.type.elements();
      int64_t full_inputs = 0;
      bool f16_input = false;
      for (ValueId input : dag.inputs) {
        full_inputs += graph.type(input).elements() == count;
        f16_input = f16_input || graph.type(input).dtype == DType::f16;
      }
      const int64_t rows = node.type.elements();
      const bool few_rows = rows < device.compute_units;
      bool extras_follow = true;
      for (const PointwiseExtraOutput& extra : dag.extra_outputs) {
        extras_follow = extras_follow && readers_follow(graph, consumer_lists, extra.value,
                                                        consumer_lists[extra.value].front(),
                                                        static_cast<ValueId>(i));
      }
      // A max writes nothing beside (its siblings would be sums of other rows' values).
      if (!extras_follow || sums_partials(graph, dag) || converts_f16(dag) || f16_input ||
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
    for (auto& [reduction, prologue] : prologue_of) {
      for (const PointwiseExtraOutput& extra : prologue.dag.extra_outputs) {
        std::vector<ValueId> readers = consumer_lists[extra.value];
        for (size_t r = 0; r < readers.size() && prologue.sibling == kNoValue; ++r) {
          const ValueId reader = readers[r];
          const Node& node = graph.node(reader);
          if (node.op == op::reshape) {
            readers.insert(readers.end(), consumer_lists[reader].begin(),
                           consumer_lists[reader].end());
            continue;
          }
          if ((node.op != op::sum && node.op != op::mean) || node.type.dtype != DType::f32 ||
              reader <= reduction || is_fused(reader) || is_partial_sum(graph, reader) ||
              prologue_of.count(reader) != 0 || in_sibling[reader] ||
              !same_rows(node, graph.node(reduction)))
            continue;
          prologue.sibling = reader;
          prologue.sibling_statement = extra.statement;
          in_sibling[reader] = true;
        }
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

  // Index chains (index_chain.cpp): a transpose or rope takes the links before it that only it
  // reads, through reshapes, transposes, one rope and a split-K sum whose partials it then reads
  // itself. From the last node, so that a chain's root is its last link.
  std::map<ValueId, std::vector<ValueId>> chain_of_root;
  std::vector<bool> in_chain(graph.size(), false);
  if (fusion_enabled) {
    // Links are transposes, ropes, reshapes and sums: never matmul epilogues or companions.
    const auto available = [&](ValueId value) {
      return !observed[value] && consumers[value] == 1 && !is_fused(value);
    };
    for (size_t i = graph.size(); i-- > 0;) {
      if (in_chain[i] || !is_index_chain_root(graph.nodes()[i])) continue;
      const Node& node = graph.nodes()[i];
      std::vector<ValueId> links;
      bool rope = node.op == op::rope;
      ValueId value = node.inputs[0];
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

  if (fused_away) {
    *fused_away = std::count_if(fused_into.begin(), fused_into.end(),
                                [](ValueId consumer) { return consumer != kNoValue; }) +
                  epilogue_of_root.size() + prologue_of.size() +
                  std::count(in_sibling.begin(), in_sibling.end(), true) +
                  std::count(written_by_producer.begin(), written_by_producer.end(), true);
    for (const auto& [root, links] : chain_of_root)
      *fused_away +=
          static_cast<size_t>(std::count_if(links.begin(), links.end(), [&](ValueId link) {
            return !is_view_op(graph.node(link).op);
          }));
  }
  // Every decision is made above; what is left, each launch's kernel source, depends on its node
  // alone, so the nodes are lowered side by side and their launches joined in graph order.
  std::vector<ValueId> lowered;
  for (size_t i = 0; i < graph.size(); ++i) {
    const Node& node = graph.nodes()[i];
    if (node.is_leaf() || is_view_op(node.op) || is_fused(static_cast<ValueId>(i)) ||
        in_epilogue[i] || written_by_producer[i] || in_chain[i] || in_prologue[i] ||
        in_sibling[i]) {
      continue;
    }
    lowered.push_back(static_cast<ValueId>(i));
  }
  const auto one = [](Launch launch) {
    std::vector<Launch> launches;
    launches.push_back(std::move(launch));
    return launches;
  };
  const auto launches_of = [&](ValueId id) -> std::vector<Launch> {
    const Node& node = graph.node(id);
    if (auto it = prologue_of.find(id); it != prologue_of.end())
      return one(reduction_with_prologue(graph, id, it->second, device));
    if (auto it = chain_of_root.find(id); it != chain_of_root.end())
      return one(index_chain_launch(graph, id, it->second, device));
    if (auto it = companions_of.find(id); it != companions_of.end())
      return lower_with_companions(graph, id, it->second, device);
    if (auto it = epilogue_of_root.find(id); it != epilogue_of_root.end()) {
      const MatmulEpilogue& epilogue = it->second;
      const ValueId product = epilogue.dag.inputs[epilogue.product_input];
      const std::string label =
          "matmul %" + std::to_string(product) + " + " + fused_label(graph, epilogue.dag);
      return lower_matmul_with_epilogue(graph, product, epilogue, device, label);
    }
    const bool has_fused_producer =
        is_pointwise_op(node.op) &&
        std::any_of(node.inputs.begin(), node.inputs.end(),
                    [&](ValueId input) { return fused_into[input] == id; });
    if (!has_fused_producer) return lower_node(graph, id, device);
    const PointwiseDag dag = dag_of(graph, id, fused_into, written_beside);
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
    for (Launch& launch : node_launches) launches.push_back(std::move(launch));
  }
  return launches;
}

}  // namespace mg::kernels
