// The Session's embedding side (docs/EMBEDDING.md): the app's buffers bound to inputs and outputs,
// copied or in place, runs cut into chunks under a GPU-time budget, and runs and chunks recorded
// into the app's own command buffers.
#include <algorithm>

#include "ops/op.hpp"
#include "runtime/session_impl.hpp"

namespace mg {
namespace {

// The value whose storage `value` is, through views (reshape, stop_gradient).
ValueId view_root(const Graph& graph, ValueId value) {
  while (is_view_op(graph.node(value).op)) value = graph.node(value).inputs[0];
  return value;
}

// Every value of the graph the kernels see at a bound in-place buffer: the bound inputs and
// outputs and the views of them.
std::map<ValueId, gpu::BufferRange> in_place_values_of(
    const Graph& graph, const std::vector<std::pair<ValueId, gpu::BufferRange>>& bound) {
  std::map<ValueId, gpu::BufferRange> values;
  for (size_t i = 0; i < graph.size(); ++i) {
    const ValueId root = view_root(graph, static_cast<ValueId>(i));
    for (const auto& [bound_root, range] : bound)
      if (root == bound_root) values[static_cast<ValueId>(i)] = range;
  }
  return values;
}

}  // namespace

void Session::Impl::check_in_place(const std::string& what, ValueId value, uint64_t offset,
                                   bool output) const {
  const uint64_t alignment = device->info().caps.min_storage_buffer_offset_alignment;
  if (alignment > 0 && offset % alignment != 0)
    throw Error(what + " bound in place at offset " + std::to_string(offset) +
                ", which is not a multiple of the device's storage-buffer offset alignment (" +
                std::to_string(alignment) + ")");
  if (!output) return;
  const Graph& graph = program.graph;
  const ValueId root = view_root(graph, value);
  const Node& node = graph.node(root);
  if (node.is_leaf())
    throw Error(what + " is the " + node.op + " '" + node.name +
                "' itself, which no kernel writes: bind it copied");
  if (std::find(program.setup_results.begin(), program.setup_results.end(), root) !=
      program.setup_results.end())
    throw Error(what + " is computed once by the setup, not by each run: bind it copied");
  for (const auto& [leaf, update] : graph.updates())
    if (update == root)
      throw Error(what + " is also the new value of '" + graph.node(leaf).name +
                  "', which the run writes over it: bind it copied");
  for (const auto& [name, other] : outputs)
    if (other.value != value && other.in_place && view_root(graph, other.value) == root)
      throw Error(what + " shares its memory with output '" + name +
                  "', already bound in place: bind one of them copied");
}

void Session::Impl::bind(StagingSlot& slot, bool output, const std::string& what, uint32_t buffer,
                         uint64_t offset, Binding binding) {
  refuse_during_chunked_run("binding a buffer");
  refuse_during_segmented_run("binding a buffer");
  const bool in_place = binding == Binding::in_place;
  if (in_place) check_in_place(what, slot.value, offset, output);
  split_measured_run();
  finish_run();
  slot.bound = gpu::BufferRange{buffer, offset, slot.bytes};
  slot.in_place = in_place;
  std::vector<std::pair<ValueId, gpu::BufferRange>> bound;
  for (const auto& [name, input] : inputs)
    if (input.in_place) bound.emplace_back(input.value, *input.bound);
  for (const auto& [name, staged] : outputs)
    if (staged.in_place) bound.emplace_back(view_root(program.graph, staged.value), *staged.bound);
  in_place_values = in_place_values_of(program.graph, bound);
  record_runs();
}

void Session::bind_input(std::string_view name, uint32_t buffer, uint64_t offset, Binding binding) {
  Impl& impl = *impl_;
  auto it = impl.inputs.find(name);
  if (it == impl.inputs.end())
    throw Error("the program has no input '" + std::string(name) + "' to bind");
  impl.bind(it->second, false, "input '" + std::string(name) + "'", buffer, offset, binding);
  it->second.only_in.reset();
}

void Session::bind_output(std::string_view name, uint32_t buffer, uint64_t offset,
                          Binding binding) {
  Impl& impl = *impl_;
  auto it = impl.outputs.find(name);
  if (it == impl.outputs.end()) impl.program.graph.output(name);  // throws, listing outputs
  impl.bind(it->second, true, "output '" + std::string(name) + "'", buffer, offset, binding);
}

Session::Transfers Session::run_transfers() const {
  Transfers transfers;
  for (const gpu::Command& command : runtime::whole_run(impl_->commands(impl_->slots[0]))) {
    if (command.kind != gpu::Command::Kind::copy || command.copy.source.bytes == 0) continue;
    ++transfers.copies;
    transfers.bytes += command.copy.source.bytes;
  }
  return transfers;
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
  if (impl.updates_shared) impl.note_shared_written(impl.updated_shared_names);
  return true;
}

std::vector<gpu::Command> Session::Impl::staged_by_commands(size_t target) {
  std::vector<gpu::Command> updates;
  for (auto& [name, staging] : inputs) {
    if (!staging.only_in || *staging.only_in == target) continue;
    const std::byte* latest =
        static_cast<const std::byte*>(device->mapped(slots[1 - target].upload)) + staging.offset;
    gpu::Command update{gpu::Command::Kind::update};
    update.update.destination = slots[target].upload;
    update.update.offset = staging.offset;
    // Within the slot's staging, which is padded to 256 bytes.
    update.update.data.assign(latest, latest + (staging.bytes + 3) / 4 * 4);
    updates.push_back(std::move(update));
    staging.only_in.reset();
  }
  return updates;
}

Session::Recorded Session::record_run(void* native_commands) {
  Impl& impl = *impl_;
  impl.refuse_during_chunked_run("record_run");
  impl.refuse_during_segmented_run("record_run");
  const size_t slot = impl.input_slot;
  // The run that used this slot's staging before (two runs ago), perhaps in a command buffer the
  // app has not submitted yet, is waited for only when inputs must be staged over what it reads.
  if (std::any_of(impl.inputs.begin(), impl.inputs.end(), [&](const auto& input) {
        return input.second.only_in.has_value() && *input.second.only_in != slot;
      }))
    impl.device->finish(impl.slots[slot].recording);
  impl.bring_inputs_up_to_date(slot);
  std::vector<gpu::RecordingId> recordings;
  if (impl.setup_needed()) recordings.push_back(impl.due_setup_recording());
  recordings.push_back(impl.slots[slot].recording);
  const uint64_t value = impl.device->record_into({}, recordings, native_commands);
  impl.setup_done();
  if (impl.updates_shared) impl.note_shared_written(impl.updated_shared_names);
  // The run before it, if any, is ordered before it on the queue: waiting for this one waits for
  // both. This slot's outputs are those of the new run once it finishes.
  if (impl.finished == slot) impl.finished.reset();
  impl.running = slot;
  impl.input_slot = 1 - slot;
  return {value, true};
}

Session::Recorded Session::record_next_chunk(void* native_commands) {
  Impl& impl = *impl_;
  Impl::Chunking& chunking = impl.chunking;
  if (chunking.recordings.empty())
    throw Error("record_next_chunk needs a chunk budget first (set_chunk_budget)");
  std::vector<gpu::Command> prologue;
  std::vector<gpu::RecordingId> recordings;
  if (chunking.next == 0) {
    impl.refuse_during_segmented_run("record_next_chunk");
    impl.split_measured_run();
    // Inputs set since the last run (in the other slot's staging) reach this slot's staging
    // through the command buffer itself, not the host: the chunks of earlier runs that read it
    // may lie in command buffers the app has not submitted yet, even in this one.
    prologue = impl.staged_by_commands(0);
    impl.input_slot = 1;
    if (chunking.dispatch_ms.empty()) chunking.profiled_run_started = true;
    if (impl.setup_needed()) recordings.push_back(impl.due_setup_recording());
  }
  const gpu::RecordingId chunk = chunking.recordings.at(chunking.next);
  recordings.push_back(chunk);
  const uint64_t value = impl.device->record_into(prologue, recordings, native_commands);
  impl.setup_done();
  chunking.in_flight = chunk;
  chunking.in_flight_ends_run = ++chunking.next == chunking.recordings.size();
  if (!chunking.in_flight_ends_run) return {value, false};
  chunking.next = 0;
  if (impl.updates_shared) impl.note_shared_written(impl.updated_shared_names);
  return {value, true};
}

}  // namespace mg
