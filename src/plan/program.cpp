#include "plan/program.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>

#include "ir/op_names.hpp"
#include "ops/op.hpp"
#include "passes/passes.hpp"

namespace mg::plan {
namespace {

// Training batch norms with at least this many elements a channel are decomposed
// (passes::decompose_batch_norm), a bound chosen rather than tuned: a short channel leaves the
// norm kernel's one workgroup little to walk, and the decomposition adds launches.
constexpr int64_t kDecomposedBatchNormElements = 8192;

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Values sharing another value's bytes: views (reshape, stop_gradient) and in-place results.
using AliasMap = std::unordered_map<ValueId, ValueId>;

ValueId storage_root(const Graph& graph, const AliasMap& in_place, ValueId id) {
  while (true) {
    if (is_view_op(graph.node(id).op)) {
      id = graph.node(id).inputs[0];
    } else if (auto it = in_place.find(id); it != in_place.end()) {
      id = it->second;
    } else {
      return id;
    }
  }
}

// A pointwise launch may write its result over an input of the same shape that nothing reads
// afterwards: each invocation reads element i of that input before writing element i. Not over
// a leaf or a setup result (`set_up`, by storage root), which the next run reads again.
AliasMap choose_in_place(const Graph& graph, const std::vector<PlannedLaunch>& launches,
                         const std::vector<bool>& set_up) {
  const int64_t end = static_cast<int64_t>(launches.size());
  std::vector<int64_t> last_use(graph.size(), -1);
  for (int64_t t = 0; t < end; ++t) {
    for (const target::Operand& operand : launches[t].launch.operands) {
      last_use[operand.value] = std::max(last_use[operand.value], t);
    }
  }
  for (const auto& [name, id] : graph.outputs()) last_use[id] = end;
  for (const auto& [leaf, value] : graph.updates()) last_use[leaf] = last_use[value] = end;
  for (size_t i = graph.size(); i-- > 0;) {  // a view keeps its source alive
    const Node& node = graph.nodes()[i];
    if (is_view_op(node.op)) {
      last_use[node.inputs[0]] = std::max(last_use[node.inputs[0]], last_use[i]);
    }
  }
  AliasMap in_place;
  // A leaf's new value (Graph::assign) is written over the leaf itself when a pointwise launch
  // computes it after the last read of the old value: no transient copy of every parameter and
  // optimizer moment lives through the run, and no copy follows it.
  std::vector<int64_t> last_leaf_read(graph.size(), -1);
  std::vector<int64_t> producer(graph.size(), -1);
  for (int64_t t = 0; t < end; ++t) {
    for (const target::Operand& operand : launches[t].launch.operands) {
      const ValueId root = storage_root(graph, {}, operand.value);
      if (operand.write) {
        producer[operand.value] = t;
      } else {
        last_leaf_read[root] = std::max(last_leaf_read[root], t);
      }
    }
  }
  for (const auto& [leaf, value] : graph.updates()) {
    const int64_t t = producer[value];
    if (t < 0 || launches[t].launch.kernel != "pointwise" || last_leaf_read[leaf] > t ||
        !(graph.type(leaf) == graph.type(value)) || set_up[leaf] || in_place.count(value)) {
      continue;
    }
    in_place[value] = leaf;
    last_leaf_read[leaf] = end;  // one new value a leaf
  }
  for (int64_t t = 0; t < end; ++t) {
    const target::Launch& launch = launches[t].launch;
    if (launch.kernel != "pointwise") continue;
    const ValueId result = launch.operands.back().value;
    if (in_place.count(result)) continue;
    for (size_t k = 0; k + 1 < launch.operands.size(); ++k) {
      const ValueId candidate = launch.operands[k].value;
      const ValueId root = storage_root(graph, in_place, candidate);
      // A value the launch writes beside its result (an extra output) is no input to take over,
      // even where nothing reads it later: both would be stored at the same addresses.
      if (launch.operands[k].write || graph.node(root).is_leaf() || set_up[root] ||
          last_use[candidate] != t || !(graph.type(candidate) == graph.type(result))) {
        continue;
      }
      in_place[result] = candidate;
      break;
    }
  }
  return in_place;
}

bool is_persistent_leaf(const Node& node) {
  return node.op == op::parameter || node.op == op::state || node.op == op::constant;
}

struct Interval {
  ValueId value = kNoValue;
  uint64_t bytes = 0;
  int64_t first = 0, last = 0;  // epochs or launch indices, inclusive
};

// Greedy by size: largest values first, each at the lowest offset of the first arena where it
// overlaps no placed value whose lifetime intersects its own.
void place_transients(std::vector<Interval> intervals, const PlanOptions& options,
                      Program& program) {
  std::stable_sort(intervals.begin(), intervals.end(),
                   [](const Interval& a, const Interval& b) { return a.bytes > b.bytes; });
  struct Placed {
    uint64_t offset, bytes;
    int64_t first, last;
  };
  const auto by_range = [](const Placed& a, const Placed& b) {
    return std::pair(a.offset, a.offset + a.bytes) < std::pair(b.offset, b.offset + b.bytes);
  };
  std::vector<std::vector<Placed>> arenas;
  std::vector<uint32_t> arena_index;
  for (Interval interval : intervals) {
    const uint64_t value_bytes = interval.bytes;
    interval.bytes += options.guard_bytes;
    if (interval.bytes > options.arena_limit) {
      throw Error("value %" + std::to_string(interval.value) + " of type " +
                  type_string(program.graph.type(interval.value)) + " needs " +
                  std::to_string(interval.bytes) + " bytes, more than the device's " +
                  std::to_string(options.arena_limit) + "-byte buffer limit");
    }
    bool placed = false;
    for (size_t a = 0; a < arenas.size() && !placed; ++a) {
      // Lowest first fit among the values live at the same time, visited by their byte ranges
      // in order (each arena's list is kept sorted by them).
      uint64_t candidate = 0;
      for (const Placed& other : arenas[a]) {
        const bool overlaps_in_time =
            !options.reuse_memory || !(other.last < interval.first || interval.last < other.first);
        if (!overlaps_in_time) continue;
        if (candidate + interval.bytes <= other.offset) break;
        candidate = std::max(candidate, align_up(other.offset + other.bytes, options.alignment));
      }
      if (candidate + interval.bytes <= options.arena_limit) {
        const Placed value{candidate, interval.bytes, interval.first, interval.last};
        arenas[a].insert(std::upper_bound(arenas[a].begin(), arenas[a].end(), value, by_range),
                         value);
        program.regions[interval.value] = {arena_index[a], candidate, value_bytes};
        placed = true;
      }
    }
    if (!placed) {
      arena_index.push_back(static_cast<uint32_t>(program.arenas.size()));
      program.arenas.push_back({ArenaKind::transient, 0});
      arenas.push_back({{0, interval.bytes, interval.first, interval.last}});
      program.regions[interval.value] = {arena_index.back(), 0, value_bytes};
    }
  }
  for (size_t a = 0; a < arenas.size(); ++a) {
    uint64_t end = 0;
    for (const Placed& placed : arenas[a]) end = std::max(end, placed.offset + placed.bytes);
    program.arenas[arena_index[a]].bytes = align_up(std::max<uint64_t>(end, 4), options.alignment);
    program.memory.physical_transient_bytes += program.arenas[arena_index[a]].bytes;
  }
  // Peak: the largest total of values live at one launch (one epoch, where scheduled).
  int64_t launches = 0;
  for (const Interval& interval : intervals) launches = std::max(launches, interval.last + 1);
  // Changes of the live total at each launch, summed in order (unsigned arithmetic wraps back).
  std::vector<uint64_t> change(static_cast<size_t>(launches) + 1, 0);
  for (const Interval& interval : intervals) {
    change[interval.first] += interval.bytes;
    change[interval.last + 1] -= interval.bytes;
  }
  uint64_t live = 0;
  for (uint64_t delta : change) {
    live += delta;
    program.memory.peak_live_bytes = std::max(program.memory.peak_live_bytes, live);
  }
}

void place_persistent(const std::vector<ValueId>& values, const PlanOptions& options,
                      Program& program) {
  uint32_t arena = 0;
  bool open = false;
  if (options.leaf_layout) {
    for (uint64_t bytes : options.leaf_layout->arena_bytes)
      program.arenas.push_back({ArenaKind::persistent, bytes});
  }
  for (ValueId value : values) {
    const uint64_t bytes = std::max<uint64_t>(program.graph.type(value).bytes(), 4);
    const Node& node = program.graph.node(value);
    const bool leaf = node.op == op::parameter || node.op == op::state;
    if (options.shared_leaves && leaf) {
      program.regions[value] = {static_cast<uint32_t>(program.arenas.size()), 0, bytes};
      program.arenas.push_back({ArenaKind::shared, bytes, node.name});
      program.memory.shared_bytes += bytes;
      continue;
    }
    if (options.leaf_layout && leaf) {
      const auto it = options.leaf_layout->regions.find(node.name);
      if (it == options.leaf_layout->regions.end() || it->second.bytes != bytes)
        throw Error("internal: leaf '" + node.name + "' is not where the leaf layout puts it");
      program.regions[value] = it->second;
      program.memory.persistent_bytes += bytes;
      continue;
    }
    const uint64_t footprint = bytes + options.guard_bytes;
    if (!open || align_up(program.arenas[arena].bytes, options.alignment) + footprint >
                     options.arena_limit) {
      arena = static_cast<uint32_t>(program.arenas.size());
      program.arenas.push_back({ArenaKind::persistent, 0});
      open = true;
    }
    const uint64_t offset = align_up(program.arenas[arena].bytes, options.alignment);
    program.regions[value] = {arena, offset, bytes};
    program.arenas[arena].bytes = offset + footprint;
    program.memory.persistent_bytes += bytes;
  }
}

bool ranges_overlap(const Region& a, const Region& b) {
  return a.arena == b.arena && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// Whether `later` must wait for `earlier`: both touch overlapping bytes and one of them writes
// them (read-after-write, write-after-read, write-after-write).
bool has_hazard(const PlannedLaunch& earlier, const PlannedLaunch& later) {
  for (size_t e = 0; e < earlier.regions.size(); ++e) {
    for (size_t l = 0; l < later.regions.size(); ++l) {
      if ((earlier.launch.operands[e].write || later.launch.operands[l].write) &&
          ranges_overlap(earlier.regions[e], later.regions[l]))
        return true;
    }
  }
  return false;
}

// Barriers in lowering order: one before every launch with a hazard on a launch since the last
// barrier.
void place_barriers_in_order(Program& program) {
  size_t epoch_start = 0;
  for (size_t i = 0; i < program.launches.size(); ++i) {
    for (size_t j = epoch_start; j < i; ++j) {
      if (has_hazard(program.launches[j], program.launches[i])) {
        program.launches[i].barrier_before = true;
        ++program.memory.barriers;
        epoch_start = i;
        break;
      }
    }
  }
}

// Moves the launches that read only fixed values to program.setup (PlanOptions::setup) and
// returns, by storage root, the values they write. Fixed are constants, parameters and state
// that no assignment of the graph writes, and what setup launches write. A launch joins the
// setup only if it reads something and every value it writes has no other writer (an
// accumulation into a buffer that another launch clears must run every time).
std::vector<bool> move_fixed_launches_to_setup(Program& program) {
  const Graph& graph = program.graph;
  std::vector<bool> fixed(graph.size(), false);
  for (size_t i = 0; i < graph.size(); ++i) fixed[i] = is_persistent_leaf(graph.nodes()[i]);
  for (const auto& [leaf, value] : graph.updates()) fixed[leaf] = false;
  std::vector<int> writers(graph.size(), 0);
  for (const PlannedLaunch& planned : program.launches) {
    for (const target::Operand& operand : planned.launch.operands)
      if (operand.write) ++writers[storage_root(graph, {}, operand.value)];
  }
  std::vector<bool> set_up(graph.size(), false);
  std::vector<PlannedLaunch> every_run;
  for (PlannedLaunch& planned : program.launches) {
    bool reads = false, reads_fixed_only = true, sole_writer = true;
    for (const target::Operand& operand : planned.launch.operands) {
      const ValueId root = storage_root(graph, {}, operand.value);
      if (operand.write) {
        sole_writer = sole_writer && writers[root] == 1 && !graph.node(root).is_leaf();
      } else {
        reads = true;
        reads_fixed_only = reads_fixed_only && fixed[root];
      }
    }
    if (!reads || !reads_fixed_only || !sole_writer) {
      every_run.push_back(std::move(planned));
      continue;
    }
    for (const target::Operand& operand : planned.launch.operands) {
      if (!operand.write) continue;
      const ValueId root = storage_root(graph, {}, operand.value);
      fixed[root] = set_up[root] = true;
      program.setup_results.push_back(root);
    }
    planned.barrier_before = !program.setup.empty();
    program.setup.push_back(std::move(planned));
  }
  program.launches = std::move(every_run);
  return set_up;
}

// The epoch of each launch. A launch must follow every earlier launch (in the lowering's order)
// that wrote a value it reads or writes, and every earlier one that read a value it writes (values
// by storage root, so a view or an in-place result is its source); within that, the epochs are as
// few as the longest chain of such hazards needs. Work that the lowering emitted between
// dependent launches but that depends on neither (the optimizer's update of every parameter,
// each of which waited on the one before; the weight gradients beside the data gradients) then
// shares an epoch. A launch that could run in several epochs takes the earliest where it frees
// at least the transient bytes it writes (an update that consumes a gradient), else the latest
// (columns or a recomputed norm made just before their reader, not through the whole forward).
// The transients are placed by these epochs afterwards, so bytes that two values share never
// order launches that the values themselves do not.
std::vector<int64_t> value_epochs(const Graph& graph, const AliasMap& in_place,
                                  const std::vector<bool>& set_up,
                                  const std::vector<PlannedLaunch>& launches) {
  const size_t count = launches.size();
  std::vector<std::vector<ValueId>> roots(count);
  std::vector<int64_t> last_use(graph.size(), -1);
  for (size_t t = 0; t < count; ++t) {
    for (const target::Operand& operand : launches[t].launch.operands) {
      roots[t].push_back(storage_root(graph, in_place, operand.value));
      last_use[roots[t].back()] = static_cast<int64_t>(t);
    }
  }
  for (const auto& [name, id] : graph.outputs())
    last_use[storage_root(graph, in_place, id)] = static_cast<int64_t>(count);
  for (const auto& [leaf, value] : graph.updates())
    last_use[storage_root(graph, in_place, value)] = static_cast<int64_t>(count);
  const auto transient_bytes = [&](ValueId root) -> uint64_t {
    if (is_persistent_leaf(graph.node(root)) || set_up[root]) return 0;
    return graph.type(root).bytes();
  };

  // The earliest epochs, forwards over the hazards.
  std::vector<int64_t> last_write(graph.size(), -1), last_read(graph.size(), -1);
  std::vector<int64_t> chosen(count, 0);
  int64_t epochs = 0;
  for (size_t t = 0; t < count; ++t) {
    for (size_t k = 0; k < roots[t].size(); ++k) {
      chosen[t] = std::max(chosen[t], last_write[roots[t][k]] + 1);
      if (launches[t].launch.operands[k].write)
        chosen[t] = std::max(chosen[t], last_read[roots[t][k]] + 1);
    }
    for (size_t k = 0; k < roots[t].size(); ++k) {
      int64_t& last =
          launches[t].launch.operands[k].write ? last_write[roots[t][k]] : last_read[roots[t][k]];
      last = std::max(last, chosen[t]);
    }
    epochs = std::max(epochs, chosen[t] + 1);
  }

  // Backwards, each launch that writes more transient bytes than it frees moves to the latest
  // epoch before the chosen epochs of the later launches that must follow it: those that write a
  // value it touches, and those that read a value it writes. The others keep the earliest.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> next_write(graph.size(), kNone), next_read(graph.size(), kNone);
  for (size_t t = count; t-- > 0;) {
    uint64_t written = 0, freed = 0;
    int64_t latest = epochs - 1;
    for (size_t k = 0; k < roots[t].size(); ++k) {
      const ValueId root = roots[t][k];
      const bool write = launches[t].launch.operands[k].write;
      if (write)
        written += transient_bytes(root);
      else if (last_use[root] == static_cast<int64_t>(t))
        freed += transient_bytes(root);
      if (next_write[root] != kNone) latest = std::min(latest, next_write[root] - 1);
      if (write && next_read[root] != kNone) latest = std::min(latest, next_read[root] - 1);
    }
    if (written > freed) chosen[t] = latest;
    for (size_t k = 0; k < roots[t].size(); ++k) {
      int64_t& next =
          launches[t].launch.operands[k].write ? next_write[roots[t][k]] : next_read[roots[t][k]];
      next = std::min(next, chosen[t]);
    }
  }
  return chosen;
}

// Orders the launches by epoch (the lowering's order within one) with a barrier between epochs.
void order_by_epochs(Program& program, const std::vector<int64_t>& epochs) {
  const size_t count = program.launches.size();
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return epochs[a] < epochs[b]; });
  std::vector<PlannedLaunch> scheduled;
  scheduled.reserve(count);
  for (size_t k = 0; k < count; ++k) {
    scheduled.push_back(std::move(program.launches[order[k]]));
    scheduled.back().barrier_before = k > 0 && epochs[order[k]] != epochs[order[k - 1]];
    if (scheduled.back().barrier_before) ++program.memory.barriers;
  }
  program.launches = std::move(scheduled);
}

}  // namespace

uint64_t column_limit_for(uint64_t arena_limit, uint64_t device_memory) {
  const uint64_t floor = std::min<uint64_t>(arena_limit / 4, uint64_t{256} << 20);
  return std::max(floor, std::min(arena_limit / 2, device_memory / 64));
}

LeafLayout layout_leaves(const Graph& graph, const PlanOptions& options) {
  LeafLayout layout;
  for (const Node& node : graph.nodes()) {
    if (node.op != op::parameter && node.op != op::state) continue;
    const uint64_t bytes = std::max<uint64_t>(node.type.bytes(), 4);
    if (layout.arena_bytes.empty() ||
        align_up(layout.arena_bytes.back(), options.alignment) + bytes > options.arena_limit)
      layout.arena_bytes.push_back(0);
    const uint64_t offset = align_up(layout.arena_bytes.back(), options.alignment);
    layout.regions[node.name] = {static_cast<uint32_t>(layout.arena_bytes.size() - 1), offset,
                                 bytes};
    layout.arena_bytes.back() = offset + bytes;
  }
  return layout;
}

Program build_program(const Graph& source, const target::Target& device,
                      const PlanOptions& options) {
  if (options.leaf_layout && (options.shared_leaves || options.guard_bytes > 0))
    throw Error("internal: a leaf layout with shared leaves or guard bytes");
  Program program;
  program.graph_nodes_before_passes = source.size();
  program.graph = passes::half_storage(passes::optimize(source), device);
  const Switches& switches = device.switches();
  const bool split_k = switches.split_k.value_or(options.split_k);
  const bool im2col = switches.im2col.value_or(options.im2col);
  if (im2col)
    program.graph =
        passes::im2col_convolutions(std::move(program.graph), device, options.column_limit);
  // Heads that are not whole fragments would take the strict attention kernels.
  if (switches.attention_pad_heads.value_or(true))
    program.graph =
        passes::pad_attention_heads(std::move(program.graph), device.attention_head_multiple());
  // The cooperative-matrix attention backward rounds dO and dS to f16 (also in bf16 precision),
  // which the gradients of an untrained model leave below f16's range.
  if (switches.attention_grad_scale.value_or(device.cooperative_matrices()))
    program.graph = passes::scale_attention_gradients(
        std::move(program.graph), [&device](const Graph& graph, const Node& node) {
          return device.attention_gradient_scales_itself(graph, node);
        });
  const bool dq_gemm = switches.attention_dq_gemm.value_or(options.attention_dq_gemm &&
                                                           !device.cooperative_matrices());
  // W is one transient value: at most a quarter of an arena, and 256 MiB.
  if (dq_gemm)
    program.graph = passes::attention_grad_q_gemm(
        std::move(program.graph), std::min<uint64_t>(options.arena_limit / 4, uint64_t{256} << 20));
  // Before split-K, which would otherwise split the products the workgroup GEMM takes whole.
  program.graph = passes::workgroup_gemm(std::move(program.graph), device);
  const target::DeviceTraits& traits = device.traits();
  // Products of operands stored in f16 where storing them so costs nothing; before split-K, which
  // splits half_matmuls as it splits matmuls.
  if (switches.half_products.value_or(true) && traits.fast_precision && traits.f16_tensors &&
      device.cooperative_matrices())
    program.graph = passes::half_products(std::move(program.graph), device,
                                          traits.bf16_operands ? DType::bf16 : DType::f16);
  // These rewrites trade dispatches for parallelism, which GPUs need and CPU devices do not.
  // The one-pass variance trades rounding for a pass over x, as fast precision's products do.
  const bool one_pass_variance =
      switches.one_pass_variance.value_or(device.traits().fast_precision);
  if (split_k)
    program.graph = passes::split_reductions(passes::merge_leading_sums(passes::split_k(
        passes::decompose_batch_norm(std::move(program.graph), kDecomposedBatchNormElements,
                                     one_pass_variance),
        device)));
  // The same trade for attention; forcing a slice count or head splits (sweeps, tests) applies
  // on any device.
  if (split_k || !switches.attention_splits.empty() ||
      switches.attention_head_splits.value_or(false))
    program.graph = passes::split_attention(std::move(program.graph), device);
  // Activations in 16 bits where products already take 16-bit operands, as mixed precision
  // stores them: f16 in fast precision, bfloat16 (f32's range) in bf16 precision; forced on,
  // wherever the device stores 16-bit tensors.
  using HalfActivations = Switches::HalfActivations;
  const HalfActivations half_activations = switches.half_activations.value_or(
      traits.fast_precision && device.cooperative_matrices() ? HalfActivations::on
                                                             : HalfActivations::off);
  if (half_activations != HalfActivations::off && traits.f16_tensors)
    program.graph = passes::half_activations(
        std::move(program.graph), device,
        half_activations == HalfActivations::bf16 || traits.bf16_operands ? DType::bf16
                                                                          : DType::f16);
  verify(program.graph);
  const Graph& graph = program.graph;

  for (target::Launch& launch : device.lower(graph, &program.dispatches_saved_by_fusion)) {
    program.launches.push_back({std::move(launch), {}, false});
  }
  const bool setup = switches.setup.value_or(options.setup);
  const std::vector<bool> set_up =
      setup ? move_fixed_launches_to_setup(program) : std::vector<bool>(graph.size(), false);

  const AliasMap in_place =
      options.reuse_memory ? choose_in_place(graph, program.launches, set_up) : AliasMap{};
  // Lifetimes of storage roots over the epochs where launches are scheduled into them, else over
  // the launch sequence; -1 is "before the first" (host uploads), `end` "after the last"
  // (downloads and assignments).
  const bool scheduled = switches.schedule_epochs.value_or(options.schedule_epochs);
  std::vector<int64_t> epochs;
  if (scheduled) epochs = value_epochs(graph, in_place, set_up, program.launches);
  const int64_t end =
      scheduled ? (epochs.empty() ? 0 : *std::max_element(epochs.begin(), epochs.end()) + 1)
                : static_cast<int64_t>(program.launches.size());
  std::unordered_map<ValueId, Interval> lifetimes;
  std::vector<ValueId> persistent;
  std::vector<bool> is_listed_persistent(graph.size(), false);
  std::unordered_map<ValueId, uint64_t> logical_values;  // every stored value as if unshared
  auto touch = [&](ValueId value, int64_t when) {
    const ValueId own = storage_root(graph, {}, value);
    if (!is_persistent_leaf(graph.node(own)) && !set_up[own]) {
      logical_values[own] = align_up(std::max<uint64_t>(graph.type(own).bytes(), 4), 4);
    }
    const ValueId root = storage_root(graph, in_place, value);
    const Node& node = graph.node(root);
    if (set_up[root]) return;  // placed with the persistent values below
    if (is_persistent_leaf(node)) {
      if (!is_listed_persistent[root]) {
        is_listed_persistent[root] = true;
        persistent.push_back(root);
      }
      return;
    }
    auto [it, inserted] = lifetimes.try_emplace(root);
    Interval& interval = it->second;
    if (inserted) {
      interval.value = root;
      interval.bytes = align_up(std::max<uint64_t>(node.type.bytes(), 4), 4);
      interval.first = node.op == op::input ? -1 : when;
      interval.last = when;
    }
    interval.first = std::min(interval.first, when);
    interval.last = std::max(interval.last, when);
  };
  for (const PlannedLaunch& planned : program.setup) {
    for (const target::Operand& operand : planned.launch.operands) touch(operand.value, -1);
  }
  for (size_t t = 0; t < program.launches.size(); ++t) {
    for (const target::Operand& operand : program.launches[t].launch.operands)
      touch(operand.value, scheduled ? epochs[t] : static_cast<int64_t>(t));
  }
  for (const auto& [name, id] : graph.outputs()) touch(id, end);
  for (const auto& [leaf, value] : graph.updates()) {
    touch(leaf, end);
    touch(value, end);
  }
  for (ValueId input : graph.leaves(op::input)) {
    if (lifetimes.count(input)) program.inputs.push_back(input);
  }

  for (const auto& [value, bytes] : logical_values) program.memory.logical_transient_bytes += bytes;
  std::vector<Interval> intervals;
  for (auto& [root, interval] : lifetimes) {
    interval.first += 1;  // shift so that "before the first launch" is 0
    interval.last += 1;
    intervals.push_back(interval);
  }
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.value < b.value; });
  std::sort(persistent.begin(), persistent.end());
  program.persistent = persistent;
  persistent.insert(persistent.end(), program.setup_results.begin(), program.setup_results.end());
  place_persistent(persistent, options, program);
  place_transients(std::move(intervals), options, program);

  for (size_t i = 0; i < graph.size(); ++i) {
    const ValueId root = storage_root(graph, in_place, static_cast<ValueId>(i));
    auto it = program.regions.find(root);
    if (it != program.regions.end() && root != static_cast<ValueId>(i)) {
      program.regions[static_cast<ValueId>(i)] = it->second;
    }
  }
  for (std::vector<PlannedLaunch>* launches : {&program.setup, &program.launches}) {
    for (PlannedLaunch& planned : *launches) {
      for (const target::Operand& operand : planned.launch.operands) {
        planned.regions.push_back(program.regions.at(operand.value));
      }
    }
  }
  if (scheduled) {
    order_by_epochs(program, epochs);
  } else {
    place_barriers_in_order(program);
  }
  return program;
}

std::optional<size_t> last_writer(const Program& program, ValueId value) {
  const auto region = program.regions.find(value);
  if (region == program.regions.end()) return std::nullopt;
  for (size_t t = program.launches.size(); t-- > 0;) {
    const PlannedLaunch& planned = program.launches[t];
    for (size_t k = 0; k < planned.regions.size(); ++k) {
      if (planned.launch.operands[k].write && ranges_overlap(planned.regions[k], region->second))
        return t;
    }
  }
  return std::nullopt;
}

std::vector<bool> barriers_of_part(const std::vector<PlannedLaunch>& launches,
                                   const std::vector<bool>& chosen) {
  std::vector<bool> barriers(launches.size(), false);
  bool any_chosen = false, separated = false;
  for (size_t i = 0; i < launches.size(); ++i) {
    separated = separated || launches[i].barrier_before;
    if (!chosen[i]) continue;
    barriers[i] = any_chosen && separated;
    any_chosen = true;
    separated = false;
  }
  return barriers;
}

std::string describe_memory(const Program& program) {
  auto mib = [](uint64_t bytes) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.3f MiB", static_cast<double>(bytes) / (1 << 20));
    return std::string(buffer);
  };
  const MemoryStats& memory = program.memory;
  std::string text;
  text += "nodes: " + std::to_string(program.graph_nodes_before_passes) + " before passes, " +
          std::to_string(program.graph.size()) + " after\n";
  text += "dispatches: " + std::to_string(program.launches.size()) + " (" +
          std::to_string(program.launches.size() + program.setup.size() +
                         program.dispatches_saved_by_fusion) +
          " before fusion), barriers: " + std::to_string(memory.barriers) + "\n";
  if (!program.setup.empty())
    text += "setup dispatches: " + std::to_string(program.setup.size()) +
            " (run once, and again after a parameter or state is written)\n";
  text += "persistent: " + mib(memory.persistent_bytes) + "\n";
  if (memory.shared_bytes > 0)
    text += "shared with other programs: " + mib(memory.shared_bytes) + "\n";
  text += "transient logical: " + mib(memory.logical_transient_bytes) + "\n";
  text += "transient physical: " + mib(memory.physical_transient_bytes);
  if (memory.logical_transient_bytes > 0) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), " (%.1f%% below logical)",
                  100.0 * (1.0 - static_cast<double>(memory.physical_transient_bytes) /
                                     static_cast<double>(memory.logical_transient_bytes)));
    text += buffer;
  }
  text += "\ntransient peak live: " + mib(memory.peak_live_bytes) + "\n";
  for (size_t a = 0; a < program.arenas.size(); ++a) {
    const Arena& arena = program.arenas[a];
    if (arena.kind == ArenaKind::shared) continue;
    text += "arena " + std::to_string(a) + ": " +
            (arena.kind == ArenaKind::persistent ? "persistent " : "transient  ") +
            mib(arena.bytes) + "\n";
  }
  return text;
}

std::string describe_dispatches(const Program& program) {
  const auto list = [](const std::vector<PlannedLaunch>& launches) {
    std::string text = "   #  kernel                    grid         label (* after a barrier)\n";
    for (size_t t = 0; t < launches.size(); ++t) {
      const PlannedLaunch& planned = launches[t];
      const std::array<uint32_t, 3>& groups = planned.launch.groups;
      char grid[40], line[160];
      std::snprintf(grid, sizeof(grid), "%ux%ux%u", groups[0], groups[1], groups[2]);
      std::snprintf(line, sizeof(line), "%4zu %c%-24s  %-11s  ", t,
                    planned.barrier_before ? '*' : ' ', planned.launch.kernel.c_str(), grid);
      text += line + planned.launch.label + "\n";
    }
    return text;
  };
  if (program.setup.empty()) return list(program.launches);
  return "setup (once, and again after a parameter or state is written):\n" + list(program.setup) +
         "every run:\n" + list(program.launches);
}

}  // namespace mg::plan
