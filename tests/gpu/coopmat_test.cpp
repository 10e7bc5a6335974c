// The `fast` precision path: GEMMs and convolutions on cooperative matrices (f16 operands, f32
// accumulation). The kernels are compiled and their KHR rewrite checked on every machine (no
// device needed); the numerics run only where the device has the fragment shape (the H200 run
// of bench/h200.sh) and are skipped, visibly, elsewhere (Lavapipe).
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string_view>
#include <tuple>

#include "backends/vulkan/kernels/fusion.hpp"
#include "backends/vulkan/kernels/gemm_workgroup.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/vulkan_target.hpp"
#include "backends/vulkan/runtime/coop_fragment_layout.hpp"
#include "backends/vulkan/runtime/gpu.hpp"
#include "backends/vulkan/runtime/spirv_bfloat16.hpp"
#include "backends/vulkan/runtime/spirv_cooperative_matrix.hpp"
#include "conv_support.hpp"
#include "ir/half.hpp"
#include "ir/op_names.hpp"
#include "passes/passes.hpp"
#include "plan/program.hpp"

namespace mg {
namespace {

using testing::check_on_gpu;
using testing::output_with_gradients;
using testing::ScopedSwitch;

// f16 operands round to 11 significant bits; for inputs in [-1, 1] and the K of these tests
// the normalised error is a few 1e-4, far above strict f32 (1e-7) and far below a wrong
// kernel (order 1).
constexpr double kFastTolerance = 3e-3;
// bfloat16 operands keep 8 significant bits, rounding eight times as coarsely as f16: a few
// 1e-3 here, still far below a wrong kernel. (Attention keeps its f16 kernels in bf16 precision:
// its gradients keep fast's bound, its climbing-scores forward takes this one.)
constexpr double kBf16Tolerance = 2e-2;

// The kernels' tests run small products, which the fast path would leave on gemm.comp
// (kernels::coop_gemm_suits): these suites put every product on cooperative matrices.
class CoopMatrixLowering : public ::testing::Test {
  ScopedSwitch every_product_ =
      ScopedSwitch("MEGANEURA_COOP_GEMM_MIN", "0", ScopedSwitch::Check::none);
};
class GpuCoopMatrix : public CoopMatrixLowering {};

target::DeviceTraits coop_device() {
  target::DeviceTraits device;
  device.subgroup_size = 32;
  device.max_shared_memory_bytes = 49152;
  device.max_workgroup_invocations = 1024;
  device.coop_matrix_f16_nv = true;
  device.coop_matrix_f16_khr = true;
  device.f16_tensors = true;
  device.fast_precision = true;
  return device;
}

// A matmul, a convolution, both convolution gradients and an attention forward: every kernel
// the fast path has.
Graph coop_graph() {
  Graph graph;
  Tensor a = input(graph, "a", {2, 37, 70});
  Tensor b = input(graph, "b", {45, 70});
  graph.set_output("product", matmul(a, b, false, true).id());
  // Whole blocks: the vector-load variant.
  graph.set_output("aligned product",
                   matmul(input(graph, "c", {64, 32}), input(graph, "d", {32, 64})).id());
  Tensor x = input(graph, "x", {2, 3, 9, 9});
  Tensor w = input(graph, "w", {8, 3, 3, 3});
  Tensor seed = input(graph, "seed", {2, 8, 4, 4});
  testing::output_with_gradients(graph, conv2d(x, w, std::nullopt, {.stride = {2, 2}}), seed,
                                 {x, w});
  Tensor q = input(graph, "q", {1, 2, 40, 32});
  Tensor k = input(graph, "k", {1, 1, 40, 32});
  Tensor v = input(graph, "v", {1, 1, 40, 16});
  Tensor attention = scaled_dot_product_attention(q, k, v, {.causal = true});
  Tensor attention_seed = input(graph, "attention_seed", {1, 2, 40, 16});
  graph.set_output("attention", attention.id());
  const std::map<ValueId, ValueId> grads =
      gradients(graph, attention.id(), {q.id(), k.id(), v.id()}, attention_seed.id());
  for (const auto& [leaf, grad] : grads)
    graph.set_output("attention_grad" + std::to_string(leaf), grad);
  return graph;
}

// The cooperative-matrix launches of every node of `graph` on `device` with the test's switches.
std::vector<kernels::Launch> coop_launches(const Graph& graph, target::DeviceTraits device) {
  device = testing::switched(device);
  std::vector<kernels::Launch> found;
  for (size_t i = 0; i < graph.size(); ++i) {
    if (graph.nodes()[i].is_leaf()) continue;
    for (kernels::Launch& launch : kernels::lower_node(graph, static_cast<ValueId>(i), device)) {
      if (launch.kernel.ends_with("coopmat")) found.push_back(std::move(launch));
    }
  }
  return found;
}

std::string define_of(const kernels::Launch& launch, const std::string& name) {
  for (const auto& [key, value] : launch.defines)
    if (key == name) return value;
  return "missing";
}

// The one cooperative-matrix launch of a @ b on coop_device().
kernels::Launch matmul_launch(const Shape& a, const Shape& b, bool transpose_a = false) {
  Graph graph;
  graph.set_output("y", matmul(input(graph, "a", a), input(graph, "b", b), transpose_a).id());
  const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
  EXPECT_EQ(launches.size(), 1u);
  return launches.at(0);
}

// The GEMM reads an operand that is contiguous along the other index than its fragments' rows
// (A along m, B along k) as column-major fragments.
int gemm_column_major_loads(const kernels::Launch& launch) {
  return (define_of(launch, "A_M_CONTIGUOUS") == "1" ? 1 : 0) +
         (define_of(launch, "B_K_CONTIGUOUS") == "1" ? 1 : 0);
}

gpu::KernelSpec spec_of(const Graph& graph, const kernels::Launch& launch) {
  gpu::KernelSpec spec;
  spec.label = launch.label;
  spec.source = kernels::launch_source(graph, launch);
  spec.defines = launch.defines;
  spec.binding_count = static_cast<uint32_t>(launch.operands.size());
  return spec;
}

TEST_F(CoopMatrixLowering, FastPrecisionSelectsCoopKernelsOnlyWhenAllowed) {
  const Graph graph = coop_graph();
  // Two matmuls, conv2d, conv2d_grad_input, conv2d_grad_weight, scaled_dot_product_attention,
  // attention_lse, attention_grad_q, attention_grad_k, attention_grad_v.
  EXPECT_EQ(coop_launches(graph, coop_device()).size(), 10u);

  target::DeviceTraits strict = coop_device();
  strict.fast_precision = false;
  EXPECT_TRUE(coop_launches(graph, strict).empty());

  target::DeviceTraits without = coop_device();
  without.coop_matrix_f16_nv = without.coop_matrix_f16_khr = false;
  EXPECT_TRUE(coop_launches(graph, without).empty());

  const ScopedSwitch kill("MEGANEURA_NO_COOPMAT", "1");
  EXPECT_TRUE(coop_launches(graph, coop_device()).empty());
}

// Fast precision puts products of at least 64K multiply-adds per compute unit on cooperative
// matrices, except products of few rows that their own kernel takes and products over a K under
// 16, and leaves smaller ones on gemm.comp; MEGANEURA_COOP_GEMM_MIN sets one bound for all (0:
// every product) and rejects what is not a whole number.
TEST(CoopMatrixRouting, SmallProductsStayOnTheSimtGemm) {
  const auto kernel_of = [](const Shape& a, const Shape& b, bool transpose_b = false) {
    Graph graph;
    const Tensor y = matmul(input(graph, "a", a), input(graph, "b", b), false, transpose_b);
    return kernels::lower_node(graph, y.id(), testing::switched(coop_device())).at(0).kernel;
  };
  // 132 units: SmolLM2's products at 128 tokens go, the smallest (128 x 192 x 576, 14.2M) over
  // 132 x 64K = 8.65M, as does its weight gradients' 576 x 576 x 128; 128 x 256 x 256 (8.4M)
  // stays; a decode step's 1 x 576 x 576 against a weight stored [N, K] takes the few-rows
  // kernel; Whisper's embedding gradient over 4 tokens (51865 x 384 x 4) stays on gemm.comp.
  EXPECT_EQ(kernel_of({128, 576}, {576, 192}), "gemm_coopmat");
  EXPECT_EQ(kernel_of({576, 128}, {128, 576}), "gemm_coopmat");
  EXPECT_EQ(kernel_of({128, 256}, {256, 256}), "gemm");
  EXPECT_EQ(kernel_of({1, 576}, {49152, 576}, true), "gemm_few_rows");
  EXPECT_EQ(kernel_of({51865, 4}, {4, 384}), "gemm");
  EXPECT_EQ(kernel_of({2, 128, 576}, {576, 1536}), "gemm_coopmat");
  {
    const ScopedSwitch every("MEGANEURA_COOP_GEMM_MIN", "0");
    EXPECT_EQ(kernel_of({16, 16}, {16, 16}), "gemm_coopmat");
  }
  {
    const ScopedSwitch fewer("MEGANEURA_COOP_GEMM_MIN", "50000");
    EXPECT_EQ(kernel_of({128, 256}, {256, 256}), "gemm_coopmat");
  }
  {
    const ScopedSwitch more("MEGANEURA_COOP_GEMM_MIN", "1048576");
    EXPECT_EQ(kernel_of({128, 576}, {576, 576}), "gemm");
  }
  for (const char* bad : {"-1", "a lot"}) {
    testing::expect_switch_rejected("MEGANEURA_COOP_GEMM_MIN", bad, [&] {
      kernel_of({128, 576}, {576, 576});
    });
  }
}

// Vector loads of an operand wherever its contiguous extent (A's k, or m where A is transposed;
// B's n, or k where B is transposed) is a multiple of 4, whatever the other extents; bounds on
// them only where a block reaches past an edge; scalar loads otherwise.
TEST_F(CoopMatrixLowering, VectorLoadsWhereContiguousExtentsAlignBoundedOnPartialBlocks) {
  const auto loads = [](const Shape& a, const Shape& b, bool transpose_a = false) {
    const kernels::Launch launch = matmul_launch(a, b, transpose_a);
    return define_of(launch, "VECTOR_A") + define_of(launch, "VECTOR_B") +
           define_of(launch, "WHOLE_BLOCKS");
  };
  EXPECT_EQ(loads({256, 96}, {96, 192}), "111");
  EXPECT_EQ(loads({256, 96}, {96, 196}), "110");    // 196 columns: a partial block
  EXPECT_EQ(loads({256, 100}, {100, 192}), "110");  // K = 100: a partial slice
  EXPECT_EQ(loads({250, 96}, {96, 192}), "110");    // 250 rows: A's rows are whole vec4s
  EXPECT_EQ(loads({50, 720}, {720, 964}), "110");   // an action chunk's 50 rows
  EXPECT_EQ(loads({256, 98}, {98, 192}), "010");    // A's rows of 98 are not
  EXPECT_EQ(loads({256, 96}, {96, 190}), "100");
  EXPECT_EQ(loads({96, 250}, {96, 192}, true), "010");  // A contiguous along its 250 rows
  EXPECT_EQ(loads({96, 252}, {96, 190}, true), "100");
}

// A matmul's fragments go straight to its product where the product is C itself, row-major
// with rows of a multiple of 4 floats (16-byte aligned fragments); convolutions scatter theirs
// through store_c.
TEST_F(CoopMatrixLowering, DirectStoresOnlyIntoRowMajorProducts) {
  EXPECT_EQ(define_of(matmul_launch({256, 96}, {96, 192}), "DIRECT_STORE"), "1");
  EXPECT_EQ(define_of(matmul_launch({250, 96}, {96, 196}), "DIRECT_STORE"), "1");
  EXPECT_EQ(define_of(matmul_launch({256, 96}, {96, 190}), "DIRECT_STORE"), "0");
  int convolutions = 0;
  for (const kernels::Launch& launch : coop_launches(coop_graph(), coop_device())) {
    if (!launch.label.starts_with("conv2d")) continue;
    ++convolutions;
    EXPECT_EQ(define_of(launch, "DIRECT_STORE"), "0") << launch.label;
  }
  EXPECT_EQ(convolutions, 3);
}

// KHR wherever the device has it (faster on the H200); NV where only NV exists or where
// MEGANEURA_COOPMAT=nv asks for it on a device with both.
TEST_F(CoopMatrixLowering, KhrWhereverTheDeviceHasIt) {
  const Graph graph = coop_graph();
  const auto expect_khr = [&](const target::DeviceTraits& device, bool khr) {
    const std::vector<kernels::Launch> launches = coop_launches(graph, device);
    ASSERT_FALSE(launches.empty());
    for (const kernels::Launch& launch : launches)
      EXPECT_EQ(launch.khr_cooperative_matrix, khr) << launch.label;
  };
  target::DeviceTraits khr_only = coop_device(), nv_only = coop_device();
  khr_only.coop_matrix_f16_nv = false;
  nv_only.coop_matrix_f16_khr = false;
  expect_khr(coop_device(), true);
  expect_khr(khr_only, true);
  expect_khr(nv_only, false);
  const ScopedSwitch prefer("MEGANEURA_COOPMAT", "nv");
  expect_khr(coop_device(), false);
  expect_khr(khr_only, true);
}

// Reads a SPIR-V module's instructions as (opcode, operands).
std::vector<std::pair<uint32_t, std::vector<uint32_t>>> instructions(
    const std::vector<uint32_t>& module) {
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> list;
  for (size_t at = 5; at < module.size();) {
    const uint32_t words = module[at] >> 16;
    EXPECT_GT(words, 0u);
    if (words == 0 || at + words > module.size()) break;
    list.emplace_back(module[at] & 0xffffu,
                      std::vector<uint32_t>(module.begin() + static_cast<ptrdiff_t>(at) + 1,
                                            module.begin() + static_cast<ptrdiff_t>(at + words)));
    at += words;
  }
  return list;
}

// A rewritten module's cooperative-matrix types with their constants resolved, and the layout
// (1: column-major) of each load and store.
struct MatrixType {
  uint32_t width, scope, rows, columns, use;
  auto operator<=>(const MatrixType&) const = default;
};
struct KhrMatrixUse {
  std::set<MatrixType> types;
  std::vector<uint32_t> load_layouts, store_layouts;
};
KhrMatrixUse khr_matrix_use(const std::vector<uint32_t>& module) {
  constexpr uint32_t kOpTypeFloat = 22, kOpConstant = 43, kOpTypeMatrixKhr = 4456,
                     kOpLoadKhr = 4457, kOpStoreKhr = 4458;
  std::map<uint32_t, uint32_t> constant_value, float_width;
  KhrMatrixUse found;
  for (const auto& [opcode, operands] : instructions(module)) {
    if (opcode == kOpTypeFloat) float_width[operands[0]] = operands[1];
    if (opcode == kOpConstant) constant_value[operands[1]] = operands[2];
    if (opcode == kOpTypeMatrixKhr)
      found.types.insert({float_width.at(operands[1]), constant_value.at(operands[2]),
                          constant_value.at(operands[3]), constant_value.at(operands[4]),
                          constant_value.at(operands[5])});
    if (opcode == kOpLoadKhr) found.load_layouts.push_back(constant_value.at(operands[3]));
    if (opcode == kOpStoreKhr) found.store_layouts.push_back(constant_value.at(operands[2]));
  }
  return found;
}

// The SPIR-V validator of Debian 12 predates SPV_KHR_cooperative_matrix, so the rewritten
// modules are checked against the extension's encoding here: the NV forms are gone, every
// matrix type carries the use its shape implies (A 16x16 f16, B 16x8 f16, accumulator 16x8
// f32), loads carry the layout the kernel asked for (the attention kernel reads K^T
// column-major, everything else is row-major) and every id is below the module's bound.
void expect_khr_module(const std::vector<uint32_t>& module, const std::string& label,
                       int expected_column_major_loads, bool stores_matrices = true) {
  SCOPED_TRACE(label);
  constexpr uint32_t kOpExtension = 10, kOpCapability = 17, kOpTypeFloat = 22, kOpConstant = 43;
  constexpr uint32_t kOpTypeMatrixKhr = 4456, kOpLoadKhr = 4457, kOpStoreKhr = 4458;
  std::map<uint32_t, uint32_t> constant_value, float_width;
  bool khr_capability = false, khr_extension = false;
  int matrix_types = 0, loads = 0, stores = 0, column_major_loads = 0;
  const uint32_t bound = module.at(3);
  for (const auto& [opcode, operands] : instructions(module)) {
    EXPECT_FALSE(opcode >= 5358 && opcode <= 5362) << "NV opcode " << opcode << " left";
    if (opcode == kOpCapability) {
      EXPECT_NE(operands[0], 5357u) << "NV capability left";
      khr_capability |= operands[0] == 6022;
    }
    if (opcode == kOpExtension) {
      const std::string name(reinterpret_cast<const char*>(operands.data()));
      EXPECT_NE(name, "SPV_NV_cooperative_matrix");
      khr_extension |= name == "SPV_KHR_cooperative_matrix";
    }
    if (opcode == kOpTypeFloat) float_width[operands[0]] = operands[1];
    if (opcode == kOpConstant) constant_value[operands[1]] = operands[2];
    if (opcode == kOpTypeMatrixKhr) {
      ++matrix_types;
      ASSERT_EQ(operands.size(), 6u);
      for (uint32_t id : operands) EXPECT_LT(id, bound);
      const uint32_t width = float_width.at(operands[1]);
      const uint32_t rows = constant_value.at(operands[3]);
      const uint32_t columns = constant_value.at(operands[4]);
      const uint32_t use = constant_value.at(operands[5]);
      if (width == 32) {
        EXPECT_EQ(use, 2u) << "f32 accumulator";
        EXPECT_EQ(rows * 100 + columns, 1608u);
      } else {
        EXPECT_EQ(width, 16u);
        EXPECT_EQ(use, columns == 16 ? 0u : 1u) << rows << "x" << columns << " f16";
      }
    }
    if (opcode == kOpLoadKhr) {
      ++loads;
      const uint32_t layout = constant_value.at(operands[3]);
      EXPECT_LE(layout, 1u);
      column_major_loads += layout == 1 ? 1 : 0;
    }
    if (opcode == kOpStoreKhr) {
      ++stores;
      EXPECT_EQ(constant_value.at(operands[2]), 0u) << "row-major store";
    }
  }
  EXPECT_TRUE(khr_capability);
  EXPECT_TRUE(khr_extension);
  EXPECT_EQ(matrix_types, 3);
  EXPECT_GT(loads, 0);
  EXPECT_EQ(stores > 0, stores_matrices);
  EXPECT_EQ(column_major_loads, expected_column_major_loads);
}

TEST_F(CoopMatrixLowering, KernelsCompileToValidNvAndWellFormedKhrSpirv) {
  const Graph graph = coop_graph();
  const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
  ASSERT_EQ(launches.size(), 10u);
  // The attention kernels read K^T, V^T, Q^T or dO^T as column-major fragments.
  const std::map<std::string, int> column_major_loads = {{"attention_forward_coopmat", 1},
                                                         {"attention_grad_q_coopmat", 2},
                                                         {"attention_grad_kv_coopmat", 1}};
  for (const kernels::Launch& launch : launches) {
    const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
    const int expected = launch.kernel == "gemm_coopmat" ? gemm_column_major_loads(launch)
                         : launch.label.starts_with("attention_grad_k ")
                             ? 2  // Q^T and dO^T
                             : column_major_loads.at(launch.kernel);
    expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label, expected);
  }
}

// coop_device() asked for bfloat16 operands, which it has (Precision::bf16).
target::DeviceTraits bf16_device() {
  target::DeviceTraits device = coop_device();
  device.coop_matrix_bf16_khr = true;
  device.bf16_operands = true;
  return device;
}

// A module rewritten for bfloat16 operands, checked against SPV_KHR_bfloat16's encoding (Debian's
// validator predates it): its one 16-bit float carries the BFloat16KHR encoding (0), the
// capabilities BFloat16TypeKHR (5116) and BFloat16CooperativeMatrixKHR (5118) and the extension
// are declared, the KHR matrices of 16-bit elements are bfloat16 ones, and no arithmetic or
// extended instruction yields a bfloat16 value.
void expect_bf16_module(const std::vector<uint32_t>& module, const std::string& label) {
  SCOPED_TRACE(label);
  constexpr uint32_t kOpExtension = 10, kOpExtInst = 12, kOpCapability = 17, kOpTypeFloat = 22,
                     kOpTypeVector = 23, kOpTypeMatrixKhr = 4456;
  constexpr uint32_t kOpFNegate = 127, kOpFAdd = 129, kOpFSub = 131, kOpFMul = 133, kOpFDiv = 136,
                     kOpVectorTimesScalar = 142, kOpDot = 148;
  std::set<uint32_t> capabilities, bf16_types;
  bool extension = false;
  int sixteen_bit_floats = 0, bf16_matrices = 0;
  for (const auto& [opcode, operands] : instructions(module)) {
    if (opcode == kOpCapability) capabilities.insert(operands[0]);
    if (opcode == kOpExtension)
      extension |=
          std::string(reinterpret_cast<const char*>(operands.data())) == "SPV_KHR_bfloat16";
    if (opcode == kOpTypeFloat && operands[1] == 16) {
      ++sixteen_bit_floats;
      ASSERT_EQ(operands.size(), 3u) << "a 16-bit float without an encoding";
      EXPECT_EQ(operands[2], 0u) << "BFloat16KHR";
      bf16_types.insert(operands[0]);
    }
    if (opcode == kOpTypeVector && bf16_types.count(operands[1])) bf16_types.insert(operands[0]);
    if (opcode == kOpTypeMatrixKhr && bf16_types.count(operands[1])) ++bf16_matrices;
    for (uint32_t arithmetic :
         {kOpExtInst, kOpFNegate, kOpFAdd, kOpFSub, kOpFMul, kOpFDiv, kOpVectorTimesScalar, kOpDot})
      EXPECT_FALSE(opcode == arithmetic && bf16_types.count(operands[0]))
          << "opcode " << opcode << " yields bfloat16";
  }
  EXPECT_EQ(sixteen_bit_floats, 1);
  EXPECT_GE(bf16_matrices, 2) << "A and B";
  EXPECT_TRUE(capabilities.count(5116) && capabilities.count(5118) && capabilities.count(6022));
  EXPECT_TRUE(extension);
}

// Precision::bf16 runs the fast path's GEMMs (matmuls, convolutions) on cooperative matrices
// through KHR with bfloat16 operands on 16 x 16 fragments, each compiling to a well-formed
// bfloat16 module, and attention on its f16 kernels (written for 16 x 8 B fragments, which
// devices offer for f16 alone); fast precision keeps f16 operands, and a device without bfloat16
// matrices (or with the kill switch) runs strict.
TEST_F(CoopMatrixLowering, Bf16PrecisionCompilesTheGemmsForBfloat16Operands) {
  const Graph graph = coop_graph();
  const std::vector<kernels::Launch> launches = coop_launches(graph, bf16_device());
  ASSERT_EQ(launches.size(), 10u);
  int gemms = 0;
  for (const kernels::Launch& launch : launches) {
    SCOPED_TRACE(launch.label);
    EXPECT_TRUE(launch.khr_cooperative_matrix);
    const bool gemm = launch.kernel == "gemm_coopmat";
    gemms += gemm;
    EXPECT_EQ(launch.bf16_operands, gemm);
    EXPECT_EQ(define_of(launch, "BFLOAT16_FRAGMENTS"), gemm ? "1" : "missing");
    gpu::KernelSpec spec = spec_of(graph, launch);
    spec.khr_cooperative_matrix = true;
    spec.bf16_operands = launch.bf16_operands;
    const std::vector<uint32_t> module = gpu::compile_glsl(spec);
    if (gemm) expect_bf16_module(module, launch.label);
  }
  EXPECT_EQ(gemms, 5);  // two matmuls, the convolution and both its gradients
  for (const kernels::Launch& launch : coop_launches(graph, coop_device())) {
    EXPECT_FALSE(launch.bf16_operands) << launch.label;
    if (launch.kernel == "gemm_coopmat") {
      EXPECT_EQ(define_of(launch, "BFLOAT16_FRAGMENTS"), "0");
    }
  }

  target::DeviceTraits without = bf16_device();
  without.coop_matrix_bf16_khr = false;
  EXPECT_TRUE(coop_launches(graph, without).empty());
  const ScopedSwitch kill("MEGANEURA_NO_COOPMAT", "1");
  EXPECT_TRUE(coop_launches(graph, bf16_device()).empty());
}

// coop_graph with a product of f32 tensors large enough for the workgroup GEMM ("wa" x "wb")
// and one of f16 tensors.
Graph graph_with_large_and_f16_products() {
  Graph graph = coop_graph();
  graph.set_output("wide product",
                   matmul(input(graph, "wa", {2048, 64}), input(graph, "wb", {64, 4096})).id());
  Tensor half_a = cast(input(graph, "ha", {96, 64}), DType::f16);
  Tensor half_b = cast(input(graph, "hb", {64, 80}), DType::f16);
  graph.set_output("half product", matmul(half_a, half_b).id());
  return graph;
}

// bfloat16 keeps f32's range, so a bf16 program rounds no f32 operand to f16 for the workgroup
// GEMM (no half_matmul of them), where a fast program does; products of f16 tensors keep their
// f16 kernels, and attention's gradients stay scaled (its kernels round dO and dS to f16).
TEST_F(CoopMatrixLowering, Bf16ProgramsRoundNoF32OperandToF16) {
  const Graph graph = graph_with_large_and_f16_products();
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fast");
    target::DeviceTraits device = bf16 ? bf16_device() : coop_device();
    device.workgroup_coop_matrix_f16 = true;
    const plan::Program program = plan::build_program(
        graph, vulkan::VulkanTarget(testing::switched(device)), plan::PlanOptions{});
    int scaled = 0, half_products = 0;
    for (const Node& node : program.graph.nodes()) {
      scaled += node.attrs.get_int("has_grad_out_max", 0) != 0 ||
                node.attrs.get_int("own_grad_out_scale", 0) != 0;
      half_products += node.op == op::half_matmul;
    }
    EXPECT_GT(scaled, 0);
    EXPECT_EQ(half_products, bf16 ? 1 : 2);
    int f16_operand_launches = 0, bf16_launches = 0;
    for (const plan::PlannedLaunch& planned : program.launches) {
      const kernels::Launch& launch = vulkan::glsl_launch(planned.launch);
      f16_operand_launches += launch.f16_operands && launch.kernel.ends_with("coopmat");
      bf16_launches += launch.bf16_operands;
      if (launch.bf16_operands) {
        EXPECT_FALSE(launch.f16_operands) << launch.label;
      }
    }
    EXPECT_GT(f16_operand_launches, 0);
    EXPECT_EQ(bf16_launches > 0, bf16);
  }
}

// `launch` of `program` reads bfloat16 buffers as bfloat16 operands and compiles to a bfloat16
// module.
void expect_bfloat16_launch(const plan::Program& program, const kernels::Launch& launch) {
  EXPECT_TRUE(launch.bf16_operands);
  EXPECT_TRUE(launch.bf16_buffers);
  gpu::KernelSpec spec = spec_of(program.graph, launch);
  spec.khr_cooperative_matrix = true;
  spec.bf16_operands = true;
  spec.bf16_buffers = true;
  expect_bf16_module(gpu::compile_glsl(spec), launch.label);
}

// On a device with workgroup-scope bfloat16 matrices, a bf16 program's large product of f32
// tensors takes the workgroup GEMM as a fast one does, its operands rounded to bfloat16
// (round_to_bf16, stored as bfloat16 bit patterns) rather than f16, and its kernel compiles to a
// bfloat16 module whose buffers a and b are bfloat16 too; the f16 tensors' product keeps its f16
// kernel. Without those matrices the product stays on the subgroup GEMM (the test above).
TEST_F(CoopMatrixLowering, Bf16ProgramsRoundWorkgroupOperandsToBfloat16) {
  const Graph graph = graph_with_large_and_f16_products();
  target::DeviceTraits device = bf16_device();
  device.workgroup_coop_matrix_f16 = true;
  const auto f16_roundings_of = [](const plan::Program& program) {
    return std::count_if(program.graph.nodes().begin(), program.graph.nodes().end(),
                         [](const Node& node) { return node.op == op::round_to_f16; });
  };
  const long f16_roundings_without = f16_roundings_of(plan::build_program(
      graph, vulkan::VulkanTarget(testing::switched(device)), plan::PlanOptions{}));
  device.workgroup_coop_matrix_bf16 = true;
  const plan::Program program = plan::build_program(
      graph, vulkan::VulkanTarget(testing::switched(device)), plan::PlanOptions{});
  int bf16_roundings = 0, bf16_products = 0;
  for (const Node& node : program.graph.nodes()) {
    if (node.op == op::round_to_bf16) {
      ++bf16_roundings;
      const std::string& name = program.graph.node(node.inputs[0]).name;
      EXPECT_TRUE(name == "wa" || name == "wb") << name;
    }
    if (node.op == op::half_matmul && program.graph.type(node.inputs[0]).dtype == DType::bf16) {
      ++bf16_products;
      EXPECT_EQ(program.graph.node(node.inputs[0]).op, op::round_to_bf16);
      EXPECT_EQ(program.graph.node(node.inputs[1]).op, op::round_to_bf16);
      EXPECT_EQ(node.type.dtype, DType::f32);
    }
  }
  EXPECT_EQ(bf16_roundings, 2);
  EXPECT_EQ(bf16_products, 1);
  // The f16 roundings are the f16 tensors' casts, as without the bfloat16 route.
  EXPECT_EQ(f16_roundings_of(program), f16_roundings_without);
  int workgroup_launches = 0;
  for (const plan::PlannedLaunch& planned : program.launches) {
    const kernels::Launch& launch = vulkan::glsl_launch(planned.launch);
    if (launch.kernel != "gemm_workgroup_coopmat") continue;
    SCOPED_TRACE(launch.label);
    ++workgroup_launches;
    expect_bfloat16_launch(program, launch);
  }
  EXPECT_EQ(workgroup_launches, 1);
}

// Products of bf16 tensors in bf16 precision read the bfloat16 operands as they are: into a bf16
// result, on a device with workgroup-scope bfloat16 matrices, one workgroup GEMM launch that
// stores the bfloat16 result itself (F16_RESULT in the module made bfloat16, every buffer
// bfloat16); a product that kernel does not take, on the subgroup GEMM (in units of 8 values, 4,
// and one at a time) into an f32 result, with 16-column bfloat16 fragments, then a rounding. Each
// GEMM compiles to a bfloat16 module.
TEST_F(CoopMatrixLowering, Bf16TensorsProductReadsAndStoresBfloat16) {
  target::DeviceTraits device = bf16_device();
  device.workgroup_coop_matrix_f16 = true;
  device.workgroup_coop_matrix_bf16 = true;
  {
    Graph graph;
    graph.set_output("product", matmul(input(graph, "a", {2048, 64}, DType::bf16),
                                       input(graph, "b", {64, 4096}, DType::bf16))
                                    .id());
    const plan::Program program = plan::build_program(
        graph, vulkan::VulkanTarget(testing::switched(device)), plan::PlanOptions{});
    ASSERT_EQ(program.launches.size(), 1u);
    const kernels::Launch& launch = vulkan::glsl_launch(program.launches.front().launch);
    EXPECT_EQ(launch.kernel, "gemm_workgroup_coopmat");
    EXPECT_EQ(define_of(launch, "F16_RESULT"), "1");
    expect_bfloat16_launch(program, launch);
  }
  for (const auto& [m, n, k, units] : {std::tuple{128, 1536, 576, "1"}, std::tuple{60, 92, 36, "0"},
                                       std::tuple{61, 93, 37, "0"}}) {
    SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k));
    Graph graph;
    graph.set_output("product", matmul(input(graph, "a", {m, k}, DType::bf16),
                                       input(graph, "b", {k, n}, DType::bf16))
                                    .id());
    const plan::Program program = plan::build_program(
        graph, vulkan::VulkanTarget(testing::switched(device)), plan::PlanOptions{});
    int gemms = 0;
    for (const plan::PlannedLaunch& planned : program.launches) {
      const kernels::Launch& launch = vulkan::glsl_launch(planned.launch);
      if (launch.kernel != "gemm_coopmat") continue;
      ++gemms;
      EXPECT_EQ(define_of(launch, "BFLOAT16_FRAGMENTS"), "1");
      EXPECT_EQ(define_of(launch, "HALF_A_UNITS"), units);
      expect_bfloat16_launch(program, launch);
    }
    EXPECT_GE(gemms, 1);
    EXPECT_EQ(program.graph.type(program.graph.output("product")).dtype, DType::bf16);
  }
}

// coop_launches, and the launch of the graph's last attention_grad_k with its attention_grad_v
// (dK with dV in one launch, as the lowering of the whole graph pairs them).
std::vector<kernels::Launch> coop_launches_with_grad_kv(const Graph& graph,
                                                        const target::DeviceTraits& device) {
  std::vector<kernels::Launch> launches = coop_launches(graph, device);
  ValueId grad_k = kNoValue, grad_v = kNoValue;
  for (size_t i = 0; i < graph.size(); ++i) {
    if (graph.nodes()[i].op == op::attention_grad_k) grad_k = static_cast<ValueId>(i);
    if (graph.nodes()[i].op == op::attention_grad_v) grad_v = static_cast<ValueId>(i);
  }
  for (kernels::Launch& launch :
       kernels::lower_attention_with_companions(graph, grad_k, {grad_v}, testing::switched(device)))
    launches.push_back(std::move(launch));
  return launches;
}

// Where the session's probe found NVIDIA's fragment layout, the attention forward, the
// log-sum-exp, dQ and dK with dV keep scores, probabilities and dS in registers
// (FRAGMENT_REGISTERS): valid NV SPIR-V and a KHR rewrite that stores no matrix (the lanes write
// their own elements).
// Elsewhere, or with MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=0, they stage them through shared
// memory; a bad value is an error naming the switch.
TEST_F(CoopMatrixLowering, AttentionInRegistersWhereTheLayoutIsKnown) {
  const Graph graph = coop_graph();
  const auto forward_defines = [&](bool quad_rows) {
    target::DeviceTraits device = coop_device();
    device.quad_row_fragments = quad_rows;
    const std::vector<kernels::Launch> launches = coop_launches_with_grad_kv(graph, device);
    std::string defines;
    for (const kernels::Launch& launch : launches) {
      const bool grad_q = launch.kernel == "attention_grad_q_coopmat";
      const bool grad_kv = launch.kernel == "attention_grad_kv_coopmat";
      if (launch.kernel != "attention_forward_coopmat" && !grad_q && !grad_kv) continue;
      defines += define_of(launch, "FRAGMENT_REGISTERS");
      if (define_of(launch, "FRAGMENT_REGISTERS") != "1") continue;
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
      // K^T (the forward's and dQ's) or Q^T (dK's and dV's) read column-major, and for dQ V^T
      // and for dK dO^T too.
      const bool two_products = grad_q || (grad_kv && define_of(launch, "GRAD_K") == "1");
      expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                        two_products ? 2 : 1, false);
    }
    return defines;
  };
  // The forward, the backward's log-sum-exp, dQ, dK, dV, and dK with dV.
  EXPECT_EQ(forward_defines(true), "111111");
  EXPECT_EQ(forward_defines(false), "000000");
  {
    const ScopedSwitch off("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", "0");
    EXPECT_EQ(forward_defines(true), "000000");
  }
  const ScopedSwitch bad("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", "yes");
  try {
    forward_defines(true);
    ADD_FAILURE() << "a bad value was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS='yes'"),
              std::string::npos)
        << error.what();
  }
}

// The backward given max |dO| (passes::scale_attention_gradients): dQ, dK, dV and dK with dV
// read it (SCALED_GRAD_OUT=1, one per batch entry for these grouped heads) and compile to valid
// NV SPIR-V, in registers and staged; told to find it themselves (own_grad_out_scale) they read
// none and compile (SCALED_GRAD_OUT=2); without either they read none and leave dO as it is.
TEST_F(CoopMatrixLowering, AttentionBackwardReadsTheLargestCotangent) {
  enum class Scale { given, own, none };
  for (const Scale scale : {Scale::given, Scale::own, Scale::none}) {
    const Graph graph =
        scale == Scale::none
            ? coop_graph()
            : passes::scale_attention_gradients(
                  coop_graph(), [&](const Graph&, const Node&) { return scale == Scale::own; });
    for (const bool quad_rows : {true, false}) {
      SCOPED_TRACE(std::string(scale == Scale::given ? "given"
                               : scale == Scale::own ? "own"
                                                     : "as it is") +
                   (quad_rows ? ", registers" : ""));
      target::DeviceTraits device = coop_device();
      device.quad_row_fragments = quad_rows;
      const std::vector<kernels::Launch> launches = coop_launches_with_grad_kv(graph, device);
      size_t backward = 0;
      for (const kernels::Launch& launch : launches) {
        if (launch.kernel != "attention_grad_q_coopmat" &&
            launch.kernel != "attention_grad_kv_coopmat")
          continue;
        ++backward;
        EXPECT_EQ(define_of(launch, "SCALED_GRAD_OUT"), scale == Scale::given ? "1"
                                                        : scale == Scale::own ? "2"
                                                                              : "0")
            << launch.label;
        const auto reads = std::count_if(
            launch.operands.begin(), launch.operands.end(),
            [](const kernels::Operand& operand) { return operand.name == "grad_out_max"; });
        EXPECT_EQ(reads, scale == Scale::given ? 1 : 0) << launch.label;
        if (scale == Scale::given) {
          EXPECT_EQ(define_of(launch, "GRAD_OUT_MAX_HEADS"), "1u") << launch.label;
        }
        EXPECT_FALSE(gpu::compile_glsl(spec_of(graph, launch)).empty());  // validated
      }
      EXPECT_EQ(backward, 4u);
    }
  }
}

// Which attention gradients find max |dO| themselves: those whose dK / dV kernel rereads few
// elements of dO (SmolLM2's 128 tokens, a decoder's few queries over a long encoder), not
// Whisper's encoder (1500 queries and keys, 24 key blocks each rereading every row of its head);
// MEGANEURA_ATTENTION_OWN_GRAD_SCALE decides for every shape, and a bad value names it.
TEST_F(CoopMatrixLowering, AttentionGradientsScaleThemselvesWhereTheyRereadLittle) {
  const auto scales_itself = [](const Shape& q, const Shape& kv) {
    Graph graph;
    const Tensor query = input(graph, "q", q), key = input(graph, "k", kv);
    const Tensor value = input(graph, "v", kv), seed = input(graph, "seed", q);
    const Tensor out = scaled_dot_product_attention(query, key, value, {.causal = q == kv});
    gradients(graph, out.id(), {query.id()}, seed.id());
    for (size_t i = 0; i < graph.size(); ++i) {
      if (graph.nodes()[i].op == op::attention_grad_q) {
        return kernels::attention_gradient_scales_itself(graph, graph.nodes()[i],
                                                         testing::switched(coop_device()));
      }
    }
    ADD_FAILURE() << "no attention_grad_q";
    return false;
  };
  const Shape smollm2{1, 9, 128, 64}, smollm2_kv{1, 3, 128, 64};
  const Shape whisper{1, 6, 1500, 64}, decoder{1, 6, 4, 64};
  EXPECT_TRUE(scales_itself(smollm2, smollm2_kv));
  EXPECT_TRUE(scales_itself(decoder, whisper));
  EXPECT_FALSE(scales_itself(whisper, whisper));
  {
    const ScopedSwitch always("MEGANEURA_ATTENTION_OWN_GRAD_SCALE", "1");
    EXPECT_TRUE(scales_itself(whisper, whisper));
  }
  {
    const ScopedSwitch never("MEGANEURA_ATTENTION_OWN_GRAD_SCALE", "0");
    EXPECT_FALSE(scales_itself(smollm2, smollm2_kv));
  }
  const ScopedSwitch bad("MEGANEURA_ATTENTION_OWN_GRAD_SCALE", "yes");
  try {
    scales_itself(smollm2, smollm2_kv);
    ADD_FAILURE() << "a bad value was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("MEGANEURA_ATTENTION_OWN_GRAD_SCALE='yes'"),
              std::string::npos)
        << error.what();
  }
}

// The layout check against fragments written out by hand: NVIDIA's (upper row's A components
// first) passes; the PTX register order of mma.m16n8k16 (A components 2, 3 in the lower row)
// and a layout with two lanes' accumulator rows swapped do not.
TEST(FragmentLayout, QuadRowLayoutIsRecognised) {
  gpu::FragmentLayout nvidia;
  for (int lane = 0; lane < 32; ++lane) {
    const int row = lane / 4, col = 2 * (lane % 4);
    for (int e = 0; e < 4; ++e)
      nvidia.accumulator[lane][e] = {static_cast<uint8_t>(row + 8 * (e / 2)),
                                     static_cast<uint8_t>(col + e % 2)};
    for (int e = 0; e < 8; ++e)
      nvidia.a[lane][e] = {static_cast<uint8_t>(row + 8 * (e / 4)),
                           static_cast<uint8_t>(col + 8 * ((e / 2) % 2) + e % 2)};
  }
  EXPECT_TRUE(gpu::is_quad_row_layout(nvidia));
  gpu::FragmentLayout ptx_order = nvidia;
  for (auto& lane : ptx_order.a) std::swap(lane[2], lane[4]), std::swap(lane[3], lane[5]);
  EXPECT_FALSE(gpu::is_quad_row_layout(ptx_order));
  gpu::FragmentLayout swapped = nvidia;
  std::swap(swapped.accumulator[0], swapped.accumulator[4]);
  EXPECT_FALSE(gpu::is_quad_row_layout(swapped));
}

// The workgroup GEMM (forced onto small products) in every transposition, K an odd and an
// even number of 64-deep steps: its two operand roundings compile to valid SPIR-V, and its
// product to valid NV SPIR-V whose KHR rewrite has three workgroup-scope matrix types, A
// 128 x 64 and B 64 x 256 in f16 and a 128 x 256 f32 accumulator, a column-major load per
// transposed operand and the row-major store of C.
TEST_F(CoopMatrixLowering, WorkgroupGemmCompilesToWorkgroupScopeKhr) {
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_GEMM", "1");
  target::DeviceTraits device = coop_device();
  device.workgroup_coop_matrix_f16 = true;
  for (const int64_t k : {192, 256}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      Graph graph;
      const Tensor a = input(graph, "a", ta ? Shape{k, 256} : Shape{256, k});
      const Tensor b = input(graph, "b", tb ? Shape{512, k} : Shape{k, 512});
      graph.set_output("y", matmul(a, b, ta, tb).id());
      const Graph rewritten =
          passes::workgroup_gemm(graph, vulkan::VulkanTarget(testing::switched(device)));
      int roundings = 0, products = 0;
      for (size_t i = 0; i < rewritten.size(); ++i) {
        if (rewritten.nodes()[i].is_leaf()) continue;
        for (const kernels::Launch& launch :
             kernels::lower_node(rewritten, static_cast<ValueId>(i), testing::switched(device))) {
          SCOPED_TRACE(launch.label + " K " + std::to_string(k) + " flags " +
                       std::to_string(flags));
          const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(rewritten, launch));
          if (launch.kernel == "round_to_f16") {
            ++roundings;
            continue;
          }
          ASSERT_EQ(launch.kernel, "gemm_workgroup_coopmat");
          ++products;
          EXPECT_TRUE(launch.khr_cooperative_matrix);
          EXPECT_EQ(define_of(launch, "ODD_STEPS"), k == 192 ? "1" : "0");
          const KhrMatrixUse use = khr_matrix_use(gpu::detail::nv_to_khr_cooperative_matrix(nv));
          constexpr uint32_t kWorkgroup = 2;  // scope
          EXPECT_EQ(use.types, (std::set<MatrixType>{{16, kWorkgroup, 128, 64, 0},
                                                     {16, kWorkgroup, 64, 256, 1},
                                                     {32, kWorkgroup, 128, 256, 2}}));
          // Each step loads both operands: three steps when K is 192 (two in the loop, one
          // after it), two when 256.
          EXPECT_EQ(std::count(use.load_layouts.begin(), use.load_layouts.end(), 1u),
                    (ta + tb) * (k == 192 ? 3 : 2));
          EXPECT_EQ(use.store_layouts, std::vector<uint32_t>{0}) << "one row-major store";
        }
      }
      EXPECT_EQ(roundings, 2);
      EXPECT_EQ(products, 1);
    }
  }
}

// The workgroup GEMM's two block forms, for products of f32 tensors (rounded operands, f32
// result) and of f16 tensors (F16_RESULT: the accumulators converted to f16 before the store),
// in every transposition. Where the device loads workgroup-scope matrices through tensor
// layouts: a 256 x 128 block held as two 128 x 128 accumulators one above the other, each
// multiplied by its half of A and the same B (SPLIT_ROWS), built with every load a tensor load;
// elsewhere: one 128 x 256 accumulator with plain loads. Both store row-major.
TEST_F(CoopMatrixLowering, WorkgroupGemmSplitsItsRowsWhereTensorLoadsExist) {
  constexpr uint32_t kWorkgroup = 2, kOpLoadKhr = 4457, kOpLoadTensor = 5367;
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_GEMM", "1");
  for (const bool tensor_loads : {true, false}) {
    target::DeviceTraits device = coop_device();
    device.workgroup_coop_matrix_f16 = true;
    device.workgroup_tensor_loads = tensor_loads;
    // 512 x 512 fits either block; 128 x 512 only the unsplit one; 256 x 128 only the split
    // one; 384 x 384 neither.
    const std::optional<kernels::WorkgroupGemmBlock> found =
        kernels::workgroup_gemm_block(512, 512, device);
    ASSERT_TRUE(found);
    const kernels::WorkgroupGemmBlock block = *found;
    EXPECT_EQ(block.split_rows, tensor_loads);
    EXPECT_EQ(block.m, tensor_loads ? 256 : 128);
    EXPECT_EQ(block.n, tensor_loads ? 128 : 256);
    EXPECT_FALSE(kernels::workgroup_gemm_block(128, 512, device)->split_rows);
    EXPECT_EQ(kernels::workgroup_gemm_block(256, 128, device).has_value(), tensor_loads);
    EXPECT_FALSE(kernels::workgroup_gemm_block(384, 384, device));
    // Planes of 3136 and 784 take the narrow forms where the device has them: 224 wide on 256
    // invocations and 112 wide on 128, 128 rows high or 64 where 128 do not divide M, none split
    // into rows.
    EXPECT_FALSE(kernels::workgroup_gemm_block(512, 784, device));
    target::DeviceTraits narrow = device;
    narrow.workgroup_narrow_blocks = true;
    for (const auto& [n, columns, invocations] :
         {std::tuple<int64_t, int64_t, int64_t>{3136, 224, 256}, {784, 112, 128}}) {
      for (const auto& [m, rows] :
           {std::pair<int64_t, int64_t>{128, 128}, {512, 128}, {64, 64}, {320, 64}}) {
        const std::optional<kernels::WorkgroupGemmBlock> found_narrow =
            kernels::workgroup_gemm_block(m, n, narrow);
        ASSERT_TRUE(found_narrow);
        EXPECT_EQ(found_narrow->m, rows);
        EXPECT_EQ(found_narrow->n, columns);
        EXPECT_EQ(found_narrow->invocations, invocations);
        EXPECT_FALSE(found_narrow->split_rows);
      }
    }
    EXPECT_FALSE(kernels::workgroup_gemm_block(96, 784, narrow));
    EXPECT_FALSE(kernels::workgroup_gemm_block(64, 512, narrow));
    EXPECT_EQ(kernels::workgroup_gemm_block(512, 512, narrow)->n, block.n);
    for (const DType dtype : {DType::f16, DType::f32}) {
      for (int flags = 0; flags < 4; ++flags) {
        const bool ta = flags & 1, tb = flags & 2;
        SCOPED_TRACE(std::string(tensor_loads ? "tensor loads " : "plain loads ") +
                     std::string(dtype_name(dtype)) + " flags " + std::to_string(flags));
        constexpr int64_t m = 512, n = 512, k = 192;
        Graph graph;
        const Tensor a = input(graph, "a", ta ? Shape{k, m} : Shape{m, k}, dtype);
        const Tensor b = input(graph, "b", tb ? Shape{n, k} : Shape{k, n}, dtype);
        graph.set_output("c", matmul(a, b, ta, tb).id());
        const Graph rewritten =
            dtype == DType::f16
                ? passes::half_storage(graph, vulkan::VulkanTarget(testing::switched(device)))
                : passes::workgroup_gemm(graph, vulkan::VulkanTarget(testing::switched(device)));
        const ValueId product = rewritten.output("c");
        ASSERT_EQ(rewritten.node(product).op, "half_matmul");
        const std::vector<kernels::Launch> launches =
            kernels::lower_node(rewritten, product, testing::switched(device));
        ASSERT_EQ(launches.size(), 1u);
        const kernels::Launch& launch = launches[0];
        ASSERT_EQ(launch.kernel, "gemm_workgroup_coopmat");
        EXPECT_EQ(define_of(launch, "F16_RESULT"), dtype == DType::f16 ? "1" : "0");
        EXPECT_EQ(define_of(launch, "SPLIT_ROWS"), tensor_loads ? "1" : "0");
        EXPECT_EQ(launch.tensor_loads, tensor_loads);
        EXPECT_EQ(launch.groups, (std::array<uint32_t, 3>{static_cast<uint32_t>(n / block.n),
                                                          static_cast<uint32_t>(m / block.m), 1}));
        gpu::KernelSpec spec = spec_of(rewritten, launch);
        spec.khr_cooperative_matrix = true;
        const KhrMatrixUse use =
            khr_matrix_use(gpu::detail::nv_to_khr_cooperative_matrix(gpu::compile_glsl(spec)));
        // A and the accumulators are 128 rows high in both forms.
        const uint32_t columns = static_cast<uint32_t>(block.n);
        std::set<MatrixType> types = {{16, kWorkgroup, 128, 64, 0},
                                      {16, kWorkgroup, 64, columns, 1},
                                      {32, kWorkgroup, 128, columns, 2}};
        if (dtype == DType::f16) types.insert({16, kWorkgroup, 128, columns, 2});
        EXPECT_EQ(use.types, types);
        // Three 64-deep steps, each loading B and A whole or in two halves.
        const size_t a_loads = tensor_loads ? 2 : 1, loads = 3 * (a_loads + 1);
        ASSERT_EQ(use.load_layouts.size(), loads);
        EXPECT_EQ(std::count(use.load_layouts.begin(), use.load_layouts.end(), 1u),
                  3 * (a_loads * ta + tb));
        EXPECT_EQ(use.store_layouts, std::vector<uint32_t>(a_loads, 0));
        if (!tensor_loads) continue;
        spec.matrix_loads = gpu::MatrixLoads::tensor_at_element;
        size_t plain = 0, tensor = 0;
        for (const auto& [opcode, operands] : instructions(gpu::compile_glsl(spec))) {
          plain += opcode == kOpLoadKhr;
          tensor += opcode == kOpLoadTensor;
        }
        EXPECT_EQ(plain, 0u);
        EXPECT_EQ(tensor, loads);
      }
    }
  }
}

// MEGANEURA_WORKGROUP_BLOCK forces the workgroup GEMM's block wherever it divides M and N and
// the device runs it (DeviceTraits::workgroup_forced_block); elsewhere the built-in choice
// stands. A forced 128 x 128 block on 128 invocations lowers to that block and compiles to
// workgroup-scope matrices of its shape.
TEST_F(CoopMatrixLowering, WorkgroupBlockSwitchForcesTheBlockWhereItDividesAndRuns) {
  constexpr uint32_t kWorkgroup = 2;
  const ScopedSwitch forced_gemm("MEGANEURA_WORKGROUP_GEMM", "1");
  target::DeviceTraits device = coop_device();
  device.workgroup_coop_matrix_f16 = true;
  device.workgroup_tensor_loads = true;
  device.workgroup_forced_block = true;
  {
    const ScopedSwitch forced("MEGANEURA_WORKGROUP_BLOCK", "256,256,256,1");
    const target::DeviceTraits switched = testing::switched(device);
    const std::optional<kernels::WorkgroupGemmBlock> block =
        kernels::workgroup_gemm_block(512, 512, switched);
    ASSERT_TRUE(block);
    EXPECT_EQ(std::tuple(block->m, block->n, block->invocations, block->split_rows),
              std::tuple(int64_t{256}, int64_t{256}, int64_t{256}, true));
    // 256 does not divide N = 128: the built-in 256 x 128 block.
    EXPECT_EQ(kernels::workgroup_gemm_block(256, 128, switched)->n, 128);
    // A device without the form keeps the built-in block everywhere.
    target::DeviceTraits without_form = switched;
    without_form.workgroup_forced_block = false;
    EXPECT_EQ(kernels::workgroup_gemm_block(512, 512, without_form)->n, 128);
  }
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_BLOCK", "128,128,128");
  const target::DeviceTraits switched = testing::switched(device);
  constexpr int64_t m = 512, n = 384, k = 192;
  Graph graph;
  const Tensor a = input(graph, "a", Shape{m, k});
  const Tensor b = input(graph, "b", Shape{k, n});
  graph.set_output("c", matmul(a, b).id());
  const Graph rewritten = passes::workgroup_gemm(graph, vulkan::VulkanTarget(switched));
  const ValueId product = rewritten.output("c");
  ASSERT_EQ(rewritten.node(product).op, "half_matmul");
  const std::vector<kernels::Launch> launches = kernels::lower_node(rewritten, product, switched);
  ASSERT_EQ(launches.size(), 1u);
  const kernels::Launch& launch = launches[0];
  EXPECT_EQ(define_of(launch, "BLOCK_M"), "128");
  EXPECT_EQ(define_of(launch, "BLOCK_N"), "128");
  EXPECT_EQ(define_of(launch, "INVOCATIONS"), "128");
  EXPECT_EQ(define_of(launch, "SPLIT_ROWS"), "0");
  EXPECT_FALSE(launch.tensor_loads);
  EXPECT_EQ(launch.groups, (std::array<uint32_t, 3>{n / 128, m / 128, 1}));
  gpu::KernelSpec spec = spec_of(rewritten, launch);
  spec.khr_cooperative_matrix = true;
  const KhrMatrixUse use =
      khr_matrix_use(gpu::detail::nv_to_khr_cooperative_matrix(gpu::compile_glsl(spec)));
  EXPECT_EQ(use.types, (std::set<MatrixType>{{16, kWorkgroup, 128, 64, 0},
                                             {16, kWorkgroup, 64, 128, 1},
                                             {32, kWorkgroup, 128, 128, 2}}));
  // A forced block 64 wide cannot store a product's f16 result (its f16 accumulator would have
  // A's type): the workgroup GEMM leaves such a product to the subgroup GEMM, and takes it with
  // the 128 x 128 block.
  const ScopedSwitch narrow("MEGANEURA_WORKGROUP_BLOCK", "128,64,256");
  Graph halves;
  const Tensor a16 = input(halves, "a", Shape{m, k}, DType::f16);
  const Tensor b16 = input(halves, "b", Shape{k, n}, DType::f16);
  halves.set_output("c", matmul(a16, b16).id());
  const Node& half_product = halves.node(halves.output("c"));
  EXPECT_FALSE(kernels::workgroup_gemm_writes_half_result(halves, half_product,
                                                          testing::switched(device)));
  EXPECT_FALSE(kernels::workgroup_gemm_takes_f16_product(halves, half_product,
                                                         testing::switched(device)));
  EXPECT_TRUE(kernels::workgroup_gemm_takes_f16_product(halves, half_product, switched));
  EXPECT_TRUE(kernels::workgroup_gemm_writes_half_result(halves, half_product, switched));
}

// The opening of the hand-written kernels below: NV matrices of f16 operands, a subgroup of
// invocations, the f32 buffer `data` (and f16 storage, which some declare).
constexpr const char* kTestKernelOpening = R"(
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer Data { float data[]; };
)";

// KHR converts only between matrices of one use, so the rewrite gives a matrix converted into
// an operand that operand's use: here an f32 16 x 16 matrix loaded and converted to f16 before
// it multiplies as A (as bench/coop_probe's f32-operand workgroup GEMM does).
TEST(CoopMatrixRewrite, UsesCarryThroughConversions) {
  gpu::KernelSpec spec;
  spec.label = "converted A";
  spec.binding_count = 1;
  spec.source = std::string(kTestKernelOpening) + R"(
void main() {
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> a_wide;
  coopMatLoadNV(a_wide, data, 0, 16, false);
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
  coopMatLoadNV(b, data, 256, 4, false);
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  acc = coopMatMulAddNV(fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(a_wide), b, acc);
  coopMatStoreNV(acc, data, 512, 8, false);
}
)";
  constexpr uint32_t kSubgroup = 3;  // scope
  EXPECT_EQ(
      khr_matrix_use(gpu::detail::nv_to_khr_cooperative_matrix(gpu::compile_glsl(spec))).types,
      (std::set<MatrixType>{{32, kSubgroup, 16, 16, 0},
                            {16, kSubgroup, 16, 16, 0},
                            {16, kSubgroup, 16, 8, 1},
                            {32, kSubgroup, 16, 8, 2}}));
}

// A kernel's f16 constants become the bfloat16 of their value, rounded to nearest with ties to
// even: 1.5 (f16 0x3E00) exactly 0x3FC0, 0.0999755859375 (0x2E66, f32 0x3DCCC000) up to 0x3DCD,
// and -0.3330078125 (0xB554, f32 0xBEAA8000, a tie) to the even 0xBEAA.
TEST(CoopMatrixRewrite, Bf16ConstantsKeepTheirValue) {
  gpu::KernelSpec spec;
  spec.label = "bfloat16 constants";
  spec.binding_count = 1;
  spec.khr_cooperative_matrix = true;
  spec.bf16_operands = true;
  spec.source = std::string(kTestKernelOpening) + R"(
shared float16_t tile[256];
void main() {
  tile[gl_LocalInvocationID.x] = float16_t(1.5);
  tile[gl_LocalInvocationID.x + 32] = float16_t(0.0999755859375);
  tile[gl_LocalInvocationID.x + 64] = float16_t(data[gl_LocalInvocationID.x]);
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
  coopMatLoadNV(a, tile, 0, 16, false);
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b =
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>(float16_t(-0.3330078125));
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  acc = coopMatMulAddNV(a, b, acc);
  coopMatStoreNV(acc, data, 0, 8, false);
}
)";
  const std::vector<uint32_t> module = gpu::compile_glsl(spec);
  expect_bf16_module(module, spec.label);
  constexpr uint32_t kOpTypeFloat = 22, kOpConstant = 43;
  std::set<uint32_t> half_types, constants;
  for (const auto& [opcode, operands] : instructions(module)) {
    if (opcode == kOpTypeFloat && operands[1] == 16) half_types.insert(operands[0]);
    if (opcode == kOpConstant && half_types.count(operands[0])) constants.insert(operands[2]);
  }
  EXPECT_EQ(constants, (std::set<uint32_t>{0x3FC0, 0x3DCD, 0xBEAA}));
}

// What bfloat16 operands cannot be: f16 arithmetic (SPV_KHR_bfloat16 allows none) and f16
// tensors in memory, which would be misread; each refused by name rather than miscompiled. A
// buffer marked as holding bfloat16 values (KernelSpec::bf16_buffers, the workgroup GEMM's bf16
// operands) is read as such, and arithmetic on its values is still refused.
TEST(CoopMatrixRewrite, Bf16RefusesF16ArithmeticAndF16Memory) {
  // `body` starts main(); the f16 buffer is declared only where `f16_buffer`.
  const auto refusal = [](const std::string& body, bool f16_buffer = false,
                          bool holds_bfloat16 = false) {
    gpu::KernelSpec spec;
    spec.label = "refused";
    spec.binding_count = f16_buffer ? 2 : 1;
    spec.khr_cooperative_matrix = true;
    spec.bf16_operands = true;
    spec.bf16_buffers = holds_bfloat16;
    spec.source =
        std::string(kTestKernelOpening) +
        (f16_buffer ? "layout(set = 0, binding = 1) buffer Halves { float16_t halves[]; };\n"
                    : "") +
        R"(
shared float16_t tile[256];
void main() {
)" + body +
        R"(
  barrier();
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
  coopMatLoadNV(a, tile, 0, 16, false);
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
  coopMatLoadNV(b, tile, 0, 8, false);
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> acc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>(0.0);
  acc = coopMatMulAddNV(a, b, acc);
  coopMatStoreNV(acc, data, 0, 8, false);
}
)";
    try {
      gpu::compile_glsl(spec);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("tile[gl_LocalInvocationID.x] = float16_t(data[0]) * float16_t(data[1]);")
                .find("computes with f16 values"),
            std::string::npos);
  EXPECT_NE(refusal("tile[gl_LocalInvocationID.x] = halves[gl_LocalInvocationID.x];", true)
                .find("f16 memory"),
            std::string::npos);
  EXPECT_EQ(refusal("tile[gl_LocalInvocationID.x] = float16_t(data[gl_LocalInvocationID.x]);"),
            "accepted");
  EXPECT_EQ(refusal("tile[gl_LocalInvocationID.x] = halves[gl_LocalInvocationID.x];", true, true),
            "accepted");
  EXPECT_NE(refusal("tile[gl_LocalInvocationID.x] = halves[0] * halves[1];", true, true)
                .find("computes with f16 values"),
            std::string::npos);
}

// The workgroup GEMM's launch for C [m, n] = A B (A stored transposed where `ta`, B where `tb`),
// forced onto the workgroup pass, as a KHR spec with the given loads; `groups` receives its grid.
gpu::KernelSpec workgroup_gemm_spec(int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                                    gpu::MatrixLoads loads,
                                    std::array<uint32_t, 3>* groups = nullptr) {
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_GEMM", "1");
  target::DeviceTraits device = coop_device();
  device.workgroup_coop_matrix_f16 = true;
  Graph graph;
  const Tensor a = input(graph, "a", ta ? Shape{k, m} : Shape{m, k});
  const Tensor b = input(graph, "b", tb ? Shape{n, k} : Shape{k, n});
  graph.set_output("c", matmul(a, b, ta, tb).id());
  const Graph rewritten =
      passes::workgroup_gemm(graph, vulkan::VulkanTarget(testing::switched(device)));
  for (size_t i = 0; i < rewritten.size(); ++i) {
    if (rewritten.nodes()[i].is_leaf()) continue;
    for (const kernels::Launch& launch :
         kernels::lower_node(rewritten, static_cast<ValueId>(i), testing::switched(device))) {
      if (launch.kernel != "gemm_workgroup_coopmat") continue;
      gpu::KernelSpec spec = spec_of(rewritten, launch);
      spec.khr_cooperative_matrix = true;
      spec.matrix_loads = loads;
      if (groups) *groups = launch.groups;
      return spec;
    }
  }
  ADD_FAILURE() << "no workgroup GEMM launch";
  return {};
}

// The tensor-addressing rewrite checked against the plain KHR module it starts from (no driver
// here has the extension; GpuCoopMatrix.TensorAddressingLoadsReadTheSameOperands runs them):
// every load keeps its result id and matrix type and becomes a tensor load whose layout is the
// stored matrix (rows x columns, or columns x rows read through the (1, 0) view where the load
// was column-major) with the load's stride, either at the loaded element or from the buffer's
// first element with the element's row and column (element / stride, element % stride) as the
// slice; the capabilities, extensions and layout types are declared, every id is below the bound.
TEST(CoopMatrixRewrite, TensorLoadsReadWhatThePlainLoadsRead) {
  constexpr uint32_t kOpExtension = 10, kOpCapability = 17, kOpConstant = 43, kOpAccessChain = 65,
                     kOpIAdd = 128, kOpUDiv = 134, kOpUMod = 137;
  constexpr uint32_t kOpTypeMatrixKhr = 4456, kOpLoadKhr = 4457, kOpLoadTensor = 5367,
                     kOpTypeLayout = 5370, kOpTypeView = 5371, kOpCreateLayout = 5372,
                     kOpSetDimension = 5373, kOpSetStride = 5374, kOpSlice = 5375,
                     kOpCreateView = 5377;
  using Operands = std::vector<uint32_t>;
  for (const gpu::MatrixLoads loads :
       {gpu::MatrixLoads::tensor_at_element, gpu::MatrixLoads::tensor_at_buffer_start}) {
    const bool from_start = loads == gpu::MatrixLoads::tensor_at_buffer_start;
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      SCOPED_TRACE(std::string(from_start ? "from the buffer start" : "at the element") +
                   " flags " + std::to_string(flags));
      const gpu::KernelSpec tensor_spec = workgroup_gemm_spec(256, 512, 192, ta, tb, loads);
      gpu::KernelSpec plain_spec = tensor_spec;
      plain_spec.matrix_loads = gpu::MatrixLoads::plain;
      const auto plain = instructions(gpu::compile_glsl(plain_spec));
      const std::vector<uint32_t> module = gpu::compile_glsl(tensor_spec);
      const auto rewritten = instructions(module);

      std::map<uint32_t, uint32_t> constant_value;
      std::map<uint32_t, Operands> plain_loads, matrix_shape, chains;
      for (const auto& [opcode, operands] : plain) {
        if (opcode == kOpConstant) constant_value[operands[1]] = operands[2];
        if (opcode == kOpLoadKhr) plain_loads[operands[1]] = operands;
        if (opcode == kOpTypeMatrixKhr) matrix_shape[operands[0]] = {operands[3], operands[4]};
        if (opcode == kOpAccessChain) chains[operands[1]] = operands;
      }
      // Three steps (K 192, 64 deep) of two loads.
      ASSERT_EQ(plain_loads.size(), 6u);

      const uint32_t bound = module.at(3);
      std::map<uint32_t, std::pair<uint32_t, Operands>> defined;  // result id -> instruction
      std::set<uint32_t> capabilities;
      std::set<std::string> extensions;
      std::vector<Operands> tensor_loads;
      Operands layout_type, view_type;
      for (const auto& [opcode, operands] : rewritten) {
        EXPECT_NE(opcode, kOpLoadKhr) << "a plain load left";
        if (opcode == kOpCapability) capabilities.insert(operands[0]);
        if (opcode == kOpExtension)
          extensions.insert(reinterpret_cast<const char*>(operands.data()));
        if (opcode == kOpConstant) constant_value[operands[1]] = operands[2];
        if (opcode == kOpTypeLayout) layout_type = operands;
        if (opcode == kOpTypeView) view_type = operands;
        if (opcode == kOpLoadTensor) tensor_loads.push_back(operands);
        if (operands.size() >= 2) defined[operands[1]] = {opcode, operands};
        if (opcode == kOpLoadTensor || opcode == kOpCreateLayout || opcode == kOpSlice) {
          for (uint32_t id : operands) EXPECT_LT(id, bound);
        }
      }
      EXPECT_TRUE(capabilities.count(5439) && capabilities.count(5433));
      EXPECT_TRUE(extensions.count("SPV_NV_tensor_addressing") &&
                  extensions.count("SPV_NV_cooperative_matrix2"));
      ASSERT_EQ(layout_type.size(), 3u);
      EXPECT_EQ(constant_value.at(layout_type[1]), 2u) << "two dimensions";
      EXPECT_EQ(constant_value.at(layout_type[2]), 0u) << "no clamping";
      ASSERT_EQ(view_type.size(), 5u);
      EXPECT_EQ(constant_value.at(view_type[1]), 2u);
      EXPECT_EQ(constant_value.at(view_type[3]), 1u) << "the view swaps the dimensions";
      EXPECT_EQ(constant_value.at(view_type[4]), 0u);
      ASSERT_EQ(tensor_loads.size(), plain_loads.size());

      const auto instruction = [&](uint32_t id, uint32_t opcode) -> const Operands& {
        const auto& [found, operands] = defined.at(id);
        EXPECT_EQ(found, opcode) << "id " << id;
        return operands;
      };
      const auto value = [&](uint32_t id) { return constant_value.at(id); };
      int column_major = 0;
      for (const Operands& load : tensor_loads) {
        // type, result, pointer, object, layout, memory operand, addressing operands [, view]
        const Operands& before = plain_loads.at(load[1]);
        EXPECT_EQ(load[0], before[0]) << "matrix type";
        const bool transposed = value(before[3]) == 1;
        column_major += transposed;
        const Operands& shape = matrix_shape.at(before[0]);
        const uint32_t rows = value(shape[transposed ? 1 : 0]);
        const uint32_t columns = value(shape[transposed ? 0 : 1]);
        const uint32_t stride = before[4];
        const Operands& slice = instruction(load[4], kOpSlice);
        const Operands& strided = instruction(slice[2], kOpSetStride);
        const Operands& sized = instruction(strided[2], kOpSetDimension);
        instruction(sized[2], kOpCreateLayout);
        EXPECT_EQ(strided[3], stride);
        EXPECT_EQ(value(strided[4]), 1u);
        EXPECT_EQ(value(slice[4]), rows);
        EXPECT_EQ(value(slice[6]), columns);
        const uint32_t element = chains.at(before[2]).back();
        if (from_start) {
          const Operands& start = instruction(load[2], kOpAccessChain);
          EXPECT_EQ(start[2], chains.at(before[2])[2]) << "same buffer";
          EXPECT_EQ(value(start.back()), 0u) << "its first element";
          const Operands& row = instruction(slice[3], kOpUDiv);
          const Operands& column = instruction(slice[5], kOpUMod);
          EXPECT_EQ(Operands(row.begin() + 2, row.end()), (Operands{element, stride}));
          EXPECT_EQ(Operands(column.begin() + 2, column.end()), (Operands{element, stride}));
          const Operands& extent = instruction(sized[3], kOpIAdd);
          EXPECT_EQ(Operands(extent.begin() + 2, extent.end()), (Operands{slice[3], slice[4]}));
          EXPECT_EQ(sized[4], stride);
        } else {
          EXPECT_EQ(load[2], before[2]) << "the loaded element";
          EXPECT_EQ(value(slice[3]), 0u);
          EXPECT_EQ(value(slice[5]), 0u);
          EXPECT_EQ(value(sized[3]), rows);
          EXPECT_EQ(value(sized[4]), columns);
        }
        ASSERT_EQ(load.size(), transposed ? 8u : 7u);
        EXPECT_EQ(load[5], 0u) << "no memory operand";
        EXPECT_EQ(load[6], transposed ? 1u : 0u) << "the TensorView operand";
        if (transposed) instruction(load[7], kOpCreateView);
      }
      EXPECT_EQ(column_major, 3 * (ta + tb));
    }
  }
}

// Only the kernels written for f16 values (the conversions, the f16 GEMMs, pointwise kernels,
// which convert at their loads and stores) declare f16 buffers; any other kernel given one (here
// a softmax) names the operand and its dtype instead of compiling against values it was not
// written for.
TEST_F(CoopMatrixLowering, F16BuffersOnlyForKernelsWrittenForThem) {
  Graph graph;
  const Tensor x = input(graph, "x", {4, 4}, DType::f16);
  const Tensor y = softmax(x, -1);
  graph.set_output("y", y.id());
  const std::vector<kernels::Launch> launches =
      kernels::lower_node(graph, y.id(), testing::switched(coop_device()));
  ASSERT_EQ(launches.size(), 1u);
  try {
    kernels::buffer_declarations(graph, launches[0]);
    ADD_FAILURE() << "an f16 operand was declared for " << launches[0].kernel;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("has dtype f16"), std::string::npos) << error.what();
  }
}

// A device without f16 storage buffers and f16 arithmetic refuses f16 tensors by name, whether
// their conversions fuse into a pointwise kernel or run on their own (fusion off).
TEST_F(CoopMatrixLowering, F16TensorsRefusedWithoutF16Support) {
  Graph graph;
  const Tensor x = input(graph, "x", {8}, DType::f16);
  graph.set_output("y", relu(x + x).id());
  target::DeviceTraits device = coop_device();
  device.f16_tensors = false;
  device.name = "a GPU without f16";
  const Graph stored = passes::half_storage(graph, vulkan::VulkanTarget(testing::switched(device)));
  for (const char* fusion_off : {"0", "1"}) {
    const ScopedSwitch fusion("MEGANEURA_NO_FUSION", fusion_off);
    try {
      kernels::lower_graph(stored, testing::switched(device));
      ADD_FAILURE() << "f16 tensors were lowered for a device without f16";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("an f16 tensor, which needs f16 storage buffers and f16 arithmetic"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("'a GPU without f16'"), std::string::npos) << message;
      EXPECT_NE(message.find(fusion_off[0] == '0' ? "reads or writes" : "converts from"),
                std::string::npos)
          << message;
    }
  }
}

// Loads of a subgroup-scope GEMM over operands whose contiguous extents are `a_run` and `b_run`,
// f16 where `half_a` / `half_b`: an f16 operand eight halves at a time (stored to shared memory as
// they are) where its extent is a multiple of 8, four at a time where it is a multiple of 4; an
// f32 one as vec4s where its extent is a multiple of 4. It compiles to valid NV SPIR-V and
// well-formed KHR SPIR-V.
void expect_operand_loads(const Graph& graph, const kernels::Launch& launch, int64_t a_run,
                          int64_t b_run, bool half_a, bool half_b) {
  const bool a_units = half_a && a_run % 8 == 0, b_units = half_b && b_run % 8 == 0;
  EXPECT_EQ(define_of(launch, "HALF_A_UNITS"), a_units ? "1" : "0");
  EXPECT_EQ(define_of(launch, "HALF_B_UNITS"), b_units ? "1" : "0");
  EXPECT_EQ(launch.body.find("a_units") != std::string::npos, a_units);
  EXPECT_EQ(launch.body.find("b_units") != std::string::npos, b_units);
  EXPECT_EQ(launch.body.find("a_halves4") != std::string::npos,
            half_a && !a_units && a_run % 4 == 0);
  EXPECT_EQ(launch.body.find("b_halves4") != std::string::npos,
            half_b && !b_units && b_run % 4 == 0);
  EXPECT_EQ(launch.body.find("vec4 load_a4") != std::string::npos, !a_units && a_run % 4 == 0);
  EXPECT_EQ(launch.body.find("vec4 load_b4") != std::string::npos, !b_units && b_run % 4 == 0);
  const std::string declarations = kernels::buffer_declarations(graph, launch);
  EXPECT_NE(declarations.find(half_a ? "float16_t a[]" : "float a[]"), std::string::npos)
      << declarations;
  EXPECT_NE(declarations.find(half_b ? "float16_t b[]" : "float b[]"), std::string::npos)
      << declarations;
  const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
  expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                    gemm_column_major_loads(launch));
}

// A product of f16 tensors into an f16 result that the workgroup GEMM does not take runs on the
// subgroup-scope GEMM as it is: one launch with f16 buffers, reading the operands as halves and
// rounding each stored value to f16 (never storing f32 fragments straight into the f16 result),
// in every transposition. A half product of one f16 and one f32 operand (passes/half_products.cpp)
// reads each operand by its own type and extent into an f32 result.
TEST_F(CoopMatrixLowering, HalfMatmulOnSubgroupsReadsAndWritesF16) {
  for (const auto& [m, n, k] : {std::tuple{128, 192, 96}, std::tuple{132, 68, 36},
                                std::tuple{130, 66, 34}, std::tuple{50, 96, 200}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      const int64_t a_run = ta ? m : k, b_run = tb ? k : n;
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                   " flags " + std::to_string(flags));
      Graph graph;
      const Tensor a = input(graph, "a", ta ? Shape{k, m} : Shape{m, k}, DType::f16);
      const Tensor b = input(graph, "b", tb ? Shape{n, k} : Shape{k, n}, DType::f16);
      graph.set_output("c", matmul(a, b, ta, tb).id());
      const Graph stored =
          passes::half_storage(graph, vulkan::VulkanTarget(testing::switched(coop_device())));
      const ValueId product = stored.output("c");
      ASSERT_EQ(stored.node(product).op, "half_matmul");
      const std::vector<kernels::Launch> launches =
          kernels::lower_node(stored, product, testing::switched(coop_device()));
      ASSERT_EQ(launches.size(), 1u);
      const kernels::Launch& launch = launches[0];
      EXPECT_EQ(launch.kernel, "gemm_coopmat");
      EXPECT_TRUE(launch.f16_operands);
      const std::string declarations = kernels::buffer_declarations(stored, launch);
      EXPECT_NE(declarations.find("float16_t c[]"), std::string::npos) << declarations;
      EXPECT_NE(launch.body.find("= float16_t(value)"), std::string::npos);
      EXPECT_EQ(define_of(launch, "DIRECT_STORE"), "0");
      expect_operand_loads(stored, launch, a_run, b_run, true, true);

      for (const bool half_a : {false, true}) {
        SCOPED_TRACE(half_a ? "A f16, B f32" : "A f32, B f16");
        Graph mixed;
        const Tensor x =
            input(mixed, "a", ta ? Shape{k, m} : Shape{m, k}, half_a ? DType::f16 : DType::f32);
        const Tensor y =
            input(mixed, "b", tb ? Shape{n, k} : Shape{k, n}, half_a ? DType::f32 : DType::f16);
        const ValueId half_product =
            mixed.add("half_matmul", {x.id(), y.id()},
                      {{"transpose_a", int64_t{ta}}, {"transpose_b", int64_t{tb}}});
        mixed.set_output("c", half_product);
        const std::vector<kernels::Launch> mixed_launches =
            kernels::lower_node(mixed, half_product, testing::switched(coop_device()));
        ASSERT_EQ(mixed_launches.size(), 1u);
        EXPECT_TRUE(mixed_launches[0].f16_operands);
        expect_operand_loads(mixed, mixed_launches[0], a_run, b_run, half_a, !half_a);
      }
    }
  }
}

// The node of coop_graph() whose op is `op` (it has one).
ValueId node_of(const Graph& graph, const std::string& op) {
  for (size_t i = 0; i < graph.size(); ++i)
    if (graph.nodes()[i].op == op) return static_cast<ValueId>(i);
  ADD_FAILURE() << "no " << op << " node";
  return kNoValue;
}

// The one launch of `producer` that writes `companion` too, as its last binding; it compiles to
// valid NV SPIR-V and well-formed KHR SPIR-V with `column_major_loads` column-major loads.
kernels::Launch companion_launch(const Graph& graph, ValueId producer, ValueId companion,
                                 int column_major_loads) {
  EXPECT_TRUE(
      kernels::can_write_companion(graph, producer, companion, testing::switched(coop_device())));
  std::vector<kernels::Launch> launches = kernels::lower_with_companions(
      graph, producer, {companion}, testing::switched(coop_device()));
  EXPECT_EQ(launches.size(), 1u);
  const kernels::Launch& launch = launches.front();
  EXPECT_EQ(launch.operands.back().value, companion);
  EXPECT_TRUE(launch.operands.back().write);
  const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
  expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                    column_major_loads);
  return launch;
}

// With its attention_lse in the graph, the forward writes the log-sum-exp too (WITH_LSE=1), and
// that variant compiles as well.
TEST_F(CoopMatrixLowering, ForwardWritingTheLogSumExpCompiles) {
  const Graph graph = coop_graph();
  const kernels::Launch launch = companion_launch(
      graph, node_of(graph, "scaled_dot_product_attention"), node_of(graph, "attention_lse"), 1);
  EXPECT_EQ(launch.kernel, "attention_forward_coopmat");
  EXPECT_EQ(define_of(launch, "WITH_LSE"), "1");
}

// dV as the companion of the dK launch over the same inputs (WITH_GRAD_V=1), unless
// MEGANEURA_ATTENTION_FUSED_KV=0; that variant compiles as well, and reads Q^T and dO^T
// column-major, as dK alone does.
TEST_F(CoopMatrixLowering, KeyAndValueGradientsInOneLaunchCompile) {
  const Graph graph = coop_graph();
  const ValueId grad_k = node_of(graph, "attention_grad_k"),
                grad_v = node_of(graph, "attention_grad_v");
  {
    const testing::ScopedSwitch separate("MEGANEURA_ATTENTION_FUSED_KV", "0");
    EXPECT_FALSE(
        kernels::can_write_companion(graph, grad_k, grad_v, testing::switched(coop_device())));
  }
  const kernels::Launch launch = companion_launch(graph, grad_k, grad_v, 2);
  EXPECT_EQ(launch.kernel, "attention_grad_kv_coopmat");
  EXPECT_EQ(define_of(launch, "GRAD_K"), "1");
  EXPECT_EQ(define_of(launch, "WITH_GRAD_V"), "1");
}

// Every attention kernel over slices (passes/split_attention.cpp, forced to 2: the forward and
// dQ over two slices of 64 keys, dK and dV over two of 64 queries; each workgroup z one slice),
// and with dK and dV over each query head of a group apart too, compiles to valid NV and
// well-formed KHR SPIR-V.
TEST_F(CoopMatrixLowering, SlicedAttentionKernelsCompile) {
  Graph graph;
  const Tensor q = input(graph, "q", {1, 2, 70, 32});
  const Tensor k = input(graph, "k", {1, 1, 100, 32});
  const Tensor v = input(graph, "v", {1, 1, 100, 16});
  output_with_gradients(graph, scaled_dot_product_attention(q, k, v, {.causal = true}),
                        input(graph, "seed", {1, 2, 70, 16}), {q, k, v});
  const ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "2");
  // Then dK and dV over each of the group's two query heads apart as well (workgroup z: slice
  // z % 2 of head z / 2).
  for (const char* heads : {"0", "1"}) {
    const ScopedSwitch head_splits("MEGANEURA_ATTENTION_HEAD_SPLITS", heads);
    const Graph split = passes::split_attention(
        graph, vulkan::VulkanTarget(testing::switched(target::DeviceTraits{})));
    const std::vector<kernels::Launch> launches = coop_launches(split, coop_device());
    ASSERT_EQ(launches.size(), 5u);  // forward, log-sum-exp (whole), dQ, dK, dV
    for (const kernels::Launch& launch : launches) {
      SCOPED_TRACE(launch.label + " head splits " + heads);
      const bool whole = launch.label.starts_with("attention_lse ");
      const bool key_owned = launch.label.starts_with("attention_grad_k ") ||
                             launch.label.starts_with("attention_grad_v ");
      const bool heads_apart = key_owned && std::string(heads) == "1";
      EXPECT_EQ(define_of(launch, "SPLITS"), whole ? "1" : "2");
      EXPECT_EQ(define_of(launch, "HEAD_SPLITS"), heads_apart ? "2u" : "1u");
      if (!whole) {
        EXPECT_EQ(define_of(launch, "SLICE"), "64u");
      }
      EXPECT_EQ(launch.groups[2], whole ? 1u : heads_apart ? 4u : 2u);
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(split, launch));  // validated
      const bool grad_k = launch.label.starts_with("attention_grad_k ");
      expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                        launch.kernel == "attention_grad_q_coopmat" || grad_k ? 2 : 1);
    }
  }
}

// A product that reads a split attention's result with the heads after the queries (a
// multi-head layer's output projection) joins the slices itself as it loads A: its launch binds
// the forward's partials, not the combine's result, and compiles to valid NV and well-formed KHR
// SPIR-V, with vec4 loads of A (value width 16) and with four elements that may span two heads
// (width 6).
TEST_F(CoopMatrixLowering, ProductJoiningKeySlicesCompiles) {
  const ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "2");
  for (const int64_t value_dim : {16, 6}) {
    SCOPED_TRACE("value width " + std::to_string(value_dim));
    Graph graph;
    const Tensor q = input(graph, "q", {1, 2, 70, 32});
    const Tensor k = input(graph, "k", {1, 1, 100, 32});
    const Tensor v = input(graph, "v", {1, 1, 100, value_dim});
    const Tensor heads = scaled_dot_product_attention(q, k, v, {.causal = true});
    const Tensor moved = reshape(transpose(heads, {0, 2, 1, 3}), {70, 2 * value_dim});
    graph.set_output("y", matmul(moved, input(graph, "w", {2 * value_dim, 64})).id());
    const Graph split = passes::split_attention(
        graph, vulkan::VulkanTarget(testing::switched(target::DeviceTraits{})));
    ValueId forward = kNoValue, product = kNoValue;
    for (size_t i = 0; i < split.size(); ++i) {
      const std::string& op = split.nodes()[i].op;
      if (op == op::scaled_dot_product_attention) forward = static_cast<ValueId>(i);
      if (op == op::matmul) product = static_cast<ValueId>(i);
    }
    ASSERT_NE(forward, kNoValue);
    ASSERT_NE(product, kNoValue);
    const std::vector<kernels::Launch> launches =
        kernels::lower_node(split, product, testing::switched(coop_device()));
    ASSERT_EQ(launches.size(), 1u);
    const kernels::Launch& launch = launches[0];
    EXPECT_EQ(launch.kernel, "gemm_coopmat");
    EXPECT_EQ(launch.operands.at(0).value, forward);
    const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(split, launch));  // validated
    expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label, 0);
  }
}

// An attention forward whose output only a transpose reads, moving the heads after the queries,
// writes the transposed value itself (HEADS_LAST), and one whose queries are an index chain's
// value (a projection split into heads, moved, rotated) computes the chain as it loads them
// (Q_CHAIN): one launch for the chain, the forward and the transpose, binding the transpose as
// its result and the chain's input, whose kernel compiles to valid NV and well-formed KHR
// SPIR-V, staged and in registers, each fusion alone and both. A chain that sums split-K
// partials keeps its own launch. In training the forward writes the transposed value beside its
// own output and log-sum-exp (HEADS_LAST_COPY).
TEST_F(CoopMatrixLowering, AttentionForwardFusionsCompile) {
  {
    Graph graph;
    const Tensor partials = input(graph, "partials", {3, 40, 4 * 32});
    const Tensor q = rope(transpose(reshape(sum(partials, {0}), {1, 40, 4, 32}), {0, 2, 1, 3}));
    graph.set_output("y", scaled_dot_product_attention(q, input(graph, "k", {1, 2, 70, 32}),
                                                       input(graph, "v", {1, 2, 70, 16}))
                              .id());
    const std::vector<kernels::Launch> launches =
        kernels::lower_graph(graph, testing::switched(coop_device()));
    ASSERT_EQ(launches.size(), 2u);
    EXPECT_EQ(launches[1].kernel, "attention_forward_coopmat");
    EXPECT_EQ(define_of(launches[1], "Q_CHAIN"), "0");
  }
  for (const bool chained : {false, true}) {
    for (const bool heads_last : {false, true}) {
      if (!chained && !heads_last) continue;
      Graph graph;
      const Tensor projected = input(graph, "projected", {1, 40, 4 * 32});
      const Tensor q = chained ? rope(transpose(reshape(projected, {1, 40, 4, 32}), {0, 2, 1, 3}))
                               : input(graph, "q", {1, 4, 40, 32});
      const Tensor k = input(graph, "k", {1, 2, 70, 32});
      const Tensor v = input(graph, "v", {1, 2, 70, 16});
      const Tensor y = scaled_dot_product_attention(q, k, v);
      const Tensor result = heads_last ? transpose(y, {0, 2, 1, 3}) : y;
      graph.set_output("y", result.id());
      for (const bool quad_rows : {false, true}) {
        SCOPED_TRACE(std::string(chained ? "chained " : "") + (heads_last ? "heads last " : "") +
                     (quad_rows ? "in registers" : "staged"));
        target::DeviceTraits device = testing::switched(coop_device());
        device.quad_row_fragments = quad_rows;
        const std::vector<kernels::Launch> launches = kernels::lower_graph(graph, device);
        ASSERT_EQ(launches.size(), 1u);
        const kernels::Launch& launch = launches[0];
        EXPECT_EQ(launch.kernel, "attention_forward_coopmat");
        EXPECT_EQ(define_of(launch, "HEADS_LAST"), heads_last ? "1" : "0");
        EXPECT_EQ(define_of(launch, "Q_CHAIN"), chained ? "1" : "0");
        EXPECT_EQ(define_of(launch, "FRAGMENT_REGISTERS"), quad_rows ? "1" : "0");
        const bool binds_projection =
            std::any_of(launch.operands.begin(), launch.operands.end(),
                        [&](const auto& operand) { return operand.value == projected.id(); });
        EXPECT_EQ(binds_projection, chained);
        const bool writes_result = std::any_of(
            launch.operands.begin(), launch.operands.end(),
            [&](const auto& operand) { return operand.write && operand.value == result.id(); });
        EXPECT_TRUE(writes_result);
        const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
        expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label, 1,
                          !quad_rows);
      }
    }
  }
  // In training the backward reads the forward's output as it is: the forward, which writes its
  // log-sum-exp beside it, writes the transposed value as well (HEADS_LAST_COPY), and the
  // transpose has no launch.
  Graph graph;
  const Tensor q = input(graph, "q", {1, 4, 40, 32});
  const Tensor k = input(graph, "k", {1, 2, 70, 32});
  const Tensor v = input(graph, "v", {1, 2, 70, 16});
  const Tensor y = scaled_dot_product_attention(q, k, v);
  const Tensor moved = transpose(y, {0, 2, 1, 3});
  const Tensor seed = input(graph, "seed", {1, 40, 4, 16});
  for (const auto& [leaf, gradient] :
       gradients(graph, moved.id(), {q.id(), k.id(), v.id()}, seed.id()))
    graph.set_output("d" + std::to_string(leaf), gradient);
  graph.set_output("moved", moved.id());
  for (const bool quad_rows : {false, true}) {
    SCOPED_TRACE(quad_rows ? "training, in registers" : "training, staged");
    target::DeviceTraits device = testing::switched(coop_device());
    device.quad_row_fragments = quad_rows;
    const std::vector<kernels::Launch> launches = kernels::lower_graph(graph, device);
    const auto forward = std::find_if(launches.begin(), launches.end(), [](const auto& launch) {
      return launch.kernel == "attention_forward_coopmat";
    });
    ASSERT_NE(forward, launches.end());
    EXPECT_EQ(define_of(*forward, "HEADS_LAST"), "0");
    EXPECT_EQ(define_of(*forward, "HEADS_LAST_COPY"), "1");
    EXPECT_EQ(define_of(*forward, "WITH_LSE"), "1");
    const auto writes = [&](ValueId value) {
      return std::any_of(
          forward->operands.begin(), forward->operands.end(),
          [&](const auto& operand) { return operand.write && operand.value == value; });
    };
    EXPECT_TRUE(writes(y.id()));
    EXPECT_TRUE(writes(moved.id()));
    const std::regex names_transpose("transpose %" + std::to_string(moved.id()) + "(?![0-9])");
    const auto naming_transpose = std::count_if(
        launches.begin(), launches.end(),
        [&](const auto& launch) { return std::regex_search(launch.label, names_transpose); });
    EXPECT_EQ(naming_transpose, 1) << forward->label;
    EXPECT_TRUE(std::regex_search(forward->label, names_transpose)) << forward->label;
    const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, *forward));  // validated
    expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), forward->label, 1, !quad_rows);
  }
}

// A product whose result a transpose alone reads (SmolLM2's q projection at 128 tokens split
// into heads and moved head-major) writes the transposed value from its cooperative-matrix
// GEMM's store: one launch, binding the transpose as its result, no direct fragment stores,
// valid NV and well-formed KHR SPIR-V.
TEST_F(CoopMatrixLowering, ProductsStoreWhereTheirTransposeMoves) {
  Graph graph;
  const Tensor x = input(graph, "x", {128, 576});
  const Tensor w = input(graph, "w", {576, 576});
  const Tensor heads = transpose(reshape(matmul(x, w, false, true), {1, 128, 9, 64}), {0, 2, 1, 3});
  graph.set_output("heads", heads.id());
  const std::vector<kernels::Launch> launches =
      kernels::lower_graph(graph, testing::switched(coop_device()));
  ASSERT_EQ(launches.size(), 1u);
  const kernels::Launch& launch = launches[0];
  EXPECT_EQ(launch.kernel, "gemm_coopmat");
  EXPECT_EQ(define_of(launch, "DIRECT_STORE"), "0");
  EXPECT_TRUE(std::any_of(launch.operands.begin(), launch.operands.end(), [&](const auto& operand) {
    return operand.write && operand.value == heads.id();
  }));
  const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
  expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label, 1);
}

// The backward kernels stream blocks of 32 (fewer registers than 64), and 64 where
// MEGANEURA_ATTENTION_COOP_BLOCK=64 asks and shared memory allows (head dimension 64, not 128);
// a mask moves the bindings of out_value and grad_out. Both block sizes, with a mask, compile
// to valid NV SPIR-V and well-formed KHR SPIR-V; a forced block that is neither is an error
// naming the variable.
TEST_F(CoopMatrixLowering, AttentionBackwardBlocksCompile) {
  for (const auto& [dim, forced] :
       {std::pair<int64_t, const char*>{64, nullptr}, {64, "64"}, {128, nullptr}}) {
    SCOPED_TRACE(std::to_string(dim) + (forced ? " forced 64" : ""));
    std::optional<ScopedSwitch> block;
    if (forced) block.emplace("MEGANEURA_ATTENTION_COOP_BLOCK", forced);
    Graph graph;
    const Tensor q = input(graph, "q", {1, 2, 70, dim});
    const Tensor k = input(graph, "k", {1, 1, 70, dim});
    const Tensor v = input(graph, "v", {1, 1, 70, dim});
    const Tensor mask = input(graph, "mask", {70, 70});
    const Tensor y = scaled_dot_product_attention(q, k, v, {.causal = true, .mask = mask});
    output_with_gradients(graph, y, input(graph, "seed", {1, 2, 70, dim}), {q, k, v});
    const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
    int backward = 0;
    for (const kernels::Launch& launch : launches) {
      if (launch.kernel == "attention_forward_coopmat") continue;
      ++backward;
      for (const auto& [name, value] : launch.defines) {
        if (name == "BQ" || name == "BK") {
          EXPECT_EQ(value, forced ? "64u" : "32u") << launch.label;
        }
      }
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));
      const bool grad_k = launch.label.starts_with("attention_grad_k ");
      expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                        launch.kernel == "attention_grad_q_coopmat" || grad_k ? 2 : 1);
    }
    EXPECT_EQ(backward, 3) << dim;
  }
  Graph graph;
  const Tensor q = input(graph, "q", {1, 1, 70, 64});
  graph.set_output("y", scaled_dot_product_attention(q, q, q, {}).id());
  testing::expect_switch_rejected("MEGANEURA_ATTENTION_COOP_BLOCK", "48",
                                  [&] { coop_launches(graph, coop_device()); });
}

// Split-K partial results (matmul and convolution weight gradient) on cooperative matrices: one
// launch each whose grid z covers the K slices, compiled to valid SPIR-V.
TEST_F(CoopMatrixLowering, SplitKPartialsCompile) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 37, 70});
  const Tensor b = input(graph, "b", {45, 70});
  graph.set_output("partials", graph.add("matmul", {a.id(), b.id()},
                                         {{"transpose_b", int64_t{1}}, {"k_splits", int64_t{3}}}));
  const Tensor x = input(graph, "x", {2, 3, 9, 9});
  const Tensor dy = input(graph, "dy", {2, 8, 4, 4});
  graph.set_output("weight_partials", graph.add("conv2d_grad_weight", {x.id(), dy.id()},
                                                {{"stride", std::vector<int64_t>{2, 2}},
                                                 {"weight_shape", std::vector<int64_t>{8, 3, 3, 3}},
                                                 {"k_splits", int64_t{2}}}));
  const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].groups[2], 6u);  // 2 batch entries x 3 slices
  EXPECT_EQ(launches[1].groups[2], 2u);  // 1 group x 2 slices
  for (const kernels::Launch& launch : launches) gpu::compile_glsl(spec_of(graph, launch));
}

// With MEGANEURA_PACKED_COLUMNS=1, convolution columns feeding the cooperative-matrix GEMM are
// packed f16 pairs: the gather writes uvec2s of halves and the GEMM unpacks them in its
// generated loads, in the forward and data gradient (B along n) and the weight gradient (B along
// k, over K slices); the kernels compile. An output width of 6 keeps f32 columns, and so does
// the default.
TEST_F(CoopMatrixLowering, PackedColumnsFeedTheFastGemm) {
  const auto lowered = [](int64_t width) {
    Graph graph;
    const Tensor x = input(graph, "x", {2, 8, 16, width});
    const Tensor w = input(graph, "w", {16, 8, 3, 3});
    const Tensor seed = input(graph, "seed", {2, 16, 16, width});
    testing::output_with_gradients(graph, conv2d(x, w, std::nullopt, {.padding = {1, 1}}), seed,
                                   {x, w});
    const Graph columns = passes::im2col_convolutions(
        graph, vulkan::VulkanTarget(testing::switched(coop_device())), uint64_t{1} << 30);
    std::vector<kernels::Launch> launches;
    for (size_t i = 0; i < columns.size(); ++i) {
      const std::string& op = columns.nodes()[i].op;
      if (op != "im2col" && op != "matmul") continue;
      for (kernels::Launch& launch :
           kernels::lower_node(columns, static_cast<ValueId>(i), testing::switched(coop_device())))
        launches.push_back(std::move(launch));
    }
    return std::pair{columns, launches};
  };
  const auto count = [](const std::vector<kernels::Launch>& launches, const std::string& text) {
    return std::count_if(launches.begin(), launches.end(), [&](const kernels::Launch& launch) {
      return launch.body.find(text) != std::string::npos;
    });
  };
  EXPECT_EQ(count(lowered(16).second, "packHalf2x16"), 0);
  const ScopedSwitch packed("MEGANEURA_PACKED_COLUMNS", "1");
  {
    const auto [graph, launches] = lowered(16);
    // The forward's and the weight gradient's columns; the data gradient's are packed too.
    EXPECT_EQ(count(launches, "columns_halves[i] = uvec2(packHalf2x16"), 3);
    EXPECT_EQ(count(launches, "unpackHalf2x16(pairs.x)"), 3);
    for (const kernels::Launch& launch : launches) {
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
      if (launch.kernel == "gemm_coopmat")
        expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                          gemm_column_major_loads(launch));
    }
  }
  EXPECT_EQ(count(lowered(6).second, "packHalf2x16"), 0);
}

// Fast precision takes the Winograd weight gradient where strict would take the direct kernel
// (64 channels over 56 x 56, ResNet's first stage): its 16 tile products are one batched matmul
// on cooperative matrices, which compiles to valid NV and well-formed KHR SPIR-V.
TEST_F(CoopMatrixLowering, WinogradTileProductsRunOnCoopMatrices) {
  Graph graph;
  const Tensor x = input(graph, "x", {4, 64, 56, 56});
  const Tensor w = input(graph, "w", {64, 64, 3, 3});
  const Tensor seed = input(graph, "seed", {4, 64, 56, 56});
  const Tensor y = conv2d(x, w, std::nullopt, {.padding = {1, 1}});
  graph.set_output("dw", gradients(graph, y.id(), {w.id()}, seed.id()).at(w.id()));
  const Graph rewritten = passes::im2col_convolutions(
      passes::eliminate_dead_code(graph), vulkan::VulkanTarget(testing::switched(coop_device())),
      uint64_t{1} << 30);
  int products = 0;
  for (size_t i = 0; i < rewritten.size(); ++i) {
    if (rewritten.nodes()[i].op != "matmul") continue;
    for (const kernels::Launch& launch : kernels::lower_node(rewritten, static_cast<ValueId>(i),
                                                             testing::switched(coop_device()))) {
      ++products;
      ASSERT_EQ(launch.kernel, "gemm_coopmat");
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(rewritten, launch));
      expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                        gemm_column_major_loads(launch));
    }
  }
  EXPECT_EQ(products, 1);
  size_t tile_transforms = 0;
  for (const Node& node : rewritten.nodes()) tile_transforms += node.op == "winograd_tiles" ? 1 : 0;
  EXPECT_EQ(tile_transforms, 1u);
}

// Winograd's f16 points in fast precision (256 channels at 16 x 16, batch 8): the transforms
// that write them (x's tiles, grad_out's blocks, the filter) and both batched products on the
// workgroup GEMM, one workgroup z a point, compile to valid SPIR-V with workgroup-scope
// matrices: the forward's A the point's 256 x 256 filter and B its 256 x 512 tiles, the weight
// gradient's A grad_out's 256 x 512 blocks and B x's tiles read transposed (each operand a whole
// matrix on from the last point's); no launch rounds an operand.
TEST_F(CoopMatrixLowering, WinogradF16PointsCompile) {
  target::DeviceTraits device = coop_device();
  device.workgroup_coop_matrix_f16 = true;
  device.compute_units = 1;
  Graph graph;
  const Tensor x = input(graph, "x", {8, 256, 16, 16});
  const Tensor w = input(graph, "w", {256, 256, 3, 3});
  const Tensor seed = input(graph, "seed", {8, 256, 16, 16});
  const Tensor y = conv2d(x, w, std::nullopt, {.padding = {1, 1}});
  graph.set_output("y", y.id());
  graph.set_output("dw", gradients(graph, y.id(), {w.id()}, seed.id()).at(w.id()));
  const vulkan::VulkanTarget target(testing::switched(device));
  const Graph rewritten = passes::workgroup_gemm(
      passes::im2col_convolutions(passes::eliminate_dead_code(graph), target, uint64_t{1} << 30),
      target);
  std::map<std::string, int> kernels_seen;
  std::set<std::array<std::string, 4>> strides;  // A, B, C, B transposed
  for (size_t i = 0; i < rewritten.size(); ++i) {
    if (rewritten.nodes()[i].is_leaf()) continue;
    for (const kernels::Launch& launch :
         kernels::lower_node(rewritten, static_cast<ValueId>(i), testing::switched(device))) {
      SCOPED_TRACE(launch.label);
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(rewritten, launch));
      ++kernels_seen[launch.kernel];
      if (launch.kernel.rfind("winograd_", 0) == 0 && launch.kernel != "winograd_output" &&
          launch.kernel != "winograd_weight_grad") {
        EXPECT_TRUE(launch.f16_operands);
      }
      if (launch.kernel != "gemm_workgroup_coopmat") continue;
      EXPECT_EQ(launch.groups[2], 16u);
      strides.insert({define_of(launch, "A_BATCH_STRIDE"), define_of(launch, "B_BATCH_STRIDE"),
                      define_of(launch, "C_BATCH_STRIDE"), define_of(launch, "B_TRANSPOSED")});
      const KhrMatrixUse use = khr_matrix_use(gpu::detail::nv_to_khr_cooperative_matrix(nv));
      constexpr uint32_t kWorkgroup = 2;  // scope
      EXPECT_EQ(use.types, (std::set<MatrixType>{{16, kWorkgroup, 128, 64, 0},
                                                 {16, kWorkgroup, 64, 256, 1},
                                                 {32, kWorkgroup, 128, 256, 2}}));
    }
  }
  EXPECT_EQ(strides, (std::set<std::array<std::string, 4>>{{"65536u", "131072u", "131072u", "0"},
                                                           {"131072u", "131072u", "65536u", "1"}}));
  EXPECT_EQ(kernels_seen["winograd_tiles"], 2);  // the forward's and the weight gradient's
  EXPECT_EQ(kernels_seen["winograd_grad_tiles"], 1);
  EXPECT_EQ(kernels_seen["winograd_filter"], 1);
  EXPECT_EQ(kernels_seen["round_to_f16"], 0);
}

// Every GEMM form (scalar loads over ragged edges with A or B read column-major, vector loads for
// each operand layout, the three convolution GEMMs, split-K partials) in the shapes that the
// lowering picks and the ones worth sweeping with MEGANEURA_COOP_BLOCK compiles to valid NV
// SPIR-V and well-formed KHR SPIR-V, with the forced shape.
TEST_F(CoopMatrixLowering, BlockShapesCompile) {
  Graph graph;
  const Tensor a = input(graph, "a", {2, 37, 70});
  const Tensor b = input(graph, "b", {45, 70});
  graph.set_output("ragged", matmul(a, b, false, true).id());
  graph.set_output(
      "ragged_t",
      matmul(input(graph, "at", {70, 37}), input(graph, "bt", {70, 45}), true, false).id());
  for (const auto& [ta, tb] : {std::pair{false, false}, std::pair{true, false},
                               std::pair{false, true}, std::pair{true, true}}) {
    const std::string layout = std::to_string(ta) + std::to_string(tb);
    const Tensor c = input(graph, "c" + layout, ta ? Shape{64, 256} : Shape{256, 64});
    const Tensor d = input(graph, "d" + layout, tb ? Shape{256, 64} : Shape{64, 256});
    graph.set_output("whole" + layout, matmul(c, d, ta, tb).id());
  }
  graph.set_output("partials", graph.add("matmul", {a.id(), b.id()},
                                         {{"transpose_b", int64_t{1}}, {"k_splits", int64_t{3}}}));
  // Extents in multiples of 4 over partial blocks: vector loads with bounds, also over K slices.
  const Tensor aligned_a = input(graph, "aligned_a", {2, 36, 72});
  const Tensor aligned_b = input(graph, "aligned_b", {44, 72});
  graph.set_output("aligned", matmul(aligned_a, aligned_b, false, true).id());
  graph.set_output("aligned_t", matmul(input(graph, "aligned_at", {72, 36}),
                                       input(graph, "aligned_bt", {72, 44}), true, false)
                                    .id());
  graph.set_output("aligned_partials",
                   graph.add("matmul", {aligned_a.id(), aligned_b.id()},
                             {{"transpose_b", int64_t{1}}, {"k_splits", int64_t{3}}}));
  // Contiguous extents in multiples of 4 with ragged others: vector loads of both operands over
  // 37 rows and 45 columns, and of B alone where A's rows are 70 long, whole and over K slices.
  graph.set_output("aligned_runs", matmul(input(graph, "runs_a", {2, 37, 72}),
                                          input(graph, "runs_b", {45, 72}), false, true)
                                       .id());
  const Tensor ragged_a = input(graph, "ragged_a", {2, 36, 70});
  const Tensor runs_bn = input(graph, "runs_bn", {70, 44});
  graph.set_output("aligned_b_runs", matmul(ragged_a, runs_bn).id());
  graph.set_output("aligned_b_partials",
                   graph.add("matmul", {ragged_a.id(), runs_bn.id()}, {{"k_splits", int64_t{3}}}));
  const Tensor x = input(graph, "x", {2, 3, 9, 9});
  const Tensor w = input(graph, "w", {8, 3, 3, 3});
  const Tensor seed = input(graph, "seed", {2, 8, 4, 4});
  output_with_gradients(graph, conv2d(x, w, std::nullopt, {.stride = {2, 2}}), seed, {x, w});
  for (const std::string shape :
       {"2,4,4,8,16", "4,2,4,8,16", "2,4,4,4,32", "2,2,4,8,32", "2,2,4,8,16", "2,2,2,4,32",
        "2,2,2,4,16", "2,2,2,4,64", "2,4,4,8,16,2", "2,2,2,4,16,2"}) {
    SCOPED_TRACE(shape);
    const ScopedSwitch forced("MEGANEURA_COOP_BLOCK", shape);
    const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
    ASSERT_EQ(launches.size(), 16u);
    int vector_a = 0, vector_b = 0, whole_blocks = 0;
    for (const kernels::Launch& launch : launches) {
      std::string seen;
      for (const char* name : {"WARPS_M", "WARPS_N", "FRAGS_M", "FRAGS_N", "BLOCK_K"})
        seen += (seen.empty() ? "" : ",") + define_of(launch, name);
      std::erase(seen, 'u');
      seen += "," + define_of(launch, "PREFETCH_SLICES");
      // Without a sixth field the rule picks the prefetch: one slice for these short K.
      const bool prefetch_given = std::count(shape.begin(), shape.end(), ',') == 5;
      EXPECT_EQ(seen, prefetch_given ? shape : shape + ",1") << launch.label;
      vector_a += define_of(launch, "VECTOR_A") == "1" ? 1 : 0;
      vector_b += define_of(launch, "VECTOR_B") == "1" ? 1 : 0;
      whole_blocks += define_of(launch, "WHOLE_BLOCKS") == "1" ? 1 : 0;
      const std::vector<uint32_t> nv = gpu::compile_glsl(spec_of(graph, launch));  // validated
      expect_khr_module(gpu::detail::nv_to_khr_cooperative_matrix(nv), launch.label,
                        gemm_column_major_loads(launch));
    }
    // The whole products, the three aligned ones and the one of aligned runs; B also in the two
    // after it.
    EXPECT_EQ(vector_a, 8);
    EXPECT_EQ(vector_b, 10);
    EXPECT_EQ(whole_blocks, 4);
  }
}

// The block the waves cost model takes on an H200-like device, against the fastest shape of the
// coop block sweep (run 14 in git's history of docs/BENCHMARKS.md): 128 x 256 at 4096^3, 128 x 128
// where 128 x 256 leaves a thin second wave (lm_head), 64 x 64 for products that fill one wave of
// it; 128 x 192 (run 53) for lm_head's weight gradient, whose A is contiguous along m, which 128 x
// 192 needs in 48 KiB, and which it covers in fewer waves.
TEST_F(CoopMatrixLowering, BlocksByEstimatedWaves) {
  const auto block_of = [](const Shape& a, const Shape& b, bool transpose_a = false) {
    const kernels::Launch launch = matmul_launch(a, b, transpose_a);
    return define_of(launch, "WARPS_M") + "," + define_of(launch, "WARPS_N") + "," +
           define_of(launch, "FRAGS_M") + "," + define_of(launch, "FRAGS_N") + "," +
           define_of(launch, "BLOCK_K") + "," + define_of(launch, "PREFETCH_SLICES");
  };
  // Two slices ahead only for the 128 x 256 block over a long K.
  EXPECT_EQ(block_of({4096, 4096}, {4096, 4096}), "2u,4u,4u,8u,16u,2");
  EXPECT_EQ(block_of({4096, 512}, {512, 4096}), "2u,4u,4u,8u,16u,1");
  EXPECT_EQ(block_of({128, 576}, {576, 49152}), "2u,4u,4u,4u,32u,1");
  EXPECT_EQ(block_of({128, 576}, {576, 576}), "2u,2u,2u,4u,32u,1");
  EXPECT_EQ(block_of({12544, 576}, {576, 64}), "2u,2u,2u,4u,32u,1");
  EXPECT_EQ(block_of({128, 49152}, {128, 576}, true), "2u,4u,4u,6u,32u,1");
  EXPECT_EQ(block_of({4096, 4096}, {4096, 4096}, true), "2u,4u,4u,8u,16u,2");
  EXPECT_EQ(block_of({128, 576}, {128, 576}, true), "2u,2u,2u,4u,32u,1");
}

// A malformed MEGANEURA_COOP_BLOCK, or one the device cannot run, leaves the chosen block and
// says so on stderr.
TEST_F(CoopMatrixLowering, UnfitBlockOverridesAreIgnored) {
  Graph graph;
  graph.set_output("y", matmul(input(graph, "a", {256, 64}), input(graph, "b", {64, 256})).id());
  const std::vector<kernels::Launch> chosen = coop_launches(graph, coop_device());
  ASSERT_EQ(chosen.size(), 1u);
  for (const std::string shape :
       {"2,4,4,8", "2,4,4,8,16,3", "2,4,4,8,16,2,1", "2,x,4,8,16", "2,4,4,8,24", "2,4,4,8,32",
        "8,8,1,1,16", "0,4,4,8,16", "3,1,1,1,16", "2,4,4,8,99999999999999"}) {
    SCOPED_TRACE(shape);
    const ScopedSwitch forced("MEGANEURA_COOP_BLOCK", shape);
    ::testing::internal::CaptureStderr();
    const std::vector<kernels::Launch> launches = coop_launches(graph, coop_device());
    const std::string warning = ::testing::internal::GetCapturedStderr();
    ASSERT_EQ(launches.size(), 1u);
    EXPECT_EQ(launches[0].defines, chosen[0].defines);
    EXPECT_NE(warning.find("ignoring MEGANEURA_COOP_BLOCK=" + shape), std::string::npos);
  }
}

// Whether the automatically chosen device puts a product on cooperative matrices in `precision`
// (the suite's switches put every product there).
bool runs_coop_matrices(Precision precision) {
  Graph graph;
  Tensor a = input(graph, "a", {16, 16});
  graph.set_output("y", matmul(a, a).id());
  SessionOptions options = testing::session_options();
  options.precision = precision;
  return Session(graph, options).report().coop_matrix_dispatches > 0;
}

// The on-device checks: skipped where the device has no f16 cooperative matrices.
bool device_has_coop_matrices() {
  static const bool available = runs_coop_matrices(Precision::fast);
  return available;
}

// Whether the automatically chosen device lists the fragment shape the kernel uses through the
// KHR (or the NV) extension.
bool device_lists_coop_shape(bool khr) {
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const gpu::DeviceCaps& caps = devices[gpu::choose_device(devices, "")].caps;
  return std::any_of(
      caps.coop_matrix.begin(), caps.coop_matrix.end(), [&](const gpu::CoopMatrixConfig& config) {
        return config.khr == khr && config.m == 16 && config.n == 8 && config.k == 16 &&
               config.a == gpu::ScalarType::f16 && config.c == gpu::ScalarType::f32;
      });
}

// The NV tests run validated, which leaves KHR off: on a device with KHR only they would run
// strict, so they need the NV shape itself.
bool device_has_nv_coop_matrices() {
  return device_has_coop_matrices() && device_lists_coop_shape(false);
}

SessionOptions fast() {
  SessionOptions options;
  options.precision = Precision::fast;
  return options;
}

// How the on-device checks below run: the precision, validated or not (validated sessions leave
// KHR off, so they run NV), and the normalised error allowed to products, convolutions and the
// attention forward, and to attention's gradients (whose probabilities and dS are rounded too).
struct Numerics {
  Precision precision = Precision::fast;
  bool validation = true;
  double tolerance = kFastTolerance;
  double attention_gradient_tolerance = 1e-2;

  SessionOptions options() const {
    SessionOptions options;
    options.precision = precision;
    return options;
  }
};
const Numerics kKhr{.validation = false};

// a (transposed when ta) times b (when tb) in `numerics`' precision against the reference;
// `seed` draws the inputs.
void check_product(const Shape& a, const Shape& b, bool ta, bool tb, uint64_t seed,
                   const Numerics& numerics) {
  check_on_gpu(
      {{"a", a}, {"b", b}},
      [&](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("y", matmul(in[0], in[1], ta, tb).id());
      },
      numerics.tolerance, seed, numerics.options(), nullptr, numerics.validation);
}

void check_matmuls(const Numerics& numerics) {
  // Batch broadcast with transposes, partial 64 x 64 blocks, K not a multiple of the slice.
  check_product({3, 1, 70, 37}, {4, 45, 70}, true, true, 11, numerics);
  // Whole blocks: the vector loads, for each operand layout (64 x 64 blocks here).
  check_product({256, 96}, {96, 192}, false, false, 15, numerics);
  check_product({96, 256}, {192, 96}, true, true, 15, numerics);
  // Whole 128 x 128 blocks with vector loads.
  check_product({1536, 64}, {64, 1408}, false, false, 16, numerics);
  // A long K over a small output: split-K partials (one GEMM over the slices, then a sum), with
  // vector loads over partial blocks, for both operand layouts.
  check_product({64, 4096}, {4096, 48}, false, false, 17, numerics);
  check_product({4096, 64}, {48, 4096}, true, true, 18, numerics);
  // Vector loads of the operands whose contiguous extent is a multiple of 4 over ragged rows and
  // columns: an action chunk's 50 rows against a weight stored [N, K] over split-K slices (both
  // operands), A contiguous along its 52 rows beside B's 190 columns (A alone), and B's 44
  // columns beside A's rows of 4098 over split-K slices (B alone).
  check_product({50, 720}, {964, 720}, false, true, 19, numerics);
  check_product({72, 52}, {72, 190}, true, false, 20, numerics);
  check_product({40, 4098}, {4098, 44}, false, false, 25, numerics);
  // Enough output blocks for the 128 x 256 shape: whole ones with both operands read as
  // column-major fragments, and ragged ones with K not a multiple of the slice.
  check_product({64, 1920}, {2304, 64}, true, true, 21, numerics);
  check_product({1800, 40}, {40, 2200}, false, false, 22, numerics);
  // Two slices fetched ahead (the rule's choice for 128 x 256 blocks over a long K), forced
  // here on small products: an odd number of slices with ragged edges, and whole blocks with
  // vector loads.
  {
    const ScopedSwitch forced("MEGANEURA_COOP_BLOCK", "2,4,4,8,16,2");
    check_product({200, 1000}, {1000, 300}, false, false, 23, numerics);
    check_product({256, 512}, {512, 256}, false, false, 23, numerics);
  }
  // The 128 x 192 block (forced on small products; A must be contiguous along m): ragged edges
  // with K not a multiple of the slice, and whole blocks with vector loads. With bfloat16's
  // 16 x 16 fragments it needs more than 48 KiB of shared memory, so there the rule's block
  // multiplies these products.
  {
    std::optional<ScopedSwitch> forced;
    if (numerics.precision != Precision::bf16) forced.emplace("MEGANEURA_COOP_BLOCK", "2,4,4,6,32");
    check_product({100, 200}, {100, 250}, true, false, 24, numerics);
    check_product({128, 256}, {128, 384}, true, false, 24, numerics);
  }
  // Enough output blocks for the 128 x 128 shape, with ragged edges (vector loads with bounds),
  // for both operand layouts.
  check_product({1540, 40}, {40, 1500}, false, false, 12, numerics);
  check_product({40, 1540}, {1500, 40}, true, true, 13, numerics);
  // Six split-K slices of 256 at SmolLM2's MLP data gradient: 64 x 64 blocks over eight K steps
  // each, for both operand layouts.
  {
    const ScopedSwitch slices("MEGANEURA_SPLIT_K_SLICES", "6");
    check_product({128, 1536}, {1536, 576}, false, false, 27, numerics);
    check_product({1536, 128}, {576, 1536}, true, true, 28, numerics);
  }
}

void check_convolutions_once(const Numerics& numerics) {
  // A weight gradient long enough in N * OH * OW to be split over K; with 8 channels (multiples
  // of 4) the im2col forward, data and weight gradient products read vector loads over partial
  // blocks (20 output channels), the weight gradient's over K slices, with 6 scalars.
  for (const auto& [channels, seed] : {std::pair<int64_t, uint64_t>{6, 18}, {8, 19}}) {
    check_on_gpu(
        {{"x", {4, channels, 32, 32}}, {"w", {20, channels, 3, 3}}, {"seed", {4, 20, 32, 32}}},
        [](Graph& graph, std::vector<Tensor>& in) {
          output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, {.padding = {1, 1}}),
                                in[2], {in[0], in[1]});
        },
        numerics.tolerance, seed, numerics.options(), nullptr, numerics.validation);
  }
  for (const Conv2dOptions& options :
       {Conv2dOptions{.padding = {1, 1}}, Conv2dOptions{.stride = {2, 2}, .padding = {3, 3}},
        Conv2dOptions{.padding = {1, 1}, .groups = 2}}) {
    const int64_t kernel = options.padding[0] == 3 ? 7 : 3;
    const Shape x{2, 6, 13, 12}, w{20, 6 / options.groups, kernel, kernel};
    const Shape y{2, 20, testing::conv_extent(13, kernel, options.stride[0], options.padding[0], 1),
                  testing::conv_extent(12, kernel, options.stride[1], options.padding[1], 1)};
    check_on_gpu(
        {{"x", x}, {"w", w}, {"seed", y}},
        [&](Graph& graph, std::vector<Tensor>& in) {
          output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, options), in[2],
                                {in[0], in[1]});
        },
        numerics.tolerance, 13, numerics.options(), nullptr, numerics.validation);
  }
  // Planes of 25, four of them 100 floats: with im2col the forward's and the data gradient's
  // columns lie side by side (the 7 x 7 case above puts only its forward's there).
  check_on_gpu(
      {{"x", {4, 6, 5, 5}}, {"w", {20, 6, 3, 3}}, {"seed", {4, 20, 5, 5}}},
      [](Graph& graph, std::vector<Tensor>& in) {
        output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, {.padding = {1, 1}}), in[2],
                              {in[0], in[1]});
      },
      numerics.tolerance, 14, numerics.options(), nullptr, numerics.validation);
}

// Winograd convolutions with their 16 tile products on cooperative matrices (forced: these
// shapes are below the rules' minimums): the forward with both gradients, padding 1 over odd
// output extents, and 529 tiles whose weight-gradient products are split over K into 3 partials
// that the filter transform sums.
void check_winograd(const Numerics& numerics) {
  const ScopedSwitch weight_gradient("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1");
  const ScopedSwitch forward("MEGANEURA_WINOGRAD_CONV", "1");
  for (const auto& [x, slices] :
       {std::pair<Shape, const char*>{{2, 8, 19, 17}, "1"}, {{1, 8, 46, 46}, "3"}}) {
    const ScopedSwitch split("MEGANEURA_SPLIT_K_SLICES", slices);
    check_on_gpu(
        {{"x", x}, {"w", {12, 8, 3, 3}}, {"seed", {x[0], 12, x[2], x[3]}}},
        [](Graph& graph, std::vector<Tensor>& in) {
          output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, {.padding = {1, 1}}),
                                in[2], {in[0], in[1]});
        },
        numerics.tolerance, 24, numerics.options(), nullptr, numerics.validation);
  }
}

void check_convolutions(const Numerics& numerics) {
  // The implicit GEMMs on cooperative matrices, then im2col + matmul (the default on GPUs), with
  // f32 and with packed f16 columns.
  for (const char* im2col : {"0", "1"}) {
    const ScopedSwitch route("MEGANEURA_IM2COL", im2col);
    check_convolutions_once(numerics);
  }
  check_winograd(numerics);
  const ScopedSwitch route("MEGANEURA_IM2COL", "1");
  const ScopedSwitch packed("MEGANEURA_PACKED_COLUMNS", "1");
  check_convolutions_once(numerics);
}

// Whisper-like heads (64) with a partial last block, grouped-query heads with a causal mask
// and a narrower value, a random additive mask with cross attention, and Stable Diffusion's
// head width of 40 (with values of 24: both padded to whole fragments by
// passes/pad_attention_heads.cpp): the forward and the
// gradients of q, k and v (seeded with a random cotangent). f16 probabilities and dS make the
// gradients noisier than the forward; 1e-2 is still far below a wrong kernel and within the
// 5 % gradient gate of DESIGN.md.
void check_attention_once(const Numerics& numerics) {
  struct Case {
    Shape q, k, v;
    bool causal, masked;
  };
  // The fourth case again over three key slices (passes/split_attention.cpp, forced: the rule
  // leaves it whole), causal, so that the first queries see no key of the later slices.
  for (const Case& c : {Case{{1, 2, 100, 64}, {1, 2, 100, 64}, {1, 2, 100, 64}, false, false},
                        Case{{2, 4, 70, 32}, {2, 2, 70, 32}, {2, 2, 70, 16}, true, false},
                        Case{{1, 2, 33, 16}, {1, 2, 45, 16}, {1, 2, 45, 32}, false, true},
                        Case{{1, 2, 80, 32}, {1, 2, 150, 32}, {1, 2, 150, 16}, true, true},
                        Case{{2, 4, 90, 40}, {2, 2, 90, 40}, {2, 2, 90, 24}, true, false},
                        Case{{1, 6, 70, 32}, {1, 2, 70, 32}, {1, 2, 70, 16}, true, false}}) {
    const testing::ScopedSwitch splits("MEGANEURA_ATTENTION_SPLITS", c.k[2] == 150 ? "3" : "1");
    // The last case's dK and dV over each query head of its groups of 3 apart.
    const testing::ScopedSwitch heads("MEGANEURA_ATTENTION_HEAD_SPLITS", c.q[1] == 6 ? "1" : "0");
    std::vector<testing::HarnessInput> inputs = {
        {"q", c.q}, {"k", c.k}, {"v", c.v}, {"g", {c.q[0], c.q[1], c.q[2], c.v[3]}}};
    if (c.masked) inputs.push_back({"mask", {c.q[2], c.k[2]}, DType::f32, -2.0, 2.0});
    check_on_gpu(
        inputs,
        [&](Graph& graph, std::vector<Tensor>& x) {
          AttentionOptions options;
          options.causal = c.causal;
          if (c.masked) options.mask = x[4];
          output_with_gradients(graph, scaled_dot_product_attention(x[0], x[1], x[2], options),
                                x[3], {x[0], x[1], x[2]});
        },
        numerics.attention_gradient_tolerance, 14, numerics.options(), nullptr,
        numerics.validation);
  }
  // Scores that climb along the keys (an additive ramp from -30 to +30 over 200 keys, about 19
  // in log2 units per 64-key block): the staged forward keeps its running maximum until a block
  // exceeds it by a margin and the forward in registers rescales at every new maximum, so this
  // forces the rescaling of the output accumulator again and again, on top of a causal mask.
  check_on_gpu(
      {{"q", {1, 2, 200, 64}}, {"k", {1, 2, 200, 64}}, {"v", {1, 2, 200, 64}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        std::vector<double> ramp(200 * 200);
        for (size_t e = 0; e < ramp.size(); ++e) ramp[e] = -30.0 + 60.0 * (e % 200) / 199.0;
        AttentionOptions options;
        options.causal = true;
        options.mask = Tensor(&graph, graph.constant(ramp, {DType::f32, {200, 200}}));
        graph.set_output("y", scaled_dot_product_attention(x[0], x[1], x[2], options).id());
      },
      numerics.tolerance, 19, numerics.options(), nullptr, numerics.validation);
}

// The forward's, dQ's and dK / dV's scores in registers (where the session's probe found the
// fragment layout they are written for: NVIDIA's) and staged through shared memory.
void check_attention(const Numerics& numerics) {
  for (const char* registers : {"1", "0"}) {
    SCOPED_TRACE(std::string("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=") + registers);
    const ScopedSwitch forward("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", registers);
    check_attention_once(numerics);
  }
}

TEST_F(GpuCoopMatrix, AttentionAndGradientsNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  check_attention(Numerics{});
}

// The cooperative-matrix forward fused at inference (AttentionForwardFusionsCompile, run): queries
// computed from their projection as they are loaded (heads apart, rotated at each sample's
// positions) and the output moved heads last, grouped heads, a mask, against the reference, over
// whole key streams and over two slices, with scores in registers and staged; the chain takes no
// launch (one fewer than with MEGANEURA_QUERY_CHAINS=0). And a training step's forward, which
// writes the transposed value beside its output (HEADS_LAST_COPY).
TEST_F(GpuCoopMatrix, AttentionForwardFusionsNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  const Numerics numerics;
  const std::vector<testing::HarnessInput> inputs{{"projected", {2, 70, 4 * 32}},
                                                  {"positions", {2, 70}, DType::i32, 0.0, 500.0},
                                                  {"k", {2, 2, 130, 32}},
                                                  {"v", {2, 2, 130, 16}},
                                                  {"mask", {70, 130}, DType::f32, -2.0, 2.0}};
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor heads = reshape(x[0], {2, 70, 4, 32});
    const Tensor q = rope(transpose(heads, {0, 2, 1, 3}), x[1], 10000.0, 1);
    AttentionOptions options;
    options.mask = x[4];
    const Tensor y = scaled_dot_product_attention(q, x[2], x[3], options);
    graph.set_output("y", transpose(y, {0, 2, 1, 3}).id());
  };
  // The dispatches of a run against the reference, fused and with `fusion_switch` set to 0.
  const auto dispatches_fused_and_not = [&](const auto& harness_inputs, const auto& graph_build,
                                            uint64_t seed, const char* fusion_switch) {
    size_t fused = 0, apart = 0;
    check_on_gpu(harness_inputs, graph_build, numerics.tolerance, seed, numerics.options(), &fused,
                 numerics.validation);
    const ScopedSwitch off(fusion_switch, "0");
    check_on_gpu(harness_inputs, graph_build, numerics.tolerance, seed, numerics.options(), &apart,
                 numerics.validation);
    return std::pair{fused, apart};
  };
  for (const char* splits : {"1", "2"}) {
    for (const char* registers : {"1", "0"}) {
      SCOPED_TRACE(std::string("key slices ") + splits +
                   ", MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=" + registers);
      const ScopedSwitch sliced("MEGANEURA_ATTENTION_SPLITS", splits);
      const ScopedSwitch forward("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", registers);
      const auto [chained, apart] =
          dispatches_fused_and_not(inputs, build, 23, "MEGANEURA_QUERY_CHAINS");
      EXPECT_EQ(chained + 1, apart);
    }
  }
  // In training: the forward writes its output, its log-sum-exp and the transposed value
  // (HEADS_LAST_COPY), one launch fewer than with MEGANEURA_TRANSPOSED_STORES=0, values and
  // gradients against the reference.
  const std::vector<testing::HarnessInput> training_inputs{
      {"q", {2, 4, 70, 32}},
      {"k", {2, 2, 130, 32}},
      {"v", {2, 2, 130, 16}},
      {"mask", {70, 130}, DType::f32, -2.0, 2.0},
      {"seed", {2, 70, 4, 16}}};
  const auto training = [](Graph& graph, std::vector<Tensor>& x) {
    AttentionOptions options;
    options.mask = x[3];
    const Tensor moved =
        transpose(scaled_dot_product_attention(x[0], x[1], x[2], options), {0, 2, 1, 3});
    graph.set_output("moved", moved.id());
    for (const auto& [leaf, gradient] :
         gradients(graph, moved.id(), {x[0].id(), x[1].id(), x[2].id()}, x[4].id()))
      graph.set_output("d" + std::to_string(leaf), gradient);
  };
  for (const char* registers : {"1", "0"}) {
    SCOPED_TRACE(std::string("training, MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=") + registers);
    const ScopedSwitch forward("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", registers);
    const auto [written, apart] =
        dispatches_fused_and_not(training_inputs, training, 29, "MEGANEURA_TRANSPOSED_STORES");
    EXPECT_EQ(written + 1, apart);
  }
}

// Gradients of the size an untrained model's loss gives (a cotangent of 1e-6), at the shapes of
// Whisper-tiny's encoder (1500 queries and keys, heads of 64) and of SD 1.5's self-attention
// (1024 and 256 tokens, heads of 80 and 160), spread-out attention: dS is about 1e-10 there,
// below f16's smallest subnormal, so without the kernels' rescaled cotangent
// (MEGANEURA_ATTENTION_GRAD_SCALE=0) dQ and dK come out as zeros. Grouped heads share a scale
// per batch entry. A zero cotangent gives zero gradients, not NaNs. Scores in registers and
// staged through shared memory alike, max |dO| found by each kernel or reduced before them.
TEST_F(GpuCoopMatrix, AttentionGradientsOfSmallCotangentsNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  struct Case {
    Shape q, kv;
    double cotangent;
  };
  for (const auto& [registers, own_scale] :
       {std::pair{"1", "1"}, {"1", "0"}, {"0", "1"}, {"0", "0"}}) {
    const ScopedSwitch staged("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", registers);
    const ScopedSwitch own("MEGANEURA_ATTENTION_OWN_GRAD_SCALE", own_scale);
    for (const Case& c : {Case{{1, 2, 1500, 64}, {1, 2, 1500, 64}, 1e-6},
                          Case{{1, 1, 1024, 80}, {1, 1, 1024, 80}, 1e-6},
                          Case{{1, 1, 256, 160}, {1, 1, 256, 160}, 1e-6},
                          Case{{2, 6, 300, 64}, {2, 2, 300, 64}, 1e-6},
                          Case{{1, 2, 200, 64}, {1, 2, 200, 64}, 0.0}}) {
      SCOPED_TRACE(shape_string(c.q) + " cotangent " + std::to_string(c.cotangent) +
                   " MEGANEURA_ATTENTION_FRAGMENT_REGISTERS=" + registers +
                   " MEGANEURA_ATTENTION_OWN_GRAD_SCALE=" + own_scale);
      check_on_gpu(
          {{"q", c.q}, {"k", c.kv}, {"v", c.kv}, {"g", c.q, DType::f32, -c.cotangent, c.cotangent}},
          [](Graph& graph, std::vector<Tensor>& x) {
            output_with_gradients(graph, scaled_dot_product_attention(x[0], x[1], x[2], {}), x[3],
                                  {x[0], x[1], x[2]});
          },
          1e-2, 23, fast());
    }
  }
}

// A multi-head layer's output projection over key slices on cooperative matrices, joining the
// slices as it loads A (MEGANEURA_JOIN_SLICES) and after the combine's launch, at inference (one
// launch fewer joined) and in training, against the reference at fast precision's bound.
TEST_F(GpuCoopMatrix, ProductsJoinKeySlicesNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  const ScopedSwitch forced("MEGANEURA_ATTENTION_SPLITS", "2");
  for (const bool training : {false, true}) {
    size_t dispatches[2] = {0, 0};
    for (const int join : {0, 1}) {
      SCOPED_TRACE(std::string(training ? "training" : "inference") + " join " +
                   std::to_string(join));
      const ScopedSwitch joined("MEGANEURA_JOIN_SLICES", join ? "1" : "0");
      check_on_gpu(
          {{"q", {1, 4, 64, 32}},
           {"k", {1, 2, 200, 32}},
           {"v", {1, 2, 200, 32}},
           {"w", {128, 64}},
           {"g", {1, 64, 64}}},
          [&](Graph& graph, std::vector<Tensor>& x) {
            const Tensor heads = scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true});
            const Tensor y = matmul(reshape(transpose(heads, {0, 2, 1, 3}), {1, 64, 128}), x[3]);
            if (training)
              output_with_gradients(graph, y, x[4], {x[0], x[1], x[2], x[3]});
            else
              graph.set_output("y", y.id());
          },
          1e-2, 29, fast(), &dispatches[join]);
    }
    EXPECT_EQ(dispatches[1] + (training ? 0 : 1), dispatches[0]);
  }
}

TEST_F(GpuCoopMatrix, MatmulNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  check_matmuls(Numerics{});
}

// A product that writes the transposed value from its store (ProductsStoreWhereTheirTransposeMoves,
// run): a projection over 128 rows split into heads and moved head-major, alone and with a bias
// epilogue, against the reference, one launch fewer than with MEGANEURA_TRANSPOSED_STORES=0; over
// K = 384, which the split-K rule leaves whole (partial results keep their store).
TEST_F(GpuCoopMatrix, ProductsStoreWhereTheirTransposeMovesNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  const Numerics numerics;
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with a bias" : "alone");
    const auto build = [&](Graph& graph, std::vector<Tensor>& x) {
      Tensor y = matmul(x[0], x[1], false, true);
      if (bias) y = y + x[2];
      graph.set_output("heads", transpose(reshape(y, {1, 128, 9, 64}), {0, 2, 1, 3}).id());
    };
    const std::vector<testing::HarnessInput> inputs{
        {"x", {128, 384}}, {"w", {576, 384}}, {"b", {576}}};
    size_t stored = 0, apart = 0;
    check_on_gpu(inputs, build, numerics.tolerance, 31, numerics.options(), &stored,
                 numerics.validation);
    const ScopedSwitch off("MEGANEURA_TRANSPOSED_STORES", "0");
    check_on_gpu(inputs, build, numerics.tolerance, 31, numerics.options(), &apart,
                 numerics.validation);
    EXPECT_EQ(stored + 1, apart);
  }
}

TEST_F(GpuCoopMatrix, ConvolutionsAndGradientsNv) {
  if (!device_has_nv_coop_matrices())
    GTEST_SKIP() << "the device has no f16 NV cooperative matrices";
  check_convolutions(Numerics{});
}

// Workgroup-scope matrices of `operands` (f16 or bf16) on 256 invocations
// (VK_NV_cooperative_matrix2), which the workgroup GEMM needs.
bool device_has_workgroup_coop_matrices(gpu::ScalarType operands = gpu::ScalarType::f16) {
  const std::vector<gpu::DeviceInfo> devices = gpu::list_devices();
  const gpu::WorkgroupCoopMatrixCaps& caps =
      devices[gpu::choose_device(devices, "")].caps.workgroup_coop_matrix;
  return caps.available && std::any_of(caps.configs.begin(), caps.configs.end(),
                                       [&](const gpu::WorkgroupCoopMatrixConfig& config) {
                                         return config.a == operands &&
                                                config.c == gpu::ScalarType::f32 &&
                                                config.workgroup_invocations == 256;
                                       });
}

// The workgroup GEMM (forced onto products below its size rule) in every transposition and
// both block forms, K an odd and an even number of its 64-deep steps, several blocks each way
// (one block high at 128 rows), on tensors of `dtype`,
// each product in `dispatches` dispatches, within `tolerance` of the reference. Without
// validation: the layer predates the extension.
void check_workgroup_products(DType dtype, double tolerance, size_t dispatches, uint64_t seed,
                              const SessionOptions& options = fast()) {
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_GEMM", "1");
  // 512 rows take the 256 x 128 block split into rows where the device has tensor-layout loads,
  // 128 rows the 128 x 256 block everywhere (kernels::workgroup_gemm_block).
  for (const auto& [m, k] : {std::pair<int64_t, int64_t>{512, 192}, {512, 256}, {128, 192}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      SCOPED_TRACE("M " + std::to_string(m) + " K " + std::to_string(k) + " flags " +
                   std::to_string(flags));
      size_t launched = 0;
      check_on_gpu(
          {{"a", ta ? Shape{k, m} : Shape{m, k}, dtype},
           {"b", tb ? Shape{512, k} : Shape{k, 512}, dtype}},
          [&](Graph& graph, std::vector<Tensor>& in) {
            graph.set_output("y", matmul(in[0], in[1], ta, tb).id());
          },
          tolerance, seed++, options, &launched, false);
      EXPECT_EQ(launched, dispatches);
    }
  }
}

// f32 tensors: three dispatches (the two operand roundings and the product), values within the
// fast tolerance.
TEST_F(GpuCoopMatrix, WorkgroupScopeMatmul) {
  if (!device_has_workgroup_coop_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope f16 cooperative matrices";
  check_workgroup_products(DType::f32, kFastTolerance, 3, 40);
}

// f16 tensors into an f16 result: the kernel as it is, one dispatch, no rounding of operands.
// The f16 result is checked against the f64 product rounded to f16, which the f32 sum may miss
// by one f16 step (2^-10 relative at most).
TEST_F(GpuCoopMatrix, WorkgroupGemmOfF16Tensors) {
  if (!device_has_workgroup_coop_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope f16 cooperative matrices";
  check_workgroup_products(DType::f16, 1e-3, 1, 60);
}

// The lines of a dispatch list (BuildReport::dispatch_list) that hold every one of `words`.
size_t dispatch_lines_with(const std::string& dispatch_list,
                           std::initializer_list<std::string_view> words) {
  size_t lines = 0;
  for (size_t start = 0; start < dispatch_list.size();) {
    size_t end = dispatch_list.find('\n', start);
    if (end == std::string::npos) end = dispatch_list.size();
    const std::string_view line(dispatch_list.data() + start, end - start);
    lines += std::all_of(words.begin(), words.end(), [&](std::string_view word) {
      return line.find(word) != std::string_view::npos;
    });
    start = end + 1;
  }
  return lines;
}

// conv2d(x, w) with `options` and both of its gradients in fast precision (or `precision`),
// checked on the GPU against the f64 reference (which rounds nothing) within `tolerance`, with
// seeded random inputs and cotangent; returns the dispatch list it ran. Without validation: the
// layer predates the workgroup-scope extension.
// The workgroup GEMM and Winograd's forward and weight gradient forced below their size rules.
struct WinogradOnTheWorkgroupGemm {
  const ScopedSwitch workgroup{"MEGANEURA_WORKGROUP_GEMM", "1"};
  const ScopedSwitch forward{"MEGANEURA_WINOGRAD_CONV", "1"};
  const ScopedSwitch weight_gradient{"MEGANEURA_WINOGRAD_WEIGHT_GRAD", "1"};
};

std::string checked_fast_convolution(const Shape& x, const Shape& w, const Conv2dOptions& options,
                                     uint64_t seed, Precision precision = Precision::fast,
                                     double tolerance = kFastTolerance) {
  SessionOptions session_options;
  session_options.precision = precision;
  Shape y{x[0], w[0], 0, 0};
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t reach = options.dilation[axis] * (w[2 + axis] - 1) + 1;
    y[2 + axis] = (x[2 + axis] + 2 * options.padding[axis] - reach) / options.stride[axis] + 1;
  }
  std::string dispatch_list;
  check_on_gpu(
      {{"x", x}, {"w", w}, {"seed", y}},
      [&options](Graph& graph, std::vector<Tensor>& in) {
        output_with_gradients(graph, conv2d(in[0], in[1], std::nullopt, options), in[2],
                              {in[0], in[1]});
      },
      tolerance, seed, session_options, nullptr, false, &dispatch_list);
  return dispatch_list;
}

// Winograd in fast precision stores its transformed points as f16 (MEGANEURA_WINOGRAD_F16), and
// its batched point products read them as they are: the forward's (256 output channels, the
// 256 x 128 block split into rows where the device has tensor-layout loads) and the data
// gradient's (128 input channels, the 128 x 256 block) on the workgroup GEMM, forced below its
// size rule, one workgroup z a point; no operand rounded by a launch of its own. The output and
// both gradients within the fast tolerance of the f64 reference, which rounds nothing.
TEST_F(GpuCoopMatrix, WinogradPointsInF16OnTheBatchedWorkgroupGemm) {
  if (!device_has_workgroup_coop_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope f16 cooperative matrices";
  const WinogradOnTheWorkgroupGemm forced;
  const std::string dispatch_list =
      checked_fast_convolution({2, 128, 32, 32}, {256, 128, 3, 3}, {.padding = {1, 1}}, 81);
  EXPECT_GE(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}), 2u)
      << dispatch_list;
  EXPECT_GE(dispatch_lines_with(dispatch_list, {"winograd_tiles"}) +
                dispatch_lines_with(dispatch_list, {"winograd_filter"}),
            3u)
      << dispatch_list;
  EXPECT_EQ(dispatch_lines_with(dispatch_list, {"round_to_f16"}), 0u) << dispatch_list;
}

// A strided convolution's columns side by side in f16 (passes/im2col.cpp, half_columns_suit):
// im2col of x rounded to f16 once for the forward and the weight gradient, the forward and the
// data gradient (into column gradients side by side, summed by col2im) on the workgroup GEMM,
// forced below its size rule, and the weight gradient over K = N * plane: a 3x3 convolution
// with 128 output channels (the 128 x 256 block) and with 256 (the 256 x 128 block split into
// rows where the device has tensor-layout loads), and a 1x1 one with stride 2, as ResNet-50's
// downsampling. The output and both gradients within the fast tolerance of the f64 reference,
// which rounds nothing.
TEST_F(GpuCoopMatrix, StridedConvolutionOnF16ColumnsSideBySide) {
  if (!device_has_workgroup_coop_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope f16 cooperative matrices";
  const ScopedSwitch workgroup("MEGANEURA_WORKGROUP_GEMM", "1");
  uint64_t seed = 83;
  for (const auto& [x, w, options] :
       {std::tuple<Shape, Shape, Conv2dOptions>{
            {4, 128, 16, 16}, {128, 128, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
        std::tuple<Shape, Shape, Conv2dOptions>{
            {4, 128, 16, 16}, {256, 128, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
        std::tuple<Shape, Shape, Conv2dOptions>{
            {4, 256, 16, 16}, {512, 256, 1, 1}, {.stride = {2, 2}}}}) {
    SCOPED_TRACE(shape_string(x) + " * " + shape_string(w));
    const std::string dispatch_list = checked_fast_convolution(x, w, options, seed++);
    EXPECT_GE(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}), 2u)
        << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"im2col"}), 1u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"col2im"}), 1u) << dispatch_list;
  }
}

// A 1x1 convolution's forward and data gradient over f16 images one an image
// (passes/im2col.cpp, half_images_suit) on the workgroup GEMM, forced below its size rule: planes
// of 784 and 3136, which only its narrow blocks divide (112 wide on 128 invocations, 224 wide),
// with 64, 128 and 256 rows. The weight gradient's per-image products read the same f16 images,
// on the workgroup GEMM where K (the plane, 3136) is whole blocks and its 128 x 256 result one
// block, else on the subgroup GEMM, and none left reading f32 operands. The output and both
// gradients within the fast tolerance of the f64 reference, which rounds nothing.
TEST_F(GpuCoopMatrix, PointwiseConvolutionOnF16ImagesOneAnImage) {
  if (!device_has_workgroup_coop_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope f16 cooperative matrices";
  const ScopedSwitch workgroup("MEGANEURA_WORKGROUP_GEMM", "1");
  uint64_t seed = 87;
  for (const auto& [x, w, workgroup_products] :
       {std::tuple<Shape, Shape, size_t>{{2, 128, 28, 28}, {256, 128, 1, 1}, 2},
        std::tuple<Shape, Shape, size_t>{{2, 256, 56, 56}, {128, 256, 1, 1}, 3},
        std::tuple<Shape, Shape, size_t>{{2, 256, 56, 56}, {64, 256, 1, 1}, 2},
        std::tuple<Shape, Shape, size_t>{{2, 64, 28, 28}, {128, 64, 1, 1}, 2}}) {
    SCOPED_TRACE(shape_string(x) + " * " + shape_string(w));
    const std::string dispatch_list = checked_fast_convolution(x, w, {}, seed++);
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}),
              workgroup_products)
        << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"half_matmul"}), 3u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {" matmul %"}), 0u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"transpose"}), 0u) << dispatch_list;
  }
}

// Products of f16 tensors into f16 results that the workgroup GEMM does not take (below its
// size rule, or off its blocks) run on the subgroup-scope GEMM as they are, in every
// transposition, with each width of load (8 halves, 4, 1), against the f64 product rounded to
// f16: one dispatch, or two where K is long enough to split (f32 partial products, then their
// sum rounded to f16, sum_to_f16). Units of 8 halves need only the operands' contiguous extents
// to be multiples of 8: 50 rows (SmolVLA's action chunk) read them where A is not transposed.
TEST_F(GpuCoopMatrix, SubgroupGemmOfF16Tensors) {
  if (!device_has_coop_matrices()) GTEST_SKIP() << "the device has no f16 cooperative matrices";
  uint64_t seed = 70;
  for (const auto& [m, n, k, launches] :
       {std::tuple{128, 576, 192, 1}, std::tuple{132, 68, 36, 1}, std::tuple{130, 66, 34, 1},
        std::tuple{50, 96, 200, 1}, std::tuple{64, 96, 2048, 2}, std::tuple{60, 92, 2044, 2},
        std::tuple{50, 96, 2048, 2}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                   " flags " + std::to_string(flags));
      size_t dispatches = 0;
      check_on_gpu(
          {{"a", ta ? Shape{k, m} : Shape{m, k}, DType::f16},
           {"b", tb ? Shape{n, k} : Shape{k, n}, DType::f16}},
          [&](Graph& graph, std::vector<Tensor>& in) {
            graph.set_output("y", matmul(in[0], in[1], ta, tb).id());
          },
          1e-3, seed++, fast(), &dispatches, false);
      EXPECT_EQ(dispatches, static_cast<size_t>(launches));
    }
  }
}

// Products of one 16-bit (`half`) and one f32 operand (half products of a frozen weight beside
// an activation, or of a rounded activation beside a trained weight: passes/half_products.cpp)
// on the subgroup-scope GEMM, in every transposition, either operand 16-bit, against the f64
// product of the values (the f32 operand rounded as the GEMM loads it): the 16-bit operand in
// units of 8 halves where its contiguous extent allows (50 rows too), else 4 or 1 at a time; one
// dispatch, or two where K is long enough to split.
void check_products_of_one_half_operand(DType half, double tolerance,
                                        const SessionOptions& options, uint64_t seed) {
  for (const auto& [m, n, k, launches] :
       {std::tuple{50, 96, 200, 1}, std::tuple{132, 68, 36, 1}, std::tuple{50, 96, 2048, 2},
        std::tuple{60, 92, 2044, 2}}) {
    for (int flags = 0; flags < 8; ++flags) {
      const bool ta = flags & 1, tb = flags & 2, half_b = flags & 4;
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                   " flags " + std::to_string(flags));
      size_t dispatches = 0;
      check_on_gpu(
          {{"a", ta ? Shape{k, m} : Shape{m, k}, half_b ? DType::f32 : half},
           {"b", tb ? Shape{n, k} : Shape{k, n}, half_b ? half : DType::f32}},
          [&](Graph& graph, std::vector<Tensor>& in) {
            const ValueId product =
                graph.add("half_matmul", {in[0].id(), in[1].id()},
                          {{"transpose_a", int64_t{ta}}, {"transpose_b", int64_t{tb}}});
            graph.set_output("y", product);
          },
          tolerance, seed++, options, &dispatches, false);
      EXPECT_EQ(dispatches, static_cast<size_t>(launches));
    }
  }
}

TEST_F(GpuCoopMatrix, SubgroupGemmOfOneF16Operand) {
  if (!device_has_coop_matrices()) GTEST_SKIP() << "the device has no f16 cooperative matrices";
  check_products_of_one_half_operand(DType::f16, 3e-3, fast(), 90);
}

// Tensor-addressing loads, from either origin, read what the plain loads read: the workgroup
// GEMM in every transposition against the f64 product of exact f16 values (multiples of 2^-10,
// so that only the f32 sums round). Without validation: the layer predates the extension.
TEST_F(GpuCoopMatrix, TensorAddressingLoadsReadTheSameOperands) {
  std::unique_ptr<gpu::Device> device = gpu::Device::open("", false);
  if (!device->info().caps.workgroup_coop_matrix.tensor_addressing)
    GTEST_SKIP() << "the device has no tensor-addressing cooperative-matrix loads";
  constexpr int64_t m = 256, n = 512, k = 192;
  std::mt19937 random(53);
  std::uniform_int_distribution<int> numerator(-1024, 1024);
  for (int flags = 0; flags < 4; ++flags) {
    const bool ta = flags & 1, tb = flags & 2;
    std::vector<int> a(m * k), b(k * n);  // in 1024ths, as stored
    for (int& x : a) x = numerator(random);
    for (int& x : b) x = numerator(random);
    const auto a_at = [&](int64_t row, int64_t p) { return a[ta ? p * m + row : row * k + p]; };
    const auto b_at = [&](int64_t p, int64_t col) { return b[tb ? col * k + p : p * n + col]; };
    std::vector<double> expected(m * n);  // the same for every kind of load
    for (int64_t row = 0; row < m; ++row)
      for (int64_t col = 0; col < n; ++col) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += double(a_at(row, p)) * b_at(p, col);
        expected[row * n + col] = sum / (1024.0 * 1024.0);
      }
    const auto upload = [&](const std::vector<int>& values, const char* label) {
      std::vector<uint16_t> bits(values.size());
      std::transform(values.begin(), values.end(), bits.begin(),
                     [](int n) { return f16_bits(n / 1024.0); });
      const gpu::BufferId buffer =
          device->create_buffer(bits.size() * 2, gpu::BufferUse::device, label);
      device->write_buffer(buffer, 0, std::as_bytes(std::span(bits)));
      return buffer;
    };
    const gpu::BufferId a_buffer = upload(a, "a"), b_buffer = upload(b, "b");
    const gpu::BufferId c_buffer = device->create_buffer(m * n * 4, gpu::BufferUse::device, "c");
    for (const gpu::MatrixLoads loads :
         {gpu::MatrixLoads::plain, gpu::MatrixLoads::tensor_at_element,
          gpu::MatrixLoads::tensor_at_buffer_start}) {
      SCOPED_TRACE("flags " + std::to_string(flags) + " loads " +
                   std::to_string(static_cast<int>(loads)));
      std::array<uint32_t, 3> groups{};
      const gpu::KernelSpec spec = workgroup_gemm_spec(m, n, k, ta, tb, loads, &groups);
      std::vector<gpu::Command> commands(1);
      commands[0].kind = gpu::Command::Kind::dispatch;
      commands[0].dispatch = {device->create_pipelines(std::span(&spec, 1))[0],
                              {{a_buffer, 0, uint64_t(m * k * 2)},
                               {b_buffer, 0, uint64_t(k * n * 2)},
                               {c_buffer, 0, uint64_t(m * n * 4)}},
                              {},
                              groups,
                              spec.label};
      const gpu::RecordingId recording = device->record(commands, gpu::Timing::none);
      device->submit(recording);
      device->destroy_recording(recording);
      std::vector<float> c(m * n);
      device->read_buffer(c_buffer, 0, std::as_writable_bytes(std::span(c)));
      double worst = 0;
      for (int64_t i = 0; i < m * n; ++i) worst = std::max(worst, std::abs(expected[i] - c[i]));
      // 192 products of at most 1 summed in f32: errors near 1e-5; a misread operand is order 1.
      EXPECT_LT(worst, 1e-4);
    }
    for (const gpu::BufferId buffer : {a_buffer, b_buffer, c_buffer})
      device->destroy_buffer(buffer);
  }
}

// A device without tensor addressing refuses a kernel that asks for it, naming the kernel, the
// feature and the device, instead of handing the driver SPIR-V it cannot run.
TEST_F(GpuCoopMatrix, TensorAddressingLoadsRefusedWhereMissing) {
  std::unique_ptr<gpu::Device> device = gpu::Device::open("", false);
  if (device->info().caps.workgroup_coop_matrix.tensor_addressing)
    GTEST_SKIP() << "the device has tensor-addressing loads (the test above runs them)";
  const gpu::KernelSpec spec =
      workgroup_gemm_spec(256, 512, 192, false, false, gpu::MatrixLoads::tensor_at_element);
  try {
    device->create_pipelines(std::span(&spec, 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'" + spec.label + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("cooperativeMatrixTensorAddressing"), std::string::npos) << message;
    EXPECT_NE(message.find(device->info().name), std::string::npos) << message;
  }
}

// SPV_KHR_cooperative_matrix through the rewrite, the default wherever the device has it. The NV
// tests above run validated, which leaves KHR off (Debian's layer predates the extension, see
// device_features.cpp); this one runs without validation, so KHR where the device has it.
TEST_F(GpuCoopMatrix, MatmulConvolutionsAndAttentionKhr) {
  if (!device_lists_coop_shape(true))
    GTEST_SKIP() << "the device has no f16 KHR cooperative matrices";
  check_matmuls(kKhr);
  check_convolutions(kKhr);
  check_attention(kKhr);
}

// Where the device runs bfloat16 cooperative matrices.
bool device_has_bf16_coop_matrices() {
  static const bool available = runs_coop_matrices(Precision::bf16);
  return available;
}

// Where the device runs bf16 precision's products on workgroup-scope bfloat16 matrices too
// (bf16 precision needs the subgroup ones as well).
bool device_has_bf16_workgroup_matrices() {
  return device_has_bf16_coop_matrices() &&
         device_has_workgroup_coop_matrices(gpu::ScalarType::bf16);
}

const Numerics kBf16{
    .precision = Precision::bf16, .validation = false, .tolerance = kBf16Tolerance};

// Every fast kernel again with bfloat16 operands (the KHR rewrite, then SPV_KHR_bfloat16), against
// the f64 reference.
TEST_F(GpuCoopMatrix, MatmulConvolutionsAndAttentionBf16) {
  if (!device_has_bf16_coop_matrices())
    GTEST_SKIP() << "the device has no bfloat16 KHR cooperative matrices";
  check_matmuls(kBf16);
  check_convolutions(kBf16);
  check_attention(kBf16);
}

// bfloat16's range without any loss scaling: a product of values of about 1e-6 (products of
// 1e-12, below f16's smallest subnormal, where f16 operands would give zeros), and attention's
// gradients of a cotangent of 1e-6 at Whisper's and SD 1.5's shapes (on f16 operands, scaled by
// passes::scale_attention_gradients as in fast precision).
TEST_F(GpuCoopMatrix, SmallValuesNeedNoScalingBf16) {
  if (!device_has_bf16_coop_matrices())
    GTEST_SKIP() << "the device has no bfloat16 KHR cooperative matrices";
  check_on_gpu(
      {{"a", {300, 200}, DType::f32, -1e-6, 1e-6}, {"b", {200, 260}, DType::f32, -1e-6, 1e-6}},
      [](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("y", matmul(in[0], in[1]).id());
      },
      kBf16Tolerance, 31, kBf16.options(), nullptr, false);
  for (const auto& [q, kv] : {std::pair<Shape, Shape>{{1, 2, 1500, 64}, {1, 2, 1500, 64}},
                              {{1, 1, 1024, 80}, {1, 1, 1024, 80}},
                              {{2, 6, 300, 64}, {2, 2, 300, 64}}}) {
    SCOPED_TRACE(shape_string(q));
    check_on_gpu(
        {{"q", q}, {"k", kv}, {"v", kv}, {"g", q, DType::f32, -1e-6, 1e-6}},
        [](Graph& graph, std::vector<Tensor>& x) {
          output_with_gradients(graph, scaled_dot_product_attention(x[0], x[1], x[2], {}), x[3],
                                {x[0], x[1], x[2]});
        },
        kBf16.attention_gradient_tolerance, 32, kBf16.options(), nullptr, false);
  }
}

// The workgroup GEMM with bfloat16 operands (forced onto products below its size rule): both
// operands rounded to bfloat16 by launches of their own, the product read from bfloat16 memory,
// in every transposition and both block forms, within the bf16 tolerance of the f64 reference;
// and bfloat16's range, a product of values of about 1e-6 (products of 1e-12, which f16
// operands would lose), named in the dispatch list as the route it took.
TEST_F(GpuCoopMatrix, WorkgroupScopeMatmulBf16) {
  if (!device_has_bf16_workgroup_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope bfloat16 cooperative matrices";
  check_workgroup_products(DType::f32, kBf16Tolerance, 3, 70, kBf16.options());
  const ScopedSwitch forced("MEGANEURA_WORKGROUP_GEMM", "1");
  std::string dispatch_list;
  check_on_gpu(
      {{"a", {512, 192}, DType::f32, -1e-6, 1e-6}, {"b", {192, 512}, DType::f32, -1e-6, 1e-6}},
      [](Graph& graph, std::vector<Tensor>& in) {
        graph.set_output("y", matmul(in[0], in[1]).id());
      },
      kBf16Tolerance, 77, kBf16.options(), nullptr, false, &dispatch_list);
  EXPECT_EQ(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}), 1u)
      << dispatch_list;
  EXPECT_EQ(dispatch_lines_with(dispatch_list, {"round_to_bf16"}), 2u) << dispatch_list;
}

// The convolutions' routes to the workgroup GEMM in bf16 precision, forced below its size rule:
// a strided convolution's columns side by side (im2col of x rounded to bfloat16, once for the
// forward and the weight gradient; col2im of the column gradients) and a 1x1 convolution's images
// one an image, their products reading bfloat16 operands, on the subgroup GEMM where the
// workgroup GEMM does not take them (the 1x1 weight gradients over planes of 784 and 3136, with
// K not whole 64-deep steps or no block for their channels): three products each, none on f32
// operands. Nothing rounds to f16. The output and both gradients within the bf16 tolerance of the
// f64 reference.
TEST_F(GpuCoopMatrix, ConvolutionRoutesOnBfloat16Operands) {
  if (!device_has_bf16_workgroup_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope bfloat16 cooperative matrices";
  const ScopedSwitch workgroup("MEGANEURA_WORKGROUP_GEMM", "1");
  uint64_t seed = 93;
  for (const auto& [x, w, options, columns] :
       {std::tuple<Shape, Shape, Conv2dOptions, bool>{
            {4, 128, 16, 16}, {256, 128, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, true},
        std::tuple<Shape, Shape, Conv2dOptions, bool>{
            {4, 256, 16, 16}, {512, 256, 1, 1}, {.stride = {2, 2}}, true},
        std::tuple<Shape, Shape, Conv2dOptions, bool>{
            {2, 128, 28, 28}, {256, 128, 1, 1}, {}, false},
        std::tuple<Shape, Shape, Conv2dOptions, bool>{
            {2, 256, 56, 56}, {64, 256, 1, 1}, {}, false}}) {
    SCOPED_TRACE(shape_string(x) + " * " + shape_string(w));
    const std::string dispatch_list =
        checked_fast_convolution(x, w, options, seed++, Precision::bf16, kBf16Tolerance);
    EXPECT_GE(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}), 2u)
        << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"half_matmul"}), 3u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {" matmul %"}), 0u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"round_to_f16"}), 0u) << dispatch_list;
    EXPECT_EQ(dispatch_lines_with(dispatch_list, {"im2col"}), columns ? 1u : 0u) << dispatch_list;
  }
}

// Winograd in bf16 precision stores its transformed points as bfloat16 and its batched point
// products read them as they are: the forward's and the data gradient's on the workgroup GEMM
// (forced below its size rule), the weight gradient's on the subgroup GEMM (its 256 x 128 result
// splits over K, the tiles); no operand rounded by a launch of its own. The output and both
// gradients within the bf16 tolerance of the f64 reference, which rounds nothing.
TEST_F(GpuCoopMatrix, WinogradPointsInBfloat16) {
  if (!device_has_bf16_workgroup_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope bfloat16 cooperative matrices";
  const WinogradOnTheWorkgroupGemm forced;
  const std::string dispatch_list = checked_fast_convolution(
      {2, 128, 32, 32}, {256, 128, 3, 3}, {.padding = {1, 1}}, 97, Precision::bf16, kBf16Tolerance);
  EXPECT_GE(dispatch_lines_with(dispatch_list, {"gemm_workgroup_coopmat", "half_matmul"}), 2u)
      << dispatch_list;
  EXPECT_EQ(dispatch_lines_with(dispatch_list, {" matmul %"}), 0u) << dispatch_list;
  EXPECT_EQ(dispatch_lines_with(dispatch_list, {"round_to_bf16"}) +
                dispatch_lines_with(dispatch_list, {"round_to_f16"}),
            0u)
      << dispatch_list;
}

// Half activations in bf16 precision between two Winograd convolutions (the workgroup GEMM
// forced below its size rule): the first convolution's point products store bfloat16 results
// (bf16_result), its output transform reads them and stores a bfloat16 image, which the tanh
// reads, and the second convolution's tiles read the bfloat16 tanh; their gradients alike
// (passes::half_activations; Passes.HalfActivationsInBf16StoreWhatElementwiseKernelsRead checks
// that rewrite). The output and the three gradients within 0.1 of the f64 reference, as with
// MEGANEURA_HALF_ACTIVATIONS=0, in no more dispatches: the bf16 bound of
// GpuNorm.ResidualBlockOverHalfActivations, whose weight gradients likewise sum thousands of
// products of rounded values that cancel.
TEST_F(GpuCoopMatrix, HalfActivationsInBfloat16BetweenWinogradConvolutions) {
  if (!device_has_bf16_workgroup_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope bfloat16 cooperative matrices";
  const WinogradOnTheWorkgroupGemm forced;
  const auto build = [](Graph& graph, std::vector<Tensor>& in) {
    const Conv2dOptions same{.padding = {1, 1}};
    const Tensor hidden = tanh(conv2d(in[0], in[1], std::nullopt, same));
    output_with_gradients(graph, conv2d(hidden, in[2], std::nullopt, same), in[3],
                          {in[0], in[1], in[2]});
  };
  size_t dispatches[2] = {0, 0};
  for (const bool half : {false, true}) {
    SCOPED_TRACE(half ? "half activations" : "MEGANEURA_HALF_ACTIVATIONS=0");
    const ScopedSwitch activations("MEGANEURA_HALF_ACTIVATIONS", half ? "bf16" : "0");
    std::string dispatch_list;
    check_on_gpu({{"x", {2, 128, 32, 32}},
                  {"w1", {256, 128, 3, 3}},
                  {"w2", {128, 256, 3, 3}},
                  {"seed", {2, 128, 32, 32}}},
                 build, 0.1, 101, kBf16.options(), &dispatches[half], false, &dispatch_list);
    EXPECT_GE(dispatch_lines_with(dispatch_list, {"winograd_output"}), 2u) << dispatch_list;
  }
  EXPECT_LE(dispatches[1], dispatches[0]);
}

// bf16 tensors into a bf16 result in bf16 precision: the kernel reads the bfloat16 operands and
// stores the bfloat16 result itself, one dispatch, no rounding of operands; checked against the
// f64 product rounded to bfloat16, which the f32 sum may miss by one bfloat16 step (2^-8
// relative at most).
TEST_F(GpuCoopMatrix, WorkgroupGemmOfBf16Tensors) {
  if (!device_has_bf16_workgroup_matrices())
    GTEST_SKIP() << "the device has no workgroup-scope bfloat16 cooperative matrices";
  check_workgroup_products(DType::bf16, 8e-3, 1, 90, kBf16.options());
}

// Products of bf16 tensors that the workgroup GEMM does not take run on the subgroup GEMM in bf16
// precision, reading the bfloat16 operands as they are (units of 8 values, 4, and one at a time;
// split over K where it is long) into an f32 result that a rounding stores, in every
// transposition, against the f64 product rounded to bfloat16 (one bfloat16 step, 2^-8 relative,
// at most).
TEST_F(GpuCoopMatrix, SubgroupGemmOfBf16Tensors) {
  if (!device_has_bf16_coop_matrices())
    GTEST_SKIP() << "the device has no bfloat16 cooperative matrices";
  uint64_t seed = 100;
  for (const auto& [m, n, k] : {std::tuple{128, 576, 192}, std::tuple{132, 68, 36},
                                std::tuple{130, 66, 34}, std::tuple{64, 96, 2048}}) {
    for (int flags = 0; flags < 4; ++flags) {
      const bool ta = flags & 1, tb = flags & 2;
      SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                   " flags " + std::to_string(flags));
      std::string dispatch_list;
      check_on_gpu(
          {{"a", ta ? Shape{k, m} : Shape{m, k}, DType::bf16},
           {"b", tb ? Shape{n, k} : Shape{k, n}, DType::bf16}},
          [&](Graph& graph, std::vector<Tensor>& in) {
            graph.set_output("y", matmul(in[0], in[1], ta, tb).id());
          },
          8e-3, seed++, kBf16.options(), nullptr, false, &dispatch_list);
      EXPECT_EQ(dispatch_lines_with(dispatch_list, {"gemm_coopmat", "half_matmul"}), 1u)
          << dispatch_list;
    }
  }
}

// check_products_of_one_half_operand in bf16 precision with one bf16 and one f32 operand (half
// products there: the f32 operand rounded to bfloat16 as the GEMM loads it), within the bf16
// tolerance of the f64 product.
TEST_F(GpuCoopMatrix, SubgroupGemmOfOneBf16Operand) {
  if (!device_has_bf16_coop_matrices())
    GTEST_SKIP() << "the device has no bfloat16 cooperative matrices";
  check_products_of_one_half_operand(DType::bf16, kBf16Tolerance, kBf16.options(), 190);
}

// The probe of a subgroup's fragment layout: through both extensions every element of the A and
// accumulator fragments lies in exactly one lane's component (the probe checks that), and
// NVIDIA's driver keeps them in the layout the attention forward's register softmax is written
// for, which the session then turns on.
TEST_F(GpuCoopMatrix, FragmentLayoutProbe) {
  if (!device_has_nv_coop_matrices()) GTEST_SKIP() << "no f16 NV cooperative matrices";
  const std::unique_ptr<gpu::Device> device = gpu::Device::open();
  for (const bool khr : {false, true}) {
    SCOPED_TRACE(khr ? "KHR" : "NV");
    if (khr && !device_lists_coop_shape(true)) continue;
    const std::optional<gpu::FragmentLayout> layout = gpu::probe_fragment_layout(*device, khr);
    ASSERT_TRUE(layout.has_value());
    if (device->info().name.find("NVIDIA") != std::string::npos) {
      EXPECT_TRUE(gpu::is_quad_row_layout(*layout));
    }
  }
}

}  // namespace
}  // namespace mg
