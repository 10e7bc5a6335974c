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

#include <limits>

#include "backends/vulkan/kernels/conv_weight_grad.hpp"
#include "backends/vulkan/kernels/gemm_coopmat.hpp"
#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "ir/op_names.hpp"
#include "ops/conv_geometry.hpp"
#include "ops/k_split.hpp"

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
// (tests). The ResNet stem's data gradient (N = 3 input channels, already split into stride
// phases) is such a product: conv_igemm.comp's tiles would stay mostly empty on it.
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
  const std::string functions =
      plan.k_splits > 1
          ? split_k_functions(plan.functions, plan.problems, plan.k, plan.k_splits, false, false)
          : plan.functions;
  if (use_cpu_kernels(context.device())) {
    emit_cpu_conv_gemm(context, plan, entries, k, functions, std::move(operands));
    return;
  }
  if (gemm_rows_suit(plan, entries, context.device())) {
    Launch launch;
    launch.label = context.label();
    launch.kernel = "gemm_rows";
    launch.body = functions;
    launch.files = {kernel_source("gemm_rows.comp")};
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
  launch.body = functions;
  launch.files = {kernel_source("conv_igemm.comp")};
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

}  // namespace

std::vector<LoweringEntry> conv_lowerings() {
  return {{op::conv2d, lower_conv2d},
          {op::conv2d_grad_input, lower_conv2d_data_grad},
          {op::conv_transpose2d, lower_conv2d_data_grad},
          {op::conv2d_grad_weight, lower_conv2d_weight_grad}};
}

}  // namespace mg::kernels
