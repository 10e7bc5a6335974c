#include "kernels/gemm_coopmat.hpp"

#include <cstdlib>
#include <cstring>

#include "kernels/index_codegen.hpp"

namespace mg::kernels {
namespace {

bool kill_switch_set() {
  const char* off = std::getenv("MEGANEURA_NO_COOPMAT");
  return off != nullptr && std::strcmp(off, "0") != 0;
}

// The K slice of every block. Measured on the H200 (4096^3): 32-deep slices 1.18 ms, 64-deep
// 1.61 ms (the larger prefetch costs occupancy), and 128 x 256 blocks 1.39 ms.
constexpr int64_t kBlockK = 32;

struct BlockShape {
  int64_t warps_m, warps_n, frags_m, frags_n;
  int64_t rows() const { return warps_m * frags_m * 16; }
  int64_t cols() const { return warps_n * frags_n * 8; }
};

// 128 x 128 blocks (8 subgroups, 64 x 32 each) when they already give every compute unit of a
// large GPU work, else 64 x 64 blocks (4 subgroups, 32 x 32 each).
BlockShape choose_block(const GeneratedGemm& gemm) {
  constexpr int64_t kWorkgroupsWanted = 132;
  const BlockShape large{2, 4, 4, 4};
  const int64_t large_blocks = ((gemm.m + large.rows() - 1) / large.rows()) *
                               ((gemm.n + large.cols() - 1) / large.cols()) * gemm.entries;
  if (large_blocks >= kWorkgroupsWanted) return large;
  return {2, 2, 2, 4};
}

}  // namespace

bool use_coop_gemm(const DeviceTraits& device) {
  return device.fast_precision && (device.coop_matrix_f16_nv || device.coop_matrix_f16_khr) &&
         device.subgroup_size == 32 && device.max_workgroup_invocations >= 256 &&
         !kill_switch_set();
}

bool coop_wants_khr(const DeviceTraits& device) {
  if (!device.coop_matrix_f16_nv) return true;
  const char* choice = std::getenv("MEGANEURA_COOPMAT");
  return choice != nullptr && std::strcmp(choice, "khr") == 0 && device.coop_matrix_f16_khr;
}

void emit_coop_gemm(LoweringContext& context, const GeneratedGemm& gemm,
                    std::vector<Operand> operands) {
  const BlockShape block = choose_block(gemm);
  // Whole blocks only: a vec4 then never straddles the edge of the matrix or the K range.
  const bool vector_loads = gemm.vector_loads && gemm.m % block.rows() == 0 &&
                            gemm.n % block.cols() == 0 && gemm.k % kBlockK == 0;
  Launch launch;
  launch.label = context.label();
  launch.kernel = "gemm_coopmat";
  launch.body = gemm.functions + std::string(kernel_source("gemm_coopmat.comp"));
  launch.defines = {{"GEMM_M", glsl_uint(gemm.m)},
                    {"GEMM_N", glsl_uint(gemm.n)},
                    {"GEMM_K", glsl_uint(gemm.k)},
                    {"WARPS_M", glsl_uint(block.warps_m)},
                    {"WARPS_N", glsl_uint(block.warps_n)},
                    {"FRAGS_M", glsl_uint(block.frags_m)},
                    {"FRAGS_N", glsl_uint(block.frags_n)},
                    {"BLOCK_K", glsl_uint(kBlockK)},
                    {"A_M_CONTIGUOUS", gemm.a_m_contiguous ? "1" : "0"},
                    {"B_K_CONTIGUOUS", gemm.b_k_contiguous ? "1" : "0"},
                    {"VECTOR_LOADS", vector_loads ? "1" : "0"}};
  launch.operands = std::move(operands);
  launch.khr_cooperative_matrix = coop_wants_khr(context.device());
  launch.groups = tiled_grid(launch.label, gemm.n, block.cols(), gemm.m, block.rows(), gemm.entries,
                             context.device());
  context.emit(std::move(launch));
}

}  // namespace mg::kernels
