#include "meganeura/session.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "backends/vulkan/runtime/device_target.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/memory_budget.hpp"
#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "ops/interpreter.hpp"
#include "plan/program.hpp"
#include "plan/roofline.hpp"
#include "runtime/device_values.hpp"
#include "runtime/index_checks.hpp"
#include "runtime/run_commands.hpp"
#include "runtime/shared_device.hpp"

namespace mg {
namespace {

plan::PlanOptions plan_options_of(const gpu::DeviceInfo& info, const SessionOptions& session) {
  plan::PlanOptions options;
  options.reuse_memory = session.reuse_memory && session.guard_bytes == 0;
  options.guard_bytes = session.guard_bytes;
  options.arena_limit =
      std::min(info.caps.max_storage_buffer_range, info.caps.max_memory_allocation_size);
  options.alignment = std::max<uint64_t>(256, info.caps.min_storage_buffer_offset_alignment);
  options.split_k = info.kind != gpu::DeviceKind::cpu;
  options.attention_dq_gemm = info.kind != gpu::DeviceKind::cpu;
  options.im2col = info.kind != gpu::DeviceKind::cpu;
  options.setup = session.setup;
  return options;
}

// Written into every guard: a NaN pattern no kernel produces by accident.
constexpr uint32_t kGuardWord = 0x7fbadbad;

// A host-visible staging slot of one value.
struct StagingSlot {
  ValueId value = kNoValue;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  // A buffer that runs copy the value from (an input) or into (an output) on the GPU instead of
  // the staging (Session::bind_input).
  std::optional<gpu::BufferRange> bound;
};

// An input's place in both run slots' staging, and the slot that alone holds its last set
// value (none: both do).
struct InputStaging : StagingSlot {
  std::optional<size_t> only_in;
};

}  // namespace

Precision parse_precision(std::string_view text) {
  if (text == "strict") return Precision::strict;
  if (text == "fast") return Precision::fast;
  throw Error("unknown precision \"" + std::string(text) + "\": use strict or fast");
}

std::string_view precision_name(Precision precision) {
  return precision == Precision::fast ? "fast" : "strict";
}

struct Session::Impl {
  std::shared_ptr<gpu::Device> device;
  std::shared_ptr<SharedTensors> shared;
  // Shared tensors this session created, which it initialises; the others keep their values.
  std::vector<ValueId> created_shared;
  uint64_t seen_generation = 0;
  bool updates_shared = false;
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
  // The program's setup (plan::Program::setup), and whether it must run before the next run:
  // at first, and after every write to a leaf.
  gpu::RecordingId setup_recording = 0;
  bool setup_due = false;
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

  gpu::BufferRange range_of(ValueId value) const {
    const plan::Region& region = program.regions.at(value);
    return {arena_buffers[region.arena], region.offset, region.bytes};
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
    const bool rounded_into_f16 = type.dtype == DType::f16 && dtype == DType::f32;
    if ((type.dtype != dtype && !rounded_into_f16) ||
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
    for (ValueId value : program.persistent) {
      const Node& node = graph.node(value);
      if (node.op == op::constant) {
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
    fill_constant_leaves(original, leaves);
    visit_initial_leaves(
        original, seed, !initialise_parameters,
        [&](const Node& node) { return leaves.count(node.name) > 0; },
        [&](const Node& node, std::span<const double> values) {
          write_values(leaves.at(node.name), values);
        });
  }

  // Leaves that start as one value (zeros, ones, a fill: optimizer state, norms' weights) are
  // filled on the device and taken out of `leaves`: drawing them on the host and uploading them
  // would cost time in proportion to the model's size. Constant leaves draw nothing from the
  // generator, so the random leaves keep their values.
  void fill_constant_leaves(const Graph& original,
                            std::map<std::string, ValueId, std::less<>>& leaves) {
    std::vector<gpu::Command> fills;
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
      const TensorType& type = program.graph.type(leaf->second);
      std::optional<uint32_t> word;
      if (type.dtype == DType::f32) {
        word = std::bit_cast<uint32_t>(static_cast<float>(value));
      } else if (type.dtype == DType::i32 && value == std::trunc(value)) {
        word = static_cast<uint32_t>(static_cast<int32_t>(value));
      }
      if (!word) continue;
      gpu::Command fill;
      fill.kind = gpu::Command::Kind::fill;
      fill.fill.range = range_of(leaf->second);
      fill.fill.range.bytes = type.bytes();
      fill.fill.word = *word;
      fills.push_back(fill);
      leaves.erase(leaf);
    }
    if (fills.empty()) return;
    const gpu::RecordingId recording = device->record(fills, gpu::Timing::none);
    device->submit(recording);
    device->destroy_recording(recording);
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

  // Runs the setup if it is due, after any run in flight (which reads what it writes).
  void run_setup_if_due() {
    if (shared && shared->generation != seen_generation) {
      setup_due = setup_due || !program.setup.empty();
      seen_generation = shared->generation;
    }
    if (!setup_due) return;
    finish_run();
    device->submit(setup_recording);
    setup_due = false;
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
    for (const plan::Region& region : planned.regions) {
      dispatch.dispatch.bindings.push_back(
          {arena_buffers[region.arena], region.offset, region.bytes});
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
    const gpu::BufferRange output = range_of(slot.value);
    for (const auto& [leaf, value] : program.graph.updates()) {
      const gpu::BufferRange target = range_of(leaf);
      if (target.buffer == output.buffer && target.offset < output.offset + output.bytes &&
          output.offset < target.offset + target.bytes)
        return static_cast<int64_t>(program.launches.size());
    }
    const std::optional<size_t> writer = plan::last_writer(program, slot.value);
    return writer ? static_cast<int64_t>(*writer) : -1;
  }

  runtime::RunCommands commands(const RunSlot& run_slot) const {
    runtime::RunCommands run;
    for (const auto& [name, slot] : inputs) {
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
      const gpu::BufferRange source = range_of(value);
      const gpu::BufferRange target = range_of(leaf);
      // The planner may have had the new value written over the leaf itself.
      if (source.buffer == target.buffer && source.offset == target.offset) continue;
      copy.copy = {source, target.buffer, target.offset};
      run.update_copies.push_back(copy);
    }
    for (const auto& [name, slot] : outputs) {
      gpu::Command copy{gpu::Command::Kind::copy};
      copy.copy = {range_of(slot.value), run_slot.download, slot.offset};
      if (slot.bound) copy.copy = {range_of(slot.value), slot.bound->buffer, slot.bound->offset};
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

  // (Re-)records both run slots and the chunks, after the bindings changed.
  void record_runs() {
    for (RunSlot& slot : slots) {
      if (runs_recorded) drop_recording(slot.recording);
      slot.recording = own_recording(runtime::whole_run(commands(slot)), run_timing);
    }
    runs_recorded = true;
    record_chunks();
    record_segments();
  }

  void record_segments() {
    for (gpu::RecordingId recording : segmenting.recordings) drop_recording(recording);
    segmenting.recordings.clear();
    if (segmenting.ends.empty()) return;
    for (const std::vector<gpu::Command>& segment :
         runtime::segmented_run(commands(slots[0]), segmenting.ends))
      segmenting.recordings.push_back(own_recording(segment, gpu::Timing::none));
  }

  void submit_segment(size_t index) {
    Segmenting& run = segmenting;
    if (run.recordings.empty()) throw Error("submit_segment needs segments first (set_segments)");
    if (index != run.submitted || index >= run.recordings.size())
      throw Error("segment " + std::to_string(index) +
                  " submitted out of order: " + std::to_string(run.submitted) + " of the run's " +
                  std::to_string(run.recordings.size()) +
                  " segments are submitted (segment 0 starts a run after the last one ended)");
    if (index == 0) {
      refuse_during_chunked_run("a segmented run");
      finish_run();
      run_setup_if_due();
      bring_inputs_up_to_date(0);
      input_slot = 1;  // inputs set during the segmented run wait in the other slot
    }
    device->start(run.recordings[index]);
    ++run.submitted;
    if (run.submitted == run.recordings.size() && updates_shared)
      seen_generation = ++shared->generation;
  }

  void wait_segment(size_t index) {
    Segmenting& run = segmenting;
    if (index >= run.submitted)
      throw Error("segment " + std::to_string(index) + " waited for before it was submitted (" +
                  std::to_string(run.submitted) + " of the run under way are)");
    for (; run.waited <= index; ++run.waited) device->finish(run.recordings[run.waited]);
    if (run.waited == run.recordings.size()) {
      finished = 0;
      run.submitted = run.waited = 0;
    }
  }

  // Completes a segmented run under way: submits its remaining segments and waits for them.
  void finish_segmented_run() {
    if (segmenting.submitted == 0) return;
    while (segmenting.submitted < segmenting.recordings.size())
      submit_segment(segmenting.submitted);
    wait_segment(segmenting.recordings.size() - 1);
  }

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

  void refuse_during_segmented_run(const char* what) const {
    if (segmenting.submitted != 0)
      throw Error(
          std::string(what) +
          " while a segmented run is under way: wait for its last segment first (wait_segment)");
  }

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
    std::vector<gpu::KernelSpec> specs;
    std::map<std::tuple<std::string, std::vector<std::pair<std::string, std::string>>, bool>,
             uint32_t>
        unique;
    std::vector<uint32_t> spec_of_launch;  // the setup's launches, then every run's
    std::vector<const plan::PlannedLaunch*> launches;
    for (const plan::PlannedLaunch& planned : program.setup) launches.push_back(&planned);
    for (const plan::PlannedLaunch& planned : program.launches) launches.push_back(&planned);
    for (const plan::PlannedLaunch* planned : launches) {
      const kernels::Launch& launch = vulkan::glsl_launch(planned->launch);
      std::string source = kernels::buffer_declarations(program.graph, launch) + launch.body;
      auto key = std::make_tuple(source, launch.defines, launch.tensor_loads);
      auto [it, inserted] = unique.try_emplace(std::move(key), static_cast<uint32_t>(specs.size()));
      if (inserted) {
        gpu::KernelSpec spec;
        spec.label = launch.label;
        spec.source = std::get<0>(it->first);
        spec.defines = launch.defines;
        spec.binding_count = static_cast<uint32_t>(launch.operands.size());
        spec.khr_cooperative_matrix = launch.khr_cooperative_matrix;
        spec.matrix_loads =
            launch.tensor_loads ? gpu::MatrixLoads::tensor_at_element : gpu::MatrixLoads::plain;
        specs.push_back(std::move(spec));
      }
      spec_of_launch.push_back(it->second);
    }
    const std::vector<gpu::PipelineId> pipelines = device->create_pipelines(specs);
    for (size_t i = 0; i < spec_of_launch.size(); ++i) {
      (i < program.setup.size() ? pipeline_of_setup : pipeline_of_launch)
          .push_back(pipelines[spec_of_launch[i]]);
    }
    const gpu::CompileStats stats = device->last_compile_stats();
    report.pipelines = stats.pipelines;
    report.spirv_cache_hits = stats.spirv_cache_hits;
    report.pipeline_seconds = stats.seconds;
  }
};

Session::Session(const Graph& graph, const SessionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const auto start = std::chrono::steady_clock::now();
  Impl& impl = *impl_;
  if (options.profile && options.time_runs)
    throw Error(
        "SessionOptions: profile and time_runs cannot both be on (per-dispatch "
        "timestamps would be part of the timed run)");
  impl.profile = options.profile;
  impl.time_runs = options.time_runs;
  if (options.shared_tensors && options.shared_tensors->device != options.shared_device) {
    throw Error(
        "SessionOptions: shared_tensors belong to another device: pass the SharedDevice they "
        "were made for as shared_device");
  }
  if (options.shared_tensors && options.guard_bytes > 0)
    throw Error("SessionOptions: guard_bytes cannot be used with shared_tensors");
  impl.shared = options.shared_tensors;
  const Switches switches = options.switches ? *options.switches : Switches::from_environment();
  const auto seconds_since = [](std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  };
  auto phase = std::chrono::steady_clock::now();
  impl.device = options.shared_device
                    ? options.shared_device->device
                    : gpu::Device::open(options.device, options.validation, switches);
  impl.report.device_seconds = options.shared_device ? 0.0 : seconds_since(phase);
  const gpu::DeviceInfo& info = impl.device->info();
  impl.report.device = gpu::describe_device(info);
  const vulkan::VulkanTarget target =
      vulkan::device_target(*impl.device, options.precision == Precision::fast, switches);
  impl.report.coop_matrix_available = target.cooperative_matrices();
  plan::PlanOptions plan_options = plan_options_of(info, options);
  plan_options.shared_leaves = impl.shared != nullptr;
  phase = std::chrono::steady_clock::now();
  impl.program = plan::build_program(graph, target, plan_options);
  impl.report.plan_seconds = seconds_since(phase);
  impl.index_rules = runtime::index_rules(graph);
  const Graph& planned = impl.program.graph;

  // A program that cannot fit fails here, on one line, before anything is allocated.
  gpu::require_heap_for(info, impl.program);
  for (size_t a = 0; a < impl.program.arenas.size(); ++a) {
    const plan::Arena& arena = impl.program.arenas[a];
    if (arena.kind == plan::ArenaKind::shared) {
      impl.arena_buffers.push_back(impl.shared_buffer(arena.leaf));
      continue;
    }
    impl.arena_buffers.push_back(impl.device->create_buffer(
        arena.bytes, gpu::BufferUse::device,
        (arena.kind == plan::ArenaKind::persistent ? "persistent arena " : "transient arena ") +
            std::to_string(a)));
    impl.owned_buffers.push_back(impl.arena_buffers.back());
  }
  uint64_t upload_bytes = 0, download_bytes = 0;
  for (ValueId input : impl.program.inputs) {
    const uint64_t bytes = planned.type(input).bytes();
    impl.inputs[planned.node(input).name] = {{input, upload_bytes, bytes}, std::nullopt};
    upload_bytes += (bytes + 255) / 256 * 256;
  }
  for (const auto& [name, value] : planned.outputs()) {
    const uint64_t bytes = planned.type(value).bytes();
    impl.outputs[name] = {value, download_bytes, bytes};
    download_bytes += (bytes + 255) / 256 * 256;
  }
  for (Impl::RunSlot& slot : impl.slots) {
    slot.upload = impl.device->create_buffer(std::max<uint64_t>(upload_bytes, 256),
                                             gpu::BufferUse::upload, "input staging");
    impl.owned_buffers.push_back(slot.upload);
    slot.download = impl.device->create_buffer(std::max<uint64_t>(download_bytes, 256),
                                               gpu::BufferUse::download, "output staging");
    impl.owned_buffers.push_back(slot.download);
  }
  for (std::string_view kind : {op::parameter, op::state}) {
    for (ValueId leaf : planned.leaves(kind)) {
      if (!impl.program.regions.count(leaf)) continue;
      impl.persistent_by_name[planned.node(leaf).name] = leaf;
      impl.persistent_names.push_back(planned.node(leaf).name);
    }
  }
  impl.guard_bytes = options.guard_bytes;
  if (impl.guard_bytes > 0) {
    for (size_t a = 0; a < impl.arena_buffers.size(); ++a) {
      const std::vector<uint32_t> sentinel(impl.program.arenas[a].bytes / 4, kGuardWord);
      impl.device->write_buffer(impl.arena_buffers[a], 0,
                                std::as_bytes(std::span<const uint32_t>(sentinel)));
    }
  }
  impl.upload_persistent(graph, options.seed, options.initialise_parameters);
  if (impl.shared) {
    for (const auto& [leaf, value] : planned.updates()) {
      if (impl.program.arenas[impl.program.regions.at(leaf).arena].kind == plan::ArenaKind::shared)
        impl.updates_shared = true;
    }
    // The tensors this session created changed what the others may have derived from them.
    if (!impl.created_shared.empty()) ++impl.shared->generation;
    impl.seen_generation = impl.shared->generation;
  }
  impl.create_pipelines();
  phase = std::chrono::steady_clock::now();
  impl.run_timing = options.profile     ? gpu::Timing::per_dispatch
                    : options.time_runs ? gpu::Timing::whole
                                        : gpu::Timing::none;
  impl.record_runs();
  if (!impl.program.setup.empty()) {
    impl.setup_recording = impl.device->record(impl.setup_commands(), gpu::Timing::none);
    impl.owned_recordings.push_back(impl.setup_recording);
    impl.setup_due = true;
  }
  impl.report.record_seconds = seconds_since(phase);
  impl.report.dispatches = impl.program.launches.size();
  impl.report.setup_dispatches = impl.program.setup.size();
  impl.report.coop_matrix_dispatches =
      static_cast<size_t>(std::count_if(impl.program.launches.begin(), impl.program.launches.end(),
                                        [](const plan::PlannedLaunch& planned) {
                                          return planned.launch.kernel.ends_with("coopmat");
                                        }));
  impl.report.persistent_bytes = impl.program.memory.persistent_bytes;
  impl.report.shared_bytes = impl.program.memory.shared_bytes;
  impl.report.transient_logical_bytes = impl.program.memory.logical_transient_bytes;
  impl.report.transient_physical_bytes = impl.program.memory.physical_transient_bytes;
  impl.report.memory_plan = plan::describe_memory(impl.program);
  impl.report.dispatch_list = plan::describe_dispatches(impl.program);
  for (size_t i = 0; i < impl.program.launches.size(); ++i) {
    const plan::LaunchCost cost = plan::launch_cost(impl.program, impl.program.launches[i]);
    impl.report.dispatch_costs.push_back(
        {impl.program.launches[i].launch.label, cost.flops, cost.bytes});
  }
  impl.report.build_seconds = seconds_since(start);
}

Session::~Session() = default;

void Session::set_input(std::string_view name, std::span<const float> values) {
  impl_->set_input(name, DType::f32, values.data(), values.size());
}

void Session::set_input(std::string_view name, std::span<const int32_t> values) {
  impl_->set_input(name, DType::i32, values.data(), values.size());
}

bool Session::has_input(std::string_view name) const {
  return impl_->inputs.count(name) > 0;
}

void Session::run() {
  start_run();
  finish_run();
}

void Session::start_run() {
  Impl& impl = *impl_;
  impl.refuse_during_chunked_run("start_run");
  impl.refuse_during_segmented_run("start_run");
  impl.run_setup_if_due();
  const size_t started = impl.input_slot;
  impl.bring_inputs_up_to_date(started);
  impl.device->start(impl.slots[started].recording);
  if (impl.updates_shared) impl.seen_generation = ++impl.shared->generation;
  // The run before it, if still in flight, finishes behind it in the queue; its slot takes the
  // next inputs.
  impl.finish_run();
  impl.running = started;
  impl.input_slot = 1 - started;
}

void Session::finish_run() {
  impl_->finish_run();
}

std::pair<const std::byte*, TensorType> Session::Impl::downloaded(std::string_view name) const {
  auto it = outputs.find(name);
  if (it == outputs.end()) program.graph.output(name);  // throws, listing outputs
  if (it->second.bound)
    throw Error("output '" + std::string(name) + "' is bound to a buffer (bind_output)");
  const StagingSlot& slot = it->second;
  size_t slot_read = finished.value_or(0);
  if (segmenting.submitted > 0) {
    const size_t segment = runtime::segment_of(output_ready_after(slot), segmenting.ends);
    if (segment >= segmenting.waited)
      throw Error("output '" + std::string(name) + "' is final after segment " +
                  std::to_string(segment) + " of the run under way: wait for it (wait_segment)");
    slot_read = 0;
  } else if (!finished) {
    throw Error("output '" + std::string(name) + "' read before the first run finished");
  }
  const std::byte* data =
      static_cast<const std::byte*>(device->mapped(slots[slot_read].download)) + slot.offset;
  return {data, program.graph.type(slot.value)};
}

std::vector<float> Session::output(std::string_view name) const {
  const auto [data, type] = impl_->downloaded(name);
  return host_values(type.dtype, data, static_cast<size_t>(type.elements()));
}

std::span<const float> Session::f32_output(std::string_view name) const {
  const auto [data, type] = impl_->downloaded(name);
  if (type.dtype != DType::f32) {
    throw Error("output '" + std::string(name) + "' is " + type_string(type) +
                ", not f32: read it with output()");
  }
  return {reinterpret_cast<const float*>(data), static_cast<size_t>(type.elements())};
}

float Session::scalar_output(std::string_view name) const {
  const std::vector<float> values = output(name);
  if (values.size() != 1) {
    throw Error("output '" + std::string(name) + "' has " + std::to_string(values.size()) +
                " values, not one");
  }
  return values[0];
}

std::vector<float> Session::read(std::string_view leaf) const {
  impl_->finish_run();
  const ValueId value = impl_->persistent_leaf(leaf);
  const gpu::BufferRange range = impl_->range_of(value);
  const TensorType& type = impl_->program.graph.type(value);
  std::vector<std::byte> bytes(type.bytes());
  impl_->device->read_buffer(range.buffer, range.offset, bytes);
  return host_values(type.dtype, bytes.data(), static_cast<size_t>(type.elements()));
}

void Session::write(std::string_view leaf, std::span<const float> values) {
  const ValueId value = impl_->persistent_leaf(leaf);
  const TensorType& type = impl_->program.graph.type(value);
  if (static_cast<int64_t>(values.size()) != type.elements()) {
    throw Error("'" + std::string(leaf) + "' is " + type_string(type) + " (" +
                std::to_string(type.elements()) + " values) but was given " +
                std::to_string(values.size()) + " values");
  }
  impl_->finish_run();
  const gpu::BufferRange range = impl_->range_of(value);
  impl_->device->write_buffer(range.buffer, range.offset, device_bytes(type.dtype, values));
  impl_->setup_due = !impl_->program.setup.empty();
  if (impl_->shared) impl_->seen_generation = ++impl_->shared->generation;
}

std::vector<std::string> Session::persistent_names() const {
  return impl_->persistent_names;
}

TensorType Session::leaf_type(std::string_view leaf) const {
  return impl_->program.graph.type(impl_->persistent_leaf(leaf));
}

const BuildReport& Session::report() const {
  return impl_->report;
}

std::vector<DispatchProfile> Session::profile() const {
  if (!impl_->profile) throw Error("profiling is off: create the session with profile = true");
  std::vector<DispatchProfile> entries;
  for (const gpu::DispatchTiming& timing : impl_->last_timings()) {
    entries.push_back({timing.label, timing.start_ms, timing.duration_ms});
  }
  return entries;
}

double Session::last_run_gpu_ms() const {
  if (!impl_->time_runs) throw Error("run timing is off: create the session with time_runs = true");
  const std::vector<gpu::DispatchTiming> timings = impl_->last_timings();
  if (timings.empty())
    throw Error("no timed run yet, or the device has no timestamps (" + impl_->report.device + ")");
  return timings.front().duration_ms;
}

void Session::write_trace(const std::string& path) const {
  if (!impl_->profile) throw Error("profiling is off: create the session with profile = true");
  gpu::write_chrome_trace(impl_->last_timings(), path);
}

void Session::bind_input(std::string_view name, uint32_t buffer, uint64_t offset) {
  Impl& impl = *impl_;
  impl.refuse_during_chunked_run("bind_input");
  impl.refuse_during_segmented_run("bind_input");
  auto it = impl.inputs.find(name);
  if (it == impl.inputs.end())
    throw Error("the program has no input '" + std::string(name) + "' to bind");
  impl.split_measured_run();
  impl.finish_run();
  it->second.bound = gpu::BufferRange{buffer, offset, it->second.bytes};
  it->second.only_in.reset();
  impl.record_runs();
}

void Session::bind_output(std::string_view name, uint32_t buffer, uint64_t offset) {
  Impl& impl = *impl_;
  impl.refuse_during_chunked_run("bind_output");
  impl.refuse_during_segmented_run("bind_output");
  auto it = impl.outputs.find(name);
  if (it == impl.outputs.end()) impl.program.graph.output(name);  // throws, listing outputs
  impl.split_measured_run();
  impl.finish_run();
  it->second.bound = gpu::BufferRange{buffer, offset, it->second.bytes};
  impl.record_runs();
}

size_t Session::set_chunk_budget(double budget_ms) {
  Impl& impl = *impl_;
  impl.refuse_during_chunked_run("set_chunk_budget");
  impl.refuse_during_segmented_run("set_chunk_budget");
  if (budget_ms > 0 && !impl.device->info().caps.timestamps)
    throw Error("chunked runs measure GPU time, and " + impl.report.device +
                " has no timestamps on its queue");
  impl.split_measured_run();
  impl.chunking.budget_ms = budget_ms;
  impl.record_chunks();
  return impl.chunking.recordings.size();
}

size_t Session::chunk_count() const {
  impl_->split_measured_run();
  return impl_->chunking.recordings.size();
}

double Session::next_chunk_ms() const {
  impl_->split_measured_run();
  const Impl::Chunking& chunking = impl_->chunking;
  return chunking.recording_ms.empty() ? 0 : chunking.recording_ms.at(chunking.next);
}

bool Session::run_next_chunk() {
  Impl& impl = *impl_;
  Impl::Chunking& chunking = impl.chunking;
  if (chunking.recordings.empty())
    throw Error("run_next_chunk needs a chunk budget first (set_chunk_budget)");
  if (chunking.next == 0) {
    impl.refuse_during_segmented_run("run_next_chunk");
    impl.split_measured_run();
    impl.finish_run();
    impl.run_setup_if_due();
    impl.bring_inputs_up_to_date(0);
    impl.input_slot = 1;  // inputs set during the chunked run wait in the other slot
    if (chunking.dispatch_ms.empty()) chunking.profiled_run_started = true;
  }
  const gpu::RecordingId chunk = chunking.recordings.at(chunking.next);
  impl.device->start(chunk);
  chunking.in_flight = chunk;
  chunking.in_flight_ends_run = ++chunking.next == chunking.recordings.size();
  if (!chunking.in_flight_ends_run) return false;
  chunking.next = 0;
  if (impl.updates_shared) impl.seen_generation = ++impl.shared->generation;
  return true;
}

std::optional<size_t> Session::output_ready_after(std::string_view name) const {
  auto it = impl_->outputs.find(name);
  if (it == impl_->outputs.end()) impl_->program.graph.output(name);  // throws, listing outputs
  const int64_t ready = impl_->output_ready_after(it->second);
  if (ready < 0) return std::nullopt;
  return static_cast<size_t>(ready);
}

size_t Session::set_segments(std::span<const size_t> segment_ends) {
  Impl& impl = *impl_;
  impl.refuse_during_segmented_run("set_segments");
  impl.refuse_during_chunked_run("set_segments");
  std::vector<size_t> ends(segment_ends.begin(), segment_ends.end());
  if (!ends.empty() && ends.back() + 1 == impl.program.launches.size()) ends.pop_back();
  runtime::check_segment_ends(ends, impl.program.launches.size());
  impl.finish_run();
  impl.segmenting.ends = std::move(ends);
  impl.record_segments();
  return impl.segmenting.recordings.size();
}

size_t Session::segment_count() const {
  return impl_->segmenting.recordings.size();
}

size_t Session::output_segment(std::string_view name) const {
  auto it = impl_->outputs.find(name);
  if (it == impl_->outputs.end()) impl_->program.graph.output(name);  // throws, listing outputs
  return runtime::segment_of(impl_->output_ready_after(it->second), impl_->segmenting.ends);
}

void Session::submit_segment(size_t index) {
  impl_->submit_segment(index);
}

void Session::wait_segment(size_t index) {
  impl_->wait_segment(index);
}

uint32_t Session::validation_messages() const {
  return impl_->device->validation_message_count();
}

void Session::check_guards() const {
  impl_->finish_run();
  const Impl& impl = *impl_;
  if (impl.guard_bytes == 0) throw Error("check_guards needs a session built with guard_bytes");
  std::vector<std::vector<uint32_t>> arenas;
  for (size_t a = 0; a < impl.arena_buffers.size(); ++a) {
    arenas.emplace_back(impl.program.arenas[a].bytes / 4);
    impl.device->read_buffer(impl.arena_buffers[a], 0,
                             std::as_writable_bytes(std::span(arenas.back())));
  }
  for (const auto& [value, region] : impl.program.regions) {
    const uint64_t first = (region.offset + region.bytes) / 4;
    for (uint64_t word = first; word < first + impl.guard_bytes / 4; ++word) {
      if (arenas[region.arena][word] != kGuardWord) {
        const Node& node = impl.program.graph.node(value);
        throw Error("a kernel wrote past %" + std::to_string(value) + " (" + node.op + ", " +
                    type_string(node.type) + "): guard word " + std::to_string(word - first) +
                    " was overwritten");
      }
    }
  }
}

}  // namespace mg
