#pragma once
// A Session's run as commands, in its parts: the inputs' uploads, the dispatches, the copies of
// assigned values onto their leaves and the outputs' downloads. Recorded whole (one submission a
// run) or cut into segments (Session::set_segments): each segment ends after a given dispatch
// and downloads the outputs that are final by then, so that the host can read them while the
// GPU runs the next segments.
#include <cstdint>
#include <span>
#include <vector>

#include "backends/vulkan/runtime/gpu.hpp"

namespace mg::runtime {

struct RunCommands {
  std::vector<gpu::Command> input_copies;
  // One entry a dispatch, in order: the dispatch, after a barrier where it needs one.
  std::vector<std::vector<gpu::Command>> dispatches;
  std::vector<gpu::Command> update_copies;
  struct OutputCopy {
    gpu::Command copy;
    // The dispatch after which the output is final; -1 before the first (an input or a leaf
    // passed through), the dispatch count where an update copy writes it.
    int64_t ready_after = -1;
  };
  std::vector<OutputCopy> output_copies;
};

// The run as one list.
std::vector<gpu::Command> whole_run(const RunCommands& run);

// The segment that ends with dispatch `ready_after` or the first after it, of segments ending
// after each of `segment_ends` (ascending) and at the end.
size_t segment_of(int64_t ready_after, std::span<const size_t> segment_ends);

// Throws mg::Error unless `segment_ends` ascend and lie below `dispatches`.
void check_segment_ends(std::span<const size_t> segment_ends, size_t dispatches);

// The run cut after each dispatch of `segment_ends` (ascending, each below the dispatch count):
// segment_ends.size() + 1 lists. The first uploads the inputs; each downloads the outputs that
// segment_of puts in it, after a barrier over its dispatches; the last also copies the updates
// (before its downloads, as a whole run does). A segment submitted behind another runs after it
// (every recording starts with a barrier), so the order of the whole run is kept.
std::vector<std::vector<gpu::Command>> segmented_run(const RunCommands& run,
                                                     std::span<const size_t> segment_ends);

}  // namespace mg::runtime
