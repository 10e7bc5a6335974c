// Attention kernels: strict flash attention, forward, log-sum-exp and the dQ / dK / dV backward
// (attention_tiled.comp), their cooperative-matrix counterparts (attention_*_coopmat.comp), and
// rope. Block sizes are chosen per shape so that every tile fits the device's shared memory;
// the shared-memory formulas below mirror the declarations in the .comp files.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numbers>
#include <stdexcept>

#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

constexpr int64_t kThreads = 128;
// The longest stream (keys for the forward and dQ, queries for dK / dV) that the strict kernels
// take in 16-row blocks where the compute units would otherwise idle (choose_tiled_blocks).
constexpr int64_t kShortStream = 256;

struct Dims {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
};

// The extents of an attention node (every op takes q and k first, and v third when it has
// values; attention_lse has none).
Dims attention_dims(const Graph& graph, const Node& node) {
  const Shape& q = graph.type(node.inputs[0]).shape;
  const Shape& k = graph.type(node.inputs[1]).shape;
  const int64_t value_dim =
      node.op == op::attention_lse ? q[3] : graph.type(node.inputs[2]).shape[3];
  return {q[0], q[1], k[1], q[2], k[2], q[3], value_dim};
}

double attention_scale(const Node& node, const Dims& dims) {
  return node.attrs.get_float("scale", 1.0 / std::sqrt(static_cast<double>(dims.head_dim)));
}

// Input positions (src/ops/attention.cpp). Forward: q, k, v, mask?; attention_lse: q, k,
// mask?; backward: q, k, v, mask?, out, grad_out, lse, grad_out_max?.
struct Inputs {
  bool with_value;
  bool has_mask;
  size_t mask() const { return with_value ? 3 : 2; }
  size_t out() const { return mask() + (has_mask ? 1 : 0); }
  size_t grad_out_max() const { return out() + 3; }
};

// The cooperative-matrix backward scales dO to a largest element of kGradientMaximum where the
// graph gives it max |dO| (passes/scale_attention_gradients.cpp). |dS| is at most
// |dP - delta| scale (P <= 1), and |dP - delta| at most max |dO| sqrt(Dv) |v_j - o_i|: with
// scale = 1 / sqrt(D) and Dv = D, 64 |v_j - o_i|, below f16's largest value (65504) unless two
// value rows lie over 1000 apart, while the dS that matter stay far above f16's smallest normal
// (2^-14). A zero cotangent takes the floor kSmallestMaximum: a finite scale and zero gradients.
constexpr double kGradientMaximum = 64.0;
constexpr double kSmallestMaximum = 1e-30;
// A kernel that finds max |dO| itself (attribute own_grad_out_scale) reads its rows of dO once
// more first: the dK / dV kernel every row of its group's heads for each block of 64 keys. Up to
// this many such elements in all (L2-resident at these sizes) the rule takes the rereading to
// cost less than the reduction's two launches and the barriers around them; past it, as the
// rereading grows with the square of the sequence, the reduction made once is cheaper.
constexpr int64_t kMostOwnScaleRereads = int64_t{1} << 22;

// The values are attention_tiled.comp's MODE.
// grad_kv: dK and dV of one node pair in one launch (attention_grad_k writing attention_grad_v);
// grad_scores: attention_grad_scores (SCALE * dS) alone.
enum class Mode {
  forward = 0,
  lse = 1,
  grad_q = 2,
  grad_k = 3,
  grad_v = 4,
  grad_kv = 5,
  grad_scores = 6
};

int64_t next_power_of_two(int64_t value) {
  int64_t result = 1;
  while (result < value) result *= 2;
  return result;
}

bool is_key_owned(Mode mode) {
  return mode == Mode::grad_k || mode == Mode::grad_v || mode == Mode::grad_kv ||
         mode == Mode::grad_scores;
}

// Modes with a second product over the value dimension (dP).
bool has_two_products(Mode mode) {
  return mode == Mode::grad_q || mode == Mode::grad_k || mode == Mode::grad_kv ||
         mode == Mode::grad_scores;
}

// Bytes of shared memory attention_tiled.comp declares for blocks of `owned` and `streamed`
// rows: rows of vec4s padded by one, the weights and the per-row statistics.
int64_t tiled_shared_bytes(Mode mode, const Dims& dims, int64_t owned, int64_t streamed) {
  const int64_t k_row = 16 * ((dims.head_dim + 3) / 4 + 1);
  const int64_t v_row = 16 * ((dims.value_dim + 3) / 4 + 1);
  int64_t bytes = owned * k_row + (has_two_products(mode) ? owned * v_row : 0) + streamed * k_row;
  if (mode != Mode::lse) bytes += streamed * v_row + 4 * streamed * owned;
  if (mode == Mode::grad_kv) bytes += 4 * streamed * owned;
  if (mode == Mode::forward || mode == Mode::lse) bytes += 8 * owned;
  if (is_key_owned(mode)) bytes += 8 * streamed;
  return bytes;
}

struct TiledBlocks {
  int64_t owned, streamed, threads, lanes;
};

// Owned rows per workgroup, streamed rows per block, threads per workgroup and the lanes that
// share an owned row. The largest blocks that fit, owned first (each owned row reuses every
// streamed tile), neither longer than its sequence needs.
// MEGANEURA_ATTENTION_BLOCKS=OWNED,STREAMED[,THREADS[,LANES]] is tried first (for tuning
// sweeps; where it does not fit, the built-in candidates follow).
TiledBlocks choose_tiled_blocks(Mode mode, const Dims& dims, const LoweringContext& context) {
  const DeviceTraits& device = context.device();
  const int64_t max_lanes = std::min<int64_t>(32, device.subgroup_size);
  const int64_t lanes = std::min<int64_t>(8, device.subgroup_size);
  if (lanes < 4 || device.max_workgroup_invocations < kThreads) {
    throw Error(context.label() + ": the strict attention kernels need subgroups of at least 4 " +
                "lanes and workgroups of " + std::to_string(kThreads) + " invocations; " +
                device.name + " offers " + std::to_string(device.subgroup_size) + " and " +
                std::to_string(device.max_workgroup_invocations));
  }
  const bool key_owned = is_key_owned(mode);
  const int64_t owned_len = key_owned ? dims.kv_len : dims.q_len;
  const int64_t streamed_len = key_owned ? dims.q_len : dims.kv_len;
  std::vector<TiledBlocks> candidates;
  // Where 64-row blocks would leave three quarters of the compute units idle (short prompts at
  // batch 1), 32-row blocks give twice the workgroups. Where such a node's stream is short as
  // well, 16-row streamed blocks run as fast as 32-row ones, and the driver compiles their
  // kernels (the unrolled products of a block) in markedly less time: that is the longest
  // kernel build of a short-sequence training program, a cold build's critical path.
  const int64_t heads = key_owned ? dims.kv_heads : dims.q_heads;
  const bool idle_units = 4 * dims.batch * heads * ((owned_len + 63) / 64) <= device.compute_units;
  const bool short_stream = streamed_len <= kShortStream;
  for (auto [owned, streamed] :
       {std::pair<int64_t, int64_t>{64, 32}, {64, 16}, {32, 32}, {32, 16}, {16, 16}, {16, 8}}) {
    if (idle_units && owned > 32) continue;
    if (idle_units && short_stream && streamed > 16) continue;
    candidates.push_back({owned, streamed, kThreads, lanes});
  }
  if (const std::vector<int64_t>& forced = device.switches.attention_blocks; !forced.empty()) {
    const auto reject = [&] {
      return Error("MEGANEURA_ATTENTION_BLOCKS='" + switch_text(forced) +
                   "': expected OWNED,STREAMED[,THREADS[,LANES]], powers of two with LANES at " +
                   "most " + std::to_string(max_lanes) + " (the subgroup), LANES <= STREAMED " +
                   "<= 128, THREADS / LANES <= OWNED <= 128 and OWNED <= 4 * THREADS; unset it " +
                   "for the built-in blocks");
    };
    // Two to four fields; THREADS and LANES default to the built-in ones.
    std::vector<int64_t> fields = forced;
    if (fields.size() < 3) fields.push_back(kThreads);
    if (fields.size() < 4) fields.push_back(lanes);
    const TiledBlocks wanted{fields[0], fields[1], fields[2], fields[3]};
    const auto power_of_two = [](int64_t n) { return n > 0 && (n & (n - 1)) == 0; };
    // Phase 1 gives every group of `lanes` threads at least one owned row, phase 2 every
    // thread four.
    if (!power_of_two(wanted.owned) || !power_of_two(wanted.streamed) ||
        !power_of_two(wanted.threads) || !power_of_two(wanted.lanes) || wanted.lanes > max_lanes ||
        wanted.streamed < wanted.lanes || wanted.streamed > 128 ||
        wanted.threads > device.max_workgroup_invocations || wanted.owned > 128 ||
        wanted.owned * wanted.lanes < wanted.threads || wanted.owned > 4 * wanted.threads)
      throw reject();
    candidates.insert(candidates.begin(), wanted);
  }
  for (TiledBlocks blocks : candidates) {
    blocks.owned = std::max(blocks.threads / blocks.lanes,
                            std::min(blocks.owned, next_power_of_two(owned_len)));
    blocks.streamed =
        std::max(blocks.lanes, std::min(blocks.streamed, next_power_of_two(streamed_len)));
    if (tiled_shared_bytes(mode, dims, blocks.owned, blocks.streamed) <=
        device.max_shared_memory_bytes)
      return blocks;
  }
  throw Error(context.label() + ": head dimensions " + std::to_string(dims.head_dim) + "/" +
              std::to_string(dims.value_dim) + " need more shared memory than " + device.name +
              " offers");
}

// `float mask_at(b, h, i, j)`: the additive mask broadcast to [B, Hq, Sq, Sk], 0 without one.
// The padding rows and columns of partial blocks read the last row or column: the kernels mask
// those scores themselves, and a load without a branch around it can be issued with the others
// of its block instead of waiting for each in turn.
std::string mask_function(const Graph& graph, const Node& node, const Inputs& inputs,
                          const Dims& dims) {
  std::string text = "float mask_at(uint b, uint h, uint i, uint j) {\n";
  if (!inputs.has_mask) return text + "  return 0.0;\n}\n";
  const Shape& mask = graph.type(node.inputs[inputs.mask()]).shape;
  const std::vector<int64_t> strides = row_major_strides(mask);
  const char* coordinates[] = {"b", "h", "i", "j"};
  std::string index;
  for (size_t k = 0; k < mask.size(); ++k) {
    if (mask[k] == 1) continue;
    if (!index.empty()) index += " + ";
    index += std::string(coordinates[4 - mask.size() + k]) + " * " + glsl_uint(strides[k]);
  }
  text += "  i = min(i, " + glsl_uint(dims.q_len - 1) + ");\n  j = min(j, " +
          glsl_uint(dims.kv_len - 1) + ");\n";
  return text + "  return mask[" + (index.empty() ? "0u" : index) + "];\n}\n";
}

// Shared memory of the cooperative-matrix dQ and dK / dV kernels for streamed blocks of
// `streamed` keys (dQ) or queries (dK / dV), mirroring their declarations (64 owned rows): f16
// tiles (the owned block's operands, or the streamed block's two), f32 staging rows (S, then dP,
// and parts of the result at the end; padded by 8 floats for dQ's vec4 reads, 4 otherwise), the
// per-query lse and delta of dK / dV and the f16 weights. Kernels that keep their scores in
// registers (FRAGMENT_REGISTERS) declare no staging rows or weights: this bounds them.
int64_t coop_shared_bytes(Mode mode, const Dims& dims, int64_t streamed) {
  const int64_t owned = 64;
  const int64_t d = dims.head_dim + 8, dv = dims.value_dim + 8;
  const int64_t tiles = std::max(streamed * (d + dv), owned * std::max(d, dv));
  const int64_t stage = owned * (streamed + (mode == Mode::grad_q ? 8 : 4));
  const int64_t query_stats = mode == Mode::grad_k || mode == Mode::grad_kv ? 2
                              : mode == Mode::grad_v                        ? 1
                                                                            : 0;
  return 2 * tiles + 4 * stage + 4 * query_stats * streamed + 2 * owned * (streamed + 8);
}

// The streamed blocks the cooperative-matrix kernels try in order, `preferred` (from the
// built-in choice) or only the one MEGANEURA_ATTENTION_COOP_BLOCK=32/64 names (tuning sweeps).
std::vector<int64_t> coop_block_candidates(std::vector<int64_t> preferred,
                                           const DeviceTraits& device) {
  if (const std::optional<int64_t> forced = device.switches.attention_coop_block) return {*forced};
  return preferred;
}

// The backward's streamed block: 32, else 64; 0 when neither fits. Blocks of 64 take many more
// registers, so fewer workgroups share a compute unit and the backward runs slower.
int64_t coop_backward_block(Mode mode, const Dims& dims, const DeviceTraits& device) {
  for (int64_t streamed : coop_block_candidates({32, 64}, device))
    if (coop_shared_bytes(mode, dims, streamed) <= device.max_shared_memory_bytes) return streamed;
  return 0;
}

// Whether the cooperative-matrix forward, dQ and dK / dV keep scores, probabilities and dS in
// registers (FRAGMENT_REGISTERS): where the session's probe found the fragment layout they are
// written for, unless MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=0.
bool fragment_registers(const DeviceTraits& device) {
  return device.switches.attention_fragment_registers.value_or(true) && device.quad_row_fragments;
}

// Shared memory of the cooperative-matrix forward (attention_forward_coopmat.comp) for key
// blocks of bk: f16 query block or K and V tiles; staging through shared memory adds f32 rows
// (scores, or the output during a rescale and at the end) and f16 probabilities; 64 owned
// queries.
int64_t coop_forward_shared_bytes(const Dims& dims, int64_t bk, bool in_registers) {
  const int64_t owned = 64;
  const int64_t d = dims.head_dim + 8, dv = dims.value_dim + 8;
  const int64_t tiles = std::max(bk * (d + dv), owned * d);
  if (in_registers) return 2 * tiles;
  const int64_t stage = owned * (std::max(bk, dims.value_dim) + 4);
  return 2 * tiles + 4 * stage + 2 * owned * (bk + 8);
}

// The forward's key block: 64 keys where they fit (half the barriers and statistics passes of
// 32), else 32; 0 when neither fits.
int64_t coop_forward_block(const Dims& dims, const DeviceTraits& device) {
  const bool in_registers = fragment_registers(device);
  for (int64_t bk : coop_block_candidates({64, 32}, device))
    if (coop_forward_shared_bytes(dims, bk, in_registers) <= device.max_shared_memory_bytes)
      return bk;
  return 0;
}

// The side of the cooperative-matrix kernels' fragments, which the head widths fill, and the
// rows (queries or keys) a workgroup of theirs owns: 4 subgroups of 16.
constexpr int64_t kCoopFragment = 16;
constexpr int64_t kCoopOwnedRows = 64;

// The fast kernels run when the GEMMs do and the head dimensions fill whole fragments
// (attention_lse runs the forward kernel without values). Their operands are f16 also in bf16
// precision: they are written for 16 x 8 B fragments, which devices offer for f16 alone.
bool use_coop_attention(Mode mode, const Dims& dims, const DeviceTraits& device) {
  const bool f16_fragments = device.coop_matrix_f16_nv || device.coop_matrix_f16_khr;
  if (mode == Mode::grad_scores || !use_coop_gemm(device) || !f16_fragments ||
      dims.head_dim % kCoopFragment != 0 || dims.value_dim % kCoopFragment != 0)
    return false;
  if (mode == Mode::forward || mode == Mode::lse) return coop_forward_block(dims, device) != 0;
  return coop_backward_block(mode, dims, device) != 0;
}

// `companion`: a second value the launch writes (kNoValue: none): the attention_lse of a
// forward, or the attention_grad_v of grad_kv; `scores`: the attention_grad_scores that a dK
// launch (grad_k, grad_kv) writes as well; `fused`: how a forward without a companion is fused
// (lowering.hpp: the transpose it writes heads last, the index chain its queries come from).
void lower_attention(LoweringContext& context, Mode mode, ValueId companion = kNoValue,
                     ValueId scores = kNoValue, const AttentionForwardFusion* fused = nullptr) {
  const Node& node = context.node();
  const Graph& graph = context.graph();
  const bool with_value = mode != Mode::lse;
  const Inputs inputs{with_value, node.attrs.get_int("has_mask", 0) != 0};
  const Dims dims = attention_dims(graph, node);
  const double scale = attention_scale(node, dims);
  const bool coop = use_coop_attention(mode, dims, context.device());
  const bool key_owned = is_key_owned(mode);
  const bool backward = mode != Mode::forward && mode != Mode::lse;
  // The strict kernels compute in f32 throughout and leave max |dO| unread.
  const bool scaled_grad_out = coop && backward && node.attrs.get_int("has_grad_out_max", 0) != 0;
  const bool own_grad_out_scale =
      coop && backward && node.attrs.get_int("own_grad_out_scale", 0) != 0;

  Launch launch;
  launch.label = context.label();
  launch.defines = {{"HQ", glsl_uint(dims.q_heads)},
                    {"HKV", glsl_uint(dims.kv_heads)},
                    {"SQ", glsl_uint(dims.q_len)},
                    {"SK", glsl_uint(dims.kv_len)},
                    {"D", glsl_uint(dims.head_dim)},
                    {"DV", glsl_uint(dims.value_dim)},
                    {"SCALE", glsl_float(scale)},
                    {"CAUSAL", node.attrs.get_int("causal", 0) != 0 ? "1" : "0"}};
  const bool writes_lse = mode == Mode::forward && companion != kNoValue;
  // Slices of the streamed rows (passes/split_attention.cpp): workgroup z computes partial z,
  // over keys (forward and dQ: kv_splits) or queries (dK and dV: q_splits); the log-sum-exp
  // alone is never split.
  const int64_t splits =
      mode == Mode::lse ? 1 : node.attrs.get_int(key_owned ? "q_splits" : "kv_splits", 1);
  const int64_t slice = attention_slice_length(key_owned ? dims.q_len : dims.kv_len, splits);
  launch.defines.push_back({"SPLITS", std::to_string(splits)});  // tested by #if: no suffix
  const ValueId heads_last = fused ? fused->heads_last : kNoValue;
  const bool heads_last_copy = heads_last != kNoValue && fused->keeps_output;
  // The transpose's value in place of the forward's own output.
  const bool heads_last_only = heads_last != kNoValue && !heads_last_copy;
  const bool query_chain = fused && fused->query_chain != kNoValue;
  // A forward that writes its log-sum-exp (for a backward) keeps its output and computes no
  // query chain.
  if ((fused && (mode != Mode::forward || (writes_lse && (query_chain || heads_last_only)))) ||
      (heads_last != kNoValue && splits != 1))
    throw std::logic_error(context.label() + ": no such fusion of this attention");
  launch.defines.push_back({"HEADS_LAST", heads_last_only ? "1" : "0"});
  launch.defines.push_back({"HEADS_LAST_COPY", heads_last_copy ? "1" : "0"});
  launch.defines.push_back({"Q_CHAIN", query_chain ? "1" : "0"});
  launch.defines.push_back({"SLICE", glsl_uint(slice)});
  // dK and dV over parts of each group's query heads (head_splits): partial z is slice
  // z % splits of part z / splits.
  const int64_t head_splits = key_owned ? node.attrs.get_int("head_splits", 1) : 1;
  launch.defines.push_back({"HEAD_SPLITS", glsl_uint(head_splits)});
  std::string file;
  int64_t owned_block = kCoopOwnedRows;
  if (coop) {
    switch (mode) {
      case Mode::forward:
      case Mode::lse:
        file = "attention_forward_coopmat.comp";
        launch.defines.push_back({"BK", glsl_uint(coop_forward_block(dims, context.device()))});
        launch.defines.push_back(
            {"FRAGMENT_REGISTERS", fragment_registers(context.device()) ? "1" : "0"});
        launch.defines.push_back({"WITH_VALUE", with_value ? "1" : "0"});
        launch.defines.push_back({"WITH_LSE", writes_lse ? "1" : "0"});
        break;
      case Mode::grad_q:
        file = "attention_grad_q_coopmat.comp";
        launch.defines.push_back(
            {"BK", glsl_uint(coop_backward_block(mode, dims, context.device()))});
        launch.defines.push_back(
            {"FRAGMENT_REGISTERS", fragment_registers(context.device()) ? "1" : "0"});
        break;
      case Mode::grad_k:
      case Mode::grad_v:
      case Mode::grad_kv:
        file = "attention_grad_kv_coopmat.comp";
        launch.defines.push_back(
            {"BQ", glsl_uint(coop_backward_block(mode, dims, context.device()))});
        launch.defines.push_back({"GRAD_K", mode != Mode::grad_v ? "1" : "0"});
        launch.defines.push_back({"WITH_GRAD_V", mode == Mode::grad_kv ? "1" : "0"});
        launch.defines.push_back(
            {"FRAGMENT_REGISTERS", fragment_registers(context.device()) ? "1" : "0"});
        break;
      case Mode::grad_scores:  // use_coop_attention never picks it
        throw Error(context.label() + ": no cooperative-matrix kernel for this attention mode");
    }
  } else {
    file = "attention_tiled.comp";
    const TiledBlocks blocks = choose_tiled_blocks(mode, dims, context);
    if (splits > 1 && slice % blocks.streamed != 0) {
      throw Error(context.label() + ": slices of " + std::to_string(slice) +
                  " streamed rows need streamed blocks that divide them, not " +
                  std::to_string(blocks.streamed) +
                  " (check MEGANEURA_ATTENTION_BLOCKS and MEGANEURA_ATTENTION_SPLITS)");
    }
    owned_block = blocks.owned;
    launch.defines.push_back({"MODE", std::to_string(static_cast<int>(mode))});
    launch.defines.push_back({"WITH_LSE", writes_lse ? "1" : "0"});
    launch.defines.push_back({"WITH_SCORES", scores != kNoValue ? "1" : "0"});
    launch.defines.push_back({"BO", glsl_uint(blocks.owned)});
    launch.defines.push_back({"BS", glsl_uint(blocks.streamed)});
    launch.defines.push_back({"TC", glsl_uint(blocks.lanes)});
    launch.defines.push_back({"THREADS", glsl_uint(blocks.threads)});
    // Loads grouped 4 and 8 steps ahead hide the fetches' latency on GPUs; Lavapipe's compiler
    // only takes longer over them.
    const bool cpu = context.device().cpu;
    launch.defines.push_back({"U1", cpu ? "1" : "4"});
    launch.defines.push_back({"U2", cpu ? "1" : "8"});
  }
  launch.khr_cooperative_matrix = coop && coop_wants_khr(context.device());
  launch.kernel = file.substr(0, file.size() - 5);
  launch.body = mask_function(graph, node, inputs, dims);
  if (coop) launch.files.push_back(kernel_source("attention_coopmat_tiles.glsl"));
  launch.files.push_back(kernel_source(file));

  // Queries computed as they are loaded (Q_CHAIN): the chain's functions and buffers, bound after
  // every other operand; binding 0 (q) then holds the chain's first buffer, unread.
  std::vector<Operand> chain_operands;
  if (query_chain) {
    std::string functions;
    const std::string query = index_chain_functions(graph, fused->query_chain, fused->query_links,
                                                    "q_", chain_operands, functions);
    launch.body =
        functions + "float q_chain(uint i) {\n  return " + query +
        "(i);\n}\nvec4 q_chain4(uint i4) {\n  uint i = 4u * i4;\n  return vec4(q_chain(i), " +
        "q_chain(i + 1u), q_chain(i + 2u), q_chain(i + 3u));\n}\n" + launch.body;
  }
  launch.operands = {{"q", query_chain ? chain_operands.front().value : node.inputs[0], false},
                     {"k", node.inputs[1], false}};
  if (mode == Mode::forward || has_two_products(mode))
    launch.operands.push_back({"v", node.inputs[2], false});
  if (inputs.has_mask) launch.operands.push_back({"mask", node.inputs[inputs.mask()], false});
  if (has_two_products(mode))
    launch.operands.push_back({"out_value", node.inputs[inputs.out()], false});
  if (mode != Mode::forward && mode != Mode::lse) {
    launch.operands.push_back({"grad_out", node.inputs[inputs.out() + 1], false});
    launch.operands.push_back({"lse", node.inputs[inputs.out() + 2], false});
  }
  if (scaled_grad_out) {
    const ValueId largest = node.inputs[inputs.grad_out_max()];
    launch.operands.push_back({"grad_out_max", largest, false});
    launch.defines.push_back({"GRAD_OUT_MAX_HEADS", glsl_uint(graph.type(largest).shape[1])});
  }
  if (scaled_grad_out || own_grad_out_scale) {
    launch.defines.push_back({"GRADIENT_MAXIMUM", glsl_float(kGradientMaximum)});
    launch.defines.push_back({"SMALLEST_MAXIMUM", glsl_float(kSmallestMaximum)});
  }
  if (coop && backward) {
    launch.defines.push_back({"SCALED_GRAD_OUT", scaled_grad_out      ? "1"
                                                 : own_grad_out_scale ? "2"
                                                                      : "0"});
  }
  const char* result_name = mode == Mode::forward       ? "out_"
                            : mode == Mode::lse         ? "lse"
                            : mode == Mode::grad_q      ? "grad_q"
                            : mode == Mode::grad_scores ? "scores"
                                                        : "result";
  launch.operands.push_back({result_name, heads_last_only ? heads_last : context.id(), true});
  if (companion != kNoValue)
    launch.operands.push_back({mode == Mode::forward ? "lse" : "result_v", companion, true});
  if (scores != kNoValue) launch.operands.push_back({"scores", scores, true});
  if (heads_last_copy) launch.operands.push_back({"out_t", heads_last, true});
  for (Operand& operand : chain_operands) launch.operands.push_back(std::move(operand));
  // W in whole vec4s where its rows are (the owned keys of a block start at multiples of 4).
  if (!coop && (scores != kNoValue || mode == Mode::grad_scores)) {
    const bool vec4 = dims.kv_len % 4 == 0;
    launch.defines.push_back({"SCORES_VEC4", vec4 ? "1" : "0"});
    for (size_t k = 0; vec4 && k < launch.operands.size(); ++k) {
      if (launch.operands[k].name == "scores")
        launch.body = vector_buffer_view("scores4", k, true) + launch.body;
    }
  }
  // The backward coop kernels alias out_value and grad_out as vec4 views, so they need the
  // bindings, which shift with the mask.
  if (coop && mode != Mode::forward) {
    for (size_t k = 0; k < launch.operands.size(); ++k) {
      if (launch.operands[k].name == "out_value")
        launch.defines.push_back({"OUT_BINDING", std::to_string(k)});
      if (launch.operands[k].name == "grad_out")
        launch.defines.push_back({"GRAD_OUT_BINDING", std::to_string(k)});
    }
  }

  const int64_t owned_len = key_owned ? dims.kv_len : dims.q_len;
  const int64_t blocks = (owned_len + owned_block - 1) / owned_block;
  const int64_t heads = key_owned ? dims.kv_heads : dims.q_heads;
  launch.groups = {static_cast<uint32_t>(blocks), static_cast<uint32_t>(dims.batch * heads),
                   static_cast<uint32_t>(splits * head_splits)};
  context.emit(std::move(launch));
}

// attention_combine (attention_combine.comp): one invocation per output element; `companion`,
// when given, is the attention_lse it writes as well.
void lower_attention_combine(LoweringContext& context, ValueId companion = kNoValue) {
  const Node& node = context.node();
  const Shape& partials = context.input_type(0).shape;
  const int64_t splits = partials[0];
  const int64_t value_dim = node.type.shape.back();
  const int64_t rows = node.type.elements() / value_dim;
  const bool heads_last = node.attrs.get_int("heads_last", 0) != 0;
  Launch launch;
  launch.label = context.label();
  launch.kernel = "attention_combine";
  launch.files = {kernel_source("attention_combine.comp")};
  launch.defines = {{"SPLITS", glsl_uint(splits)},
                    {"ROWS", glsl_uint(rows)},
                    {"DV", glsl_uint(value_dim)},
                    {"WITH_LSE", companion != kNoValue ? "1" : "0"},
                    {"HEADS_LAST", heads_last ? "1" : "0"}};
  if (heads_last) {
    launch.defines.push_back({"HEADS", glsl_uint(partials[2])});
    launch.defines.push_back({"QUERIES", glsl_uint(partials[3])});
  }
  launch.operands = {{"partials", node.inputs[0], false}, {"out_", context.id(), true}};
  if (companion != kNoValue) launch.operands.push_back({"lse", companion, true});
  launch.groups = grid_for(static_cast<uint64_t>(rows * value_dim), 256, context.device());
  context.emit(std::move(launch));
}

}  // namespace

std::string join_slices_functions(const Graph& graph, ValueId combine) {
  const Node& node = graph.node(combine);
  const Shape& partials = graph.type(node.inputs[0]).shape;
  const int64_t splits = partials[0], width = partials.back(), value_dim = width - 1;
  const int64_t rows = graph.type(node.inputs[0]).elements() / splits / width;
  const std::string dv = glsl_uint(value_dim), w = glsl_uint(width);
  const std::string slice = glsl_uint(rows * width), count = glsl_uint(splits);
  // The partial row of the result's row: with heads_last the result's rows are (b, i, h), the
  // partials' (b, h, i).
  std::string text = "uint joined_row(uint e) {\n  uint row = e / " + dv + ";\n";
  if (node.attrs.get_int("heads_last", 0) != 0) {
    const std::string heads = glsl_uint(partials[2]), queries = glsl_uint(partials[3]);
    text += "  uint head = row % " + heads + ", query = (row / " + heads + ") % " + queries +
            ", entry = row / (" + heads + " * " + queries + ");\n  row = (entry * " + heads +
            " + head) * " + queries + " + query;\n";
  }
  text += "  return row * " + w + ";\n}\n";
  // As attention_combine.comp joins them, in the same order: the largest log-sum-exp first.
  const auto joined = [&](const std::string& type, const std::string& name, const std::string& at) {
    return type + " " + name + "(uint e) {\n  uint base = joined_row(e), d = e % " + dv +
           ";\n  float largest = -1.0 / 0.0;\n  for (uint s = 0u; s < " + count +
           "; ++s) largest = max(largest, a[s * " + slice + " + base + " + dv + "]);\n  " + type +
           " value = " + type + "(0.0);\n  float total = 0.0;\n  for (uint s = 0u; s < " + count +
           "; ++s) {\n    uint at = s * " + slice + " + base;\n    float weight = exp(a[at + " +
           dv + "] - largest);\n    total += weight;\n    value += weight * " + at +
           ";\n  }\n  return value / total;\n}\n";
  };
  text += joined("float", "joined_a", "a[at + d]");
  if (value_dim % 4 == 0)
    return text + joined("vec4", "joined_a4",
                         "vec4(a[at + d], a[at + d + 1u], a[at + d + 2u], a[at + d + 3u])");
  // Four elements may then span two rows.
  return text + "vec4 joined_a4(uint e) {\n  return vec4(joined_a(e), joined_a(e + 1u), " +
         "joined_a(e + 2u), joined_a(e + 3u));\n}\n";
}

namespace {

template <Mode mode>
void lower(LoweringContext& context) {
  lower_attention(context, mode);
}

// The GLSL table of lower_rope's angle parts for `theta` and `dim`: the same for every layer's
// rope, so its floats are printed once a thread instead of once a layer.
const std::string& turn_parts_table(double theta, int64_t dim) {
  thread_local std::map<std::pair<double, int64_t>, std::string> tables;
  std::string& heads = tables[{theta, dim}];
  if (!heads.empty()) return heads;
  const int64_t half = dim / 2;
  // The angle p * f (position p, frequency f) is taken in turns, modulo 1, without a rounded
  // f32 product: with t = f / 2pi and p = 4096 p1 + p0 (p0, p1 < 4096), p * t = p1 * s + p0 * t
  // where s = frac(4096 t). Each of s and t is split into a 12-bit head (k / 4096, so that head
  // times a 12-bit integer is exact in f32, and so is its fractional part) and a small tail, and
  // the four fractional parts add up to the angle with about f32 precision at any position below
  // 2^24. (One f32 product loses 1e-3 radians by position 16k.)
  const auto split = [](double value) {
    const double head = std::floor(value * 4096.0) / 4096.0;
    return std::pair<float, float>{static_cast<float>(head), static_cast<float>(value - head)};
  };
  heads = "const vec4 turn_parts[" + std::to_string(half) + "] = vec4[](";
  for (int64_t d = 0; d < half; ++d) {
    const double frequency =
        std::pow(theta, -2.0 * static_cast<double>(d) / static_cast<double>(dim));
    const double turns = frequency / (2.0 * std::numbers::pi);
    const double wrapped = 4096.0 * turns - std::floor(4096.0 * turns);
    const auto [s_head, s_tail] = split(wrapped);
    const auto [t_head, t_tail] = split(turns);
    heads += std::string(d ? ", " : "") + "vec4(" + glsl_float(s_head) + ", " + glsl_float(s_tail) +
             ", " + glsl_float(t_head) + ", " + glsl_float(t_tail) + ")";
  }
  heads += ");\n";
  return heads;
}

}  // namespace

std::string rope_angle_function(const Node& node, const std::string& name,
                                const std::string& positions) {
  const int64_t dim = node.type.shape.back();
  const int64_t length = node.type.shape[node.type.shape.size() - 2];
  const bool inverse = node.attrs.get_int("inverse", 0) != 0;
  std::string text = turn_parts_table(node.attrs.get_float("theta"), dim);
  text += "vec2 " + name + "(uint row, uint d) {\n";
  const std::string s = "row % " + glsl_uint(length);
  // Sample b's rows are the b-th run of elements / (D B) rows; its positions the b-th row of
  // [B, S].
  const int64_t rows_per_sample = node.type.elements() / (dim * node.type.shape.front());
  const std::string position = positions.empty()
                                   ? "int(" + s + ")"
                                   : positions + "[row / " + glsl_uint(rows_per_sample) + " * " +
                                         glsl_uint(length) + " + " + s + "]";
  text += "  int position = " + std::to_string(node.attrs.get_int("position_offset", 0)) + " + " +
          position + ";\n";
  text += "  uint p = uint(abs(position));\n";
  text += "  float p1 = float(p >> 12), p0 = float(p & 4095u);\n";
  text += "  vec4 parts = turn_parts[d];\n";
  text +=
      "  float turns = fract(p1 * parts.x) + fract(p1 * parts.y) + fract(p0 * parts.z) +\n"
      "                p0 * parts.w;\n";
  text += "  float angle = 6.28318530717958648 * fract(turns) * float(sign(position)) * " +
          std::string(inverse ? "-1.0" : "1.0") + ";\n";
  return text + "  return vec2(cos(angle), sin(angle));\n}\n";
}

namespace {

// One thread per rotated pair; the frequencies are computed in double on the host and baked
// in as parts of a turn, so that the angle is accurate at any position (turn_parts_table),
// whether the position is the row's place or read from the positions input.
void lower_rope(LoweringContext& context) {
  const Node& node = context.node();
  const int64_t dim = node.type.shape.back();
  const int64_t half = dim / 2;
  const int64_t pairs = node.type.elements() / 2;
  const bool has_positions = node.inputs.size() > 1;
  std::string body = rope_angle_function(node, "rope_angle", has_positions ? "positions" : "") +
                     "layout(local_size_x = 256) in;\nvoid main() {\n";
  body += "  uint index = linear_workgroup() * 256u + gl_LocalInvocationID.x;\n";
  body += "  if (index >= " + glsl_uint(pairs) + ") return;\n";
  body += "  uint row = index / " + glsl_uint(half) + ", d = index % " + glsl_uint(half) + ";\n";
  body += "  vec2 rotation = rope_angle(row, d);\n";
  body += "  uint first = row * " + glsl_uint(dim) + " + d, second = first + " + glsl_uint(half) +
          ";\n";
  body += "  float a = x[first], b = x[second];\n";
  body += "  out_[first] = a * rotation.x - b * rotation.y;\n";
  body += "  out_[second] = b * rotation.x + a * rotation.y;\n}\n";

  Launch launch;
  launch.label = context.label();
  launch.kernel = "rope";
  launch.body = std::move(body);
  launch.operands = {{"x", node.inputs[0], false}};
  if (has_positions) launch.operands.push_back({"positions", node.inputs[1], false});
  launch.operands.push_back({"out_", context.id(), true});
  launch.groups = grid_for(static_cast<uint64_t>(pairs), 256, context.device());
  context.emit(std::move(launch));
}

}  // namespace

int64_t attention_head_multiple(const DeviceTraits& device) {
  return use_coop_gemm(device) ? kCoopFragment : 1;
}

bool attention_gradient_scales_itself(const Graph& graph, const Node& node,
                                      const DeviceTraits& device) {
  if (const std::optional<bool> forced = device.switches.attention_own_grad_scale) return *forced;
  const Dims dims = attention_dims(graph, node);
  const int64_t key_blocks = (dims.kv_len + kCoopOwnedRows - 1) / kCoopOwnedRows;
  return key_blocks * dims.batch * dims.q_heads * dims.q_len * dims.value_dim <=
         kMostOwnScaleRereads;
}

bool is_attention_companion_op(std::string_view op) {
  return op == op::attention_lse || op == op::attention_grad_v || op == op::attention_grad_scores;
}

bool can_write_attention_companion(const Graph& graph, ValueId producer, ValueId companion,
                                   const DeviceTraits& device) {
  const Node& c = graph.node(companion);
  const Node& producer_node = graph.node(producer);
  // A forward over key slices hands its log-sum-exp to the combine that follows it.
  const bool combine = producer_node.op == op::attention_combine;
  const Node& p = combine ? graph.node(producer_node.inputs[0]) : producer_node;
  if (companion <= producer ||
      (p.op != op::scaled_dot_product_attention && p.op != op::attention_grad_k) ||
      (p.op == op::scaled_dot_product_attention && p.attrs.has("kv_splits") != combine))
    return false;
  const bool has_mask = p.attrs.get_int("has_mask", 0) != 0;
  const Dims dims = attention_dims(graph, p);
  if ((c.attrs.get_int("has_mask", 0) != 0) != has_mask ||
      c.attrs.get_int("causal", 0) != p.attrs.get_int("causal", 0) ||
      attention_scale(c, dims) != attention_scale(p, dims))
    return false;
  if (p.op == op::scaled_dot_product_attention && c.op == op::attention_lse) {
    return c.inputs[0] == p.inputs[0] && c.inputs[1] == p.inputs[1] &&
           (!has_mask || c.inputs[2] == p.inputs[3]);
  }
  if (p.op != op::attention_grad_k || c.inputs != p.inputs) return false;
  const bool coop = use_coop_attention(Mode::grad_k, dims, device);
  // The strict dK kernel has every weight of W at hand (its query slices cover W's rows).
  if (c.op == op::attention_grad_scores) return !coop;
  if (c.op == op::attention_grad_v &&
      c.attrs.get_int("q_splits", 1) == p.attrs.get_int("q_splits", 1) &&
      c.attrs.get_int("head_splits", 1) == p.attrs.get_int("head_splits", 1) &&
      (!coop || use_coop_attention(Mode::grad_kv, dims, device))) {
    // One pass over the scores for both, on cooperative matrices too: the scores are computed
    // once instead of twice.
    return device.switches.attention_fused_kv.value_or(true);
  }
  return false;
}

std::vector<Launch> lower_attention_with_companions(const Graph& graph, ValueId producer,
                                                    const std::vector<ValueId>& companions,
                                                    const DeviceTraits& device,
                                                    const AttentionForwardFusion* fused) {
  LoweringContext context(graph, producer, device);
  const std::string& op = graph.node(producer).op;
  ValueId companion = kNoValue, scores = kNoValue;
  for (const ValueId value : companions)
    (graph.node(value).op == op::attention_grad_scores ? scores : companion) = value;
  if (op == op::attention_combine)
    lower_attention_combine(context, companion);
  else if (op == op::attention_grad_k)
    lower_attention(context, companion != kNoValue ? Mode::grad_kv : Mode::grad_k, companion,
                    scores);
  else
    lower_attention(context, Mode::forward, companion, kNoValue, fused);
  // Profiles and errors name every node whose value the launch writes.
  for (Launch& launch : context.launches()) {
    for (const ValueId value : companions)
      launch.label += " + " + graph.node(value).op + " %" + std::to_string(value);
    if (fused && fused->heads_last != kNoValue)
      launch.label += " + transpose %" + std::to_string(fused->heads_last);
  }
  return std::move(context.launches());
}

bool writes_heads_last(const Graph& graph, ValueId forward, ValueId transpose) {
  const Node& node = graph.node(forward);
  const Node& moved = graph.node(transpose);
  return node.op == op::scaled_dot_product_attention && node.attrs.get_int("kv_splits", 1) == 1 &&
         moved.op == op::transpose && node.type.shape.size() == 4 &&
         moved.attrs.get_ints("permutation") == std::vector<int64_t>{0, 2, 1, 3} &&
         moved.type.dtype == node.type.dtype;
}

std::vector<Launch> lower_attention_forward(const Graph& graph, ValueId forward,
                                            const AttentionForwardFusion& fusion,
                                            const DeviceTraits& device) {
  LoweringContext context(graph, forward, device);
  lower_attention(context, Mode::forward, kNoValue, kNoValue, &fusion);
  // Profiles and errors name every node the launch computes.
  for (Launch& launch : context.launches()) {
    if (fusion.query_chain != kNoValue)
      launch.label +=
          " + " + graph.node(fusion.query_chain).op + " %" + std::to_string(fusion.query_chain);
    if (fusion.heads_last != kNoValue)
      launch.label += " + transpose %" + std::to_string(fusion.heads_last);
  }
  return std::move(context.launches());
}

std::vector<LoweringEntry> attention_lowerings() {
  return {
      {op::scaled_dot_product_attention, lower<Mode::forward>},
      {op::attention_combine, [](LoweringContext& context) { lower_attention_combine(context); }},
      {op::attention_lse, lower<Mode::lse>},
      {op::attention_grad_q, lower<Mode::grad_q>},
      {op::attention_grad_k, lower<Mode::grad_k>},
      {op::attention_grad_v, lower<Mode::grad_v>},
      {op::attention_grad_scores, lower<Mode::grad_scores>},
      {op::rope, lower_rope}};
}

}  // namespace mg::kernels
