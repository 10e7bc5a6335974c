#include "runtime/run_commands.hpp"

#include <algorithm>

#include "meganeura/error.hpp"

namespace mg::runtime {
namespace {

void append(std::vector<gpu::Command>& list, std::span<const gpu::Command> commands) {
  list.insert(list.end(), commands.begin(), commands.end());
}

const gpu::Command kBarrier{gpu::Command::Kind::barrier};

}  // namespace

std::vector<gpu::Command> whole_run(const RunCommands& run) {
  std::vector<gpu::Command> list = run.input_copies;
  if (!list.empty()) list.push_back(kBarrier);
  for (const std::vector<gpu::Command>& dispatch : run.dispatches) append(list, dispatch);
  list.push_back(kBarrier);
  append(list, run.update_copies);
  for (const RunCommands::OutputCopy& output : run.output_copies) list.push_back(output.copy);
  return list;
}

size_t segment_of(int64_t ready_after, std::span<const size_t> segment_ends) {
  const auto first_end = std::find_if(segment_ends.begin(), segment_ends.end(), [&](size_t end) {
    return static_cast<int64_t>(end) >= ready_after;
  });
  return static_cast<size_t>(first_end - segment_ends.begin());
}

void check_segment_ends(std::span<const size_t> segment_ends, size_t dispatches) {
  for (size_t s = 0; s < segment_ends.size(); ++s) {
    if (segment_ends[s] >= dispatches || (s > 0 && segment_ends[s] <= segment_ends[s - 1]))
      throw Error("segments of a run must end after ascending dispatches below " +
                  std::to_string(dispatches) + ", got one ending after dispatch " +
                  std::to_string(segment_ends[s]) + " (Session::set_segments)");
  }
}

std::vector<std::vector<gpu::Command>> segmented_run(const RunCommands& run,
                                                     std::span<const size_t> segment_ends) {
  check_segment_ends(segment_ends, run.dispatches.size());
  std::vector<std::vector<gpu::Command>> segments(segment_ends.size() + 1);
  segments[0] = run.input_copies;
  if (!run.input_copies.empty()) segments[0].push_back(kBarrier);
  size_t dispatch = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const size_t end = s < segment_ends.size() ? segment_ends[s] + 1 : run.dispatches.size();
    for (; dispatch < end; ++dispatch) append(segments[s], run.dispatches[dispatch]);
    segments[s].push_back(kBarrier);
    if (s + 1 == segments.size()) append(segments[s], run.update_copies);
    for (const RunCommands::OutputCopy& output : run.output_copies) {
      if (segment_of(output.ready_after, segment_ends) == s) segments[s].push_back(output.copy);
    }
  }
  return segments;
}

}  // namespace mg::runtime
