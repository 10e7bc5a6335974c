// The CPU-device GEMM (gemm_cpu.comp): on CPU implementations such as Lavapipe a subgroup's
// lanes share the rows of a register block through shuffles, with no barriers, instead of tiles
// in shared memory. Also the split-K form of the generated load functions that every GEMM
// reading through them shares.
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <thread>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

// The generated part of gemm_cpu.comp: one statement per row and 4-column part of the register
// block; part p of row i is acc_<i>_<p>, a vector over the lane's columns 4p .. 4p + 3.
std::string cpu_gemm_macros(int64_t rows, int64_t cols, int64_t lanes, bool padded) {
  const int64_t parts = (cols + 3) / 4;
  const auto width = [&](int64_t p) { return std::min<int64_t>(4, cols - 4 * p); };
  const auto vec = [&](int64_t p) {
    return width(p) == 1 ? std::string("float") : "vec" + std::to_string(width(p));
  };
  const auto acc = [](int64_t i, int64_t p) {
    return "acc_" + std::to_string(i) + "_" + std::to_string(p);
  };
  static constexpr std::array<const char*, 4> kSwizzle{"x", "y", "z", "w"};
  const auto component = [&](int64_t i, int64_t j) {
    const int64_t p = j / 4;
    return width(p) == 1 ? acc(i, p) : acc(i, p) + "." + kSwizzle[static_cast<size_t>(j % 4)];
  };
  const std::string nl = " \\\n";
  std::string text = "#define DECLARE_ACCUMULATORS" + nl;
  for (int64_t j = 0; j < cols; ++j) {
    const std::string c = std::to_string(j);
    text += "  uint col_" + c + " = min(col0 + " + glsl_uint(j * lanes) + ", GEMM_N - 1u);" + nl;
  }
  for (int64_t i = 0; i < rows; ++i) {
    text += "  uint row_" + std::to_string(i) + " = min(row0 + " + glsl_uint(i) + ", GEMM_M - 1u);";
    for (int64_t p = 0; p < parts; ++p)
      text += " " + vec(p) + " " + acc(i, p) + " = " + vec(p) + "(0.0);";
    text += nl;
  }
  text += "\n#define LOAD_CHUNK(k_lane)" + nl;
  for (int64_t i = 0; i < rows; ++i) {
    const std::string r = std::to_string(i);
    text += "  float chunk_" + r + " = load_a(z, row_" + r + ", min(k_lane, GEMM_K - 1u));" + nl;
    if (padded) text += "  chunk_" + r + " = k_lane < GEMM_K ? chunk_" + r + " : 0.0;" + nl;
  }
  text += "\n#define STEP(KK) {" + nl +
          (padded ? "  uint k = min(k0 + KK, GEMM_K - 1u);" : "  uint k = k0 + KK;") + nl;
  for (int64_t p = 0; p < parts; ++p) {
    text += "  " + vec(p) + " b_" + std::to_string(p) + " = " + vec(p) + "(";
    for (int64_t j = 4 * p; j < 4 * p + width(p); ++j)
      text += std::string(j > 4 * p ? ", " : "") + "load_b(z, k, col_" + std::to_string(j) + ")";
    text += ");" + nl;
  }
  for (int64_t i = 0; i < rows; ++i) {
    const std::string r = std::to_string(i);
    text += "  { float a_value = subgroupShuffle(chunk_" + r + ", KK);";
    for (int64_t p = 0; p < parts; ++p)
      text += " " + acc(i, p) + " += a_value * b_" + std::to_string(p) + ";";
    text += " }" + nl;
  }
  text += "}\n#define STORE_ACCUMULATORS" + nl;
  for (int64_t i = 0; i < rows; ++i) {
    text += "  if (row0 + " + glsl_uint(i) + " < GEMM_M) {" + nl;
    for (int64_t j = 0; j < cols; ++j) {
      text += "    if (col0 + " + glsl_uint(j * lanes) + " < GEMM_N) store_c(z, row_" +
              std::to_string(i) + ", col_" + std::to_string(j) + ", " + component(i, j) + ");" + nl;
    }
    text += "  }" + nl;
  }
  return text + "\n";
}

}  // namespace

bool use_cpu_kernels(const DeviceTraits& device) {
  if (!device.cpu) return false;
  if (device.subgroup_size != 4 && device.subgroup_size != 8 && device.subgroup_size != 16)
    return false;
  if (device.max_workgroup_invocations < device.subgroup_size) return false;
  return !device.switches.no_cpu_kernels;
}

void emit_cpu_gemm(LoweringContext& context, const CpuGemm& gemm, std::vector<Operand> operands) {
  const DeviceTraits& device = context.device();
  const int64_t lanes = device.subgroup_size;
  // Register blocks (rows x columns per lane). Cost model, in vector multiply-adds per k step of
  // a workgroup, fitted to llvmpipe timings of the classifier's GEMMs: ROWS * COLS
  // multiply-adds (padding included), kLoad per buffer load (COLS of B, ROWS / LANES of A; each
  // is a loop over the lanes) and kShuffle per broadcast A value. Workgroups run kThreads at a
  // time (Lavapipe has one thread per CPU), so the time is the per-workgroup cost times the
  // number of waves; small problems thus trade block efficiency for parallelism.
  static constexpr std::array<std::array<int64_t, 2>, 14> kBlocks{{{32, 8},
                                                                   {32, 4},
                                                                   {16, 8},
                                                                   {16, 4},
                                                                   {8, 8},
                                                                   {8, 4},
                                                                   {16, 2},
                                                                   {8, 2},
                                                                   {4, 8},
                                                                   {4, 4},
                                                                   {4, 2},
                                                                   {2, 4},
                                                                   {1, 8},
                                                                   {1, 2}}};
  constexpr double kLoad = 29.0, kShuffle = 1.4;
  const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::array<int64_t, 2> best = kBlocks[0];
  double best_cost = std::numeric_limits<double>::infinity();
  for (const auto& block : kBlocks) {
    const int64_t rows = block[0], cols = block[1];
    const int64_t groups = ((gemm.m + rows - 1) / rows) *
                           ((gemm.n + lanes * cols - 1) / (lanes * cols)) * gemm.entries;
    const double per_group = static_cast<double>(rows * cols) +
                             kLoad * (static_cast<double>(cols) +
                                      static_cast<double>(rows) / static_cast<double>(lanes)) +
                             kShuffle * static_cast<double>(rows);
    const double cost = per_group * static_cast<double>((groups + threads - 1) / threads);
    if (cost < best_cost) {
      best_cost = cost;
      best = block;
    }
  }
  // MEGANEURA_CPU_GEMM_BLOCK=ROWSxCOLS forces a block shape (tuning and tests).
  if (const std::optional<std::array<int64_t, 2>> forced = context.device().switches.cpu_gemm_block)
    best = *forced;
  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm_cpu";
  launch.body = gemm.functions + cpu_gemm_macros(best[0], best[1], lanes, gemm.k % lanes != 0);
  launch.files = {kernel_source("gemm_cpu.comp")};
  launch.defines = {{"LANES", std::to_string(lanes)}, {"ROWS", glsl_uint(best[0])},
                    {"COLS", glsl_uint(best[1])},     {"GEMM_M", glsl_uint(gemm.m)},
                    {"GEMM_N", glsl_uint(gemm.n)},    {"GEMM_K", glsl_uint(gemm.k)}};
  launch.operands = std::move(operands);
  launch.groups =
      tiled_grid(launch.label, gemm.n, lanes * best[1], gemm.m, best[0], gemm.entries, device);
  context.emit(std::move(launch));
}

std::string split_k_functions(const std::string& functions, int64_t entries, int64_t k,
                              int64_t splits, bool vector_a, bool vector_b, bool half_a_units,
                              bool half_b_units) {
  std::string whole = replace_all(replace_all(functions, "float load_a(", "float whole_a("),
                                  "float load_b(", "float whole_b(");
  if (vector_a) whole = replace_all(whole, "vec4 load_a4(", "vec4 whole_a4(");
  if (vector_b) whole = replace_all(whole, "vec4 load_b4(", "vec4 whole_b4(");
  if (half_a_units) whole = replace_all(whole, "uvec4 load_a8(", "uvec4 whole_a8(");
  if (half_b_units) whole = replace_all(whole, "uvec4 load_b8(", "uvec4 whole_b8(");
  const std::string entry = "z % " + glsl_uint(entries);
  // K slices start at multiples of 16 and `k` is a multiple of 4 wherever vec4 loads run along
  // it, so a vec4 along k lies wholly inside or wholly past `k`; one along m or n has one k.
  const auto sliced = [&](const std::string& signature, const std::string& zero,
                          const std::string& whole_call) {
    return signature + " {\n  uint whole_k = z / " + glsl_uint(entries) + " * " +
           glsl_uint(k_slice_length(k, splits)) + " + k;\n  if (whole_k >= " + glsl_uint(k) +
           ") return " + zero + ";\n  return " + whole_call + ";\n}\n";
  };
  std::string text =
      whole +
      sliced("float load_a(uint z, uint m, uint k)", "0.0", "whole_a(" + entry + ", m, whole_k)") +
      sliced("float load_b(uint z, uint k, uint n)", "0.0", "whole_b(" + entry + ", whole_k, n)");
  if (vector_a)
    text += sliced("vec4 load_a4(uint z, uint m, uint k)", "vec4(0.0)",
                   "whole_a4(" + entry + ", m, whole_k)");
  if (vector_b)
    text += sliced("vec4 load_b4(uint z, uint k, uint n)", "vec4(0.0)",
                   "whole_b4(" + entry + ", whole_k, n)");
  if (half_a_units)
    text += sliced("uvec4 load_a8(uint z, uint m, uint k)", "uvec4(0)",
                   "whole_a8(" + entry + ", m, whole_k)");
  if (half_b_units)
    text += sliced("uvec4 load_b8(uint z, uint k, uint n)", "uvec4(0)",
                   "whole_b8(" + entry + ", whole_k, n)");
  return text;
}

}  // namespace mg::kernels
