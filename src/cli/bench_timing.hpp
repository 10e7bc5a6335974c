#pragma once
// What `bench kernels` and `bench workloads` time with: a warm-up, then the median.
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace mg::cli {

// A GPU lowers its clocks while idle, and raises them only under sustained load: while a case's
// parameters are generated and uploaded its clock can drop to a fraction, and the first runs
// after it are slow. The H200 raises its clock in steps over a few tenths of a second of load,
// so the warm-up lasts well past that: every case runs back to back for kWarmupSeconds (at
// least 3 runs) before anything is timed; bench/kernels_pytorch.py and
// bench/workloads_pytorch.py do the same.
inline constexpr double kWarmupSeconds = 1.0;

inline void warm_up(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  for (int runs = 0;
       runs < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
                       kWarmupSeconds;
       ++runs) {
    run();
  }
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace mg::cli
