#pragma once
// A Session binds a graph to a GPU: it optimises the graph, lowers it to kernels, plans its
// memory, creates every pipeline up front and records its command buffer (twice: one per run
// slot, see start_run). run() then replays that fixed dispatch list: uploads of the inputs, the
// kernels, the assignments (optimizer updates) and downloads of the outputs, in one submission.
// Work over fixed values (SessionOptions::setup) has a recording of its own, submitted before
// the first run and the first after a write(). Nothing is allocated or compiled inside run().
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meganeura/graph.hpp"
#include "meganeura/switches.hpp"

namespace mg {

// How matrix products and convolutions compute (DESIGN.md, "Precision policy").
enum class Precision {
  strict,  // f32 operands and f32 arithmetic everywhere
  fast,    // f16 operands into cooperative matrices (tensor cores), f32 accumulation, f32
           // storage but for large activations between f16 products (passes::half_activations);
           // devices without cooperative matrices, or MEGANEURA_NO_COOPMAT=1, run strict
  bf16,    // as fast with bfloat16 operands (f32's range, 8 significant bits): no loss scaling
           // needed; the activations that elementwise kernels write and read stored in
           // bfloat16; devices without bfloat16 cooperative matrices run strict
};
// "strict", "fast" or "bf16"; throws mg::Error naming the text otherwise.
Precision parse_precision(std::string_view text);
std::string_view precision_name(Precision precision);

// A Vulkan device opened once for several Sessions (a training and an evaluation program,
// say): one instance, one queue, one kernel cache. Each Session keeps it alive and frees what it
// created on it when it ends. Opening a device per Session also works, but costs an instance
// each, and NVIDIA's driver refused new instances after about 26 in one process.
class SharedDevice;
// `selector` and `validation` as in SessionOptions; `switches` (the environment's where not
// given) for the device's own (validation, kernel cache). Throws mg::Error as a Session would.
std::shared_ptr<SharedDevice> open_shared_device(std::string_view selector = "",
                                                 bool validation = false,
                                                 const std::optional<Switches>& switches = {});

// Named parameters and state that several Sessions on one SharedDevice use in place: the
// training, evaluation, prefill and decode programs of one model hold one copy of its weights,
// and a KV cache that a prefill program writes is the one a decode program reads and appends to.
// A tensor is created by the first Session that declares it (and initialised as that Session's
// graph says); later Sessions declaring the same name must declare the same type. The tensors
// live as long as this object and any Session built with it.
class SharedTensors;
std::shared_ptr<SharedTensors> make_shared_tensors(std::shared_ptr<SharedDevice> device);

struct SessionOptions {
  std::string device;  // "" = automatic (or MEGANEURA_DEVICE), an index or a name part
  // When set, the session runs on this device instead of opening `device` (and `validation` is
  // the shared device's).
  std::shared_ptr<SharedDevice> shared_device;
  // When set (with shared_device, the same one), every parameter and state leaf of the graph is
  // one of these tensors. A Session whose run updates them makes the setup of the others run
  // again before their next run, so that nothing they derived from the old values is used.
  // A write() or read() waits for this Session's run in flight only: finish the runs of the
  // other Sessions first.
  std::shared_ptr<SharedTensors> shared_tensors;
  bool validation = false;  // Vulkan validation layers (also MEGANEURA_VALIDATE=1)
  bool profile = false;     // per-dispatch GPU timestamps
  // Benchmarks: the GPU time of each run as a whole (last_run_gpu_ms), with every dispatch
  // waiting for the one before, as kernels in one CUDA stream do. Not with `profile`.
  bool time_runs = false;
  Precision precision = Precision::strict;
  bool reuse_memory = true;  // false gives every value its own bytes (planner tests)
  uint64_t seed = 0;         // parameter initialisation, as initialise_leaves()
  // false leaves the model's weights without defined values until written (a model folder's
  // weights, written right after): parameters, and state leaves drawn at random (frozen
  // weights, as a frozen backbone's); building then takes no time proportional to the model's
  // size. Leaves of one value (optimizer moments, norms' weights, caches) are filled either way.
  bool initialise_parameters = true;
  // Testing: leave this many bytes after every value, filled with a sentinel that
  // check_guards() verifies (turns memory reuse off). Lavapipe bounds-checks every access
  // against the bound range, so there the guards only stay intact; on GPUs without robust
  // buffer access (NVIDIA here) a stray write lands in them and is caught.
  uint32_t guard_bytes = 0;
  // Work that reads only fixed values (constants, and parameters and state that the graph never
  // assigns: an inference graph's weights) runs once, before the first run, and again after a
  // write(), instead of in every run: Winograd's transform of convolution weights, the rounding
  // of weights to f16 for the fast GEMM. Its results stay in memory. false runs it every time
  // (benchmarks that time the whole computation on parameters); MEGANEURA_SETUP=0/1 overrides.
  bool setup = true;
  // The switches (docs/SWITCHES.md) this session plans and lowers with, and opens its device
  // with; unset, the session reads them from the environment once, when it is built.
  std::optional<Switches> switches;
};

// What one dispatch asks of the device, from shapes (plan/roofline.hpp): its FLOPs and the bytes
// of the values it binds.
struct DispatchCost {
  std::string label;
  double flops = 0;
  double bytes = 0;
};

struct BuildReport {
  std::string device;        // one-line device description
  double build_seconds = 0;  // graph to ready pipelines and recorded commands
  // Parts of build_seconds: opening the device (0 on a shared one), planning (passes, fusion,
  // kernels, memory), allocating buffers, creating pipelines and recording the command buffers;
  // the rest is mostly the upload of parameters.
  double device_seconds = 0;
  double plan_seconds = 0;
  double pipeline_seconds = 0;
  double record_seconds = 0;
  // The program's buffers: its arenas and staging. The parameters' and optimizer state's arenas
  // are allocated on another thread while the program is planned: only the wait for them, after
  // planning, counts here.
  double allocation_seconds = 0;
  uint32_t pipelines = 0;
  uint32_t spirv_cache_hits = 0;
  // Inside pipeline_seconds, summed over kernels whatever thread ran them: GLSL to SPIR-V (kernels
  // not in the cache) and the driver's pipeline creation; the kernel whose two took longest.
  double spirv_seconds = 0;
  double driver_seconds = 0;
  std::string slowest_kernel;
  double slowest_kernel_seconds = 0;
  // The (at most 8) kernels whose builds took longest, longest first: when each started, in
  // seconds after the pipelines' build began, and its GLSL-to-SPIR-V and driver seconds. A cold
  // build lasts at least its first's start plus both its parts.
  struct KernelBuildTime {
    std::string kernel;
    double start_seconds = 0, spirv_seconds = 0, driver_seconds = 0;
  };
  std::vector<KernelBuildTime> slowest_kernels;
  size_t dispatches = 0;              // every run's
  size_t setup_dispatches = 0;        // once and after a write (SessionOptions::setup)
  size_t coop_matrix_dispatches = 0;  // kernels on cooperative matrices (fast or bf16)
  // Precision::fast (or bf16) was asked for and the device runs cooperative matrices (of
  // bfloat16 operands for bf16); small products may still run strict (docs/KERNELS.md, fast
  // precision).
  bool coop_matrix_available = false;
  // Device memory the program plans (plan::describe_memory): its own persistent values, the
  // shared tensors it uses, and its transient values as if each had its own bytes (logical)
  // and as placed with reuse (physical).
  uint64_t persistent_bytes = 0;
  uint64_t shared_bytes = 0;
  uint64_t transient_logical_bytes = 0;
  uint64_t transient_physical_bytes = 0;
  std::string memory_plan;                   // plan::describe_memory
  std::string dispatch_list;                 // plan::describe_dispatches: one line per dispatch
  std::vector<DispatchCost> dispatch_costs;  // one per dispatch of every run, in order
};

struct DispatchProfile {
  std::string label;
  double start_ms = 0;
  double duration_ms = 0;
};

class Session {
 public:
  explicit Session(const Graph& graph, const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Inputs by name; the element count and dtype must match, except that floats fill an f16 or
  // bf16 input, rounded to the nearest f16 or bfloat16 (ties to even). Throws mg::Error otherwise.
  void set_input(std::string_view name, std::span<const float> values);
  void set_input(std::string_view name, std::span<const int32_t> values);
  bool has_input(std::string_view name) const;

  // Runs the program on the inputs set so far and waits for it (start_run, then finish_run).
  void run();
  // Starts a run without waiting for it, then waits for the run started before it, if that is
  // still in flight: the GPU has the new run queued behind it and never idles in between. While
  // the new run is in flight the next run's inputs can be set, and output() returns the outputs
  // of the run before it. Inputs persist: a run uses each input's last set value.
  void start_run();
  // Waits for the run in flight, if any; output() then returns its outputs.
  void finish_run();

  // Outputs of the last finished run (f32 outputs; f16, bf16 and i32 outputs convert exactly to
  // float).
  std::vector<float> output(std::string_view name) const;
  float scalar_output(std::string_view name) const;
  // An f32 output of the last finished run where the run left it, without a copy: valid until
  // the next run finishes (start_run's wait, finish_run or run). Throws mg::Error for other
  // dtypes.
  std::span<const float> f32_output(std::string_view name) const;

  // Parameters and state by name (blocking GPU reads and writes, after any run in flight); an
  // f16 or bf16 leaf is read exactly and written rounded to its format. A write makes the next run
  // run the setup first (SessionOptions::setup).
  std::vector<float> read(std::string_view leaf) const;
  void write(std::string_view leaf, std::span<const float> values);
  std::vector<std::string> persistent_names() const;  // parameters then state, in graph order
  TensorType leaf_type(std::string_view leaf) const;

  // Embedding (docs/EMBEDDING.md). Input `name` bound to `buffer` (a gpu buffer id of this
  // session's device, such as an app's imported VkBuffer) at `offset`: Binding::copied, every run
  // copies it on the GPU from there instead of from what set_input staged; Binding::in_place, the
  // kernels read it there, with no copy at all. Outputs likewise: copied into the buffer, or
  // written there by the kernels. The buffer holds the tensor as stored (leaf or output dtype).
  // In place, the offset must be a multiple of the device's storage-buffer offset alignment, and
  // an output must be a value each run computes (not an input, a parameter, a value of the setup
  // or the new value of state); else mg::Error says so. Each re-records the runs.
  enum class Binding { copied, in_place };
  void bind_input(std::string_view name, uint32_t buffer, uint64_t offset,
                  Binding binding = Binding::copied);
  void bind_output(std::string_view name, uint32_t buffer, uint64_t offset,
                   Binding binding = Binding::copied);
  // The copies a run records (inputs from the staging or a copied buffer, outputs into them, and
  // new values of state that the planner could not write over the state itself) and their bytes.
  struct Transfers {
    size_t copies = 0;
    uint64_t bytes = 0;
  };
  Transfers run_transfers() const;

  // Recording into the app's own command buffer (docs/EMBEDDING.md) instead of submitting:
  // `native_commands` is the backend's command buffer in the recording state, outside a render
  // pass (a VkCommandBuffer), of the device's queue family. record_run records the next run (and
  // the setup first, when it is due); record_next_chunk the next chunk of a chunked run, like
  // run_next_chunk. The app's submission of that command buffer must signal the device's app
  // timeline at `signal_value`; finish_run() and everything that waits for a run wait for it.
  struct Recorded {
    uint64_t signal_value = 0;
    bool last_chunk = false;  // record_next_chunk: it was the run's last chunk (record_run: true)
  };
  Recorded record_run(void* native_commands);
  Recorded record_next_chunk(void* native_commands);

  // Chunked runs, for an app that gives the GPU a slice of each frame: each run is cut into
  // chunks of at most `budget_ms` of GPU time (a dispatch longer than that is a chunk of its
  // own), measured by the first chunked run, which runs whole with per-dispatch timestamps.
  // Returns the number of chunks (1 until measured); 0 turns chunking off. Throws mg::Error on a
  // device without timestamps.
  size_t set_chunk_budget(double budget_ms);
  size_t chunk_count() const;
  // The measured GPU time of the chunk run_next_chunk submits next (0 before the measuring run):
  // an app fills a frame's spare GPU time with chunks while they fit.
  double next_chunk_ms() const;
  // Submits the next chunk of the current run (starting a run if none is under way) without
  // waiting for it: true when it was the run's last chunk, after which finish_run() waits for it
  // and output() reads its outputs. start_run() is refused while a chunked run is under way.
  bool run_next_chunk();

  // Segmented runs, for work the host does on some outputs while the GPU computes the rest
  // (data-parallel training sums each bucket of gradients across processes while backward
  // computes the next): a run submitted in pieces, each ending after a given dispatch and
  // copying out the outputs that are final by then. The results are those of whole runs.
  // The dispatch (an index below report().dispatches) after which output `name` is final;
  // nullopt where no dispatch writes it (an input or a leaf passed through).
  std::optional<size_t> output_ready_after(std::string_view name) const;
  // Cuts the following runs into segments that end after each of `segment_ends` (ascending,
  // below report().dispatches) and one that ends the run; none turns segments off. Returns the
  // number of segments. Throws mg::Error while a segmented or chunked run is under way.
  size_t set_segments(std::span<const size_t> segment_ends);
  size_t segment_count() const;
  // The segment after which output `name` can be read.
  size_t output_segment(std::string_view name) const;
  // Submits segment `index` without waiting, in order: 0 starts a run (after the run in flight
  // and the setup where due, as start_run), each further one runs behind the one before.
  void submit_segment(size_t index);
  // Waits for the segments up to `index` (submitted): the outputs of those segments can then be
  // read with output() and f32_output(); waiting for the last ends the run, as finish_run()
  // does. finish_run() completes a segmented run under way; start_run() and chunked runs are
  // refused during one.
  void wait_segment(size_t index);

  const BuildReport& report() const;
  std::vector<DispatchProfile> profile() const;  // last run, needs options.profile
  double last_run_gpu_ms() const;  // first dispatch's start to last one's end; options.time_runs
  void write_trace(const std::string& path) const;  // Chrome trace JSON of the last run
  uint32_t validation_messages() const;
  // With options.guard_bytes: throws mg::Error naming the value whose guard a kernel overwrote.
  void check_guards() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg
