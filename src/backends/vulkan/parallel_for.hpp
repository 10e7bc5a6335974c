#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <limits>
#include <thread>
#include <vector>

namespace mg::vulkan {

// Runs task(i) for every i in [0, count) on at most one thread a core and at most `max_workers`
// (the calling thread among them), each taking the next index as it finishes one. A task must
// not throw: callers keep each task's exception and rethrow the first in index order, so errors
// do not depend on timing.
template <typename Task>
void parallel_for(size_t count, Task task,
                  size_t max_workers = std::numeric_limits<size_t>::max()) {
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::min({count, max_workers, cores});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) task(i);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
}

}  // namespace mg::vulkan
