// Kernels of round_to_f16 and half_matmul, the workgroup GEMM's operands and product
// (gemm_workgroup.hpp).
#include "kernels/gemm_workgroup.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/gemm_coopmat.hpp"
#include "kernels/index_codegen.hpp"

namespace mg::kernels {
namespace {

// Four values an invocation, read as one vec4 and written as one f16vec4 through views of the
// two buffers (the planner aligns every value to 256 bytes), rounded by the conversion to f16
// (to nearest even): 16-byte accesses ran at 3.8 TB/s on the H200 where scalar ones ran at 2.5.
constexpr const char* kRoundToF16 = R"glsl(
layout(std430, set = 0, binding = 0) readonly buffer x_quads { vec4 x4[]; };
layout(std430, set = 0, binding = 1) writeonly buffer y_quads { f16vec4 y4[]; };
layout(local_size_x = 256) in;
void main() {
  const uint quad = linear_workgroup() * 256u + gl_LocalInvocationID.x;
  if (quad < QUADS) y4[quad] = f16vec4(x4[quad]);
}
)glsl";

void lower_round_to_f16(LoweringContext& context) {
  const int64_t count = element_count(context.node().type.shape);
  if (count % 4 != 0)
    throw Error(context.label() + " rounds " + std::to_string(count) +
                " values; its kernel takes a multiple of 4, as every operand of the workgroup "
                "GEMM is (the pass that writes the op)");
  Launch launch;
  launch.label = context.label();
  launch.kernel = "round_to_f16";
  launch.body = kRoundToF16;
  launch.defines = {{"QUADS", glsl_uint(count / 4)}};
  launch.operands = {{"x", context.node().inputs[0], false}, {"y", context.id(), true}};
  launch.f16_operands = true;
  launch.groups = grid_for(static_cast<uint64_t>(count / 4), 256, context.device());
  context.emit(std::move(launch));
}

void lower_half_matmul(LoweringContext& context) {
  const Node& node = context.node();
  const bool transpose_a = node.attrs.get_int("transpose_a", 0) != 0;
  const bool transpose_b = node.attrs.get_int("transpose_b", 0) != 0;
  const Shape& a = context.input_type(0).shape;
  const int64_t m = node.type.shape[0], n = node.type.shape[1], k = a[transpose_a ? 0 : 1];
  if (!context.device().workgroup_coop_matrix_f16 || m % kWorkgroupGemmBlockM != 0 ||
      n % kWorkgroupGemmBlockN != 0 || k % kWorkgroupGemmBlockK != 0)
    throw Error(
        context.label() + " (" + std::to_string(m) + " x " + std::to_string(n) + " x " +
        std::to_string(k) +
        ") needs workgroup-scope cooperative matrices and extents in "
        "multiples of " +
        std::to_string(kWorkgroupGemmBlockM) + " x " + std::to_string(kWorkgroupGemmBlockN) +
        " x " + std::to_string(kWorkgroupGemmBlockK) + ", which '" + context.device().name +
        "' or this product lacks; it comes from the workgroup GEMM pass, which checks both");
  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm_workgroup_coopmat";
  launch.body = std::string(kernel_source("gemm_workgroup.comp"));
  launch.defines = {{"GEMM_M", glsl_uint(m)},
                    {"GEMM_N", glsl_uint(n)},
                    {"GEMM_K", glsl_uint(k)},
                    {"BLOCK_M", std::to_string(kWorkgroupGemmBlockM)},
                    {"BLOCK_N", std::to_string(kWorkgroupGemmBlockN)},
                    {"BLOCK_K", std::to_string(kWorkgroupGemmBlockK)},
                    {"A_TRANSPOSED", transpose_a ? "1" : "0"},
                    {"B_TRANSPOSED", transpose_b ? "1" : "0"},
                    {"ODD_STEPS", (k / kWorkgroupGemmBlockK) % 2 == 1 ? "1" : "0"}};
  launch.operands = {
      {"a", node.inputs[0], false}, {"b", node.inputs[1], false}, {"c", context.id(), true}};
  launch.f16_operands = true;
  // Workgroup scope is a KHR matrix property: the NV extension has only subgroups.
  launch.khr_cooperative_matrix = true;
  launch.groups = tiled_grid(launch.label, n, kWorkgroupGemmBlockN, m, kWorkgroupGemmBlockM, 1,
                             context.device());
  context.emit(std::move(launch));
}

}  // namespace

// The roundings read M K + K N values, the product does M N K multiply-adds: the product must
// be long enough along both M and N for its speed to pay for them. On the H200 the workgroup
// product ran at 300 TFLOP/s against the subgroup kernel's 167 and a rounding at 3.6 TB/s, which
// breaks even where M N / (M + N) is 314; the bound, half the harmonic mean of M and N, is 512.
// SmolLM's lm_head (128 x 49152 x 576, 128) ran 0.127 ms against 0.077 (docs/BENCHMARKS.md
// run 48).
constexpr int64_t kMinHalfHarmonicMean = 512;

bool workgroup_gemm_suits(int64_t m, int64_t n, int64_t k, const DeviceTraits& device) {
  if (!use_coop_gemm(device) || !device.workgroup_coop_matrix_f16) return false;
  if (m % kWorkgroupGemmBlockM != 0 || n % kWorkgroupGemmBlockN != 0 ||
      k % kWorkgroupGemmBlockK != 0)
    return false;
  if (const char* text = std::getenv("MEGANEURA_WORKGROUP_GEMM")) {
    if (std::strcmp(text, "0") == 0) return false;
    if (std::strcmp(text, "1") == 0) return true;
    throw Error(std::string("MEGANEURA_WORKGROUP_GEMM='") + text +
                "': expected 0 (subgroup-scope fast GEMM only) or 1 (the workgroup GEMM for "
                "every product whose extents fit its blocks); unset it for the size rule");
  }
  const int64_t blocks = (m / kWorkgroupGemmBlockM) * (n / kWorkgroupGemmBlockN);
  return blocks >= device.compute_units && m * n >= kMinHalfHarmonicMean * (m + n);
}

std::vector<LoweringEntry> workgroup_gemm_lowerings() {
  return {{"round_to_f16", lower_round_to_f16}, {"half_matmul", lower_half_matmul}};
}

}  // namespace mg::kernels
