#pragma once
// What a Session holds (include/meganeura/session.hpp): its planned program, memory, staging,
// recordings and the state of runs in flight. session.cpp builds it and runs it;
// session_embedding.cpp binds the app's buffers, cuts runs into chunks and records them into an
// app's command buffers; session_segments.cpp submits runs in segments.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "ir/op_names.hpp"
#include "meganeura/session.hpp"
#include "ops/interpreter.hpp"
#include "plan/program.hpp"
#include "runtime/device_values.hpp"
#include "runtime/index_checks.hpp"
#include "runtime/kernel_specs.hpp"
#include "runtime/run_commands.hpp"
#include "runtime/shared_device.hpp"

namespace mg {
namespace session_detail {

// A host-visible staging slot of one value.
struct StagingSlot {
  ValueId value = kNoValue;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  // A buffer that runs copy the value from (an input) or into (an output) on the GPU instead of
  // the staging, or, `in_place`, that the kernels read or write themselves (Session::bind_input).
  std::optional<gpu::BufferRange> bound;
  bool in_place = false;
};

// An input's place in both run slots' staging, and the slot that alone holds its last set
// value (none: both do).
struct InputStaging : StagingSlot {
  std::optional<size_t> only_in;
};

}  // namespace session_detail

struct Session::Impl {
  using StagingSlot = session_detail::StagingSlot;
  using InputStaging = session_detail::InputStaging;

  std::shared_ptr<gpu::Device> device;
  std::shared_ptr<SharedTensors> shared;
  // Shared tensors this session created, which it initialises; the others keep their values.
  std::vector<ValueId> created_shared;
  uint64_t seen_generation = 0;
  bool updates_shared = false;
  // The names of the shared tensors that this program's runs update.
  std::vector<std::string> updated_shared_names;
  // What this session created on the device, released when it ends: on a shared device, the
  // device outlives the session.
  std::vector<gpu::BufferId> owned_buffers;
  std::vector<gpu::RecordingId> owned_recordings;

  ~Impl() {
    if (!device) return;
    for (gpu::RecordingId recording : owned_recordings) device->destroy_recording(recording);
    std::vector<gpu::PipelineId> pipelines = pipeline_of_launch;
    pipelines.insert(pipelines.end(), pipeline_of_setup.begin(), pipeline_of_setup.end());
    std::sort(pipelines.begin(), pipelines.end());
    pipelines.erase(std::unique(pipelines.begin(), pipelines.end()), pipelines.end());
    device->destroy_pipelines(pipelines);
    for (gpu::BufferId buffer : owned_buffers) device->destroy_buffer(buffer);
  }

  plan::Program program;
  std::vector<gpu::BufferId> arena_buffers;
  std::map<std::string, InputStaging, std::less<>> inputs;
  // The ranges that i32 inputs feeding indices or labels must keep to.
  std::map<std::string, std::vector<runtime::IndexRule>, std::less<>> index_rules;
  std::map<std::string, StagingSlot, std::less<>> outputs;
  std::map<std::string, ValueId, std::less<>> persistent_by_name;
  std::vector<std::string> persistent_names;
  // Two run slots, so that the next run's inputs can be set while a run is in flight
  // (start_run): each has its own input and output staging and its own recording, which copies
  // from and to them.
  struct RunSlot {
    gpu::BufferId upload = 0, download = 0;
    gpu::RecordingId recording = 0;
  };
  std::array<RunSlot, 2> slots;
  // The program's setup (plan::Program::setup), and what of it must run before the next run:
  // all of it at first; after a write to a leaf (by this session, or by another to a shared
  // tensor), the dispatches that read it, and those whose results they read.
  gpu::RecordingId setup_recording = 0;
  bool setup_due = false;
  std::vector<bool> stale_leaves;  // by value: leaves written since the setup last ran
  // Whether a stale leaf is one that the setup reads (read_by_setup), so that a run asks no
  // more than this flag.
  bool stale_setup_leaf = false;
  std::vector<bool> read_by_setup;  // by value
  // Each setup dispatch's leaves (what it reads, through the setup's own results) and the
  // setup dispatches whose results it reads.
  std::vector<std::vector<ValueId>> setup_leaves;
  std::vector<std::vector<size_t>> setup_producers;
  // Recordings of parts of the setup, by the dispatches they run.
  std::map<std::vector<bool>, gpu::RecordingId> partial_setups;
  size_t input_slot = 0;          // set_input writes to it, start_run submits it
  std::optional<size_t> running;  // the slot of the run in flight
  // The slot of the last finished run, whose outputs output() reads.
  std::optional<size_t> finished;
  bool profile = false;
  bool time_runs = false;  // every dispatch after a barrier, one timestamp pair (whole run)
  gpu::Timing run_timing = gpu::Timing::none;
  bool runs_recorded = false;
  // Chunked runs (set_chunk_budget): run slot 0's commands cut into recordings of at most
  // budget_ms of measured GPU time each; until measured, one profiled recording of the whole run.
  struct Chunking {
    double budget_ms = 0;
    std::vector<double> dispatch_ms;  // one a dispatch of a run, from the profiled run
    std::vector<gpu::RecordingId> recordings;
    std::vector<double> recording_ms;  // each recording's measured GPU time (0 until measured)
    size_t next = 0;  // the chunk run_next_chunk submits next; 0 when no chunked run is under way
    bool profiled_run_started = false;
    std::optional<gpu::RecordingId> in_flight;  // the chunk submitted last, not yet waited for
    bool in_flight_ends_run = false;
  } chunking;
  // Segmented runs (set_segments): run slot 0's commands cut after given dispatches, one
  // recording a segment, submitted in order; the host reads a segment's outputs once it waited
  // for it.
  struct Segmenting {
    std::vector<size_t> ends;  // the dispatch each segment but the last ends after
    std::vector<gpu::RecordingId> recordings;
    size_t submitted = 0;  // segments of the run under way submitted (0: none under way)
    size_t waited = 0;     // the first segments of the run under way waited for
  } segmenting;
  uint32_t guard_bytes = 0;
  BuildReport report;
  // Values that the kernels read or write in a buffer bound in place (an input or output, and
  // the views of it), instead of in their planned region.
  std::map<ValueId, gpu::BufferRange> in_place_values;

  gpu::BufferRange range_of(ValueId value) const {
    const plan::Region& region = program.regions.at(value);
    return {arena_buffers[region.arena], region.offset, region.bytes};
  }

  // Where the kernels leave `value`: its planned region, or the app's buffer bound in place.
  gpu::BufferRange stored_range(ValueId value) const {
    gpu::BufferRange range = range_of(value);
    if (auto bound = in_place_values.find(value); bound != in_place_values.end()) {
      range.buffer = bound->second.buffer;
      range.offset = bound->second.offset;
    }
    return range;
  }

  // The buffer of shared tensor `name` (the leaf of that name in the planned graph), created
  // here if no session declared it before.
  gpu::BufferId shared_buffer(const std::string& name) {
    const ValueId leaf = program.graph.find_leaf(name);
    const TensorType& type = program.graph.type(leaf);
    auto it = shared->entries.find(name);
    if (it != shared->entries.end()) {
      if (!(it->second.type == type)) {
        throw Error("shared tensor '" + name + "' is " + type_string(it->second.type) +
                    " but this program declares it " + type_string(type) +
                    ": programs sharing tensors must agree on their types");
      }
      return it->second.buffer;
    }
    const gpu::BufferId buffer = device->create_buffer(std::max<uint64_t>(type.bytes(), 4),
                                                       gpu::BufferUse::device, "shared " + name);
    shared->entries[name] = {type, buffer};
    created_shared.push_back(leaf);
    return buffer;
  }

  InputStaging& checked_input(std::string_view name, DType dtype, size_t count) {
    auto it = inputs.find(name);
    if (it == inputs.end()) {
      std::string known;
      for (const auto& [input_name, slot] : inputs)
        known += (known.empty() ? "" : ", ") + input_name;
      throw Error("the program has no input '" + std::string(name) + "' (inputs: " + known + ")");
    }
    const TensorType& type = program.graph.type(it->second.value);
    const bool rounded_into_half = is_half_dtype(type.dtype) && dtype == DType::f32;
    if ((type.dtype != dtype && !rounded_into_half) ||
        static_cast<int64_t>(count) != type.elements()) {
      throw Error("input '" + std::string(name) + "' expects " + type_string(type) + " (" +
                  std::to_string(type.elements()) + " values) but was given " +
                  std::to_string(count) + " " + std::string(dtype_name(dtype)) + " values");
    }
    return it->second;
  }

  ValueId persistent_leaf(std::string_view name) const {
    auto it = persistent_by_name.find(name);
    if (it == persistent_by_name.end()) {
      throw Error("the program has no parameter or state named '" + std::string(name) + "'");
    }
    return it->second;
  }

  // Writes the initial values of this program's constants and of the parameters and state it
  // owns or created (not those of shared tensors that another session created), a leaf at a time.
  void upload_persistent(const Graph& original, uint64_t seed, bool initialise_parameters) {
    const Graph& graph = program.graph;
    std::map<std::string, ValueId, std::less<>> leaves;
    // Constants of one value (a scatter's zero target the size of an embedding table) are filled
    // on the device, as constant leaves are: drawing them on the host and uploading them would
    // cost time in proportion to their size.
    std::vector<gpu::Command> fills;
    for (ValueId value : program.persistent) {
      const Node& node = graph.node(value);
      if (node.op == op::constant) {
        if (!node.data) {
          if (std::optional<gpu::Command> fill =
                  fill_command(value, node.attrs.get_float("value"))) {
            fills.push_back(*fill);
            continue;
          }
        }
        const HostTensor tensor = node.data
                                      ? HostTensor(node.type.shape, *node.data)
                                      : HostTensor(node.type.shape, node.attrs.get_float("value"));
        write_values(value, tensor.data);
        continue;
      }
      const bool shared_elsewhere =
          shared &&
          program.arenas[program.regions.at(value).arena].kind == plan::ArenaKind::shared &&
          std::find(created_shared.begin(), created_shared.end(), value) == created_shared.end();
      if (!shared_elsewhere) leaves[node.name] = value;
    }
    fill_constant_leaves(original, leaves, fills);
    if (!fills.empty()) {
      const gpu::RecordingId recording = device->record(fills, gpu::Timing::none);
      device->submit(recording);
      device->destroy_recording(recording);
    }
    visit_initial_leaves(
        original, seed, !initialise_parameters,
        [&](const Node& node) { return leaves.count(node.name) > 0; },
        [&](const Node& node, std::span<const double> values) {
          write_values(leaves.at(node.name), values);
        });
  }

  // Leaves that start as one value (zeros, ones, a fill: optimizer state, norms' weights) get a
  // fill command in `fills` and are taken out of `leaves`: drawing them on the host and
  // uploading them would cost time in proportion to the model's size. Constant leaves draw nothing
  // from the generator, so the random leaves keep their values.
  void fill_constant_leaves(const Graph& original,
                            std::map<std::string, ValueId, std::less<>>& leaves,
                            std::vector<gpu::Command>& fills) {
    for (const Node& node : original.nodes()) {
      if (node.op != op::parameter && node.op != op::state) continue;
      const auto leaf = leaves.find(node.name);
      if (leaf == leaves.end()) continue;
      const Init init = leaf_init(node);
      if (init.kind != Init::Kind::zeros && init.kind != Init::Kind::ones &&
          init.kind != Init::Kind::fill)
        continue;
      const double value = init.kind == Init::Kind::zeros  ? 0.0
                           : init.kind == Init::Kind::ones ? 1.0
                                                           : init.a;
      std::optional<gpu::Command> fill = fill_command(leaf->second, value);
      if (!fill) continue;
      fills.push_back(*fill);
      leaves.erase(leaf);
    }
  }

  // A command that fills `value`'s bytes with `element`, where its type holds it in one 32-bit
  // word (f32, or i32 for whole numbers); none otherwise.
  std::optional<gpu::Command> fill_command(ValueId value, double element) {
    const TensorType& type = program.graph.type(value);
    std::optional<uint32_t> word;
    if (type.dtype == DType::f32) {
      word = std::bit_cast<uint32_t>(static_cast<float>(element));
    } else if (type.dtype == DType::i32 && element == std::trunc(element)) {
      word = static_cast<uint32_t>(static_cast<int32_t>(element));
    }
    if (!word) return std::nullopt;
    gpu::Command fill;
    fill.kind = gpu::Command::Kind::fill;
    fill.fill.range = range_of(value);
    fill.fill.range.bytes = type.bytes();
    fill.fill.word = *word;
    return fill;
  }

  void write_values(ValueId value, std::span<const double> values) {
    const gpu::BufferRange range = range_of(value);
    device->write_buffer(range.buffer, range.offset,
                         device_bytes(program.graph.type(value).dtype, values));
  }

  // Timestamps of the last run, once any run in flight has finished; none before the first.
  std::vector<gpu::DispatchTiming> last_timings() {
    finish_run();
    if (!finished) return {};
    return device->timings(slots[*finished].recording);
  }

  void finish_run() {
    finish_segmented_run();
    if (chunking.in_flight) {
      device->finish(*chunking.in_flight);
      if (chunking.in_flight_ends_run) finished = 0;
      chunking.in_flight.reset();
    }
    if (!running) return;
    device->finish(slots[*running].recording);
    finished = running;
    running.reset();
  }

  // Marks the leaves that other sessions changed since this one last looked.
  void absorb_shared_changes() {
    if (!shared || shared->generation == seen_generation) return;
    for (const auto& [name, written] : shared->written_at) {
      if (written <= seen_generation) continue;
      if (auto leaf = persistent_by_name.find(name); leaf != persistent_by_name.end())
        mark_leaf_written(leaf->second);
    }
    seen_generation = shared->generation;
  }

  // A run or a write changed the shared tensors `names`: the setups of other sessions that read
  // them are stale. Changes of others not yet seen are taken in first.
  void note_shared_written(std::span<const std::string> names) {
    absorb_shared_changes();
    seen_generation = ++shared->generation;
    for (const std::string& name : names) shared->written_at[name] = seen_generation;
  }

  void mark_leaf_written(ValueId leaf) {
    if (program.setup.empty() || !read_by_setup[leaf]) return;
    stale_leaves[leaf] = true;
    stale_setup_leaf = true;
  }

  // Which setup dispatches must run before the next run (none, some or all).
  std::vector<bool> due_setup_dispatches() const {
    const size_t count = program.setup.size();
    std::vector<bool> due(count, setup_due);
    if (setup_due) return due;
    for (size_t i = count; i-- > 0;) {
      due[i] = due[i] || std::any_of(setup_leaves[i].begin(), setup_leaves[i].end(),
                                     [&](ValueId leaf) { return stale_leaves[leaf]; });
    }
    // A dispatch that runs again reads the results of those before it afresh.
    for (size_t i = count; i-- > 0;)
      if (due[i])
        for (size_t producer : setup_producers[i]) due[producer] = true;
    return due;
  }

  // Whether some of the setup must run before the next run: after a write, or after another
  // session changed shared tensors that it reads.
  bool setup_needed() {
    absorb_shared_changes();
    return setup_due || stale_setup_leaf;
  }

  // The recording of the setup's due dispatches (setup_needed): the whole setup's, or one of a
  // part, recorded the first time that part is due.
  gpu::RecordingId due_setup_recording() {
    const std::vector<bool> due = due_setup_dispatches();
    if (std::find(due.begin(), due.end(), false) == due.end()) return setup_recording;
    if (auto it = partial_setups.find(due); it != partial_setups.end()) return it->second;
    // Dispatches that the whole setup runs side by side (no barrier between them) stay so.
    const std::vector<bool> barriers = plan::barriers_of_part(program.setup, due);
    std::vector<gpu::Command> list;
    for (size_t i = 0; i < due.size(); ++i) {
      if (!due[i]) continue;
      if (barriers[i]) list.push_back({gpu::Command::Kind::barrier});
      list.push_back(dispatch_of(program.setup[i], pipeline_of_setup[i]));
    }
    const gpu::RecordingId recording = device->record(list, gpu::Timing::none);
    owned_recordings.push_back(recording);
    partial_setups.emplace(due, recording);
    return recording;
  }

  // The setup's results are up to date once the recording due_setup_recording gave has run.
  void setup_done() {
    if (!setup_due && !stale_setup_leaf) return;
    setup_due = false;
    stale_setup_leaf = false;
    std::fill(stale_leaves.begin(), stale_leaves.end(), false);
  }

  // Runs the part of the setup that is due, after any run in flight (which reads what it
  // writes).
  void run_setup_if_due() {
    if (!setup_needed()) return;
    finish_run();
    device->submit(due_setup_recording());
    setup_done();
  }

  // Each setup dispatch's leaves and the setup dispatches whose results it reads
  // (setup_leaves, setup_producers).
  void trace_setup() {
    const Graph& graph = program.graph;
    const size_t count = program.setup.size();
    stale_leaves.assign(graph.size(), false);
    read_by_setup.assign(graph.size(), false);
    setup_leaves.assign(count, {});
    setup_producers.assign(count, {});
    std::map<ValueId, size_t> writer;
    for (size_t i = 0; i < count; ++i) {
      std::vector<bool> seen(graph.size(), false);
      std::vector<ValueId> pending;
      for (const target::Operand& operand : program.setup[i].launch.operands)
        if (!operand.write) pending.push_back(operand.value);
      while (!pending.empty()) {
        const ValueId value = pending.back();
        pending.pop_back();
        if (seen[value]) continue;
        seen[value] = true;
        if (auto it = writer.find(value); it != writer.end()) {
          setup_producers[i].push_back(it->second);
          setup_leaves[i].insert(setup_leaves[i].end(), setup_leaves[it->second].begin(),
                                 setup_leaves[it->second].end());
          continue;
        }
        const Node& node = graph.node(value);
        if (node.is_leaf()) {
          setup_leaves[i].push_back(value);
          continue;
        }
        pending.insert(pending.end(), node.inputs.begin(), node.inputs.end());
      }
      for (const target::Operand& operand : program.setup[i].launch.operands)
        if (operand.write) writer[operand.value] = i;
      for (ValueId leaf : setup_leaves[i]) read_by_setup[leaf] = true;
    }
  }

  void set_input(std::string_view name, DType dtype, const void* values, size_t count) {
    InputStaging& staging = checked_input(name, dtype, count);
    if (staging.bound)
      throw Error("input '" + std::string(name) + "' is bound to a buffer (bind_input)");
    if (dtype == DType::i32) {
      if (const auto rules = index_rules.find(name); rules != index_rules.end()) {
        runtime::check_indices(name, std::span(static_cast<const int32_t*>(values), count),
                               rules->second);
      }
    }
    // A run recorded into an app's command buffer may still read this slot's staging.
    device->finish(slots[input_slot].recording);
    std::byte* staged =
        static_cast<std::byte*>(device->mapped(slots[input_slot].upload)) + staging.offset;
    const DType stored = program.graph.type(staging.value).dtype;
    if (stored == dtype) {
      std::memcpy(staged, values, staging.bytes);
    } else {
      store_device_values(stored, std::span<const float>(static_cast<const float*>(values), count),
                          staged);
    }
    staging.only_in = input_slot;
  }

  // Inputs not set since this slot last ran are in the other slot's staging (which a run in
  // flight only reads).
  void bring_inputs_up_to_date(size_t target) {
    for (auto& [name, staging] : inputs) {
      if (!staging.only_in || *staging.only_in == target) continue;
      std::memcpy(
          static_cast<std::byte*>(device->mapped(slots[target].upload)) + staging.offset,
          static_cast<const std::byte*>(device->mapped(slots[1 - target].upload)) + staging.offset,
          staging.bytes);
      staging.only_in.reset();
    }
  }

  // A dispatch of `planned`, run by `pipeline`.
  gpu::Command dispatch_of(const plan::PlannedLaunch& planned, gpu::PipelineId pipeline) const {
    gpu::Command dispatch{gpu::Command::Kind::dispatch};
    dispatch.dispatch.pipeline = pipeline;
    for (size_t k = 0; k < planned.regions.size(); ++k) {
      const plan::Region& region = planned.regions[k];
      auto bound = in_place_values.find(planned.launch.operands[k].value);
      if (bound != in_place_values.end()) {
        dispatch.dispatch.bindings.push_back(
            {bound->second.buffer, bound->second.offset, region.bytes});
      } else {
        dispatch.dispatch.bindings.push_back(
            {arena_buffers[region.arena], region.offset, region.bytes});
      }
    }
    dispatch.dispatch.groups = planned.launch.groups;
    dispatch.dispatch.label = planned.launch.label;
    return dispatch;
  }

  std::vector<gpu::Command> setup_commands() const {
    std::vector<gpu::Command> list;
    for (size_t i = 0; i < program.setup.size(); ++i) {
      if (program.setup[i].barrier_before) list.push_back({gpu::Command::Kind::barrier});
      list.push_back(dispatch_of(program.setup[i], pipeline_of_setup[i]));
    }
    return list;
  }

  // The dispatch after which output `slot` is final (RunCommands::OutputCopy::ready_after).
  int64_t output_ready_after(const StagingSlot& slot) const {
    const gpu::BufferRange output = stored_range(slot.value);
    for (const auto& [leaf, value] : program.graph.updates()) {
      const gpu::BufferRange target = range_of(leaf);
      if (target.buffer == output.buffer && target.offset < output.offset + output.bytes &&
          output.offset < target.offset + target.bytes)
        return static_cast<int64_t>(program.launches.size());
    }
    const std::optional<size_t> writer = plan::last_writer(program, slot.value);
    return writer ? static_cast<int64_t>(*writer) : -1;
  }

  // A run's commands in their parts; in-place inputs and outputs need no copy.
  runtime::RunCommands commands(const RunSlot& run_slot) const {
    runtime::RunCommands run;
    for (const auto& [name, slot] : inputs) {
      if (slot.in_place) continue;
      gpu::Command copy{gpu::Command::Kind::copy};
      const gpu::BufferRange target = range_of(slot.value);
      const gpu::BufferRange staged{run_slot.upload, slot.offset, slot.bytes};
      copy.copy = {slot.bound.value_or(staged), target.buffer, target.offset};
      run.input_copies.push_back(copy);
    }
    for (size_t i = 0; i < program.launches.size(); ++i) {
      const plan::PlannedLaunch& planned = program.launches[i];
      std::vector<gpu::Command>& dispatch = run.dispatches.emplace_back();
      if (planned.barrier_before || (time_runs && i > 0))
        dispatch.push_back({gpu::Command::Kind::barrier});
      dispatch.push_back(dispatch_of(planned, pipeline_of_launch[i]));
    }
    for (const auto& [leaf, value] : program.graph.updates()) {
      gpu::Command copy{gpu::Command::Kind::copy};
      const gpu::BufferRange source = stored_range(value);
      const gpu::BufferRange target = range_of(leaf);
      // The planner may have had the new value written over the leaf itself.
      if (source.buffer == target.buffer && source.offset == target.offset) continue;
      copy.copy = {source, target.buffer, target.offset};
      run.update_copies.push_back(copy);
    }
    for (const auto& [name, slot] : outputs) {
      if (slot.in_place) continue;
      gpu::Command copy{gpu::Command::Kind::copy};
      copy.copy = {stored_range(slot.value), run_slot.download, slot.offset};
      if (slot.bound)
        copy.copy = {stored_range(slot.value), slot.bound->buffer, slot.bound->offset};
      run.output_copies.push_back({copy, output_ready_after(slot)});
    }
    return run;
  }

  gpu::RecordingId own_recording(std::span<const gpu::Command> list, gpu::Timing timing) {
    owned_recordings.push_back(device->record(list, timing));
    return owned_recordings.back();
  }

  void drop_recording(gpu::RecordingId recording) {
    device->destroy_recording(recording);
    std::erase(owned_recordings, recording);
  }

  // (Re-)records both run slots, the chunks and the segments, after the bindings changed.
  void record_runs() {
    for (RunSlot& slot : slots) {
      if (runs_recorded) drop_recording(slot.recording);
      slot.recording = own_recording(runtime::whole_run(commands(slot)), run_timing);
    }
    runs_recorded = true;
    record_chunks();
    record_segments();
  }

  // Segmented runs (session_segments.cpp).
  void record_segments();
  void submit_segment(size_t index);
  void wait_segment(size_t index);
  // Completes a segmented run under way: submits its remaining segments and waits for them.
  void finish_segmented_run();
  void refuse_during_segmented_run(const char* what) const;

  void record_chunks() {
    for (gpu::RecordingId recording : chunking.recordings) drop_recording(recording);
    chunking.recordings.clear();
    chunking.recording_ms.clear();
    if (chunking.budget_ms <= 0) return;
    const std::vector<gpu::Command> all = runtime::whole_run(commands(slots[0]));
    if (chunking.dispatch_ms.empty()) {
      chunking.profiled_run_started = false;
      chunking.recordings.push_back(own_recording(all, gpu::Timing::per_dispatch));
      chunking.recording_ms.push_back(0);
      return;
    }
    std::vector<gpu::Command> chunk;
    double chunk_ms = 0;
    bool chunk_dispatches = false;
    size_t dispatch = 0;
    for (const gpu::Command& command : all) {
      if (command.kind == gpu::Command::Kind::dispatch) {
        const double ms = chunking.dispatch_ms.at(dispatch++);
        if (chunk_dispatches && chunk_ms + ms > chunking.budget_ms) {
          chunking.recordings.push_back(own_recording(chunk, gpu::Timing::none));
          chunking.recording_ms.push_back(chunk_ms);
          chunk.clear();
          chunk_ms = 0;
        }
        chunk_ms += ms;
        chunk_dispatches = true;
      }
      chunk.push_back(command);
    }
    chunking.recordings.push_back(own_recording(chunk, gpu::Timing::none));
    chunking.recording_ms.push_back(chunk_ms);
  }

  // After the first chunked run (whole and profiled) finished: cuts the runs into chunks.
  void split_measured_run() {
    if (!chunking.dispatch_ms.empty() || !chunking.profiled_run_started) return;
    finish_run();
    const std::vector<gpu::DispatchTiming> timings = device->timings(chunking.recordings.at(0));
    if (timings.size() != program.launches.size())
      throw Error("the profiled run reported " + std::to_string(timings.size()) +
                  " dispatch times for " + std::to_string(program.launches.size()) +
                  " dispatches: chunked runs need GPU timestamps (" + report.device + ")");
    for (const gpu::DispatchTiming& timing : timings)
      chunking.dispatch_ms.push_back(timing.duration_ms);
    record_chunks();
  }

  // Commands that write into slot `target`'s staging the inputs set in the other slot only (and
  // mark them as in both): the staging of an input is updated by the GPU, in order with the runs
  // that read it, where the host could not write it without waiting for them.
  std::vector<gpu::Command> staged_by_commands(size_t target);

  // Binds an input's or output's staging slot to an app's buffer (Session::bind_input), after
  // checking that an in-place binding can be had, and re-records the runs.
  void bind(StagingSlot& slot, bool output, const std::string& what, uint32_t buffer,
            uint64_t offset, Binding binding);
  void check_in_place(const std::string& what, ValueId value, uint64_t offset, bool output) const;

  void refuse_during_chunked_run(const char* what) const {
    if (chunking.next != 0)
      throw Error(std::string(what) + " while a chunked run is under way: submit its " +
                  std::to_string(chunking.recordings.size() - chunking.next) +
                  " remaining chunks first (run_next_chunk)");
  }

  std::vector<gpu::PipelineId> pipeline_of_launch, pipeline_of_setup;

  // Where output `name` of the last finished run lies in its staging, and its type.
  std::pair<const std::byte*, TensorType> downloaded(std::string_view name) const;

  void create_pipelines() {
    const runtime::ProgramKernels kernels = runtime::program_kernels(program);
    const std::vector<gpu::PipelineId> pipelines = device->create_pipelines(kernels.specs);
    const std::vector<uint32_t>& spec_of_launch = kernels.spec_of_launch;
    for (size_t i = 0; i < spec_of_launch.size(); ++i) {
      (i < program.setup.size() ? pipeline_of_setup : pipeline_of_launch)
          .push_back(pipelines[spec_of_launch[i]]);
    }
    const gpu::CompileStats stats = device->last_compile_stats();
    report.pipelines = stats.pipelines;
    report.spirv_cache_hits = stats.spirv_cache_hits;
    report.pipeline_seconds = stats.seconds;
    report.spirv_seconds = stats.spirv_seconds;
    report.driver_seconds = stats.driver_seconds;
    report.slowest_kernel = stats.slowest_kernel;
    report.slowest_kernel_seconds = stats.slowest_kernel_seconds;
    for (const gpu::CompileStats::KernelTime& kernel : stats.slowest_kernels)
      report.slowest_kernels.push_back(
          {kernel.label, kernel.start_seconds, kernel.spirv_seconds, kernel.driver_seconds});
  }
};

}  // namespace mg
