#pragma once
// Lowering: each graph node becomes one or more kernel launches. A launch names the buffers it
// binds (graph values, in binding order), the GLSL source and defines that specialise the kernel
// to the node's shapes and the device, and its grid. Shapes are compile-time constants in the
// generated code, so every kernel is specialised per shape.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meganeura/graph.hpp"
#include "target/device_traits.hpp"
#include "target/launch.hpp"

namespace mg::kernels {

using target::DeviceTraits;
using target::kAssumedComputeUnits;
using target::Operand;

struct Launch {
  std::string label;   // "matmul %12", shown in profiles and errors
  std::string kernel;  // archetype name, e.g. "pointwise", "gemm"
  std::string body;    // GLSL after the generated buffer declarations
  // Embedded kernel files (kernel_source) that follow `body`, in order. Views, not copies: one
  // file serves hundreds of a program's launches, and copying it into each made planning slow.
  std::vector<std::string_view> files;
  std::vector<std::pair<std::string, std::string>> defines;
  std::vector<Operand> operands;
  std::array<uint32_t, 3> groups{1, 1, 1};
  // The GLSL uses GL_NV_cooperative_matrix; compile it to SPV_KHR_cooperative_matrix instead.
  bool khr_cooperative_matrix = false;
  // With khr_cooperative_matrix: its matrices are loaded through tensor layouts at the loaded
  // element (gpu::MatrixLoads::tensor_at_element; needs DeviceTraits::workgroup_tensor_loads).
  bool tensor_loads = false;
  // With khr_cooperative_matrix: its f16 type, which only its matrices' operands use, compiles
  // to bfloat16 (gpu::KernelSpec::bf16_operands; DeviceTraits::bf16_operands).
  bool bf16_operands = false;
  // With bf16_operands: its f16 buffers (bf16 operands, declared float16_t) hold bfloat16
  // values and compile to bfloat16 buffers (gpu::KernelSpec::bf16_buffers).
  bool bf16_buffers = false;
  // The kernel reads or writes f16 values (float16_t arrays); other kernels name the f16 operand
  // in an error instead of compiling against values they were not written for.
  bool f16_operands = false;
};

// Throws mg::Error unless `device` has f16 storage buffers and f16 arithmetic: `label` `does`
// ("converts into", "reads or writes") an f16 tensor.
void require_f16_tensors(const std::string& label, const std::string& does,
                         const DeviceTraits& device);

// The GLSL text that declares `launch`'s operands as std430 storage buffers (binding k is
// operand k; f32 values as float[], i32 as int[], and f16 as float16_t[] after the extensions
// that allow it where the launch has f16_operands), followed by the common prelude.
std::string buffer_declarations(const Graph& graph, const Launch& launch);

// The whole GLSL of `launch`: its buffer declarations, its body, then its kernel files.
std::string launch_source(const Graph& graph, const Launch& launch);

// Grid for `count` independent work items in workgroups of `local_size`, spread over x and y
// so that no dimension exceeds the device's limit. Kernels use linear_workgroup() (prelude).
std::array<uint32_t, 3> grid_for(uint64_t count, uint32_t local_size, const DeviceTraits& device);

// The grid of a tiled kernel: ceil(columns / tile_columns) x ceil(rows / tile_rows) x entries.
// Throws mg::Error naming `label` when an extent exceeds the device's workgroup count limit.
std::array<uint32_t, 3> tiled_grid(const std::string& label, int64_t columns, int64_t tile_columns,
                                   int64_t rows, int64_t tile_rows, int64_t entries,
                                   const DeviceTraits& device);

class LoweringContext {
 public:
  LoweringContext(const Graph& graph, ValueId id, const DeviceTraits& device)
      : graph_(graph), id_(id), device_(device) {}

  const Graph& graph() const { return graph_; }
  ValueId id() const { return id_; }
  const Node& node() const { return graph_.node(id_); }
  const TensorType& input_type(size_t k) const { return graph_.type(node().inputs.at(k)); }
  const DeviceTraits& device() const { return device_; }
  std::string label() const { return node().op + " %" + std::to_string(id_); }

  void emit(Launch launch) { launches_.push_back(std::move(launch)); }
  std::vector<Launch>& launches() { return launches_; }

 private:
  const Graph& graph_;
  ValueId id_;
  const DeviceTraits& device_;
  std::vector<Launch> launches_;
};

using LoweringFunction = void (*)(LoweringContext& context);

struct LoweringEntry {
  std::string_view op;
  LoweringFunction lower;
};

// One table a kernel archetype file, listing the ops that archetype runs.
std::vector<LoweringEntry> pointwise_lowerings();
std::vector<LoweringEntry> layout_lowerings();
std::vector<LoweringEntry> reduction_lowerings();
std::vector<LoweringEntry> gemm_lowerings();
std::vector<LoweringEntry> workgroup_gemm_lowerings();
std::vector<LoweringEntry> conv_lowerings();
std::vector<LoweringEntry> columns_lowerings();
std::vector<LoweringEntry> winograd_lowerings();
std::vector<LoweringEntry> pool_lowerings();
std::vector<LoweringEntry> norm_lowerings();
std::vector<LoweringEntry> attention_lowerings();
// The multiple of the head widths that the cooperative-matrix attention kernels take (their
// fragments' side) where they run on `device`, else 1 (target::Target::attention_head_multiple).
int64_t attention_head_multiple(const DeviceTraits& device);
// Whether the cooperative-matrix backward of the attention gradient `node` finds the rescaled
// cotangent's largest |dO| itself (target::Target::attention_gradient_scales_itself; the rule
// and its reason in attention.cpp), unless MEGANEURA_ATTENTION_OWN_GRAD_SCALE decides.
bool attention_gradient_scales_itself(const Graph& graph, const Node& node,
                                      const DeviceTraits& device);
// GLSL of `float joined_a(uint e)` and `vec4 joined_a4(uint e)`: element e (and four from e, a
// multiple of 4) of the attention_combine `combine`'s result, joined from its slices' partials in
// the float buffer `a` as the combine's own kernel joins them, for a product that reads the
// partials in its place (joined_split_attention).
std::string join_slices_functions(const Graph& graph, ValueId combine);
std::vector<LoweringEntry> loss_lowerings();
// GLSL: lower_rope's table of angle parts and `vec2 NAME(uint row, uint d)`, the cosine and sine
// of rope node `node`'s rotation of pair d in row `row` of its [..., S, D] shape; where the node
// has positions, `positions` names the i32 buffer they are read from.
std::string rope_angle_function(const Node& node, const std::string& name,
                                const std::string& positions = "");
// Index chains (index_chain.cpp): a transpose, a rope or a concat (the root) computed in one
// launch with the transposes, ropes, reshapes and split-K sums before it whose one reader is the
// next link (`links`, in graph order): each element of the root is evaluated from the memory the
// chain starts at, without launches or memory in between. Where attention's inputs are rotated and
// moved to head-major order after their projections (and their gradients back), that is one
// launch instead of up to three.
bool is_index_chain_root(const Node& node);
// A concat is a chain's root too, never a link: one of its parts is the chain's value, the others
// are read from memory (SmolVLA's cached prefix keys beside the flow step's new, rotated ones).
bool is_index_chain_concat(const Node& node);
bool is_index_chain_link(const Node& node);
// The GLSL functions that compute chain `root` (with `links`) at a flat index, as
// index_chain_launch does, appended to `text`: functions and buffers named from `prefix`, the
// buffers joining `operands`. Returns the name of the root's function, `float <name>(uint i)`.
std::string index_chain_functions(const Graph& graph, ValueId root,
                                  const std::vector<ValueId>& links, const std::string& prefix,
                                  std::vector<Operand>& operands, std::string& text);
Launch index_chain_launch(const Graph& graph, ValueId root, const std::vector<ValueId>& links,
                          const DeviceTraits& device);

// Launches for node `id`. Throws mg::Error naming the op and the device when no kernel exists.
std::vector<Launch> lower_node(const Graph& graph, ValueId id, const DeviceTraits& device);

// The launch of scatter_add `id` that adds its update rows into its result, which holds the
// target already: after a copy of the target (its lowering), or where the target's own launches
// wrote it there (fusion.cpp, scatters into their target's memory).
Launch scatter_add_rows_launch(const Graph& graph, ValueId id, const DeviceTraits& device);

// An attention forward over whole key streams (no slices) that `transpose` reads, moving the heads
// after the queries: its launch can write the transpose's value itself (HEADS_LAST, or
// HEADS_LAST_COPY beside its own output), and the transpose then has none (kernels/fusion.cpp).
bool writes_heads_last(const Graph& graph, ValueId forward, ValueId transpose);
// How an attention forward is fused (kernels/fusion.cpp): the transpose whose value it writes
// heads last (kNoValue: none), in place of its own output or, with keeps_output, beside it (the
// output has other readers: a training step's backward, whose forward writes its log-sum-exp as a
// companion); and for a forward without a log-sum-exp, the index chain (root and links) whose
// value its queries are, which it then computes as it loads them (Q_CHAIN) instead of reading
// them from memory (kNoValue: read them).
struct AttentionForwardFusion {
  ValueId heads_last = kNoValue;
  bool keeps_output = false;
  ValueId query_chain = kNoValue;
  std::vector<ValueId> query_links;
};

// Values another node's launch can write beside its own result, so that their node needs no
// launch: an attention_lse after a forward over the same q, k and mask, with the same scale and
// causality (the forward, or for a forward over key slices the attention_combine after it, has
// the log-sum-exp at hand); after the attention_grad_k of the same inputs on the strict kernel,
// an attention_grad_v (one pass over the scores for both; MEGANEURA_ATTENTION_FUSED_KV=0 turns
// that off) and an attention_grad_scores (the weights it computes anyway); a
// winograd_grad_tiles after the winograd_tiles that one matmul multiplies it with, when its
// input comes before that (one launch for both transforms of a Winograd weight gradient). A
// companion comes after its producer in the graph, so every reader of it runs after the producer's
// launch; a producer writes at most one companion of each op.
bool is_companion_op(std::string_view op);
// The ops that can_write_companion can accept as a producer: attention forwards, their combines,
// dK, and Winograd input tiles.
bool is_companion_producer_op(std::string_view op);
bool can_write_companion(const Graph& graph, ValueId producer, ValueId companion,
                         const DeviceTraits& device);

// The producer's launches, writing the companions as well (an attention forward fused as `fused`
// says, where given).
std::vector<Launch> lower_with_companions(const Graph& graph, ValueId producer,
                                          const std::vector<ValueId>& companions,
                                          const DeviceTraits& device,
                                          const AttentionForwardFusion* fused = nullptr);

// The attention family's companions (attention.cpp) and the Winograd tile pair (conv_winograd.cpp),
// which the three functions above dispatch to.
bool is_attention_companion_op(std::string_view op);
bool can_write_attention_companion(const Graph& graph, ValueId producer, ValueId companion,
                                   const DeviceTraits& device);
std::vector<Launch> lower_attention_with_companions(const Graph& graph, ValueId producer,
                                                    const std::vector<ValueId>& companions,
                                                    const DeviceTraits& device,
                                                    const AttentionForwardFusion* fused = nullptr);
std::vector<Launch> lower_attention_forward(const Graph& graph, ValueId forward,
                                            const AttentionForwardFusion& fusion,
                                            const DeviceTraits& device);
bool can_pair_winograd_tiles(const Graph& graph, ValueId producer, ValueId companion);
std::vector<Launch> lower_winograd_tiles_pair(const Graph& graph, ValueId producer,
                                              ValueId companion, const DeviceTraits& device);

// Every op that has a kernel (for `meganeura inspect --ops` and the coverage test).
std::vector<std::string> lowered_ops();

// The embedded GLSL file `file_name` (e.g. "gemm.comp"); throws if absent.
std::string_view kernel_source(std::string_view file_name);

// Prints "meganeura: <message>" to stderr once per distinct message: a sweep lowers many kernels
// with the same ignored override.
void warn_once(const std::string& message);

}  // namespace mg::kernels
