#include "backends/vulkan/runtime/profiler/timestamps.hpp"

#include "backends/vulkan/runtime/vk_result.hpp"

namespace mg::gpu::detail {

std::vector<DispatchTiming> read_timings(VkDevice device, const Recording& recording,
                                         double timestamp_period_ns, uint32_t valid_bits) {
  if (recording.timestamps == VK_NULL_HANDLE || !recording.submitted || recording.in_flight)
    return {};
  std::vector<uint64_t> ticks(timestamp_count(recording));
  check(vkGetQueryPoolResults(device, recording.timestamps, 0, static_cast<uint32_t>(ticks.size()),
                              ticks.size() * sizeof(uint64_t), ticks.data(), sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "reading the timestamps of " + recording.name);

  // Only the low valid_bits of a timestamp count; the rest are undefined.
  const uint64_t mask = valid_bits >= 64 ? ~0ull : (1ull << valid_bits) - 1;
  const double ms_per_tick = timestamp_period_ns * 1e-6;
  const uint64_t origin = ticks[0] & mask;
  if (recording.timing == Timing::whole)
    return {{"run", 0.0, static_cast<double>(((ticks[1] & mask) - origin) & mask) * ms_per_tick}};
  const size_t count = recording.dispatch_labels.size();
  std::vector<DispatchTiming> timings(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t start = ticks[2 * i] & mask, end = ticks[2 * i + 1] & mask;
    timings[i].label = recording.dispatch_labels[i];
    timings[i].start_ms = static_cast<double>((start - origin) & mask) * ms_per_tick;
    timings[i].duration_ms = static_cast<double>((end - start) & mask) * ms_per_tick;
  }
  return timings;
}

}  // namespace mg::gpu::detail
