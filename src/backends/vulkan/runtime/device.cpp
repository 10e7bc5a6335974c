// The Vulkan implementation of mg::gpu::Device. One object owns every Vulkan handle it makes;
// it is used from one thread at a time (create_pipelines parallelizes internally).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backends/vulkan/runtime/adopted_device.hpp"
#include "backends/vulkan/runtime/buffer.hpp"
#include "backends/vulkan/runtime/command_recorder.hpp"
#include "backends/vulkan/runtime/device_features.hpp"
#include "backends/vulkan/runtime/fault_injection.hpp"
#include "backends/vulkan/runtime/instance.hpp"
#include "backends/vulkan/runtime/physical_device.hpp"
#include "backends/vulkan/runtime/pipeline.hpp"
#include "backends/vulkan/runtime/pipeline_cache.hpp"
#include "backends/vulkan/runtime/profiler/timestamps.hpp"
#include "backends/vulkan/runtime/vk_result.hpp"
#include "meganeura/error.hpp"

namespace mg::gpu {
namespace {

using namespace detail;

constexpr uint64_t kSubmitTimeoutNs = 60ull * 1000 * 1000 * 1000;
// A CPU device (Lavapipe) runs its work on the cores the rest of the machine shares, so a large
// program under load may take minutes there: its own recordings and transfers wait ten times as
// long before they count as hung.
constexpr uint64_t kCpuDeviceTimeoutFactor = 10;
// Blocking transfers go through staging in chunks of at most this, so uploading a large
// checkpoint does not need a staging buffer as large as the checkpoint.
constexpr uint64_t kStagingChunkBytes = 64ull << 20;

class VulkanDevice final : public Device, public VulkanAccess {
 public:
  VulkanDevice(std::string_view selector, bool validation, const Switches& switches) {
    try {
      open(selector, validation, switches);
      create_own_objects(switches);
    } catch (...) {
      release();
      throw;
    }
  }
  VulkanDevice(const AppVulkanDevice& app, const Switches& switches) {
    try {
      adopt(app);
      create_own_objects(switches);
    } catch (...) {
      release();
      throw;
    }
  }
  ~VulkanDevice() override { release(); }

  VkSemaphore timeline() const override { return timeline_; }
  uint64_t timeline_value() const override { return timeline_value_; }
  VkSemaphore app_timeline() const override { return app_timeline_; }

  BufferId import_buffer(VkBuffer handle, uint64_t bytes, std::string_view label) override {
    if (handle == VK_NULL_HANDLE)
      throw Error("cannot import a null VkBuffer ('" + std::string(label) + "')");
    Buffer imported;
    imported.handle = handle;
    imported.bytes = bytes;
    imported.label = label;
    imported.external = true;
    buffers_.push_back(imported);
    return static_cast<BufferId>(buffers_.size() - 1);
  }

  const DeviceInfo& info() const override { return physical_.info; }

  BufferId create_buffer(uint64_t bytes, BufferUse use, std::string_view label) override {
    buffers_.push_back(
        detail::create_buffer(device_, physical_, bytes, use, label, app_allocator()));
    return static_cast<BufferId>(buffers_.size() - 1);
  }

  void destroy_buffer(BufferId id) override {
    Buffer& target = buffer(id);
    for (Recording& recording : recordings_)
      if (std::binary_search(recording.buffers.begin(), recording.buffers.end(), id))
        recording.stale_reason = "buffer '" + target.label + "' it uses was destroyed";
    detail::destroy_buffer(device_, target);
  }

  void* mapped(BufferId id) override {
    Buffer& target = buffer(id);
    if (target.allocation.mapped == nullptr)
      throw Error("buffer '" + target.label +
                  "' is device-local and has no host pointer; create it as upload or download");
    return target.allocation.mapped;
  }

  void write_buffer(BufferId id, uint64_t offset, std::span<const std::byte> data) override {
    Buffer& target = checked_range(id, offset, data.size(), "write");
    if (target.allocation.mapped != nullptr) {
      std::memcpy(static_cast<std::byte*>(target.allocation.mapped) + offset, data.data(),
                  data.size());
      return;
    }
    for (uint64_t done = 0; done < data.size();) {
      uint64_t bytes = std::min<uint64_t>(data.size() - done, kStagingChunkBytes);
      ensure_staging(bytes);
      std::memcpy(staging_.allocation.mapped, data.data() + done, bytes);
      transfer(staging_.handle, 0, target.handle, offset + done, bytes);
      done += bytes;
    }
  }

  void read_buffer(BufferId id, uint64_t offset, std::span<std::byte> data) override {
    Buffer& source = checked_range(id, offset, data.size(), "read");
    if (source.allocation.mapped != nullptr) {
      std::memcpy(data.data(), static_cast<const std::byte*>(source.allocation.mapped) + offset,
                  data.size());
      return;
    }
    for (uint64_t done = 0; done < data.size();) {
      uint64_t bytes = std::min<uint64_t>(data.size() - done, kStagingChunkBytes);
      ensure_staging(bytes);
      transfer(source.handle, offset + done, staging_.handle, 0, bytes);
      std::memcpy(data.data() + done, staging_.allocation.mapped, bytes);
      done += bytes;
    }
  }

  std::vector<PipelineId> create_pipelines(std::span<const KernelSpec> specs) override {
    std::vector<VkPipelineLayout> layouts;
    std::vector<PipelineLayouts::Layout> chosen;
    for (const KernelSpec& spec : specs) {
      check_spec(spec);
      chosen.push_back(layouts_->get(spec.binding_count, spec.push_constant_bytes));
      layouts.push_back(chosen.back().layout);
    }
    PipelineBuildOptions options{shader_target_, instance_ && instance_->validation(),
                                 kernel_statistics_};
    CompileStats stats;
    auto handles = build_pipelines(device_, *pipeline_cache_, specs, layouts, options, stats);
    last_stats_ = stats;

    std::vector<PipelineId> ids;
    for (size_t i = 0; i < specs.size(); ++i) {
      ids.push_back(static_cast<PipelineId>(pipelines_.size()));
      pipelines_.push_back({handles[i], chosen[i].layout, chosen[i].set_layout,
                            specs[i].binding_count, specs[i].push_constant_bytes, specs[i].label});
    }
    return ids;
  }

  CompileStats last_compile_stats() const override { return last_stats_; }

  void destroy_pipelines(std::span<const PipelineId> ids) override {
    for (PipelineId id : ids) {
      if (id >= pipelines_.size())
        throw Error("pipeline id " + std::to_string(id) + " does not exist");
      vkDestroyPipeline(device_, pipelines_[id].handle, nullptr);
      pipelines_[id].handle = VK_NULL_HANDLE;
    }
  }

  RecordingId record(std::span<const Command> commands, Timing timing) override {
    auto id = static_cast<RecordingId>(recordings_.size());
    RecorderContext context{device_, command_pool_, physical_, buffers_, pipelines_, adopted_};
    recordings_.push_back(record_commands(context, commands, timing, id));
    return id;
  }

  uint64_t record_into(std::span<const Command> prologue, std::span<const RecordingId> ids,
                       void* native) override {
    if (app_timeline_ == VK_NULL_HANDLE)
      throw Error(
          "recording into the app's command buffer needs a device adopted from the app "
          "(mg_device_adopt_vulkan), not one Meganeura opened");
    if (native == nullptr) throw Error("the app's command buffer is null");
    std::vector<Recording*> targets;
    for (RecordingId id : ids) {
      Recording& target = recording(id);
      if (!target.stale_reason.empty())
        throw Error("cannot record " + target.name +
                    " into the app's command buffer: " + target.stale_reason + "; record it again");
      targets.push_back(&target);
    }
    RecorderContext context{device_, command_pool_, physical_, buffers_, pipelines_, true};
    record_into_app(context, prologue, targets, static_cast<VkCommandBuffer>(native));
    const uint64_t value = ++app_timeline_recorded_;
    for (Recording* target : targets) {
      target->app_value = value;
      target->submitted = true;
    }
    return value;
  }

  void destroy_recording(RecordingId id) override {
    Recording& target = recording(id);
    if (target.in_flight) wait(target);
    wait_for_app_before_release(target.app_value);
    const std::string name = target.name;
    detail::destroy_recording(device_, command_pool_, target);
    target.name = name;
    target.stale_reason = "it was destroyed";
  }

  void submit(RecordingId id) override {
    start(id);
    finish(id);
  }

  void start(RecordingId id) override {
    Recording& recording = this->recording(id);
    if (!recording.stale_reason.empty())
      throw Error("cannot submit " + recording.name + ": " + recording.stale_reason +
                  "; record it again");
    // A submission still in flight (started without a wait, or one whose wait timed out) must
    // signal its fence before the fence is reset for this one.
    if (recording.in_flight) wait(recording);
    check(vkResetFences(device_, 1, &recording.fence), "resetting a fence");
    submit_to_queue(recording.commands, recording.fence, "submitting " + recording.name);
    recording.in_flight = true;
    recording.submitted = true;
  }

  void finish(RecordingId id) override {
    Recording& recording = this->recording(id);
    if (recording.in_flight) wait(recording);
    if (recording.app_value > app_timeline_reached_) wait_for_app(recording);
  }

  std::vector<DispatchTiming> timings(RecordingId id) override {
    finish(id);
    return read_timings(device_, recording(id), physical_.info.caps.timestamp_period_ns,
                        physical_.timestamp_valid_bits);
  }

  uint32_t validation_message_count() const override {
    return instance_ ? instance_->validation_message_count() : 0;
  }

 private:
  void open(std::string_view selector, bool validation, const Switches& switches) {
    instance_ = std::make_unique<Instance>(validation || switches.validate);
    auto devices = enumerate_physical_devices(*instance_);
    std::vector<DeviceInfo> infos;
    for (const auto& device : devices) infos.push_back(device.info);
    physical_ = std::move(devices[choose_device(infos, selector, switches)]);
    const std::string& name = physical_.info.name;
    if (physical_.api_version < VK_API_VERSION_1_1)
      throw Error("device '" + name +
                  "' supports only Vulkan 1.0; Meganeura needs 1.1 or newer "
                  "(update its driver)");
    if (physical_.compute_queue_family == kNoQueueFamily)
      throw Error("device '" + name + "' has no compute queue");

    float priority = 1.0f;
    auto queue = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    queue.queueFamilyIndex = physical_.compute_queue_family;
    queue.queueCount = 1;
    queue.pQueuePriorities = &priority;
    const bool statistics_requested = switches.kernel_stats;
    DeviceFeatures enabled =
        features_to_enable(physical_.features, instance_->validation(), statistics_requested);
    auto create = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    create.pNext = enabled.chain();
    create.queueCreateInfoCount = 1;
    create.pQueueCreateInfos = &queue;
    create.enabledExtensionCount = static_cast<uint32_t>(enabled.extensions.size());
    create.ppEnabledExtensionNames = enabled.extensions.data();
    check(vkCreateDevice(physical_.handle, &create, nullptr, &device_),
          "opening Vulkan device '" + name + "'");
    vkGetDeviceQueue(device_, physical_.compute_queue_family, 0, &queue_);
    keep_enabled(enabled);
    statistics_requested_ = statistics_requested;
  }

  // Kernels may use what was enabled, not all the device offers: validated runs leave the KHR
  // cooperative matrices off (see features_to_enable), and an app enables what it chose.
  void keep_enabled(const DeviceFeatures& enabled) {
    std::erase_if(physical_.info.caps.coop_matrix, [&](const CoopMatrixConfig& config) {
      return config.khr
                 ? !(enabled.known.coop_matrix_khr && enabled.coop_matrix_khr.cooperativeMatrix)
                 : !(enabled.known.coop_matrix_nv && enabled.coop_matrix_nv.cooperativeMatrix);
    });
    if (!(enabled.known.coop_matrix2_nv &&
          enabled.coop_matrix2_nv.cooperativeMatrixWorkgroupScope &&
          enabled.coop_matrix2_nv.cooperativeMatrixFlexibleDimensions))
      physical_.info.caps.workgroup_coop_matrix = {};
    kernel_statistics_ =
        enabled.known.executable_properties && enabled.executable_properties.pipelineExecutableInfo;
    maintenance4_ = enabled.maintenance4.maintenance4;
  }

  void adopt(const AppVulkanDevice& app) {
    adopted_ = true;
    std::vector<std::string> missing;
    if (app.instance == VK_NULL_HANDLE) missing.push_back("a VkInstance");
    if (app.physical_device == VK_NULL_HANDLE) missing.push_back("a VkPhysicalDevice");
    if (app.device == VK_NULL_HANDLE) missing.push_back("a VkDevice");
    if (app.queue == VK_NULL_HANDLE) missing.push_back("a VkQueue");
    if (!missing.empty())
      throw Error("adopting the app's Vulkan device needs " + join(missing) + " (got null)");
    const uint32_t instance_version = std::max(app.api_version, VK_API_VERSION_1_0);
    physical_ =
        describe_physical_device(app.instance, instance_version, false, app.physical_device, 0);
    const std::string& name = physical_.info.name;
    const AppFeatures features =
        features_enabled_by_app(physical_.api_version, app.enabled_extensions, app.enabled_features,
                                app.enabled_core_features);
    if (physical_.api_version < VK_API_VERSION_1_1)
      missing.push_back("Vulkan 1.1 (the instance's apiVersion and the device's)");
    if (!features.timeline_semaphore)
      missing.push_back(
          "the timelineSemaphore feature (VkPhysicalDeviceVulkan12Features or "
          "VkPhysicalDeviceTimelineSemaphoreFeatures, with Vulkan 1.2 or "
          "VK_KHR_timeline_semaphore)");
    uint32_t family_count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(app.physical_device, &family_count, nullptr);
    std::vector<VkQueueFamilyProperties> families(family_count);
    vkGetPhysicalDeviceQueueFamilyProperties(app.physical_device, &family_count, families.data());
    if (app.queue_family >= family_count ||
        (families[app.queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT) == 0)
      missing.push_back("a queue whose family (" + std::to_string(app.queue_family) +
                        ") supports compute");
    if ((app.allocator.allocate == nullptr) != (app.allocator.free == nullptr))
      missing.push_back("both functions of the memory allocator (one is null)");
    if (!missing.empty())
      throw Error("the app's Vulkan device '" + name +
                  "' lacks what Meganeura needs: " + join(missing));

    physical_.features = features.enabled;
    read_feature_caps(physical_);
    physical_.compute_queue_family = app.queue_family;
    physical_.timestamp_valid_bits = families[app.queue_family].timestampValidBits;
    physical_.info.caps.timestamps =
        physical_.timestamp_valid_bits > 0 && physical_.limits.timestampPeriod > 0;
    device_ = app.device;
    queue_ = app.queue;
    app_allocator_ = app.allocator;
    keep_enabled(features.enabled);

    auto type = vk_struct<VkSemaphoreTypeCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO);
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    type.initialValue = 0;
    auto semaphore = vk_struct<VkSemaphoreCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO);
    semaphore.pNext = &type;
    check(vkCreateSemaphore(device_, &semaphore, nullptr, &timeline_),
          "creating the timeline semaphore on the app's device");
    check(vkCreateSemaphore(device_, &semaphore, nullptr, &app_timeline_),
          "creating the app timeline semaphore on the app's device");
    wait_semaphores_ =
        reinterpret_cast<PFN_vkWaitSemaphores>(vkGetDeviceProcAddr(device_, "vkWaitSemaphores"));
    if (wait_semaphores_ == nullptr)
      wait_semaphores_ = reinterpret_cast<PFN_vkWaitSemaphores>(
          vkGetDeviceProcAddr(device_, "vkWaitSemaphoresKHR"));
    if (wait_semaphores_ == nullptr)
      throw Error("the app's Vulkan device '" + name +
                  "' has no vkWaitSemaphores (timeline semaphores need Vulkan 1.2 or "
                  "VK_KHR_timeline_semaphore enabled)");
  }

  // Waits until the app's command buffer holding `recording` signalled the app timeline.
  void wait_for_app(const Recording& recording) {
    const VkResult result = wait_for_app_value(recording.app_value, kSubmitTimeoutNs);
    if (result == VK_TIMEOUT)
      throw Error(recording.name +
                  " was recorded into the app's command buffer, which has not "
                  "signalled the app timeline semaphore at value " +
                  std::to_string(recording.app_value) +
                  " within 60 s: submit it with that signal, or signal the value from the host "
                  "(vkSignalSemaphore) when the command buffer is dropped");
    check(result, "waiting for the app's command buffer");
  }

  VkResult wait_for_app_value(uint64_t value, uint64_t timeout_ns) {
    if (value <= app_timeline_reached_) return VK_SUCCESS;
    auto wait = vk_struct<VkSemaphoreWaitInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO);
    wait.semaphoreCount = 1;
    wait.pSemaphores = &app_timeline_;
    wait.pValues = &value;
    const VkResult result = wait_semaphores_(device_, &wait, timeout_ns);
    if (result == VK_SUCCESS) app_timeline_reached_ = value;
    return result;
  }

  // Before freeing what an app's command buffer may still use: a release cannot throw, so an app
  // that never submits a recorded command buffer only delays it, once, with a warning; the
  // values recorded so far then count as reached.
  void wait_for_app_before_release(uint64_t value) {
    if (value <= app_timeline_reached_ || app_timeline_ == VK_NULL_HANDLE) return;
    if (wait_for_app_value(value, kSubmitTimeoutNs) == VK_SUCCESS) return;
    std::fprintf(stderr,
                 "meganeura: releasing work recorded into the app's command buffer whose app "
                 "timeline value %llu was not signalled within 60 s\n",
                 static_cast<unsigned long long>(value));
    app_timeline_reached_ = app_timeline_recorded_;
  }

  static std::string join(const std::vector<std::string>& parts) {
    std::string text;
    for (size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
    return text;
  }

  // Submits one command buffer, signalling `fence` and, on an adopted device, the timeline.
  void submit_to_queue(VkCommandBuffer commands, VkFence fence, const std::string& what) {
    auto submit = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &commands;
    auto timeline =
        vk_struct<VkTimelineSemaphoreSubmitInfo>(VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO);
    const uint64_t next_value = timeline_value_ + 1;
    if (timeline_ != VK_NULL_HANDLE) {
      timeline.signalSemaphoreValueCount = 1;
      timeline.pSignalSemaphoreValues = &next_value;
      submit.pNext = &timeline;
      submit.signalSemaphoreCount = 1;
      submit.pSignalSemaphores = &timeline_;
    }
    VkResult result = injected_submission_result();
    if (result == VK_SUCCESS) result = vkQueueSubmit(queue_, 1, &submit, fence);
    check(result, what);
    if (timeline_ != VK_NULL_HANDLE) timeline_value_ = next_value;
  }

  void create_own_objects(const Switches& switches) {
    arm_injected_faults(switches);
    const std::string& name = physical_.info.name;

    auto pool = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;  // the transfer buffer is reused
    pool.queueFamilyIndex = physical_.compute_queue_family;
    check(vkCreateCommandPool(device_, &pool, nullptr, &command_pool_), "creating a command pool");

    auto allocate =
        vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    allocate.commandPool = command_pool_;
    allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    allocate.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(device_, &allocate, &transfer_commands_),
          "allocating a command buffer");
    auto fence = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    check(vkCreateFence(device_, &fence, nullptr, &transfer_fence_), "creating a fence");

    if (statistics_requested_ && !kernel_statistics_)
      std::fprintf(stderr,
                   "MEGANEURA_KERNEL_STATS: device '%s' does not report kernel statistics "
                   "(no VK_KHR_pipeline_executable_properties)\n",
                   name.c_str());
    // glslang's SPIR-V 1.6 (the Vulkan 1.3 target) needs maintenance4; without it, target 1.2.
    shader_target_ = physical_.api_version;
    if (shader_target_ >= VK_API_VERSION_1_3 && !maintenance4_) shader_target_ = VK_API_VERSION_1_2;
    layouts_ = std::make_unique<PipelineLayouts>(device_);
    pipeline_cache_ = std::make_unique<PipelineCache>(device_, physical_.info, shader_target_,
                                                      switches.cache_dir);
  }

  // Safe on a partly opened device: every handle may still be null.
  void release() {
    if (device_ != VK_NULL_HANDLE) {
      // The app's device may be busy with its own work, which is not ours to wait for.
      if (adopted_) {
        wait_for_own_submissions();
        wait_for_app_before_release(app_timeline_recorded_);
      } else
        vkDeviceWaitIdle(device_);
      for (Recording& recording : recordings_)
        detail::destroy_recording(device_, command_pool_, recording);
      for (Pipeline& pipeline : pipelines_) vkDestroyPipeline(device_, pipeline.handle, nullptr);
      layouts_.reset();
      pipeline_cache_.reset();
      for (Buffer& buffer : buffers_) detail::destroy_buffer(device_, buffer);
      detail::destroy_buffer(device_, staging_);
      vkDestroyFence(device_, transfer_fence_, nullptr);
      vkDestroyCommandPool(device_, command_pool_, nullptr);
      vkDestroySemaphore(device_, timeline_, nullptr);
      vkDestroySemaphore(device_, app_timeline_, nullptr);
      if (!adopted_) vkDestroyDevice(device_, nullptr);
      device_ = VK_NULL_HANDLE;
    }
    instance_.reset();
  }

  const AppAllocator* app_allocator() const {
    return app_allocator_.allocate != nullptr ? &app_allocator_ : nullptr;
  }

  void wait_for_own_submissions() {
    for (Recording& recording : recordings_)
      if (recording.in_flight && recording.fence != VK_NULL_HANDLE)
        vkWaitForFences(device_, 1, &recording.fence, VK_TRUE, work_timeout_ns());
  }

  Buffer& buffer(BufferId id) {
    if (id >= buffers_.size() || !buffers_[id].alive())
      throw Error("buffer id " + std::to_string(id) +
                  " does not exist (never created or destroyed)");
    return buffers_[id];
  }

  Buffer& checked_range(BufferId id, uint64_t offset, uint64_t bytes, const char* verb) {
    Buffer& target = buffer(id);
    if (offset > target.bytes || bytes > target.bytes - offset)
      throw Error(std::string("cannot ") + verb + " " + std::to_string(bytes) +
                  " bytes at offset " + std::to_string(offset) + " of buffer '" + target.label +
                  "', which holds " + std::to_string(target.bytes) + " bytes");
    return target;
  }

  Recording& recording(RecordingId id) {
    if (id >= recordings_.size())
      throw Error("recording id " + std::to_string(id) + " does not exist");
    return recordings_[id];
  }

  // How long the device's own work may take before it counts as hung.
  uint64_t work_timeout_ns() const {
    return info().kind == DeviceKind::cpu ? kSubmitTimeoutNs * kCpuDeviceTimeoutFactor
                                          : kSubmitTimeoutNs;
  }

  std::string work_timeout_text() const {
    return std::to_string(work_timeout_ns() / 1000000000ull) + " s";
  }

  void wait(Recording& recording) {
    VkResult result = vkWaitForFences(device_, 1, &recording.fence, VK_TRUE, work_timeout_ns());
    if (result == VK_TIMEOUT)
      throw Error(recording.name + " did not finish within " + work_timeout_text() +
                  " (a kernel may loop forever, or the work is too large for this device)");
    check(result, "waiting for " + recording.name);
    recording.in_flight = false;
  }

  void ensure_staging(uint64_t bytes) {
    if (staging_.alive() && staging_.bytes >= bytes) return;
    uint64_t size = std::min(std::max(bytes, 2 * staging_.bytes), kStagingChunkBytes);
    detail::destroy_buffer(device_, staging_);
    staging_ = detail::create_buffer(device_, physical_, std::max(size, bytes), BufferUse::download,
                                     "staging", app_allocator());
  }

  // Copies between two buffers and waits, ordered after all earlier work.
  void transfer(VkBuffer source, uint64_t source_offset, VkBuffer destination,
                uint64_t destination_offset, uint64_t bytes) {
    check(vkResetCommandBuffer(transfer_commands_, 0), "resetting a command buffer");
    auto begin = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(transfer_commands_, &begin), "beginning a command buffer");
    record_full_barrier(transfer_commands_);
    VkBufferCopy region{source_offset, destination_offset, bytes};
    vkCmdCopyBuffer(transfer_commands_, source, destination, 1, &region);
    record_full_barrier(transfer_commands_);
    auto to_host = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    to_host.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    to_host.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(transfer_commands_, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &to_host, 0, nullptr, 0, nullptr);
    check(vkEndCommandBuffer(transfer_commands_), "ending a command buffer");

    check(vkResetFences(device_, 1, &transfer_fence_), "resetting a fence");
    submit_to_queue(transfer_commands_, transfer_fence_, "submitting a buffer transfer");
    VkResult result = vkWaitForFences(device_, 1, &transfer_fence_, VK_TRUE, work_timeout_ns());
    if (result == VK_TIMEOUT)
      throw Error("a buffer transfer did not finish within " + work_timeout_text());
    check(result, "waiting for a buffer transfer");
  }

  void check_spec(const KernelSpec& spec) const {
    const auto& limits = physical_.limits;
    if (spec.binding_count > limits.maxPerStageDescriptorStorageBuffers)
      throw Error("kernel '" + spec.label + "' binds " + std::to_string(spec.binding_count) +
                  " storage buffers; the device allows " +
                  std::to_string(limits.maxPerStageDescriptorStorageBuffers));
    if (spec.push_constant_bytes % 4 != 0 ||
        spec.push_constant_bytes > physical_.info.caps.max_push_constants_bytes)
      throw Error("kernel '" + spec.label + "' declares " +
                  std::to_string(spec.push_constant_bytes) +
                  " bytes of push constants; it must be a multiple of 4 and at most " +
                  std::to_string(physical_.info.caps.max_push_constants_bytes));
    if (spec.matrix_loads != MatrixLoads::plain &&
        !(spec.khr_cooperative_matrix &&
          physical_.info.caps.workgroup_coop_matrix.tensor_addressing))
      throw Error("kernel '" + spec.label +
                  "' asks for tensor-addressing loads, which need a KHR cooperative-matrix "
                  "kernel and a device with VK_NV_cooperative_matrix2's "
                  "cooperativeMatrixTensorAddressing; '" +
                  physical_.info.name +
                  "' lacks it (or it is off under validation): use plain loads");
  }

  std::unique_ptr<Instance> instance_;
  PhysicalDevice physical_;
  uint32_t shader_target_ = VK_API_VERSION_1_1;  // the Vulkan version kernels are compiled for
  bool kernel_statistics_ = false;  // MEGANEURA_KERNEL_STATS, where the driver reports them
  bool statistics_requested_ = false;
  bool maintenance4_ = false;
  bool adopted_ = false;  // the app's device and queue: not destroyed here
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  uint64_t timeline_value_ = 0;
  // Signalled by the app's submissions of command buffers that Meganeura recorded into
  // (record_into): the value the last recorded one signals, and the highest seen reached.
  VkSemaphore app_timeline_ = VK_NULL_HANDLE;
  uint64_t app_timeline_recorded_ = 0;
  uint64_t app_timeline_reached_ = 0;
  PFN_vkWaitSemaphores wait_semaphores_ = nullptr;
  AppAllocator app_allocator_;  // the app's device memory, when it gave an allocator
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool command_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer transfer_commands_ = VK_NULL_HANDLE;
  VkFence transfer_fence_ = VK_NULL_HANDLE;
  Buffer staging_;
  std::unique_ptr<PipelineLayouts> layouts_;
  std::unique_ptr<PipelineCache> pipeline_cache_;
  std::vector<Buffer> buffers_;
  std::vector<Pipeline> pipelines_;
  std::vector<Recording> recordings_;
  CompileStats last_stats_;
};

}  // namespace

std::unique_ptr<Device> adopt_vulkan_device(const AppVulkanDevice& app, const Switches& switches) {
  return std::make_unique<VulkanDevice>(app, switches);
}

VulkanAccess* vulkan_access(Device& device) {
  return dynamic_cast<VulkanAccess*>(&device);
}

std::unique_ptr<Device> Device::open(std::string_view selector, bool validation,
                                     const Switches& switches) {
  return std::make_unique<VulkanDevice>(selector, validation, switches);
}

}  // namespace mg::gpu
