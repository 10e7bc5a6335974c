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
  // On a device adopted from an app (RecorderContext::keep_for_replay): the commands and their
  // descriptor sets, which record_into_app replays into the app's command buffers, and the value
  // of the app timeline that the last of those command buffers signals.
  std::vector<Command> replay;
  std::vector<VkDescriptorSet> descriptor_sets;
  uint64_t app_value = 0;
};

struct RecorderContext {
  VkDevice device;
  VkCommandPool command_pool;
  const PhysicalDevice& physical;
  const std::vector<Buffer>& buffers;
  const std::vector<Pipeline>& pipelines;
  bool keep_for_replay = false;
};

// Checks every command against the device limits (throwing mg::Error naming the command) and
// records them. Timestamps are recorded only when asked for and supported.
Recording record_commands(const RecorderContext& context, std::span<const Command> commands,
                          Timing timing, RecordingId id);

// The queries of a recording's timestamp pool: two a dispatch, or two in all for Timing::whole.
uint32_t timestamp_count(const Recording& recording);

// Replays `prologue` (no dispatches) and then recordings kept for replay into `commands`, a
// command buffer of the app in the recording state, outside a render pass: after a barrier over
// the app's earlier work (any stage), each after a full barrier, and before a barrier that makes
// their writes visible to the app's later work (any stage) and the host. It binds compute
// pipelines, descriptor sets and push constants of its own.
void record_into_app(const RecorderContext& context, std::span<const Command> prologue,
                     std::span<Recording* const> recordings, VkCommandBuffer commands);

void destroy_recording(VkDevice device, VkCommandPool command_pool, Recording& recording);

// A global barrier covering compute and transfer work on both sides.
void record_full_barrier(VkCommandBuffer commands);

}  // namespace mg::gpu::detail
