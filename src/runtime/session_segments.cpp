// Segmented runs (Session::set_segments): a run submitted in pieces cut after given dispatches,
// each downloading the outputs that are final by then, so that the host works on them while the
// GPU computes the rest (data-parallel training sums gradients during backward).
#include "runtime/session_impl.hpp"

namespace mg {

void Session::Impl::record_segments() {
  for (gpu::RecordingId recording : segmenting.recordings) drop_recording(recording);
  segmenting.recordings.clear();
  if (segmenting.ends.empty()) return;
  for (const std::vector<gpu::Command>& segment :
       runtime::segmented_run(commands(slots[0]), segmenting.ends))
    segmenting.recordings.push_back(own_recording(segment, gpu::Timing::none));
}

void Session::Impl::submit_segment(size_t index) {
  Segmenting& run = segmenting;
  if (run.recordings.empty()) throw Error("submit_segment needs segments first (set_segments)");
  if (index != run.submitted || index >= run.recordings.size())
    throw Error("segment " + std::to_string(index) +
                " submitted out of order: " + std::to_string(run.submitted) + " of the run's " +
                std::to_string(run.recordings.size()) +
                " segments are submitted (segment 0 starts a run after the last one ended)");
  if (index == 0) {
    refuse_during_chunked_run("a segmented run");
    // Also waits for a run recorded into the app's command buffer: the segments run on
    // Meganeura's own submissions, which the app's command buffer does not order.
    finish_run();
    run_setup_if_due();
    bring_inputs_up_to_date(0);
    input_slot = 1;  // inputs set during the segmented run wait in the other slot
  }
  device->start(run.recordings[index]);
  ++run.submitted;
  if (run.submitted == run.recordings.size() && updates_shared)
    note_shared_written(updated_shared_names);
}

void Session::Impl::wait_segment(size_t index) {
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

void Session::Impl::finish_segmented_run() {
  if (segmenting.submitted == 0) return;
  while (segmenting.submitted < segmenting.recordings.size()) submit_segment(segmenting.submitted);
  wait_segment(segmenting.recordings.size() - 1);
}

void Session::Impl::refuse_during_segmented_run(const char* what) const {
  if (segmenting.submitted != 0)
    throw Error(std::string(what) +
                " while a segmented run is under way: wait for its last segment first "
                "(wait_segment)");
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

}  // namespace mg
