#pragma once
// The GPU device layer as seen from above src/backends/vulkan/runtime/: no Vulkan type crosses this
// header, so a Metal backend can provide the same interface.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meganeura/switches.hpp"

namespace mg::gpu {

enum class DeviceKind { discrete, integrated, virtual_gpu, cpu, other };
std::string_view device_kind_name(DeviceKind kind);

enum class ScalarType { f16, bf16, f32, f64, i8, u8, i32, u32, other };

// One cooperative-matrix shape the driver supports (C = A x B + C with A MxK, B KxN).
struct CoopMatrixConfig {
  uint32_t m = 0, n = 0, k = 0;
  ScalarType a = ScalarType::other, b = ScalarType::other, c = ScalarType::other,
             result = ScalarType::other;
  bool khr = false;  // from VK_KHR_cooperative_matrix (else VK_NV_cooperative_matrix)
};

// One workgroup-scope cooperative-matrix configuration (VK_NV_cooperative_matrix2): a matrix
// spread over a whole workgroup of `workgroup_invocations`, whose sizes are any multiples of
// the granularities (A is M x K, B K x N), staged through shared memory by the driver.
struct WorkgroupCoopMatrixConfig {
  uint32_t m_granularity = 0, n_granularity = 0, k_granularity = 0;
  ScalarType a = ScalarType::other, b = ScalarType::other, c = ScalarType::other,
             result = ScalarType::other;
  uint32_t workgroup_invocations = 0;
};

struct WorkgroupCoopMatrixCaps {
  // The device has VK_NV_cooperative_matrix2 with workgroup scope and flexible dimensions, and
  // they are enabled (not on validated devices: Debian's layer predates the extension).
  bool available = false;
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_dimension = 0;
  uint32_t reserved_shared_memory_bytes = 0;  // taken from a kernel's 48 KiB by the staging
  std::vector<WorkgroupCoopMatrixConfig> configs;
  bool tensor_addressing = false;  // cooperativeMatrixTensorAddressing (KernelSpec::matrix_loads)
};

struct MemoryHeap {
  uint64_t bytes = 0;
  bool device_local = false;
};

// Capabilities read once at device selection.
struct DeviceCaps {
  uint32_t api_version = 0;
  uint32_t subgroup_size = 0;
  uint32_t min_subgroup_size = 0, max_subgroup_size = 0;  // 0 when size control is absent
  uint32_t max_shared_memory_bytes = 0;
  uint32_t max_workgroup_invocations = 0;
  // Streaming multiprocessors, compute units or shader cores, from VK_NV_shader_sm_builtins,
  // VK_AMD_shader_core_properties(2) or VK_ARM_shader_core_builtins; 0 where the driver has none
  // of them (Vulkan itself does not report the count).
  uint32_t compute_units = 0;
  std::array<uint32_t, 3> max_workgroup_size{};
  std::array<uint32_t, 3> max_workgroup_count{};
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_memory_allocation_size = 0;
  uint64_t min_storage_buffer_offset_alignment = 0;
  uint32_t max_push_constants_bytes = 0;
  uint32_t max_storage_buffers_per_stage = 0;
  bool shader_f16 = false, storage_f16 = false;
  bool shader_bf16 = false;
  bool coop_matrix_bf16 = false;  // bfloat16 cooperative matrices (shaderBFloat16CooperativeMatrix)
  bool float_atomic_add = false;
  bool timestamps = false;
  double timestamp_period_ns = 0;
  std::vector<CoopMatrixConfig> coop_matrix;
  WorkgroupCoopMatrixCaps workgroup_coop_matrix;
  std::vector<MemoryHeap> heaps;
};

struct DeviceInfo {
  uint32_t index = 0;  // position in enumeration order
  std::string name;
  DeviceKind kind = DeviceKind::other;
  uint32_t vendor_id = 0, device_id = 0;
  uint32_t driver_version = 0;
  std::string driver_name;  // e.g. "llvmpipe", "NVIDIA"
  std::array<uint8_t, 16> pipeline_cache_uuid{};
  DeviceCaps caps;
};

// Lists every Vulkan physical device. Throws mg::Error when no Vulkan loader or device exists,
// saying which package to install.
std::vector<DeviceInfo> list_devices();

// Picks a device: `selector` is "" (automatic: discrete > integrated > virtual > cpu), a number
// (the index) or a case-insensitive substring of the name. An empty selector falls back to
// switches.device (MEGANEURA_DEVICE). Throws mg::Error naming the selector and the devices.
uint32_t choose_device(const std::vector<DeviceInfo>& devices, std::string_view selector,
                       const Switches& switches = Switches::from_environment());

// One line a device, like ggml: "0: NVIDIA H200 (discrete) | subgroup 32 | shared 48 KiB | ..."
std::string describe_device(const DeviceInfo& info);

using BufferId = uint32_t;
using PipelineId = uint32_t;
using RecordingId = uint32_t;

enum class BufferUse {
  device,    // device-local storage, not host visible
  upload,    // host-visible staging that the host writes and the GPU reads
  download,  // host-visible staging that the GPU writes and the host reads
};

// How a cooperative-matrix kernel's loads reach memory: as written, or rewritten into
// VK_NV_cooperative_matrix2 tensor-addressing loads whose two-dimensional layout starts at the
// loaded element, or at the buffer's first element with the load's position as the slice.
// bench/coop_probe compares them on a driver.
enum class MatrixLoads { plain, tensor_at_element, tensor_at_buffer_start };

// A GLSL compute kernel to instantiate: `source` is the full text without a #version line; the
// compiler prepends "#version 450", the extensions it needs and one #define per entry of
// `defines`. `label` names it in errors and traces.
struct KernelSpec {
  std::string label;
  std::string source;
  std::vector<std::pair<std::string, std::string>> defines;
  uint32_t binding_count = 0;        // storage buffers at set 0, bindings 0..binding_count-1
  uint32_t push_constant_bytes = 0;  // size of the push-constant block, <= 128
  // The source uses GL_NV_cooperative_matrix (all glslang 12 compiles); rewrite the SPIR-V to
  // SPV_KHR_cooperative_matrix for devices that only have the KHR extension.
  bool khr_cooperative_matrix = false;
  // With khr_cooperative_matrix: how the matrices are loaded (needs
  // WorkgroupCoopMatrixCaps::tensor_addressing unless plain).
  MatrixLoads matrix_loads = MatrixLoads::plain;
  // With khr_cooperative_matrix: the kernel's f16 type, only its matrices' operands, becomes
  // bfloat16 (SPV_KHR_bfloat16; Precision::bf16).
  bool bf16_operands = false;
  // With bf16_operands: its f16 buffers hold bfloat16 values and become bfloat16 buffers too
  // (otherwise the rewrite refuses a kernel that reads or writes f16 memory).
  bool bf16_buffers = false;
};

// A buffer range bound to one storage-buffer binding.
struct BufferRange {
  BufferId buffer = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct DispatchCommand {
  PipelineId pipeline = 0;
  std::vector<BufferRange> bindings;     // in binding order
  std::vector<uint32_t> push_constants;  // words, <= push_constant_bytes/4
  std::array<uint32_t, 3> groups{1, 1, 1};
  std::string label;  // shown in the per-dispatch profile and trace
};

struct CopyCommand {
  BufferRange source;
  BufferId destination = 0;
  uint64_t destination_offset = 0;
};

// A full memory barrier between everything before it and everything after it (compute and
// transfer). The planner inserts these only where byte ranges really overlap.
struct BarrierCommand {};

struct FillCommand {  // fill a range with a 32-bit pattern
  BufferRange range;
  uint32_t word = 0;
};

// Bytes written into a buffer from the command buffer itself, captured when recorded (so the
// host may change its own copy right after); offset and size multiples of 4.
struct UpdateCommand {
  BufferId destination = 0;
  uint64_t offset = 0;
  std::vector<std::byte> data;
};

struct Command {
  enum class Kind { dispatch, copy, barrier, fill, update } kind = Kind::barrier;
  DispatchCommand dispatch;
  CopyCommand copy;
  FillCommand fill;
  UpdateCommand update;
};

// GPU timestamps in a recording: none; a pair around every dispatch (the profile); or one pair
// around all of its dispatches (the first's start to the last's end), which adds no wait between
// dispatches.
enum class Timing { none, per_dispatch, whole };

struct DispatchTiming {
  std::string label;
  double start_ms = 0;  // relative to the first dispatch of the submission
  double duration_ms = 0;
  // The dispatch's FLOPs and bytes where the caller knows them (negative: unknown); a trace
  // writes them as the event's args.
  double flops = -1;
  double bytes = -1;
};

struct CompileStats {
  uint32_t pipelines = 0;
  uint32_t spirv_cache_hits = 0;
  double seconds = 0;  // the whole build, its kernels side by side
  // Summed over kernels, whatever thread ran them: GLSL to SPIR-V (kernels not in the cache) and
  // the driver's pipeline creation. The kernel whose two took longest, and their time: a build
  // on enough threads takes at least that long.
  double spirv_seconds = 0;
  double driver_seconds = 0;
  std::string slowest_kernel;
  double slowest_kernel_seconds = 0;
  // The kCompileTimesListed kernels whose builds took longest, longest first: when each started
  // (seconds after the build began), and its two parts.
  struct KernelTime {
    std::string label;
    double start_seconds = 0, spirv_seconds = 0, driver_seconds = 0;
  };
  static constexpr size_t kCompileTimesListed = 8;
  std::vector<KernelTime> slowest_kernels;
};

class Device {
 public:
  // Opens the chosen device (see choose_device). Validation layers are enabled when
  // `validation` or switches.validate (MEGANEURA_VALIDATE=1) is true; their messages are counted
  // and printed. Kernels are cached in switches.cache_dir.
  static std::unique_ptr<Device> open(std::string_view selector = "", bool validation = false,
                                      const Switches& switches = Switches::from_environment());
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;

  // Throws mg::Error naming the size, the label and the device limit when it cannot allocate.
  virtual BufferId create_buffer(uint64_t bytes, BufferUse use, std::string_view label) = 0;
  virtual void destroy_buffer(BufferId buffer) = 0;
  // Host pointer of an upload/download buffer (persistently mapped, coherent).
  virtual void* mapped(BufferId buffer) = 0;
  // Blocking helpers for set-up and tests (they go through an internal staging buffer).
  virtual void write_buffer(BufferId buffer, uint64_t offset, std::span<const std::byte> data) = 0;
  virtual void read_buffer(BufferId buffer, uint64_t offset, std::span<std::byte> data) = 0;

  // Compiles (or loads from the on-disk cache) and creates one pipeline per spec, in parallel.
  // A GLSL error throws mg::Error with the label, the defines and the offending source lines.
  virtual std::vector<PipelineId> create_pipelines(std::span<const KernelSpec> specs) = 0;
  virtual CompileStats last_compile_stats() const = 0;

  // Frees pipelines that nothing records any more (a Session that ends on a shared device).
  virtual void destroy_pipelines(std::span<const PipelineId> pipelines) = 0;

  // Records the commands into a reusable command buffer once.
  virtual RecordingId record(std::span<const Command> commands, Timing timing) = 0;
  // Frees a recording, after waiting for a submission of it still in flight.
  virtual void destroy_recording(RecordingId recording) = 0;
  // Submits a recording and waits for it to finish.
  virtual void submit(RecordingId recording) = 0;
  // Submits a recording without waiting for it. It runs after everything submitted before it
  // (every recording starts with a barrier over earlier work); a submission of the same recording
  // still in flight is waited for first.
  virtual void start(RecordingId recording) = 0;
  // Waits for the submission of `recording` in flight, if any.
  virtual void finish(RecordingId recording) = 0;
  // Embedding: records `prologue` (commands without dispatches: updates, copies, fills) and then
  // `recordings`, in order, into a command buffer of the app's (`native`: the backend's handle;
  // on Vulkan a VkCommandBuffer in the recording state, outside a render pass) between barriers
  // that order them after the app's work before and before its work after, in any stage and on
  // the host. Returns the value at which the app's submission of that command
  // buffer must signal the device's app timeline; finish() and destroy_recording() of these
  // recordings wait for it. Throws mg::Error on a device that is not the app's.
  virtual uint64_t record_into(std::span<const Command> prologue,
                               std::span<const RecordingId> recordings, void* native) = 0;
  // GPU times of the last submission of a recording recorded with Timing::per_dispatch (one
  // entry a dispatch) or Timing::whole (one entry, labelled "run"); empty for Timing::none.
  virtual std::vector<DispatchTiming> timings(RecordingId recording) = 0;

  // Validation messages seen so far (always 0 without validation).
  virtual uint32_t validation_message_count() const = 0;
};

// Compiles GLSL to SPIR-V without a device (for tests and `meganeura check-kernels`), validating
// the result with SPIRV-Tools. Throws mg::Error as create_pipelines does.
std::vector<uint32_t> compile_glsl(const KernelSpec& spec);

// Starts building, on a background thread and once a process, the shader compiler's built-in
// tables for compute kernels of the newest Vulkan target, which the first kernel compiled would
// otherwise build alone while every other compile waits. A session starts it before opening its
// device, so that the work overlaps opening the device and planning; with every kernel cached it
// only costs a core for a moment.
void prepare_shader_compiler();

// Writes timings as Chrome trace JSON (chrome://tracing, Perfetto).
void write_chrome_trace(const std::vector<DispatchTiming>& timings, const std::string& path);

}  // namespace mg::gpu
