#include "backends/vulkan/runtime/command_recorder.hpp"

#include <algorithm>

#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu::detail {
namespace {

constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr VkAccessFlags kWorkWrites = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
constexpr VkAccessFlags kWorkAccess = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                      VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;

void memory_barrier(VkCommandBuffer commands, VkPipelineStageFlags source_stages,
                    VkAccessFlags source_access, VkPipelineStageFlags destination_stages,
                    VkAccessFlags destination_access) {
  auto barrier = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  barrier.srcAccessMask = source_access;
  barrier.dstAccessMask = destination_access;
  vkCmdPipelineBarrier(commands, source_stages, destination_stages, 0, 1, &barrier, 0, nullptr, 0,
                       nullptr);
}

std::string command_name(size_t index, const Command& command) {
  std::string name = "command " + std::to_string(index);
  if (command.kind == Command::Kind::dispatch && !command.dispatch.label.empty())
    name += " ('" + command.dispatch.label + "')";
  return name;
}

// Checks commands before anything is created, so a bad one leaks nothing.
class CommandChecker {
 public:
  explicit CommandChecker(const RecorderContext& context) : context_(context) {}

  void check(size_t index, const Command& command) {
    where_ = command_name(index, command);
    switch (command.kind) {
      case Command::Kind::dispatch:
        check_dispatch(command.dispatch);
        break;
      case Command::Kind::copy:
        check_range(command.copy.source, "copy source", false);
        check_range(
            {command.copy.destination, command.copy.destination_offset, command.copy.source.bytes},
            "copy destination", false);
        check_copy_overlap(command.copy);
        break;
      case Command::Kind::fill:
        check_range(command.fill.range, "fill", false);
        if (command.fill.range.offset % 4 != 0 || command.fill.range.bytes % 4 != 0)
          fail("fill offset and size must be multiples of 4 bytes");
        break;
      case Command::Kind::update:
        check_range({command.update.destination, command.update.offset, command.update.data.size()},
                    "update", false);
        if (command.update.offset % 4 != 0 || command.update.data.size() % 4 != 0)
          fail("update offset and size must be multiples of 4 bytes");
        break;
      case Command::Kind::barrier:
        break;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error("cannot record " + where_ + ": " + problem);
  }

  const Buffer& buffer(BufferId id) const {
    if (id >= context_.buffers.size() || !context_.buffers[id].alive())
      fail("buffer id " + std::to_string(id) + " does not exist (never created or destroyed)");
    return context_.buffers[id];
  }

  void check_range(const BufferRange& range, const std::string& role, bool binding) const {
    const Buffer& target = buffer(range.buffer);
    if (range.offset > target.bytes || range.bytes > target.bytes - range.offset)
      fail(role + " range [" + std::to_string(range.offset) + ", +" + std::to_string(range.bytes) +
           ") exceeds buffer '" + target.label + "' of " + std::to_string(target.bytes) + " bytes");
    if (!binding) return;
    const DeviceCaps& caps = context_.physical.info.caps;
    if (range.bytes == 0) fail(role + " binds an empty range of buffer '" + target.label + "'");
    if (range.bytes > caps.max_storage_buffer_range)
      fail(role + " binds " + std::to_string(range.bytes) + " bytes of buffer '" + target.label +
           "', more than the device's maxStorageBufferRange of " +
           std::to_string(caps.max_storage_buffer_range) + " bytes");
    if (range.offset % caps.min_storage_buffer_offset_alignment != 0)
      fail(role + " offset " + std::to_string(range.offset) + " into buffer '" + target.label +
           "' is not a multiple of the device's minStorageBufferOffsetAlignment (" +
           std::to_string(caps.min_storage_buffer_offset_alignment) + ")");
  }

  void check_copy_overlap(const CopyCommand& copy) const {
    const BufferRange& source = copy.source;
    bool overlaps = source.buffer == copy.destination &&
                    source.offset < copy.destination_offset + source.bytes &&
                    copy.destination_offset < source.offset + source.bytes;
    if (overlaps)
      fail("copy source and destination overlap in buffer '" + buffer(source.buffer).label + "'");
  }

  void check_dispatch(const DispatchCommand& dispatch) const {
    if (dispatch.pipeline >= context_.pipelines.size())
      fail("pipeline id " + std::to_string(dispatch.pipeline) + " does not exist");
    const Pipeline& pipeline = context_.pipelines[dispatch.pipeline];
    if (dispatch.bindings.size() != pipeline.binding_count)
      fail("kernel '" + pipeline.label + "' takes " + std::to_string(pipeline.binding_count) +
           " buffers but " + std::to_string(dispatch.bindings.size()) + " are bound");
    for (size_t b = 0; b < dispatch.bindings.size(); ++b)
      check_range(dispatch.bindings[b], "binding " + std::to_string(b), true);
    if (dispatch.push_constants.size() * 4 > pipeline.push_constant_bytes)
      fail(std::to_string(dispatch.push_constants.size() * 4) +
           " bytes of push constants for "
           "kernel '" +
           pipeline.label + "', which declares " + std::to_string(pipeline.push_constant_bytes));
    const auto& limit = context_.physical.info.caps.max_workgroup_count;
    for (int axis = 0; axis < 3; ++axis)
      if (dispatch.groups[axis] > limit[axis])
        fail(std::to_string(dispatch.groups[axis]) + " workgroups along axis " +
             std::to_string(axis) + ", more than the device's limit of " +
             std::to_string(limit[axis]));
  }

  const RecorderContext& context_;
  std::string where_;
};

void create_objects(const RecorderContext& context, std::span<const Command> commands,
                    Recording& recording) {
  VkDevice device = context.device;
  auto allocate =
      vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  allocate.commandPool = context.command_pool;
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(device, &allocate, &recording.commands),
        "allocating a command buffer");

  auto fence_info = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  check(vkCreateFence(device, &fence_info, nullptr, &recording.fence), "creating a fence");

  uint32_t sets = 0, descriptors = 0;
  for (const Command& command : commands) {
    if (command.kind != Command::Kind::dispatch || command.dispatch.bindings.empty()) continue;
    ++sets;
    descriptors += static_cast<uint32_t>(command.dispatch.bindings.size());
  }
  if (sets > 0) {
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptors};
    auto pool =
        vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
    pool.maxSets = sets;
    pool.poolSizeCount = 1;
    pool.pPoolSizes = &size;
    check(vkCreateDescriptorPool(device, &pool, nullptr, &recording.descriptor_pool),
          "creating a descriptor pool");
  }

  if (recording.timing != Timing::none && context.physical.info.caps.timestamps &&
      !recording.dispatch_labels.empty()) {
    auto query = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    query.queryType = VK_QUERY_TYPE_TIMESTAMP;
    query.queryCount = timestamp_count(recording);
    check(vkCreateQueryPool(device, &query, nullptr, &recording.timestamps),
          "creating a timestamp query pool");
  }
}

// One descriptor set per dispatch that binds buffers, allocated and written before recording.
std::vector<VkDescriptorSet> write_descriptor_sets(const RecorderContext& context,
                                                   std::span<const Command> commands,
                                                   const Recording& recording) {
  std::vector<VkDescriptorSet> sets(commands.size(), VK_NULL_HANDLE);
  std::vector<VkDescriptorBufferInfo> infos;
  std::vector<VkWriteDescriptorSet> writes;
  for (size_t i = 0; i < commands.size(); ++i) {
    const DispatchCommand& dispatch = commands[i].dispatch;
    if (commands[i].kind != Command::Kind::dispatch || dispatch.bindings.empty()) continue;
    auto allocate =
        vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    allocate.descriptorPool = recording.descriptor_pool;
    allocate.descriptorSetCount = 1;
    allocate.pSetLayouts = &context.pipelines[dispatch.pipeline].set_layout;
    check(vkAllocateDescriptorSets(context.device, &allocate, &sets[i]),
          "allocating descriptor sets");
    for (const BufferRange& range : dispatch.bindings)
      infos.push_back({context.buffers[range.buffer].handle, range.offset, range.bytes});
  }
  // Writes point into `infos`, which no longer grows.
  size_t next_info = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (sets[i] == VK_NULL_HANDLE) continue;
    auto write = vk_struct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    write.dstSet = sets[i];
    write.descriptorCount = static_cast<uint32_t>(commands[i].dispatch.bindings.size());
    write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    write.pBufferInfo = &infos[next_info];
    next_info += write.descriptorCount;
    writes.push_back(write);
  }
  vkUpdateDescriptorSets(context.device, static_cast<uint32_t>(writes.size()), writes.data(), 0,
                         nullptr);
  return sets;
}

void record_dispatch(const RecorderContext& context, const DispatchCommand& dispatch,
                     VkDescriptorSet set, VkCommandBuffer commands) {
  const Pipeline& pipeline = context.pipelines[dispatch.pipeline];
  vkCmdBindPipeline(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle);
  if (set != VK_NULL_HANDLE)
    vkCmdBindDescriptorSets(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, &set,
                            0, nullptr);
  if (pipeline.push_constant_bytes > 0) {
    // The whole declared block is pushed (zero-padded) so no push constant is ever undefined.
    std::vector<uint32_t> words(pipeline.push_constant_bytes / 4, 0);
    std::copy(dispatch.push_constants.begin(), dispatch.push_constants.end(), words.begin());
    vkCmdPushConstants(commands, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                       pipeline.push_constant_bytes, words.data());
  }
  vkCmdDispatch(commands, dispatch.groups[0], dispatch.groups[1], dispatch.groups[2]);
}

// The recording's timestamp reset and its commands, into `cb`.
void record_body(const RecorderContext& context, std::span<const Command> commands,
                 const std::vector<VkDescriptorSet>& sets, const Recording& recording,
                 VkCommandBuffer cb) {
  if (recording.timestamps != VK_NULL_HANDLE)
    vkCmdResetQueryPool(cb, recording.timestamps, 0, timestamp_count(recording));
  const bool per_dispatch =
      recording.timestamps != VK_NULL_HANDLE && recording.timing == Timing::per_dispatch;
  const bool whole = recording.timestamps != VK_NULL_HANDLE && recording.timing == Timing::whole;
  const size_t dispatches = recording.dispatch_labels.size();
  size_t dispatch_index = 0;
  uint32_t query = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    const Command& command = commands[i];
    switch (command.kind) {
      case Command::Kind::dispatch:
        if (per_dispatch || (whole && dispatch_index == 0))
          vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, recording.timestamps, query);
        record_dispatch(context, command.dispatch, sets[i], cb);
        if (per_dispatch || (whole && dispatch_index + 1 == dispatches))
          vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, recording.timestamps,
                              per_dispatch ? query + 1 : 1);
        if (per_dispatch) query += 2;
        ++dispatch_index;
        break;
      case Command::Kind::copy: {
        const CopyCommand& copy = command.copy;
        if (copy.source.bytes == 0) break;
        VkBufferCopy region{copy.source.offset, copy.destination_offset, copy.source.bytes};
        vkCmdCopyBuffer(cb, context.buffers[copy.source.buffer].handle,
                        context.buffers[copy.destination].handle, 1, &region);
        break;
      }
      case Command::Kind::fill: {
        const FillCommand& fill = command.fill;
        if (fill.range.bytes == 0) break;
        vkCmdFillBuffer(cb, context.buffers[fill.range.buffer].handle, fill.range.offset,
                        fill.range.bytes, fill.word);
        break;
      }
      case Command::Kind::update: {
        // vkCmdUpdateBuffer takes at most 65536 bytes a call.
        const UpdateCommand& update = command.update;
        for (size_t done = 0; done < update.data.size();) {
          const size_t bytes = std::min<size_t>(update.data.size() - done, 65536);
          vkCmdUpdateBuffer(cb, context.buffers[update.destination].handle, update.offset + done,
                            bytes, update.data.data() + done);
          done += bytes;
        }
        break;
      }
      case Command::Kind::barrier:
        record_full_barrier(cb);
        break;
    }
  }
}

void record_all(const RecorderContext& context, std::span<const Command> commands,
                const std::vector<VkDescriptorSet>& sets, const Recording& recording) {
  VkCommandBuffer cb = recording.commands;
  auto begin = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  check(vkBeginCommandBuffer(cb, &begin), "beginning a command buffer");
  // Earlier submissions (other recordings, buffer uploads) may have written what this reads.
  memory_barrier(cb, kWorkStages, kWorkWrites, kWorkStages, kWorkAccess);
  record_body(context, commands, sets, recording, cb);
  // Makes results visible to the host, which reads download buffers after the fence.
  memory_barrier(cb, kWorkStages, kWorkWrites, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  check(vkEndCommandBuffer(cb), "ending a command buffer");
}

std::vector<BufferId> buffers_touched(std::span<const Command> commands) {
  std::vector<BufferId> ids;
  for (const Command& command : commands) {
    switch (command.kind) {
      case Command::Kind::dispatch:
        for (const BufferRange& range : command.dispatch.bindings) ids.push_back(range.buffer);
        break;
      case Command::Kind::copy:
        ids.push_back(command.copy.source.buffer);
        ids.push_back(command.copy.destination);
        break;
      case Command::Kind::fill:
        ids.push_back(command.fill.range.buffer);
        break;
      case Command::Kind::update:
        ids.push_back(command.update.destination);
        break;
      case Command::Kind::barrier:
        break;
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace

uint32_t timestamp_count(const Recording& recording) {
  if (recording.timing == Timing::whole) return 2;
  return static_cast<uint32_t>(recording.dispatch_labels.size() * 2);
}

void record_full_barrier(VkCommandBuffer commands) {
  memory_barrier(commands, kWorkStages, kWorkAccess, kWorkStages, kWorkAccess);
}

Recording record_commands(const RecorderContext& context, std::span<const Command> commands,
                          Timing timing, RecordingId id) {
  CommandChecker checker(context);
  for (size_t i = 0; i < commands.size(); ++i) checker.check(i, commands[i]);

  Recording recording;
  recording.timing = timing;
  for (const Command& command : commands)
    if (command.kind == Command::Kind::dispatch)
      recording.dispatch_labels.push_back(command.dispatch.label.empty()
                                              ? context.pipelines[command.dispatch.pipeline].label
                                              : command.dispatch.label);
  recording.name =
      "recording " + std::to_string(id) + " (" + std::to_string(recording.dispatch_labels.size()) +
      " dispatches" +
      (recording.dispatch_labels.empty() ? ""
                                         : ", first '" + recording.dispatch_labels.front() + "'") +
      ")";
  recording.buffers = buffers_touched(commands);
  try {
    create_objects(context, commands, recording);
    std::vector<VkDescriptorSet> sets = write_descriptor_sets(context, commands, recording);
    record_all(context, commands, sets, recording);
    if (context.keep_for_replay) {
      recording.replay.assign(commands.begin(), commands.end());
      recording.descriptor_sets = std::move(sets);
    }
  } catch (...) {
    destroy_recording(context.device, context.command_pool, recording);
    throw;
  }
  return recording;
}

void record_into_app(const RecorderContext& context, std::span<const Command> prologue,
                     std::span<Recording* const> recordings, VkCommandBuffer commands) {
  CommandChecker checker(context);
  for (size_t i = 0; i < prologue.size(); ++i) {
    checker.check(i, prologue[i]);
    if (prologue[i].kind == Command::Kind::dispatch)
      throw Error("cannot record a dispatch in the prologue of the app's command buffer");
  }
  // The app's work before may have written what the recordings read, in any stage, or read what
  // they overwrite.
  memory_barrier(commands, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                 kWorkStages, kWorkAccess);
  if (!prologue.empty()) {
    const Recording none{};
    record_body(context, prologue, std::vector<VkDescriptorSet>(prologue.size()), none, commands);
  }
  for (size_t i = 0; i < recordings.size(); ++i) {
    if (i > 0 || !prologue.empty()) record_full_barrier(commands);
    const Recording& recording = *recordings[i];
    record_body(context, recording.replay, recording.descriptor_sets, recording, commands);
  }
  memory_barrier(commands, kWorkStages, kWorkWrites,
                 VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT | VK_ACCESS_HOST_READ_BIT);
}

void destroy_recording(VkDevice device, VkCommandPool command_pool, Recording& recording) {
  if (recording.commands != VK_NULL_HANDLE)
    vkFreeCommandBuffers(device, command_pool, 1, &recording.commands);
  vkDestroyDescriptorPool(device, recording.descriptor_pool, nullptr);
  vkDestroyQueryPool(device, recording.timestamps, nullptr);
  vkDestroyFence(device, recording.fence, nullptr);
  recording = {};
}

}  // namespace mg::gpu::detail
