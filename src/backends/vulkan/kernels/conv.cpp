// Convolution as implicit GEMM: the forward pass, the data gradient (also conv_transpose2d, which
// is the data gradient of the convolution mapping its output back to its input) and the weight
// gradient are each one GEMM per convolution group (and stride phase, for strided data
// gradients) whose operands are read straight from the NCHW tensors by generated load functions,
// on gemm.comp (GENERATED_LOADS), gemm_rows.comp (at most 4 columns) or, for other skinny
// products, conv_igemm.comp; 1x1 convolutions with stride 1 read their operands as plain
// matrices instead (a batched gemm.comp over buffers). Which GEMM (and so which kernel and tile
// shape) a node runs depends only on its shapes, baked into the generated code.
#include <algorithm>
#include <array>

#include <functional>
#include <limits>

#include "backends/vulkan/kernels/conv_weight_grad.hpp"
#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"
#include "ops/winograd.hpp"

namespace mg::kernels {
namespace {

std::string u(int64_t value) {
  return glsl_uint(value);
}
std::string s(int64_t value) {
  return std::to_string(value);
}

struct TileConfig {
  int64_t threads_m, threads_n, work_m, work_n;
  int64_t tile_m() const { return threads_m * work_m; }
  int64_t tile_n() const { return threads_n * work_n; }
};

// Picks the tile shape that minimises padded multiply-adds plus tile loads (loads weigh 4x a
// multiply-add): conv GEMMs are often very skinny (few output channels per group, depthwise
// N = 1, weight gradients with M = O / groups), where a square 64 x 64 tile would be mostly
// padding.
TileConfig choose_tiles(int64_t m, int64_t n, const DeviceTraits& device) {
  static constexpr std::array<TileConfig, 8> kConfigs{{{16, 16, 4, 4},
                                                       {32, 8, 4, 2},
                                                       {8, 32, 2, 4},
                                                       {64, 4, 4, 1},
                                                       {4, 64, 1, 4},
                                                       {256, 1, 1, 1},
                                                       {1, 256, 1, 1},
                                                       {8, 8, 2, 2}}};
  // MEGANEURA_CONV_TILES=<index into kConfigs> forces one tile shape, so tests can cover each.
  if (const std::optional<int64_t> forced = device.switches.conv_tiles) {
    const size_t index = static_cast<size_t>(*forced);
    if (index < kConfigs.size() &&
        kConfigs[index].threads_m * kConfigs[index].threads_n <= device.max_workgroup_invocations) {
      return kConfigs[index];
    }
  }
  TileConfig best = kConfigs.back();
  double best_cost = std::numeric_limits<double>::infinity();
  for (const TileConfig& config : kConfigs) {
    if (config.threads_m * config.threads_n > device.max_workgroup_invocations) continue;
    const int64_t tm = config.tile_m(), tn = config.tile_n();
    const double tiles = static_cast<double>(((m + tm - 1) / tm) * ((n + tn - 1) / tn));
    const double cost = tiles * static_cast<double>(tm * tn + 4 * (tm + tn));
    if (cost < best_cost) {
      best_cost = cost;
      best = config;
    }
  }
  return best;
}

struct GemmPlan {
  int64_t m = 0, n = 0, k = 0;
  // Split-K (ops/k_split.hpp): the launch computes `k_splits` partial results over slices of K,
  // whose store_c receives the flat index over [k_splits, groups]; 1 for the whole product.
  int64_t k_splits = 1;
  // Independent GEMMs of the launch (grid z, the first argument of the load and store
  // functions): the convolution groups, times the stride phases of a strided data gradient.
  int64_t problems = 1;
  bool a_k_fastest = false, b_k_fastest = false, m_fastest = true;
  // CPU devices: run the transposed GEMM (C^T = B^T A^T), so that the rows of gemm_cpu.comp,
  // whose A values are loaded once per LANES steps and broadcast, are the operand with the
  // costly index arithmetic or the fewer distinct values.
  bool cpu_transpose = false;
  std::string functions;  // load_a, load_b, store_c
};

// The plan's GEMM on gemm_cpu.comp (`entries` problems of K `k`, read through `functions`): its
// load/store functions are renamed and wrapped in the (z, m, k) interface of gemm_cpu.comp.
void emit_cpu_conv_gemm(LoweringContext& context, const GemmPlan& plan, int64_t entries, int64_t k,
                        const std::string& functions, std::vector<Operand> operands) {
  CpuGemm gemm;
  gemm.entries = entries;
  gemm.functions = replace_all(replace_all(replace_all(functions, "float load_a(", "float conv_a("),
                                           "float load_b(", "float conv_b("),
                               "void store_c(", "void conv_c(");
  if (plan.cpu_transpose) {
    gemm.m = plan.n;
    gemm.n = plan.m;
    gemm.functions +=
        "float load_a(uint z, uint m, uint k) { return conv_b(z, k, m); }\n"
        "float load_b(uint z, uint k, uint n) { return conv_a(z, n, k); }\n"
        "void store_c(uint z, uint m, uint n, float value) { conv_c(z, n, m, value); }\n";
  } else {
    gemm.m = plan.m;
    gemm.n = plan.n;
    gemm.functions +=
        "float load_a(uint z, uint m, uint k) { return conv_a(z, m, k); }\n"
        "float load_b(uint z, uint k, uint n) { return conv_b(z, k, n); }\n"
        "void store_c(uint z, uint m, uint n, float value) { conv_c(z, m, n, value); }\n";
  }
  gemm.k = k;
  emit_cpu_gemm(context, gemm, std::move(operands));
}

// gemm_rows.comp (one thread per row) for products of at most 4 columns with rows enough to
// fill a large GPU; MEGANEURA_CONV_ROWS=1 forces it for every product of at most 4 columns
// (tests). On the H200 it took the ResNet stem's data gradient (N = 3 input channels, already
// split into stride phases) from 0.85 ms on conv_igemm.comp to 0.39 ms.
constexpr uint32_t kGemmRowsThreads = 128;
constexpr int64_t kGemmRowsMaxColumns = 4, kGemmRowsMinRows = 16384;

bool gemm_rows_suit(const GemmPlan& plan, int64_t entries, const DeviceTraits& device) {
  if (plan.n > kGemmRowsMaxColumns) return false;
  if (const std::optional<bool> forced = device.switches.conv_rows) return *forced;
  return plan.m * entries >= kGemmRowsMinRows;
}

// Grid z covers the plan's problems, times the K slices of a split-K plan.
void emit_gemm(LoweringContext& context, const GemmPlan& plan, std::vector<Operand> operands) {
  const int64_t entries = plan.problems * plan.k_splits;
  const int64_t k = plan.k_splits > 1 ? k_slice_length(plan.k, plan.k_splits) : plan.k;
  const std::string functions = plan.k_splits > 1 ? split_k_functions(plan.functions, plan.problems,
                                                                      plan.k, plan.k_splits, false)
                                                  : plan.functions;
  if (use_cpu_kernels(context.device())) {
    emit_cpu_conv_gemm(context, plan, entries, k, functions, std::move(operands));
    return;
  }
  if (gemm_rows_suit(plan, entries, context.device())) {
    Launch launch;
    launch.label = context.label();
    launch.kernel = "gemm_rows";
    launch.body = functions + std::string(kernel_source("gemm_rows.comp"));
    launch.defines = {{"GEMM_M", u(plan.m)}, {"GEMM_N", u(plan.n)}, {"GEMM_K", u(k)}};
    launch.operands = std::move(operands);
    // Rows over x and y (grid_for), problems over z.
    launch.groups = grid_for(static_cast<uint64_t>(plan.m), kGemmRowsThreads, context.device());
    launch.groups[2] = static_cast<uint32_t>(entries);
    context.emit(std::move(launch));
    return;
  }
  const GeneratedGemm gemm{.m = plan.m,
                           .n = plan.n,
                           .k = k,
                           .entries = entries,
                           .a_m_contiguous = !plan.a_k_fastest,
                           .b_k_contiguous = plan.b_k_fastest,
                           .functions = functions};
  if (use_coop_gemm(context.device())) {
    emit_coop_gemm(context, gemm, std::move(operands));
    return;
  }
  // gemm.comp's square tiles where they suit the product (simt_gemm_suits); skinny products
  // (depthwise, few channels per group) stay on conv_igemm.comp, whose tiles fit their shape, as
  // does every product when MEGANEURA_CONV_TILES forces one of those tiles.
  if (simt_gemm_suits(gemm, context.device()) && !context.device().switches.conv_tiles) {
    emit_simt_gemm(context, gemm, std::move(operands));
    return;
  }
  const TileConfig tiles = choose_tiles(plan.m, plan.n, context.device());
  int64_t tile_k = 16;
  while (tile_k > 1 && 4 * tile_k * (tiles.tile_m() + tiles.tile_n()) >
                           static_cast<int64_t>(context.device().max_shared_memory_bytes)) {
    tile_k /= 2;
  }
  Launch launch;
  launch.label = context.label();
  launch.kernel = "conv";
  launch.body = functions + std::string(kernel_source("conv_igemm.comp"));
  launch.defines = {{"GEMM_M", u(plan.m)},
                    {"GEMM_N", u(plan.n)},
                    {"GEMM_K", u(k)},
                    {"THREADS_M", u(tiles.threads_m)},
                    {"THREADS_N", u(tiles.threads_n)},
                    {"WORK_M", u(tiles.work_m)},
                    {"WORK_N", u(tiles.work_n)},
                    {"TILE_K", u(tile_k)},
                    {"A_K_FASTEST", plan.a_k_fastest ? "1" : "0"},
                    {"B_K_FASTEST", plan.b_k_fastest ? "1" : "0"},
                    {"M_FASTEST", plan.m_fastest ? "1" : "0"}};
  launch.operands = std::move(operands);
  launch.groups = tiled_grid(launch.label, plan.n, tiles.tile_n(), plan.m, tiles.tile_m(), entries,
                             context.device());
  context.emit(std::move(launch));
}

// A 1x1 convolution with stride 1 and no padding multiplies each image's channels, a plain
// [C, H * W] matrix, by the weights: on GPUs' strict path it runs as a batched GEMM over buffers
// (gemm.cpp), vec4 loads and coalesced stores, no generated index arithmetic.
bool runs_as_buffer_gemm(const ConvGeometry& g, const DeviceTraits& device) {
  return g.is_pointwise() && !use_cpu_kernels(device) && !use_coop_gemm(device);
}

// The 1x1 forward (transpose_weights false: y[b, g*O/G + m] = w_g[m, :] x[b, g*C/G + :]) or data
// gradient (true: dx[b, g*C/G + m] = w_g[:, m]^T dy[b, g*O/G + :]), one batch entry per image
// and group. `from` is the channel-side operand (x or dy), `to` the result.
void emit_pointwise_conv_gemm(LoweringContext& context, const ConvGeometry& g,
                              bool transpose_weights, ValueId weights, ValueId from) {
  const int64_t plane = g.in_height * g.in_width;
  const int64_t from_channels = transpose_weights ? g.out_channels : g.in_channels;
  const int64_t to_channels = transpose_weights ? g.in_channels : g.out_channels;
  const int64_t m = transpose_weights ? g.channels_per_group() : g.outs_per_group();
  const int64_t k = transpose_weights ? g.outs_per_group() : g.channels_per_group();
  const std::string group = "(z % " + u(g.groups) + ")", image = "(z / " + u(g.groups) + ")";
  Launch launch;
  launch.label = context.label();
  launch.operands = {{"a", weights, false}, {"b", from, false}, {"c", context.id(), true}};
  launch.body = "uint a_offset(uint z) { return " + group + " * " + u(m * k) + "; }\n" +
                "uint b_offset(uint z) { return (" + image + " * " + u(from_channels) + " + " +
                group + " * " + u(k) + ") * " + u(plane) + "; }\n" +
                "void store_c(uint z, uint m, uint n, float value) {\n  c[(" + image + " * " +
                u(to_channels) + " + " + group + " * " + u(m) + " + m) * " + u(plane) +
                " + n] = value;\n}\n";
  emit_buffer_gemm(context,
                   BufferGemm{.m = m,
                              .n = plane,
                              .k = k,
                              .batches = g.batch * g.groups,
                              .transpose_a = transpose_weights},
                   std::move(launch));
}

// GLSL declaring `b`, `row` and `col` (uint) from a flat index over [batch, rows, cols].
std::string split3(const std::string& flat, const std::string& b, const std::string& row,
                   const std::string& col, int64_t rows, int64_t cols) {
  return "  uint " + col + " = " + flat + " % " + u(cols) + ";\n  uint " + row + " = (" + flat +
         " / " + u(cols) + ") % " + u(rows) + ";\n  uint " + b + " = " + flat + " / " +
         u(rows * cols) + ";\n";
}

// Returns x[b, group * Cg + ci, oh * S - P + kh * D, ow * S - P + kw * D], or 0 for a padding
// tap, where the caller has declared b, ci, kh, kw, oh, ow.
std::string input_tap_glsl(const ConvGeometry& g, const std::string& x) {
  std::string text = "  int ih = int(oh * " + u(g.stride[0]) + " + kh * " + u(g.dilation[0]) +
                     ") - " + s(g.padding[0]) + ";\n";
  text += "  int iw = int(ow * " + u(g.stride[1]) + " + kw * " + u(g.dilation[1]) + ") - " +
          s(g.padding[1]) + ";\n";
  text += "  if (ih < 0 || ih >= " + s(g.in_height) + " || iw < 0 || iw >= " + s(g.in_width) +
          ") return 0.0;\n";
  text += "  return " + x + "[((b * " + u(g.in_channels) + " + group * " +
          u(g.channels_per_group()) + " + ci) * " + u(g.in_height) + " + uint(ih)) * " +
          u(g.in_width) + " + uint(iw)];\n";
  return text;
}

// conv2d(x, w): M = batch * OH * OW, N = O / groups, K = C / groups * KH * KW.
void lower_conv2d(LoweringContext& context) {
  const Node& node = context.node();
  const ConvGeometry g =
      conv_geometry(node.attrs, context.input_type(0).shape, context.input_type(1).shape);
  if (runs_as_buffer_gemm(g, context.device())) {
    emit_pointwise_conv_gemm(context, g, false, node.inputs[1], node.inputs[0]);
    return;
  }
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t out_plane = g.out_height * g.out_width;
  GemmPlan plan;
  plan.m = g.batch * out_plane;
  plan.n = g.outs_per_group();
  plan.k = g.channels_per_group() * taps;
  plan.problems = g.groups;
  plan.b_k_fastest = true;
  plan.cpu_transpose = true;
  plan.functions = "float load_a(uint group, uint m, uint k) {\n" +
                   split3("m", "b", "oh", "ow", g.out_height, g.out_width) +
                   split3("k", "ci", "kh", "kw", g.kernel_height, g.kernel_width) +
                   input_tap_glsl(g, "x") + "}\n";
  plan.functions += "float load_b(uint group, uint k, uint n) {\n  return w[(group * " +
                    u(g.outs_per_group()) + " + n) * " + u(plan.k) + " + k];\n}\n";
  plan.functions += "void store_c(uint group, uint m, uint n, float value) {\n  y[(m / " +
                    u(out_plane) + " * " + u(g.out_channels) + " + group * " +
                    u(g.outs_per_group()) + " + n) * " + u(out_plane) + " + m % " + u(out_plane) +
                    "] = value;\n}\n";
  emit_gemm(
      context, plan,
      {{"x", node.inputs[0], false}, {"w", node.inputs[1], false}, {"y", context.id(), true}});
}

// grad_out[b, group * O/groups + o, oh, ow], where the caller has declared b, oh and ow.
std::string grad_out_element(const ConvGeometry& g, const std::string& group,
                             const std::string& o) {
  return "dy[((b * " + u(g.out_channels) + " + " + group + " * " + u(g.outs_per_group()) + " + " +
         o + ") * " + u(g.out_height) + " + oh) * " + u(g.out_width) + " + ow]";
}

// The data gradient of a strided convolution (dilation 1) as S_h * S_w GEMMs, one per stride
// phase (ih % S_h, iw % S_w): the pixels of one phase receive grad_out only through the taps
// kh = r_h + S_h * jh with r_h = (ph + P_h) % S_h, at row oh = i + (ph + P_h) / S_h - jh for
// pixel row ih = ph + S_h * i, so K shrinks to O / groups * ceil(KH / S_h) * ceil(KW / S_w)
// (49 to 16 taps for ResNet's 7x7/2 stem, 9 to 4 for 3x3/2) and no tap needs a divisibility
// test. Every phase gets the same ceil(H / S_h) x ceil(W / S_w) pixels and taps; the pixels
// past the edge are not stored, the taps past the kernel read a zero weight.
void lower_strided_data_grad(LoweringContext& context, const ConvGeometry& g) {
  const Node& node = context.node();
  const int64_t sh = g.stride[0], sw = g.stride[1];
  const int64_t rows = (g.in_height + sh - 1) / sh, cols = (g.in_width + sw - 1) / sw;
  const int64_t taps_h = (g.kernel_height + sh - 1) / sh, taps_w = (g.kernel_width + sw - 1) / sw;
  GemmPlan plan;
  plan.m = g.batch * rows * cols;
  plan.n = g.channels_per_group();
  plan.k = g.outs_per_group() * taps_h * taps_w;
  plan.problems = g.groups * sh * sw;
  plan.b_k_fastest = true;
  plan.cpu_transpose = true;
  // Declares group, ph, pw (the pixel phase) and the first tap r_h, r_w of problem z.
  const std::string phase = "  uint group = z / " + u(sh * sw) + ", ph = z % " + u(sh * sw) +
                            " / " + u(sw) + ", pw = z % " + u(sw) + ";\n  uint r_h = (ph + " +
                            u(g.padding[0]) + ") % " + u(sh) + ", r_w = (pw + " + u(g.padding[1]) +
                            ") % " + u(sw) + ";\n";
  std::string& f = plan.functions;
  f = "float load_a(uint z, uint m, uint k) {\n" + phase + split3("m", "b", "i", "j", rows, cols) +
      split3("k", "o", "jh", "jw", taps_h, taps_w);
  f += "  int oh_signed = int(i + (ph + " + u(g.padding[0]) + ") / " + u(sh) + ") - int(jh);\n";
  f += "  int ow_signed = int(j + (pw + " + u(g.padding[1]) + ") / " + u(sw) + ") - int(jw);\n";
  f += "  if (oh_signed < 0 || ow_signed < 0) return 0.0;\n";
  f += "  uint oh = uint(oh_signed), ow = uint(ow_signed);\n";
  f += "  if (oh >= " + u(g.out_height) + " || ow >= " + u(g.out_width) + ") return 0.0;\n";
  f += "  return " + grad_out_element(g, "group", "o") + ";\n}\n";
  f += "float load_b(uint z, uint k, uint n) {\n" + phase +
       split3("k", "o", "jh", "jw", taps_h, taps_w) + "  uint kh = r_h + jh * " + u(sh) +
       ", kw = r_w + jw * " + u(sw) + ";\n  if (kh >= " + u(g.kernel_height) +
       " || kw >= " + u(g.kernel_width) + ") return 0.0;\n  return w[((group * " +
       u(g.outs_per_group()) + " + o) * " + u(g.channels_per_group()) + " + n) * " +
       u(g.kernel_height * g.kernel_width) + " + kh * " + u(g.kernel_width) + " + kw];\n}\n";
  f += "void store_c(uint z, uint m, uint n, float value) {\n" + phase +
       split3("m", "b", "i", "j", rows, cols) + "  uint ih = ph + i * " + u(sh) +
       ", iw = pw + j * " + u(sw) + ";\n  if (ih >= " + u(g.in_height) +
       " || iw >= " + u(g.in_width) + ") return;\n  dx[((b * " + u(g.in_channels) + " + group * " +
       u(g.channels_per_group()) + " + n) * " + u(g.in_height) + " + ih) * " + u(g.in_width) +
       " + iw] = value;\n}\n";
  emit_gemm(
      context, plan,
      {{"dy", node.inputs[0], false}, {"w", node.inputs[1], false}, {"dx", context.id(), true}});
}

// conv2d_grad_input(grad_out, w) and conv_transpose2d(x, w): the result (shaped like the
// convolution's input) is a GEMM with M = batch * H * W, N = C / groups, K = O / groups * KH * KW.
// A tap (ih, kh) reads grad_out row (ih + P - kh * D) / S when that divides exactly.
void lower_conv2d_data_grad(LoweringContext& context) {
  const Node& node = context.node();
  const ConvGeometry g = conv_geometry(node.attrs, node.type.shape, context.input_type(1).shape);
  if (runs_as_buffer_gemm(g, context.device())) {
    emit_pointwise_conv_gemm(context, g, true, node.inputs[1], node.inputs[0]);
    return;
  }
  if ((g.stride[0] > 1 || g.stride[1] > 1) && g.dilation[0] == 1 && g.dilation[1] == 1) {
    lower_strided_data_grad(context, g);
    return;
  }
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t plane = g.in_height * g.in_width;
  GemmPlan plan;
  plan.m = g.batch * plane;
  plan.n = g.channels_per_group();
  plan.k = g.outs_per_group() * taps;
  plan.problems = g.groups;
  plan.b_k_fastest = true;
  plan.cpu_transpose = true;
  std::string& f = plan.functions;
  f = "float load_a(uint group, uint m, uint k) {\n" +
      split3("m", "b", "ih", "iw", g.in_height, g.in_width) +
      split3("k", "o", "kh", "kw", g.kernel_height, g.kernel_width);
  f += "  int th = int(ih) + " + s(g.padding[0]) + " - int(kh * " + u(g.dilation[0]) + ");\n";
  f += "  int tw = int(iw) + " + s(g.padding[1]) + " - int(kw * " + u(g.dilation[1]) + ");\n";
  f += "  if (th < 0 || tw < 0) return 0.0;\n";
  if (g.stride[0] > 1 || g.stride[1] > 1) {
    f += "  if (uint(th) % " + u(g.stride[0]) + " != 0u || uint(tw) % " + u(g.stride[1]) +
         " != 0u) return 0.0;\n";
  }
  f += "  uint oh = uint(th) / " + u(g.stride[0]) + ", ow = uint(tw) / " + u(g.stride[1]) + ";\n";
  f += "  if (oh >= " + u(g.out_height) + " || ow >= " + u(g.out_width) + ") return 0.0;\n";
  f += "  return " + grad_out_element(g, "group", "o") + ";\n}\n";
  f += "float load_b(uint group, uint k, uint n) {\n  return w[((group * " + u(g.outs_per_group()) +
       " + k / " + u(taps) + ") * " + u(g.channels_per_group()) + " + n) * " + u(taps) + " + k % " +
       u(taps) + "];\n}\n";
  f += "void store_c(uint group, uint m, uint n, float value) {\n  dx[(m / " + u(plane) + " * " +
       u(g.in_channels) + " + group * " + u(g.channels_per_group()) + " + n) * " + u(plane) +
       " + m % " + u(plane) + "] = value;\n}\n";
  emit_gemm(
      context, plan,
      {{"dy", node.inputs[0], false}, {"w", node.inputs[1], false}, {"dx", context.id(), true}});
}

// conv2d_grad_weight(x, grad_out): M = O / groups, N = C / groups * KH * KW and the long
// K = batch * OH * OW, looped over inside each workgroup, or over one K slice of it for split-K
// partial gradients [S, O, C / groups, KH, KW]; or the direct kernel where it suits
// (conv_weight_grad.hpp), whose splits divide the same K into chunks of output rows.
void lower_conv2d_weight_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape weight_shape = node.attrs.get_ints("weight_shape");
  const ConvGeometry g = conv_geometry(node.attrs, context.input_type(0).shape, weight_shape);
  if (direct_weight_gradient_suits(g, context.device())) {
    emit_direct_weight_gradient(context, g, node.attrs.get_int("k_splits", 1));
    return;
  }
  const int64_t out_plane = g.out_height * g.out_width;
  GemmPlan plan;
  plan.m = g.outs_per_group();
  plan.n = g.channels_per_group() * g.kernel_height * g.kernel_width;
  plan.k = g.batch * out_plane;
  plan.problems = g.groups;
  plan.k_splits = node.attrs.get_int("k_splits", 1);
  plan.a_k_fastest = true;
  plan.b_k_fastest = true;
  plan.m_fastest = false;
  plan.functions = "float load_a(uint group, uint m, uint k) {\n  return dy[(k / " + u(out_plane) +
                   " * " + u(g.out_channels) + " + group * " + u(g.outs_per_group()) + " + m) * " +
                   u(out_plane) + " + k % " + u(out_plane) + "];\n}\n";
  plan.functions += "float load_b(uint group, uint k, uint n) {\n" +
                    split3("k", "b", "oh", "ow", g.out_height, g.out_width) +
                    split3("n", "ci", "kh", "kw", g.kernel_height, g.kernel_width) +
                    input_tap_glsl(g, "x") + "}\n";
  plan.functions += "void store_c(uint group, uint m, uint n, float value) {\n  dw[(group * " +
                    u(g.outs_per_group()) + " + m) * " + u(plan.n) + " + n] = value;\n}\n";
  emit_gemm(
      context, plan,
      {{"x", node.inputs[0], false}, {"dy", node.inputs[1], false}, {"dw", context.id(), true}});
}

// im2col(x): the columns [N, C * KH * KW, OH * OW] (or side by side), `width` (4 where OW
// allows and the images are apart, else 1) consecutive output columns of one row per invocation,
// so that the tap's index arithmetic is done once per vec4 store; consecutive invocations take
// consecutive columns, so reads along a row of x and all writes are coalesced.
constexpr uint32_t kColumnsLocalSize = 256;

std::string columns_main(int64_t count) {
  return "layout(local_size_x = " + std::to_string(kColumnsLocalSize) +
         ") in;\nvoid main() {\n  uint i = linear_workgroup() * " + u(kColumnsLocalSize) +
         " + gl_LocalInvocationID.x;\n  if (i >= " + u(count) + ") return;\n";
}

// Emits `kernel` (`body`, `count` invocations) reading the node's input as names[0] and writing
// its result as names[1].
void emit_columns_launch(LoweringContext& context, const std::string& kernel, std::string body,
                         const std::array<std::string, 2>& names, int64_t count) {
  Launch launch;
  launch.label = context.label();
  launch.kernel = kernel;
  launch.body = std::move(body);
  launch.operands = {{names[0], context.node().inputs[0], false}, {names[1], context.id(), true}};
  launch.groups = grid_for(static_cast<uint64_t>(count), kColumnsLocalSize, context.device());
  context.emit(std::move(launch));
}

void lower_im2col(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& x = context.input_type(0).shape;
  const auto [kernel, stride, padding, dilation, size] = column_geometry(node.attrs);
  // Side by side, an invocation's four columns could belong to two images: one column each.
  const bool side_by_side = images_side_by_side(node.attrs);
  const int64_t width = size[1] % 4 == 0 && !side_by_side ? 4 : 1;
  const int64_t count = node.type.elements() / width;
  // Packed columns (packed_columns): four elements as two words of f16 pairs, element e in half
  // e % 2 of word e / 2.
  const bool packed = packed_columns(context.graph(), context.id(), context.device());
  std::string body;
  if (packed) {
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_columns_halves { uvec2 "
        "columns_halves[]; };\n";
  } else if (width == 4) {
    body +=
        "layout(std430, set = 0, binding = 1) writeonly buffer buffer_columns4 { vec4 "
        "columns4[]; };\n";
  }
  body += columns_main(count);
  const int64_t row_units = size[1] / width;
  body += "  uint ox = i % " + u(row_units) + " * " + u(width) + ", oy = i / " + u(row_units) +
          " % " + u(size[0]) + ";\n";
  // tap: the column row (c * KH + kh) * KW + kw, plane: the image's channel n * C + c.
  const int64_t taps = kernel[0] * kernel[1];
  if (side_by_side) {
    const int64_t columns_per_row = x[0] * size[0] * size[1];
    body += "  uint tap = i / " + u(columns_per_row) + ", image = i % " + u(columns_per_row) +
            " / " + u(size[0] * size[1]) + ";\n  uint plane = image * " + u(x[1]) + " + tap / " +
            u(taps) + ";\n";
  } else {
    body +=
        "  uint tap = i / " + u(row_units * size[0]) + ";\n  uint plane = tap / " + u(taps) + ";\n";
  }
  body += "  uint kw = tap % " + u(kernel[1]) + ", kh = tap / " + u(kernel[1]) + " % " +
          u(kernel[0]) + ";\n";
  body += "  int iy = int(oy) * " + s(stride[0]) + " + int(kh) * " + s(dilation[0]) + " - " +
          s(padding[0]) + ";\n  int ix0 = int(ox) * " + s(stride[1]) + " + int(kw) * " +
          s(dilation[1]) + " - " + s(padding[1]) + ";\n";
  body += "  bool row_inside = iy >= 0 && iy < " + s(x[2]) + ";\n  uint row = (plane * " + u(x[2]) +
          " + uint(iy)) * " + u(x[3]) + ";\n";
  body += "  float values[" + std::to_string(width) + "];\n  for (int j = 0; j < " +
          std::to_string(width) + "; ++j) {\n    int ix = ix0 + j * " + s(stride[1]) +
          ";\n    values[j] = row_inside && ix >= 0 && ix < " + s(x[3]) +
          " ? x[row + uint(ix)] : 0.0;\n  }\n";
  if (packed) {
    body +=
        "  columns_halves[i] = uvec2(packHalf2x16(vec2(values[0], values[1])), "
        "packHalf2x16(vec2(values[2], values[3])));\n}\n";
  } else {
    body += width == 4 ? "  columns4[i] = vec4(values[0], values[1], values[2], values[3]);\n}\n"
                       : "  columns[i] = values[0];\n}\n";
  }
  emit_columns_launch(context, "im2col", std::move(body), {"x", "columns"}, count);
}

// col2im(columns): one invocation per image element, summing the column elements of the taps
// that reach it: for kernel row kh, the output row oy with oy * S - P + kh * D = y exists when
// y + P - kh * D is a non-negative multiple of S below OH * S (likewise for columns). The loops
// run over constant extents, so the compiler unrolls them and folds the stride tests.
void lower_col2im(LoweringContext& context) {
  const Node& node = context.node();
  const Shape& image = node.type.shape;
  const auto [kernel, stride, padding, dilation, size] = column_geometry(node.attrs);
  const int64_t count = node.type.elements();
  std::string body = columns_main(count);
  body += "  uint x = i % " + u(image[3]) + ", y = i / " + u(image[3]) + " % " + u(image[2]) +
          ";\n  uint plane = i / " + u(image[2] * image[3]) + ";\n  float sum = 0.0;\n";
  const auto axis = [&](const std::string& name, const std::string& at, int64_t dim) {
    const std::string shifted = "t" + name;
    std::string text = "int " + shifted + " = int(" + at + ") + " + s(padding[dim]) + " - k" +
                       name + " * " + s(dilation[dim]) + ";\n";
    text += "if (" + shifted + " < 0" +
            (stride[dim] > 1 ? " || " + shifted + " % " + s(stride[dim]) + " != 0" : "") +
            ") continue;\n";
    text += "uint o" + name + " = uint(" + shifted + ") / " + u(stride[dim]) + ";\nif (o" + name +
            " >= " + u(size[dim]) + ") continue;\n";
    return text;
  };
  body += "  for (int ky = 0; ky < " + s(kernel[0]) + "; ++ky) {\n" + axis("y", "y", 0) +
          "  for (int kx = 0; kx < " + s(kernel[1]) + "; ++kx) {\n" + axis("x", "x", 1) +
          "  sum += columns[((plane * " + u(kernel[0]) + " + uint(ky)) * " + u(kernel[1]) +
          " + uint(kx)) * " + u(size[0] * size[1]) + " + oy * " + u(size[1]) + " + ox];\n" +
          "  }\n  }\n  image[i] = sum;\n}\n";
  emit_columns_launch(context, "col2im", std::move(body), {"columns", "image"}, count);
}

// The GLSL name `prefix`<i>_<j> of point (i, j) of a tile (as a function of (i, j): `named`).
std::string point_name(const std::string& prefix, size_t i, size_t j) {
  return prefix + std::to_string(i) + "_" + std::to_string(j);
}

std::function<std::string(size_t, size_t)> named(std::string prefix) {
  return [prefix = std::move(prefix)](size_t i, size_t j) { return point_name(prefix, i, j); };
}

// `names` combined with the coefficients of row `row` of `matrix` (zeros left out), as a GLSL
// expression.
std::string combination(const winograd::Matrix& matrix, int64_t row,
                        const std::vector<std::string>& names) {
  std::string text;
  for (int64_t k = 0; k < matrix.columns; ++k) {
    const double coefficient = matrix.at(row, k);
    if (coefficient == 0.0) continue;
    const double magnitude = coefficient < 0.0 ? -coefficient : coefficient;
    text += coefficient < 0.0 ? " - " : (text.empty() ? "" : " + ");
    text += (magnitude == 1.0 ? "" : glsl_float(magnitude) + " * ") + names[k];
  }
  return text.empty() ? "0.0" : text;
}

// The two-sided transform of one tile, T M T^T with T `transform` (rows x extent) and M the
// extent x extent GLSL values named `value(a, b)`: declares e<i>_<j> for each of its rows x rows
// points.
std::string tile_transform_glsl(const winograd::Matrix& transform,
                                const std::function<std::string(size_t, size_t)>& value) {
  const size_t rows = static_cast<size_t>(transform.rows);
  const size_t extent = static_cast<size_t>(transform.columns);
  std::string text;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t b = 0; b < extent; ++b) {
      std::vector<std::string> column(extent);
      for (size_t a = 0; a < extent; ++a) column[a] = value(a, b);
      text += "  float " + point_name("h", i, b) + " = " +
              combination(transform, static_cast<int64_t>(i), column) + ";\n";
    }
  }
  for (size_t i = 0; i < rows; ++i) {
    std::vector<std::string> row(extent);
    for (size_t b = 0; b < extent; ++b) row[b] = point_name("h", i, b);
    for (size_t j = 0; j < rows; ++j)
      text += "  float " + point_name("e", i, j) + " = " +
              combination(transform, static_cast<int64_t>(j), row) + ";\n";
  }
  return text;
}

// The name of flat point `point` (i * side + j) of a transformed side x side tile.
std::string tile_point(const std::string& prefix, int64_t point, int64_t side) {
  return point_name(prefix, static_cast<size_t>(point / side), static_cast<size_t>(point % side));
}

// Invocation i's plane p and tile t, with the tile's (ty, tx) and image n, for `tile_count`
// tiles of a grid `tiles` (TH, TW) an image, consecutive invocations on consecutive tiles.
std::string tile_coordinates_glsl(int64_t tile_count, const std::array<int64_t, 2>& tiles) {
  return "  uint t = i % " + u(tile_count) + ", p = i / " + u(tile_count) + ";\n  uint tx = t % " +
         u(tiles[1]) + ", ty = t / " + u(tiles[1]) + " % " + u(tiles[0]) + ", n = t / " +
         u(tiles[0] * tiles[1]) + ";\n";
}

// The body of a winograd_tiles or winograd_grad_tiles node for invocation i (below its
// elements / its points) of a launch that reads its input as `source` and writes its result as
// `target`: one invocation per (plane p, tile t), consecutive invocations on consecutive tiles,
// so that the patches' reads along a row of the input and every point's store are coalesced; it
// reads the patch ((m + 2) x (m + 2) of the input, m x m of grad_out) once and writes its
// (m + 2)^2 transformed points, each [P, T] apart.
std::string winograd_tiles_glsl(const Graph& graph, ValueId id, const std::string& source,
                                const std::string& target) {
  const Node& node = graph.node(id);
  const Shape& v = graph.type(node.inputs[0]).shape;
  const auto tiles = attr_pair(node.attrs, "tiles", 1);
  const auto padding = attr_pair(node.attrs, "padding", 0);
  const bool grad_out = node.op == op::winograd_grad_tiles;
  const winograd::Variant& f = winograd::variant_of(node.attrs);
  const winograd::Matrix& transform = grad_out ? f.grad : f.input;
  const int64_t tile_count = node.type.shape[2];
  const int64_t count = node.type.shape[1] * tile_count;
  std::string body = tile_coordinates_glsl(tile_count, tiles) + "  int y0 = int(ty) * " +
                     s(f.outputs) + " - " + s(padding[0]) + ", x0 = int(tx) * " + s(f.outputs) +
                     " - " + s(padding[1]) + ";\n  uint plane = (n * " + u(v[1]) + " + p) * " +
                     u(v[2] * v[3]) + ";\n";
  const int64_t extent = transform.columns;
  for (int64_t a = 0; a < extent; ++a) {
    for (int64_t b = 0; b < extent; ++b) {
      const std::string y = "y0 + " + s(a), x = "x0 + " + s(b);
      body += "  float " + point_name("d", a, b) + " = " + y + " >= 0 && " + y + " < " + s(v[2]) +
              " && " + x + " >= 0 && " + x + " < " + s(v[3]) + " ? " + source + "[plane + uint((" +
              y + ") * " + s(v[3]) + " + " + x + ")] : 0.0;\n";
    }
  }
  body += tile_transform_glsl(transform, named("d"));
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  " + target + "[i + " + u(point * count) + "] = " + tile_point("e", point, f.tile()) +
            ";\n";
  return body;
}

int64_t winograd_tiles_invocations(const Graph& graph, ValueId id) {
  const Shape& tiles = graph.type(id).shape;
  return tiles[1] * tiles[2];
}

void lower_winograd_tiles(LoweringContext& context) {
  const int64_t count = winograd_tiles_invocations(context.graph(), context.id());
  std::string body = columns_main(count) +
                     winograd_tiles_glsl(context.graph(), context.id(), "source", "tiles") + "}\n";
  emit_columns_launch(context, context.node().op, std::move(body), {"source", "tiles"}, count);
}

// winograd_weight_grad(m): one invocation per (o, c), consecutive invocations on consecutive c:
// the (m + 2)^2 points (summed over the partial products first, if any) through G^T M G. A
// workgroup's 9 taps a pair go through shared memory (an odd stride: no bank conflicts), so
// that its stores are one contiguous run instead of 9 runs strided by 9 floats, which took
// 8.1 us for ResNet's 256-channel layer on the H200.
void lower_winograd_weight_grad(LoweringContext& context) {
  const Shape& m = context.input_type(0).shape;
  const int64_t pairs = m[m.size() - 2] * m[m.size() - 1];
  const int64_t slices = m.size() == 4 ? m[0] : 1;
  const winograd::Variant& f = winograd::variant_of(context.node().attrs);
  constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel;
  std::string body = "layout(local_size_x = " + std::to_string(kColumnsLocalSize) +
                     ") in;\nshared float staged[" + s(kColumnsLocalSize * kTaps) +
                     "];\nvoid main() {\n  uint local = gl_LocalInvocationID.x;\n  uint first = "
                     "linear_workgroup() * " +
                     u(kColumnsLocalSize) + ";\n  uint i = first + local;\n  if (i < " + u(pairs) +
                     ") {\n";
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  float " + tile_point("m", point, f.tile()) + " = 0.0;\n";
  body += "  for (uint s = 0u; s < " + u(slices) + "; ++s) {\n    uint at = s * " +
          u(f.points() * pairs) + " + i;\n";
  for (int64_t point = 0; point < f.points(); ++point)
    body += "    " + tile_point("m", point, f.tile()) + " += products[at + " + u(point * pairs) +
            "];\n";
  body += "  }\n";
  body += tile_transform_glsl(f.filter.transpose(), named("m"));
  for (int64_t tap = 0; tap < kTaps; ++tap) {
    body += "  staged[local * " + u(kTaps) + " + " + u(tap) +
            "] = " + point_name("e", tap / winograd::kKernel, tap % winograd::kKernel) + ";\n";
  }
  body += "  }\n  barrier();\n  for (uint k = 0u; k < " + u(kTaps) +
          "; ++k) {\n    uint at = k * " + u(kColumnsLocalSize) + " + local;\n    if (first * " +
          u(kTaps) + " + at < " + u(pairs * kTaps) + ") grad_weight[first * " + u(kTaps) +
          " + at] = staged[at];\n  }\n}\n";
  emit_columns_launch(context, "winograd_weight_grad", std::move(body), {"products", "grad_weight"},
                      pairs);
}

// winograd_filter(w): one invocation per pair of the result's [A, B] (o and c, or c and o when
// transposed), consecutive invocations on consecutive b: its 9 taps (turned by 180 degrees when
// transposed) through G g G^T, the 16 points each [A, B] apart.
void lower_winograd_filter(LoweringContext& context) {
  const Shape& w = context.input_type(0).shape;
  const bool transposed = context.node().attrs.get_int("transposed", 0) == 1;
  const int64_t second = context.node().type.shape[2];
  const int64_t pairs = w[0] * w[1];
  constexpr int64_t kTaps = winograd::kKernel * winograd::kKernel, kLast = winograd::kKernel - 1;
  std::string body = columns_main(pairs) + "  uint a = i / " + u(second) + ", b = i % " +
                     u(second) + ";\n  uint base = (" + (transposed ? "b" : "a") + " * " + u(w[1]) +
                     " + " + (transposed ? "a" : "b") + ") * " + u(kTaps) + ";\n";
  for (int64_t r = 0; r < winograd::kKernel; ++r) {
    for (int64_t q = 0; q < winograd::kKernel; ++q) {
      const int64_t tap =
          transposed ? (kLast - r) * winograd::kKernel + kLast - q : r * winograd::kKernel + q;
      body += "  float " + point_name("g", r, q) + " = weights[base + " + u(tap) + "];\n";
    }
  }
  constexpr const winograd::Variant& f = winograd::kF2;
  body += tile_transform_glsl(f.filter, named("g"));
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  points[i + " + u(point * pairs) + "] = " + tile_point("e", point, f.tile()) + ";\n";
  emit_columns_launch(context, "winograd_filter", body + "}\n", {"weights", "points"}, pairs);
}

// winograd_output(m): one invocation per (plane p, tile t), consecutive invocations on
// consecutive tiles (coalesced reads of every point): A^T M A, and the 2 x 2 outputs that lie
// inside the image.
void lower_winograd_output(LoweringContext& context) {
  const Shape& y = context.node().type.shape;
  const auto tiles = attr_pair(context.node().attrs, "tiles", 1);
  const int64_t tile_count = context.input_type(0).shape[2];
  const int64_t count = y[1] * tile_count;
  std::string body = columns_main(count) + tile_coordinates_glsl(tile_count, tiles);
  constexpr const winograd::Variant& f = winograd::kF2;
  for (int64_t point = 0; point < f.points(); ++point)
    body += "  float " + tile_point("m", point, f.tile()) + " = products[i + " + u(point * count) +
            "];\n";
  body += tile_transform_glsl(f.grad.transpose(), named("m"));
  body += "  uint y0 = ty * " + u(f.outputs) + ", x0 = tx * " + u(f.outputs) +
          ";\n  uint plane = (n * " + u(y[1]) + " + p) * " + u(y[2] * y[3]) + ";\n";
  for (int64_t r = 0; r < f.outputs; ++r) {
    for (int64_t q = 0; q < f.outputs; ++q) {
      body += "  if (y0 + " + u(r) + " < " + u(y[2]) + " && x0 + " + u(q) + " < " + u(y[3]) +
              ") image[plane + (y0 + " + u(r) + ") * " + u(y[3]) + " + x0 + " + u(q) +
              "] = " + point_name("e", r, q) + ";\n";
    }
  }
  emit_columns_launch(context, "winograd_output", body + "}\n", {"products", "image"}, count);
}

}  // namespace

bool can_pair_winograd_tiles(const Graph& graph, ValueId producer, ValueId companion) {
  const Node& p = graph.node(producer);
  const Node& c = graph.node(companion);
  // Every reader of the companion follows it and so the producer's launch, and so must the
  // value it reads.
  if (p.op != op::winograd_tiles || c.op != op::winograd_grad_tiles || companion <= producer ||
      c.inputs[0] >= producer)
    return false;
  // The two operands of one weight gradient's product, so that neither lives longer than it
  // would in a launch of its own.
  for (size_t i = companion + 1; i < graph.size(); ++i) {
    const Node& reader = graph.nodes()[i];
    if (reader.op == op::matmul && reader.inputs == std::vector<ValueId>{companion, producer})
      return true;
  }
  return false;
}

std::vector<Launch> lower_winograd_tiles_pair(const Graph& graph, ValueId producer,
                                              ValueId companion, const DeviceTraits& device) {
  LoweringContext context(graph, producer, device);
  const int64_t first = winograd_tiles_invocations(graph, producer);
  const int64_t count = first + winograd_tiles_invocations(graph, companion);
  Launch launch;
  launch.label = context.label() + " + winograd_grad_tiles %" + std::to_string(companion);
  launch.kernel = "winograd_tiles";
  launch.body = columns_main(count) + "  if (i < " + u(first) + ") {\n" +
                winograd_tiles_glsl(graph, producer, "source", "tiles") +
                "  } else {\n  i -= " + u(first) + ";\n" +
                winograd_tiles_glsl(graph, companion, "grad", "grad_tiles") + "  }\n}\n";
  launch.operands = {{"source", graph.node(producer).inputs[0], false},
                     {"grad", graph.node(companion).inputs[0], false},
                     {"tiles", producer, true},
                     {"grad_tiles", companion, true}};
  launch.groups = grid_for(static_cast<uint64_t>(count), kColumnsLocalSize, device);
  context.emit(std::move(launch));
  return std::move(context.launches());
}

std::vector<LoweringEntry> conv_lowerings() {
  return {{op::conv2d, lower_conv2d},
          {op::conv2d_grad_input, lower_conv2d_data_grad},
          {op::conv_transpose2d, lower_conv2d_data_grad},
          {op::conv2d_grad_weight, lower_conv2d_weight_grad},
          {op::im2col, lower_im2col},
          {op::col2im, lower_col2im},
          {op::winograd_tiles, lower_winograd_tiles},
          {op::winograd_grad_tiles, lower_winograd_tiles},
          {op::winograd_weight_grad, lower_winograd_weight_grad},
          {op::winograd_filter, lower_winograd_filter},
          {op::winograd_output, lower_winograd_output}};
}

}  // namespace mg::kernels
