// Convolution as implicit GEMM: the forward pass, the data gradient (also conv_transpose2d, which
// is the data gradient of the convolution mapping its output back to its input) and the weight
// gradient are each one GEMM per convolution group whose operands are read straight from the NCHW
// tensors by generated load functions, on gemm.comp (GENERATED_LOADS) or, for skinny products,
// conv_igemm.comp. Which GEMM (and so which kernel and tile shape) a node runs depends only on
// its shapes, baked into the generated code.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>

#include "kernels/gemm_coopmat.hpp"
#include "kernels/gemm_cpu.hpp"
#include "kernels/index_codegen.hpp"
#include "kernels/lowering.hpp"
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
  if (const char* forced = std::getenv("MEGANEURA_CONV_TILES")) {
    const size_t index = static_cast<size_t>(std::atoi(forced));
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

// Grid z covers the convolution groups, times the K slices of a split-K plan.
void emit_gemm(LoweringContext& context, const ConvGeometry& g, const GemmPlan& plan,
               std::vector<Operand> operands) {
  const int64_t entries = g.groups * plan.k_splits;
  const int64_t k = plan.k_splits > 1 ? k_slice_length(plan.k, plan.k_splits) : plan.k;
  const std::string functions =
      plan.k_splits > 1 ? split_k_functions(plan.functions, g.groups, plan.k, plan.k_splits)
                        : plan.functions;
  if (use_cpu_kernels(context.device())) {
    emit_cpu_conv_gemm(context, plan, entries, k, functions, std::move(operands));
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
  if (simt_gemm_suits(gemm) && std::getenv("MEGANEURA_CONV_TILES") == nullptr) {
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
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t out_plane = g.out_height * g.out_width;
  GemmPlan plan;
  plan.m = g.batch * out_plane;
  plan.n = g.outs_per_group();
  plan.k = g.channels_per_group() * taps;
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
      context, g, plan,
      {{"x", node.inputs[0], false}, {"w", node.inputs[1], false}, {"y", context.id(), true}});
}

// conv2d_grad_input(grad_out, w) and conv_transpose2d(x, w): the result (shaped like the
// convolution's input) is a GEMM with M = batch * H * W, N = C / groups, K = O / groups * KH * KW.
// A tap (ih, kh) reads grad_out row (ih + P - kh * D) / S when that divides exactly; with
// stride > 1 most of K is such zero taps, which costs time but keeps one code path.
void lower_conv2d_data_grad(LoweringContext& context) {
  const Node& node = context.node();
  const ConvGeometry g = conv_geometry(node.attrs, node.type.shape, context.input_type(1).shape);
  const int64_t taps = g.kernel_height * g.kernel_width;
  const int64_t plane = g.in_height * g.in_width;
  GemmPlan plan;
  plan.m = g.batch * plane;
  plan.n = g.channels_per_group();
  plan.k = g.outs_per_group() * taps;
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
  f += "  return dy[((b * " + u(g.out_channels) + " + group * " + u(g.outs_per_group()) +
       " + o) * " + u(g.out_height) + " + oh) * " + u(g.out_width) + " + ow];\n}\n";
  f += "float load_b(uint group, uint k, uint n) {\n  return w[((group * " + u(g.outs_per_group()) +
       " + k / " + u(taps) + ") * " + u(g.channels_per_group()) + " + n) * " + u(taps) + " + k % " +
       u(taps) + "];\n}\n";
  f += "void store_c(uint group, uint m, uint n, float value) {\n  dx[(m / " + u(plane) + " * " +
       u(g.in_channels) + " + group * " + u(g.channels_per_group()) + " + n) * " + u(plane) +
       " + m % " + u(plane) + "] = value;\n}\n";
  emit_gemm(
      context, g, plan,
      {{"dy", node.inputs[0], false}, {"w", node.inputs[1], false}, {"dx", context.id(), true}});
}

// conv2d_grad_weight(x, grad_out): M = O / groups, N = C / groups * KH * KW and the long
// K = batch * OH * OW, looped over inside each workgroup, or over one K slice of it for split-K
// partial gradients [S, O, C / groups, KH, KW].
void lower_conv2d_weight_grad(LoweringContext& context) {
  const Node& node = context.node();
  const Shape weight_shape = node.attrs.get_ints("weight_shape");
  const ConvGeometry g = conv_geometry(node.attrs, context.input_type(0).shape, weight_shape);
  const int64_t out_plane = g.out_height * g.out_width;
  GemmPlan plan;
  plan.m = g.outs_per_group();
  plan.n = g.channels_per_group() * g.kernel_height * g.kernel_width;
  plan.k = g.batch * out_plane;
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
      context, g, plan,
      {{"x", node.inputs[0], false}, {"dy", node.inputs[1], false}, {"dw", context.id(), true}});
}

}  // namespace

std::vector<LoweringEntry> conv_lowerings() {
  return {{"conv2d", lower_conv2d},
          {"conv2d_grad_input", lower_conv2d_data_grad},
          {"conv_transpose2d", lower_conv2d_data_grad},
          {"conv2d_grad_weight", lower_conv2d_weight_grad}};
}

}  // namespace mg::kernels
