#pragma once
#include <span>
#include <string>
#include <vector>

#include "backends/vulkan/runtime/buffer.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/pipeline.hpp"

namespace mg::gpu::detail {

// A command buffer recorded once and submitted any number of times, with everything it needs
// made up front (descriptor sets, timestamp queries, fence) so submitting allocates nothing.
struct Recording {
  std::string name;  // "recording 3 (12 dispatches, first 'matmul')", for errors
  VkCommandBuffer commands = VK_NULL_HANDLE;
  VkDescriptorPool descriptor_pool = VK_NULL_HANDLE;
  VkQueryPool timestamps = VK_NULL_HANDLE;  // two queries a dispatch, or two in all (timing)
  Timing timing = Timing::none;
  VkFence fence = VK_NULL_HANDLE;
  std::vector<std::string> dispatch_labels;
  std::vector<BufferId> buffers;  // every buffer it touches, sorted
  std::string stale_reason;       // set when a buffer it uses is destroyed
  bool in_flight = false;         // submitted and not yet seen finished
  bool submitted = false;
};

struct RecorderContext {
  VkDevice device;
  VkCommandPool command_pool;
  const PhysicalDevice& physical;
  const std::vector<Buffer>& buffers;
  const std::vector<Pipeline>& pipelines;
};

// Checks every command against the device limits (throwing mg::Error naming the command) and
// records them. Timestamps are recorded only when asked for and supported.
Recording record_commands(const RecorderContext& context, std::span<const Command> commands,
                          Timing timing, RecordingId id);

// The queries of a recording's timestamp pool: two a dispatch, or two in all for Timing::whole.
uint32_t timestamp_count(const Recording& recording);

void destroy_recording(VkDevice device, VkCommandPool command_pool, Recording& recording);

// A global barrier covering compute and transfer work on both sides.
void record_full_barrier(VkCommandBuffer commands);

}  // namespace mg::gpu::detail
