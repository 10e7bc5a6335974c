#pragma once
// A Program: the optimised graph lowered to a fixed list of kernel launches over planned
// memory. Values live in arenas (persistent: parameters, optimizer state, constants; transient:
// everything else, reused across values whose lifetimes do not overlap). Barriers sit only
// where a launch touches bytes that an earlier, not yet fenced launch wrote (or writes bytes it
// read).
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meganeura/graph.hpp"
#include "target/target.hpp"

namespace mg::plan {

// `shared`: one named parameter or state leaf alone (PlanOptions::shared_leaves), whose buffer
// the runtime takes from the tensors that several programs share instead of allocating it.
enum class ArenaKind { persistent, transient, shared };

struct Arena {
  ArenaKind kind = ArenaKind::transient;
  uint64_t bytes = 0;
  std::string leaf;  // the leaf's name, for kind shared
};

struct Region {
  uint32_t arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct PlannedLaunch {
  target::Launch launch;
  std::vector<Region> regions;  // one per operand
  bool barrier_before = false;
};

// Where a graph's parameter and state leaves go, fixed before the graph is planned so that their
// memory can be allocated while it is (PlanOptions::leaf_layout): arenas of their own, filled in
// the graph's order up to the arena limit. layout_leaves makes it.
struct LeafLayout {
  std::vector<uint64_t> arena_bytes;
  std::unordered_map<std::string, Region> regions;  // by leaf name; arenas index arena_bytes
};

struct MemoryStats {
  uint64_t persistent_bytes = 0;          // this program's own: constants and results of the setup
  uint64_t shared_bytes = 0;              // parameters and state in shared arenas
  uint64_t logical_transient_bytes = 0;   // sum of every transient value's size
  uint64_t physical_transient_bytes = 0;  // sum of transient arena sizes
  uint64_t peak_live_bytes = 0;           // largest sum of simultaneously live transient values
  uint32_t barriers = 0;
};

struct PlanOptions {
  bool reuse_memory = true;  // false: every value gets its own bytes (for testing the planner)
  uint64_t arena_limit = 128ull << 20;  // min(maxStorageBufferRange, maxMemoryAllocationSize)
  uint64_t alignment = 256;             // >= minStorageBufferOffsetAlignment
  // Split matmuls and convolution weight gradients with few output tiles and a long K over K
  // (split-K, passes/split_k.cpp), sums with few outputs in two steps
  // (passes/split_reductions.cpp) and attention with few owned blocks over slices of its
  // streamed rows (passes/split_attention.cpp): pays on GPUs with many compute units, not on
  // CPU devices.
  // MEGANEURA_SPLIT_K=0/1 overrides all three.
  bool split_k = true;
  // Convolutions as im2col + matmul (passes/im2col.cpp): faster on GPUs, where the implicit GEMM's
  // per-element tap arithmetic sits in the inner loop; CPU devices keep the implicit GEMM.
  // MEGANEURA_IM2COL=0/1 overrides.
  bool im2col = true;
  // The bytes of the largest convolution columns (or Winograd tiles) the im2col pass may make,
  // one transient value: column_limit_for() of the device; a quarter of the default arena.
  uint64_t column_limit = 32ull << 20;
  // dQ of non-causal attention as a matmul of the scores' gradient, which the dK launch writes
  // (passes/attention_grad_q_gemm.cpp): pays on GPUs, where the GEMM kernels outrun the
  // attention kernels' third product, when the attention kernels are the strict ones (the
  // cooperative-matrix dK keeps its dQ kernel). MEGANEURA_ATTENTION_DQ_GEMM=0/1 overrides.
  bool attention_dq_gemm = true;
  // Bytes left unused after every value (tests fill them with a sentinel and check that no
  // kernel wrote past its outputs). Needs reuse_memory = false, or a later value could
  // legitimately land on an earlier value's guard.
  uint64_t guard_bytes = 0;
  // Launches ordered into as few barrier-separated epochs as their values allow, transients
  // placed by epoch (program.cpp, value_epochs); false keeps the lowering's order, with
  // lifetimes over it and a barrier at each hazard.
  // MEGANEURA_SCHEDULE_EPOCHS=0/1 overrides.
  bool schedule_epochs = true;
  // Launches that read only fixed values (constants, and parameters and state that the graph
  // never assigns: an inference graph's weights) move to Program::setup, which runs once and
  // again after a leaf is written, instead of every run: Winograd's filter transform of a
  // convolution's weights, the rounding of weights to f16 for the fast GEMM. Their results are
  // persistent. MEGANEURA_SETUP=0/1 overrides.
  bool setup = true;
  // Every parameter and state leaf gets an arena of its own (ArenaKind::shared) so that several
  // programs can run over the same tensors: training, evaluation, prefill and decode of one model.
  bool shared_leaves = false;
  // The program's first arenas are the layout's (layout_leaves of the graph with these options),
  // its parameter and state leaves where the layout puts them; its other persistent values
  // follow in arenas of their own. Not with shared_leaves or guard_bytes.
  const LeafLayout* leaf_layout = nullptr;
};

struct Program {
  Graph graph;  // after passes; launches refer to its values
  std::vector<Arena> arenas;
  std::unordered_map<ValueId, Region> regions;  // every stored value (views share their root's)
  std::vector<PlannedLaunch> launches;
  // Launches over fixed values only (PlanOptions::setup), in order, each after a barrier but
  // the first: the runtime runs them before the first run and after a write to a leaf.
  std::vector<PlannedLaunch> setup;
  std::vector<ValueId> inputs;         // fed by the host before each run
  std::vector<ValueId> persistent;     // parameters, state, constants
  std::vector<ValueId> setup_results;  // what setup writes: persistent, beside `persistent`
  MemoryStats memory;
  size_t graph_nodes_before_passes = 0;
  size_t dispatches_saved_by_fusion = 0;
};

// The column limit (PlanOptions::column_limit) for buffers of at most `arena_limit` bytes on a
// device with `device_memory` bytes (0: unknown): a quarter of an arena and 256 MiB, or where the
// device has the room, up to half an arena and a 64th of its memory. Convolutions whose columns
// pass it keep the implicit GEMM, whose per-element tap arithmetic is the slower route on GPUs
// (ResNet-50 at batch 256 has columns of 1.85 GB).
uint64_t column_limit_for(uint64_t arena_limit, uint64_t device_memory);

// The arenas of `graph`'s parameter and state leaves under `options` (PlanOptions::leaf_layout).
LeafLayout layout_leaves(const Graph& graph, const PlanOptions& options);

// Optimises, lowers and plans `graph`. Throws mg::Error when an op has no kernel or a single
// value exceeds the arena limit.
Program build_program(const Graph& graph, const target::Target& device, const PlanOptions& options);

// The index of the last launch of program.launches that writes bytes of `value`: once it has run,
// the value is final in memory, and a runtime may copy it out while later launches still run (an
// output lives to the end of the run, so no later launch reuses its bytes). nullopt where no
// launch writes them: inputs, leaves, constants and what the setup computes.
std::optional<size_t> last_writer(const Program& program, ValueId value);

// Where a list of `launches` run only in part (those `chosen`, in order; a setup's dispatches
// that a write made stale) needs its barriers: before a chosen launch that the whole list
// separates by a barrier from the chosen launch before it (the whole list's barriers between two
// launches ordered them, whichever launch carried them). One entry a launch, false for those not
// chosen and for the first chosen one.
std::vector<bool> barriers_of_part(const std::vector<PlannedLaunch>& launches,
                                   const std::vector<bool>& chosen);

// Human-readable memory plan (`meganeura inspect --plan`).
std::string describe_memory(const Program& program);

// One line per dispatch in execution order (`meganeura inspect --dispatches`): its index, label
// (the names that profiles and traces show), kernel, grid and whether a barrier precedes it; the
// setup's dispatches first, under their own heading, where there are any.
std::string describe_dispatches(const Program& program);

}  // namespace mg::plan
