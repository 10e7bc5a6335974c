#include "meganeura/session.hpp"

#include <chrono>
#include <future>
#include <optional>

#include "backends/vulkan/runtime/device_target.hpp"
#include "backends/vulkan/runtime/memory_budget.hpp"
#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "plan/roofline.hpp"
#include "runtime/session_impl.hpp"

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
  options.column_limit =
      plan::column_limit_for(options.arena_limit, gpu::largest_device_local_heap(info));
  options.setup = session.setup;
  return options;
}

// Written into every guard: a NaN pattern no kernel produces by accident.
constexpr uint32_t kGuardWord = 0x7fbadbad;

}  // namespace

Precision parse_precision(std::string_view text) {
  if (text == "strict") return Precision::strict;
  if (text == "fast") return Precision::fast;
  if (text == "bf16") return Precision::bf16;
  throw Error("unknown precision \"" + std::string(text) + "\": use strict, fast or bf16");
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::fast:
      return "fast";
    case Precision::bf16:
      return "bf16";
    default:
      return "strict";
  }
}

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
  gpu::prepare_shader_compiler();
  auto phase = std::chrono::steady_clock::now();
  impl.device = options.shared_device
                    ? options.shared_device->device
                    : gpu::Device::open(options.device, options.validation, switches);
  impl.report.device_seconds = options.shared_device ? 0.0 : seconds_since(phase);
  const gpu::DeviceInfo& info = impl.device->info();
  impl.report.device = gpu::describe_device(info);
  const vulkan::VulkanTarget target =
      vulkan::device_target(*impl.device, options.precision != Precision::strict,
                            options.precision == Precision::bf16, switches);
  impl.report.coop_matrix_available = target.cooperative_matrices();
  plan::PlanOptions plan_options = plan_options_of(info, options);
  plan_options.shared_leaves = impl.shared != nullptr;
  // The parameters' and optimizer state's memory, most of a training program's, is allocated on
  // another thread while the program is planned: the driver's time for it and planning's overlap.
  // Where the leaves alone exceed the device's heap, nothing is allocated early, so that
  // require_heap_for below names the whole program's needs.
  // Each buffer the allocation makes joins owned_buffers at once (this thread touches that list
  // only after the allocation is done), so it is freed with the session also when planning
  // throws: the future waits for the allocation as it is destroyed, before impl_ is.
  std::optional<plan::LeafLayout> leaf_layout;
  std::vector<gpu::BufferId> leaf_buffers;
  std::future<void> leaf_allocation;
  if (!plan_options.shared_leaves && plan_options.guard_bytes == 0) {
    leaf_layout = plan::layout_leaves(graph, plan_options);
    plan_options.leaf_layout = &*leaf_layout;
    uint64_t leaf_bytes = 0;
    for (uint64_t bytes : leaf_layout->arena_bytes) leaf_bytes += bytes;
    const uint64_t heap = gpu::largest_device_local_heap(info);
    if (heap == 0 || leaf_bytes <= heap) {
      leaf_allocation = std::async(std::launch::async, [&impl, &leaf_buffers, &leaf_layout] {
        for (size_t a = 0; a < leaf_layout->arena_bytes.size(); ++a) {
          leaf_buffers.push_back(
              impl.device->create_buffer(leaf_layout->arena_bytes[a], gpu::BufferUse::device,
                                         "persistent arena " + std::to_string(a)));
          impl.owned_buffers.push_back(leaf_buffers.back());
        }
      });
    }
  }
  phase = std::chrono::steady_clock::now();
  impl.program = plan::build_program(graph, target, plan_options);
  impl.report.plan_seconds = seconds_since(phase);
  impl.index_rules = runtime::index_rules(graph);
  const Graph& planned = impl.program.graph;

  // A program that cannot fit fails here, on one line, before anything more is allocated.
  phase = std::chrono::steady_clock::now();
  if (leaf_allocation.valid()) {
    try {
      leaf_allocation.get();
    } catch (const Error&) {
      gpu::require_heap_for(info, impl.program);  // a program too large says so first
      throw;
    }
  }
  gpu::require_heap_for(info, impl.program);
  for (size_t a = 0; a < impl.program.arenas.size(); ++a) {
    const plan::Arena& arena = impl.program.arenas[a];
    if (arena.kind == plan::ArenaKind::shared) {
      impl.arena_buffers.push_back(impl.shared_buffer(arena.leaf));
      continue;
    }
    if (a < leaf_buffers.size()) {
      impl.arena_buffers.push_back(leaf_buffers[a]);  // already in owned_buffers
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
  impl.report.allocation_seconds = seconds_since(phase);
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
  impl.create_pipelines();
  phase = std::chrono::steady_clock::now();
  impl.run_timing = options.profile     ? gpu::Timing::per_dispatch
                    : options.time_runs ? gpu::Timing::whole
                                        : gpu::Timing::none;
  impl.record_runs();
  if (!impl.program.setup.empty()) {
    impl.setup_recording = impl.device->record(impl.setup_commands(), gpu::Timing::none);
    impl.owned_recordings.push_back(impl.setup_recording);
    impl.trace_setup();
    impl.setup_due = true;
  }
  if (impl.shared) {
    for (const auto& [leaf, value] : planned.updates()) {
      if (impl.program.arenas[impl.program.regions.at(leaf).arena].kind ==
          plan::ArenaKind::shared) {
        impl.updates_shared = true;
        impl.updated_shared_names.push_back(planned.node(leaf).name);
      }
    }
    // The tensors this session created changed what the others may have derived from them.
    // Taking in the others' changes first marks the leaves its setup reads, traced above.
    std::vector<std::string> created;
    for (ValueId leaf : impl.created_shared) created.push_back(planned.node(leaf).name);
    if (created.empty())
      impl.seen_generation = impl.shared->generation;
    else
      impl.note_shared_written(created);
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
  if (impl.updates_shared) impl.note_shared_written(impl.updated_shared_names);
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
  impl_->mark_leaf_written(value);
  // With shared tensors every parameter and state is one.
  if (impl_->shared) impl_->note_shared_written(std::vector<std::string>{std::string(leaf)});
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
  std::vector<gpu::DispatchTiming> timings = impl_->last_timings();
  // The costs go with the timings only where both list the same dispatches (a run recorded in
  // parts is timed part by part).
  const std::vector<DispatchCost>& costs = impl_->report.dispatch_costs;
  bool costed = costs.size() == timings.size();
  for (size_t i = 0; costed && i < timings.size(); ++i) costed = costs[i].label == timings[i].label;
  for (size_t i = 0; costed && i < timings.size(); ++i) {
    timings[i].flops = costs[i].flops;
    timings[i].bytes = costs[i].bytes;
  }
  gpu::write_chrome_trace(timings, path);
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
