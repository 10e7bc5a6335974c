// The SIMT GEMM (gemm.comp) in every tile configuration and with K sliced over k-groups,
// split-K partial products (k_splits) on the GPU and CPU-device kernels, the split-K pass end
// to end, and products of few rows (gemm_few_rows.comp), against the f64 reference. On Lavapipe
// gemm.comp runs only with MEGANEURA_NO_CPU_KERNELS=1.
#include <array>

#include "backends/vulkan/kernels/lowering.hpp"
#include "backends/vulkan/kernels/split_k_rule.hpp"
#include "conv_support.hpp"

namespace mg {
namespace {

using testing::check_conv;
using testing::check_on_gpu;
using testing::ScopedSwitch;

// The partial products of a matmul over `splits` K slices (what the split-K pass emits).
Tensor split_matmul(Tensor a, Tensor b, bool transpose_a, bool transpose_b, int64_t splits) {
  Graph& graph = a.graph();
  return Tensor(&graph, graph.add("matmul", {a.id(), b.id()},
                                  {{"transpose_a", int64_t{transpose_a}},
                                   {"transpose_b", int64_t{transpose_b}},
                                   {"k_splits", splits}}));
}

// Every operand layout with vec4 and scalar global loads (a contiguous extent of 40, 132 or 44
// allows vec4s, 33, 21 or 19 does not), ragged tiles, broadcast batches on both sides, two row
// tiles even at 128, and K slices (multiples of 16) whose last one is short: K = 33 in [0, 32)
// and [32, 33), K = 44 and K = 40 in three. Cold pipeline compiles dominate on Lavapipe, so the
// outputs are few.
void check_gemm_layouts() {
  check_on_gpu({{"a", {2, 1, 37, 40}},
                {"b", {1, 3, 40, 36}},
                {"at_odd", {33, 21}},
                {"bt_odd", {19, 33}},
                {"at", {40, 132}},
                {"b_odd", {40, 21}},
                {"a_k44", {21, 44}},
                {"bt_k44", {36, 44}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("nn_vec4_broadcast", matmul(x[0], x[1]).id());
                 graph.set_output("tt_scalar_split", split_matmul(x[2], x[3], true, true, 2).id());
                 graph.set_output("tn_two_row_tiles", matmul(x[4], x[5], true, false).id());
                 graph.set_output("nt_vec4_split", split_matmul(x[6], x[7], false, true, 3).id());
                 graph.set_output("nn_broadcast_split",
                                  split_matmul(x[0], x[1], false, false, 3).id());
               });
}

TEST(GpuGemm, EveryTileConfiguration) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  for (const char* tile : {"128", "64", "32"}) {
    SCOPED_TRACE(tile);
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", tile);
    check_gemm_layouts();
  }
}

// A read as 4 adjacent rows at one k (gemm.comp's A_QUADS) on the 128 tile, padded and swizzled
// (A_SWIZZLE, which MEGANEURA_GEMM_SWIZZLE forces where the padding fits), and on the wide tile
// (128 x 256, 8 x 16 a thread, 16-deep slices, always swizzled: on devices with 48 KiB of shared
// memory; Lavapipe's 32 KiB run the rule's tile instead) over a whole K of at least 1024 (the
// split-K pass off, so the product stays whole): ragged row and column tiles, K = 1030 with a
// short last slice, scalar and vec4 rows of A (K = 1030 and 1032), a batch of two. The same
// products on the 64 tile read A as before. A bad switch value is an error naming it.
TEST(GpuGemm, QuadRowsOfA) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  const auto check_quads = [] {
    check_on_gpu({{"a", {130, 1030}}, {"b", {1030, 70}}, {"a2", {2, 67, 1032}}, {"b2", {1032, 36}}},
                 [](Graph& graph, std::vector<Tensor>& x) {
                   graph.set_output("ragged", matmul(x[0], x[1]).id());
                   graph.set_output("batched", matmul(x[2], x[3]).id());
                 });
  };
  for (const auto& [tile, swizzle] : {std::pair<const char*, const char*>{"128", "0"},
                                      {"128", "1"},
                                      {"128,256,8,16,16", "0"},
                                      {"64", "1"}}) {
    SCOPED_TRACE(std::string(tile) + ", swizzle " + swizzle);
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", tile);
    const ScopedSwitch swizzled("MEGANEURA_GEMM_SWIZZLE", swizzle);
    check_quads();
  }
  const ScopedSwitch forced("MEGANEURA_GEMM_TILE", "128");
  for (const char* bad : {"2", "yes"})
    testing::expect_switch_rejected("MEGANEURA_GEMM_SWIZZLE", bad, check_quads);
}

// Rectangular tiles and per-thread blocks through the override's full form: taller and wider
// tiles than threads' blocks (two A or two B vec4s a thread per slice), and 8 x 4 blocks; the
// last five are the rule's short-K tile (64 x 64 with 8 x 8 a thread) and half tiles (with
// 16-deep slices, and with the 8-deep ones of short products and of a device with 16 KiB of
// shared memory).
TEST(GpuGemm, RectangularTiles) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  for (const char* tile : {"64,32,4,4,16", "32,64,4,4,16", "64,64,8,4,8", "64,64,8,8,8",
                           "128,64,8,8,16", "128,64,8,8,8", "64,128,8,8,16", "64,128,8,8,8"}) {
    SCOPED_TRACE(tile);
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", tile);
    check_gemm_layouts();
  }
}

// Loads of the next 2 or 3 K slices in flight (MEGANEURA_GEMM_PREFETCH, a tuning hook): every
// layout, K = 33 and 40 (shorter than the prefetched slices), split-K ranges, on the 64 tile with
// 2 k-groups and the 32 tile with 4, and the convolution GEMMs through generated loads; a bad
// value is an error naming the variable.
TEST(GpuGemm, PrefetchDepths) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  for (const auto& [prefetch, tile, k_groups] :
       {std::tuple<const char*, const char*, const char*>{"2", "64", "2"},
        {"3", "32", "4"},
        {"3", "64,128,8,8,16", "1"}}) {
    SCOPED_TRACE(std::string(prefetch) + " slices ahead, tile " + tile);
    const ScopedSwitch forced_prefetch("MEGANEURA_GEMM_PREFETCH", prefetch);
    const ScopedSwitch forced_tile("MEGANEURA_GEMM_TILE", tile);
    const ScopedSwitch forced_k_groups("MEGANEURA_GEMM_K_GROUPS", k_groups);
    check_gemm_layouts();
  }
  const ScopedSwitch forced_prefetch("MEGANEURA_GEMM_PREFETCH", "2");
  check_conv({2, 36, 9, 7}, {40, 36, 3, 3}, {.padding = {1, 1}});
  for (const char* bad : {"0", "9", "two"})
    testing::expect_switch_rejected("MEGANEURA_GEMM_PREFETCH", bad, check_gemm_layouts);
}

// K sliced over the workgroup's k-groups: every layout, including split-K ranges and K = 33
// and 40, where the last k-groups' slices lie wholly past K and read zeros; then a fused
// epilogue, which k-group 0 alone applies, and the convolution GEMMs through generated loads
// (K = 324, 360 and 126). Lavapipe's 32 KiB of shared memory fit 2 k-groups of the 64 tile (whose
// reduction also passes through tile_b) and 4 of the 32 tile.
TEST(GpuGemm, KGroups) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  const std::array<std::array<const char*, 2>, 2> configurations{{{"64", "2"}, {"32", "4"}}};
  for (const auto& [tile, k_groups] : configurations) {
    SCOPED_TRACE(std::string(tile) + " tile, " + k_groups + " k-groups");
    const ScopedSwitch forced_tile("MEGANEURA_GEMM_TILE", tile);
    const ScopedSwitch forced_k_groups("MEGANEURA_GEMM_K_GROUPS", k_groups);
    check_gemm_layouts();
  }
  const ScopedSwitch forced_tile("MEGANEURA_GEMM_TILE", "32");
  const ScopedSwitch forced_k_groups("MEGANEURA_GEMM_K_GROUPS", "4");
  size_t dispatches = 0;
  check_on_gpu(
      {{"x", {37, 70}}, {"w", {45, 70}}, {"bias", {45}}},
      [](Graph& graph, std::vector<Tensor>& x) {
        graph.set_output("y", (gelu(linear(x[0], x[1], x[2])) + 1.0).id());
      },
      1e-5, 7, {}, &dispatches);
  EXPECT_EQ(dispatches, 1u);
  check_conv({2, 36, 9, 7}, {40, 36, 3, 3}, {.padding = {1, 1}});
}

// The K_GROUPS of the gemm.comp launch of `y` on `device` (with the test's switches).
std::string k_groups_of(const Graph& graph, Tensor y, target::DeviceTraits device) {
  device.switches = testing::switches();
  for (const kernels::Launch& launch : kernels::lower_node(graph, y.id(), device)) {
    if (launch.kernel != "gemm") continue;
    for (const auto& [name, value] : launch.defines)
      if (name == "K_GROUPS") return value;
  }
  return "no gemm.comp launch";
}

std::string matmul_k_groups(const Shape& a, const Shape& b, int64_t splits,
                            const target::DeviceTraits& device) {
  Graph graph;
  const Tensor x = input(graph, "a", a), y = input(graph, "b", b);
  return k_groups_of(graph, splits > 1 ? split_matmul(x, y, false, false, splits) : matmul(x, y),
                     device);
}

// The defines of the gemm.comp launch of `y` on `device` (with the test's switches).
std::vector<std::pair<std::string, std::string>> gemm_defines(const Graph& graph, Tensor y,
                                                              target::DeviceTraits device) {
  device.switches = testing::switches();
  for (const kernels::Launch& launch : kernels::lower_node(graph, y.id(), device))
    if (launch.kernel == "gemm") return launch.defines;
  return {};
}

// The gemm.comp defines of the product a @ b (as `splits` split-K partials where splits > 1).
std::vector<std::pair<std::string, std::string>> product_defines(
    const Shape& a, const Shape& b, int64_t splits, const target::DeviceTraits& device) {
  Graph graph;
  const Tensor x = input(graph, "a", a), w = input(graph, "b", b);
  const Tensor y = splits > 1 ? split_matmul(x, w, false, false, splits) : matmul(x, w);
  return gemm_defines(graph, y, device);
}

target::DeviceTraits h200_sized() {
  target::DeviceTraits device;
  device.max_shared_memory_bytes = 49152;
  device.max_workgroup_invocations = 1024;
  return device;
}

// A malformed tile override, or one gemm.comp or the device cannot run, leaves the chosen tile
// and says why on stderr.
TEST(GemmLowering, UnfitTileOverridesAreIgnored) {
  target::DeviceTraits device;  // 16 KiB of shared memory, 256 invocations
  Graph graph;
  const Tensor y = matmul(input(graph, "a", {256, 64}), input(graph, "b", {64, 256}));
  const auto chosen = gemm_defines(graph, y, device);
  ASSERT_FALSE(chosen.empty());
  for (const std::string tile :
       {"96", "64,64,4,4", "64,64,4,4,16,1", "64,x,4,4,16", "64,64,6,4,16", "32,32,4,8,16",
        "64,32,4,4,4", "128,128,4,4,8", "128,128,8,8,32", "0,64,4,4,16", "64,64,4,4,99999999999"}) {
    SCOPED_TRACE(tile);
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", tile);
    ::testing::internal::CaptureStderr();
    const auto defines = gemm_defines(graph, y, device);
    const std::string warning = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(defines, chosen);
    EXPECT_NE(warning.find("ignoring MEGANEURA_GEMM_TILE=" + tile), std::string::npos) << warning;
  }
  const ScopedSwitch forced("MEGANEURA_GEMM_TILE", "64,32,4,4,16");
  const auto defines = gemm_defines(graph, y, device);
  const auto define = [&](const std::string& name) {
    for (const auto& [key, value] : defines)
      if (key == name) return value;
    return std::string("missing");
  };
  EXPECT_EQ(define("TILE_M") + " " + define("TILE_N") + " " + define("WORK_M") + " " +
                define("WORK_N") + " " + define("TILE_K"),
            "64 32 4 4 16");
}

// The tile for an H200-sized device (132 compute units): 64 x 64 with 8 x 8 a thread for short
// K over many tiles; 128 x 128 where it fills them and
// neither extent leaves a row or column of tiles at most half full nor M is one row of them,
// else 64 x 128 (128 x 64 for thin N, and where M is exactly one row over two waves); 64 x 128 also
// before the 64 x 64 tile where 128 x 128 would leave units idle and 64 x 128 fills at least half
// of them. Both take 16-deep K slices where the device has more than 16 KiB of shared memory for
// them, unless the product's whole K is short and the launch has at least two workgroups per
// compute unit.
TEST(GemmLowering, HalfTilesForThinOrUnfilledProducts) {
  target::DeviceTraits h200;
  h200.max_shared_memory_bytes = 49152;
  h200.max_workgroup_invocations = 1024;
  const auto tile_of = [](const Shape& a, const Shape& b, const target::DeviceTraits& device,
                          int64_t splits = 1) {
    Graph graph;
    const Tensor x = input(graph, "a", a), w = input(graph, "b", b);
    const Tensor y = splits > 1 ? split_matmul(x, w, false, false, splits) : matmul(x, w);
    std::string tile;
    for (const auto& [key, value] : gemm_defines(graph, y, device))
      if (key == "TILE_M" || key == "TILE_N" || key == "TILE_K")
        tile += (tile.empty() ? "" : " ") + value;
    return tile;
  };
  EXPECT_EQ(tile_of({4096, 512}, {512, 4096}, h200), "128 128 8");
  EXPECT_EQ(tile_of({64, 512}, {512, 32768}, h200), "64 128 16");   // 64 rows
  EXPECT_EQ(tile_of({128, 576}, {576, 49152}, h200), "128 64 16");  // one row, 384 tiles
  EXPECT_EQ(tile_of({128, 576}, {576, 16384}, h200), "64 128 16");  // one row, 128 tiles
  EXPECT_EQ(tile_of({96, 576}, {576, 49152}, h200), "64 128 16");   // part of a row
  EXPECT_EQ(tile_of({320, 512}, {512, 16384}, h200), "64 128 16");  // a half-empty third row
  EXPECT_EQ(tile_of({32768, 512}, {512, 64}, h200), "128 64 16");   // 64 columns
  EXPECT_EQ(tile_of({2048, 512}, {512, 1024}, h200), "64 128 16");  // 128 tiles of 128 x 128
  EXPECT_EQ(tile_of({1024, 512}, {512, 1024}, h200), "64 128 16");  // 128 tiles of 64 x 128
  EXPECT_EQ(tile_of({576, 128}, {128, 576}, h200), "64 64 16");     // 45 tiles of 64 x 128
  // Short K: 16-deep slices where the launch is latency bound (120 workgroups), 8-deep where it
  // has workgroups to spare (392).
  EXPECT_EQ(tile_of({1536, 128}, {128, 576}, h200), "64 128 16");
  EXPECT_EQ(tile_of({64, 147}, {147, 50176}, h200), "64 128 8");
  // K <= 128 over at least 8 tiles of 128 x 128 per compute unit: 64 x 64 with 8 x 8 a thread.
  EXPECT_EQ(tile_of({49152, 128}, {128, 576}, h200), "64 64 8");
  EXPECT_EQ(tile_of({1152, 128}, {128, 3136}, h200), "128 128 8");  // 225 tiles
  // Whole K decides, not the split-K slice's: ResNet's 3x3/2 convolution, 9 slices of 128.
  EXPECT_EQ(tile_of({4, 128, 1152}, {4, 1152, 784}, h200, 9), "64 128 16");
  target::DeviceTraits minimal;  // 16 KiB of shared memory
  minimal.max_workgroup_invocations = 1024;
  EXPECT_EQ(tile_of({1024, 512}, {512, 1024}, minimal), "64 128 8");
}

// A_QUADS on an H200-sized device: only the 128 x 128 tile with 8-deep slices, one in flight and
// padded k rows, over a whole K of at least 1024, with A contiguous along k; and where that
// leaves at least two workgroups of the wide tile (128 x 256, 8 x 16 a thread, 16-deep slices) a
// compute unit, the wide tile (4096 x 4096: 512 of them; 2048 x 2048: 128), whose quads are
// swizzled (A_SWIZZLE) for want of room for the padding.
TEST(GemmLowering, QuadRowsOfAOnlyForTheLargeTileOverLongK) {
  const auto quads = [](const Shape& a, const Shape& b, const target::DeviceTraits& device,
                        int64_t splits = 1, bool transpose_a = false) {
    Graph graph;
    const Tensor x = input(graph, "a", a), w = input(graph, "b", b);
    const Tensor y =
        splits > 1 ? split_matmul(x, w, false, false, splits) : matmul(x, w, transpose_a, false);
    std::string quads = "no gemm.comp launch", tile;
    for (const auto& [key, value] : gemm_defines(graph, y, device)) {
      if (key == "A_QUADS") quads = value;
      if (key == "TILE_M" || key == "TILE_N" || key == "WORK_M" || key == "WORK_N" ||
          key == "TILE_K" || key == "A_SWIZZLE")
        tile += " " + value;
    }
    return quads + tile;
  };
  const target::DeviceTraits h200 = h200_sized();
  EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, h200), "1 128 256 8 16 16 1");
  EXPECT_EQ(quads({4096, 1024}, {1024, 4096}, h200), "1 128 256 8 16 16 1");
  EXPECT_EQ(quads({2048, 1024}, {1024, 2048}, h200), "1 128 128 8 8 8 0");
  EXPECT_EQ(quads({4096, 1016}, {1016, 4096}, h200), "0 128 128 8 8 8 0");           // K under 1024
  EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, h200, 4), "0 128 128 8 8 8 0");        // split-K
  EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, h200, 1, true), "0 128 128 8 8 8 0");  // A along m
  EXPECT_EQ(quads({128, 4096}, {4096, 49152}, h200), "0 128 64 8 8 16 0");  // one row of tiles
  target::DeviceTraits roomy = h200;  // 64 KiB: the wide tile's quads padded
  roomy.max_shared_memory_bytes = 65536;
  EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, roomy), "1 128 256 8 16 16 0");
  target::DeviceTraits minimal;  // 16 KiB: the 128 tile without padded k rows, no wide tile
  minimal.max_workgroup_invocations = 1024;
  EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, minimal), "0 128 128 8 8 8 0");
  {
    const ScopedSwitch forced("MEGANEURA_GEMM_TILE", "128");  // a forced tile stays
    EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, h200), "1 128 128 8 8 8 0");
    const ScopedSwitch swizzled("MEGANEURA_GEMM_SWIZZLE", "1");
    EXPECT_EQ(quads({4096, 4096}, {4096, 4096}, h200), "1 128 128 8 8 8 1");
  }
  const ScopedSwitch swizzled("MEGANEURA_GEMM_SWIZZLE", "1");  // only quads are swizzled
  EXPECT_EQ(quads({4096, 1016}, {1016, 4096}, h200), "0 128 128 8 8 8 0");
}

// Loads in flight (gemm.comp PREFETCH) on an H200-sized device: up to four slices for the 4 x 4
// tiles, never past the slices a k-group walks after its first (SmolLM's 128 x 576 x 576 product
// as four K slices: 2 k-groups of 5 slices; its weight gradient: 2 of 4; K = 10: one slice), two
// for the 128 x 128 tile over K <= 128 (ResNet's strided data gradient), one for the half
// tiles, the short-K tile and the 128 x 128 tile over a long K; MEGANEURA_GEMM_PREFETCH overrides
// every one.
TEST(GemmLowering, PrefetchDepthByTile) {
  const auto prefetch_of = [](const Shape& a, const Shape& b, int64_t splits = 1) {
    std::string text;
    for (const auto& [key, value] : product_defines(a, b, splits, h200_sized()))
      if (key == "TILE_M" || key == "TILE_N" || key == "WORK_M" || key == "PREFETCH")
        text += (text.empty() ? "" : " ") + value;
    return text;
  };
  EXPECT_EQ(prefetch_of({128, 576}, {576, 576}, 4), "64 64 4 4");
  EXPECT_EQ(prefetch_of({576, 128}, {128, 576}), "64 64 4 3");
  EXPECT_EQ(prefetch_of({64, 10}, {10, 128}), "32 32 4 1");
  EXPECT_EQ(prefetch_of({1152, 128}, {128, 3136}), "128 128 8 2");
  EXPECT_EQ(prefetch_of({4096, 512}, {512, 4096}), "128 128 8 1");
  EXPECT_EQ(prefetch_of({128, 576}, {576, 49152}), "128 64 8 1");
  EXPECT_EQ(prefetch_of({64, 512}, {512, 32768}), "64 128 8 1");
  EXPECT_EQ(prefetch_of({49152, 128}, {128, 576}), "64 64 8 1");
  const ScopedSwitch forced("MEGANEURA_GEMM_PREFETCH", "3");
  EXPECT_EQ(prefetch_of({128, 576}, {576, 576}, 4), "64 64 4 3");
  EXPECT_EQ(prefetch_of({4096, 512}, {512, 4096}), "128 128 8 3");
}

// A product whose rows are a multiple of 4 floats, with nothing fused into its store, leaves a
// vec4 at a time (C_VEC4); odd rows, convolutions' scattered stores and the whole-tile 128 x 128
// kernel (at two workgroups' register limit on the H200) keep scalar store_c calls.
TEST(GemmLowering, VectorStoresIntoRowMajorProducts) {
  const auto vector_stores = [](const Shape& a, const Shape& b, int64_t splits = 1) {
    for (const auto& [key, value] : product_defines(a, b, splits, h200_sized()))
      if (key == "C_VEC4") return value;
    return std::string("no gemm.comp launch");
  };
  EXPECT_EQ(vector_stores({128, 576}, {576, 576}), "1");
  EXPECT_EQ(vector_stores({128, 576}, {576, 576}, 4), "1");
  EXPECT_EQ(vector_stores({130, 64}, {64, 36}), "1");
  EXPECT_EQ(vector_stores({128, 64}, {64, 98}), "0");
  EXPECT_EQ(vector_stores({4096, 512}, {512, 4096}), "0");
  EXPECT_EQ(vector_stores({4000, 512}, {512, 4096}), "1");
}

// The rules count workgroups against the device's compute units: a product that leaves an
// H200's 132 half idle on 128 x 128 tiles (64 of them) fills a 16-unit GPU, and SmolLM's
// q_proj needs no k-groups there.
TEST(GemmLowering, RulesFollowComputeUnits) {
  target::DeviceTraits small;
  small.max_shared_memory_bytes = 49152;
  small.max_workgroup_invocations = 1024;
  small.compute_units = 16;
  target::DeviceTraits h200 = small;
  h200.compute_units = 132;
  const auto tile = [](const target::DeviceTraits& device) {
    Graph graph;
    const Tensor y = matmul(input(graph, "a", {1024, 512}), input(graph, "b", {512, 1024}));
    std::string text;
    for (const auto& [key, value] : gemm_defines(graph, y, device))
      if (key == "TILE_M" || key == "TILE_N") text += (text.empty() ? "" : " ") + value;
    return text;
  };
  EXPECT_EQ(tile(h200), "64 128");
  EXPECT_EQ(tile(small), "128 128");
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, h200), "4");
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, small), "1");
}

// SmolLM-sized products with small outputs get k-groups up to what the device's shared memory
// holds; large outputs, short K and the 128 tile keep one. The override applies where it fits.
TEST(GemmLowering, KGroupsForSmallOutputs) {
  target::DeviceTraits h200;
  h200.max_shared_memory_bytes = 49152;
  h200.max_workgroup_invocations = 1024;
  // 72 workgroups of the 32 tile: 8 k-groups would take 64 KiB.
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, h200), "4");
  // Two K slices of 288: 144 workgroups of the 32 tile.
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 2, h200), "4");
  // Six K slices of 256: 108 workgroups of the 64 tile.
  EXPECT_EQ(matmul_k_groups({128, 1536}, {1536, 576}, 6, h200), "2");
  EXPECT_EQ(matmul_k_groups({128, 48}, {48, 576}, 1, h200), "1");      // 3 slices of K
  EXPECT_EQ(matmul_k_groups({2048, 576}, {576, 2048}, 1, h200), "1");  // 128 tile
  target::DeviceTraits minimal;  // 16 KiB of shared memory, 256 invocations
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, minimal), "2");

  // A convolution through generated loads: 64 x 64 x 576 on the 32 tile.
  Graph graph;
  const Tensor conv = conv2d(input(graph, "x", {1, 64, 8, 8}), input(graph, "w", {64, 64, 3, 3}),
                             std::nullopt, {.padding = {1, 1}});
  EXPECT_EQ(k_groups_of(graph, conv, h200), "4");

  {
    const ScopedSwitch forced("MEGANEURA_GEMM_K_GROUPS", "2");
    EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, h200), "2");
    EXPECT_EQ(matmul_k_groups({128, 48}, {48, 576}, 1, h200), "2");
    EXPECT_EQ(matmul_k_groups({2048, 576}, {576, 2048}, 1, h200), "1");  // 128 tile
  }
  const ScopedSwitch forced("MEGANEURA_GEMM_K_GROUPS", "8");  // 64 KiB: the choice stands
  EXPECT_EQ(matmul_k_groups({128, 576}, {576, 576}, 1, h200), "4");
}

// Split-K partial products on the device's default GEMM (gemm_cpu.comp on Lavapipe).
TEST(GpuGemm, DefaultKernelKSplits) {
  check_on_gpu({{"a", {2, 1, 7, 40}}, {"b", {1, 3, 40, 9}}, {"at", {33, 6}}, {"bt", {5, 33}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 graph.set_output("nn", split_matmul(x[0], x[1], false, false, 3).id());
                 graph.set_output("tt", split_matmul(x[2], x[3], true, true, 2).id());
               });
}

// A long-K product with a small output, its weight gradient (K = the 600 rows) included, split
// over K: the sum of the partial products matches the whole one on both GEMM kernels, and each
// of the two split products costs one GEMM and one reduction dispatch.
void check_split_k() {
  const auto build = [](Graph& graph, std::vector<Tensor>& x) {
    const Tensor y = matmul(x[0], x[1], false, true);
    testing::output_with_gradients(graph, y, x[2], {x[1]});
    graph.set_output("long_k", matmul(x[3], x[4], true, false).id());
  };
  const std::vector<testing::HarnessInput> inputs{
      {"x", {600, 6}}, {"w", {5, 6}}, {"seed", {600, 5}}, {"at", {700, 7}}, {"b", {700, 9}}};
  const ScopedSwitch split("MEGANEURA_SPLIT_K", "1");
  check_on_gpu(inputs, build);

  Graph graph;
  std::vector<Tensor> x;
  for (const testing::HarnessInput& spec : inputs) x.push_back(input(graph, spec.name, spec.shape));
  build(graph, x);
  const size_t split_dispatches = Session(graph, testing::session_options()).report().dispatches;
  const ScopedSwitch whole("MEGANEURA_SPLIT_K", "0");
  EXPECT_EQ(split_dispatches, Session(graph, testing::session_options()).report().dispatches + 2);
}

TEST(GpuGemm, SplitKEndToEnd) {
  check_split_k();
}

TEST(GpuGemm, SplitKEndToEndOnGpuKernels) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_split_k();
}

// Products of few rows against B stored [N, K] (gemm_few_rows.comp, y = x W^T of a decode step)
// on the GPU kernels: one row, four and eight; vec4 rows (K = 576, 40) and scalar ones (K = 33,
// and A stored [K, M]); columns that leave the last workgroup partly empty (37, 130); broadcast
// batches on both sides; a bias and a ReLU in the product's epilogue; and its gradients (B
// stored [K, N], or many rows) on gemm.comp beside it.
TEST(GpuGemm, FewRowsAgainstRowsOfB) {
  const ScopedSwitch gpu_kernels("MEGANEURA_NO_CPU_KERNELS", "1");
  check_on_gpu({{"x1", {1, 576}},
                {"w1", {130, 576}},
                {"x4", {2, 1, 4, 40}},
                {"w4", {1, 3, 37, 40}},
                {"xt8", {33, 8}},
                {"w8", {37, 33}},
                {"bias", {130}},
                {"seed", {1, 130}}},
               [](Graph& graph, std::vector<Tensor>& x) {
                 const Tensor logits = relu(matmul(x[0], x[1], false, true) + x[6]);
                 testing::output_with_gradients(graph, logits, x[7], {x[0], x[1]});
                 graph.set_output("batched", matmul(x[2], x[3], false, true).id());
                 graph.set_output("a_transposed_scalar", matmul(x[4], x[5], true, true).id());
               });
}

// Which products take gemm_few_rows.comp: at most 8 rows against B stored [N, K] with K of at
// least 32, whole; not 9 rows, B stored [K, N], K of 31, MEGANEURA_FEW_ROWS_GEMM=0 or a forced
// gemm.comp tile. The split-K rule leaves them whole up to a K of 4096 (which it splits on
// gemm.comp), and slices longer ones.
TEST(GemmLowering, FewRowsProductsTakeTheirOwnKernel) {
  const target::DeviceTraits device = h200_sized();
  const auto kernel_of = [&](const Shape& a, const Shape& b, bool transpose_b) {
    Graph graph;
    const Tensor y = matmul(input(graph, "a", a), input(graph, "b", b), false, transpose_b);
    target::DeviceTraits switched = device;
    switched.switches = testing::switches();
    return kernels::lower_node(graph, y.id(), switched).at(0).kernel;
  };
  EXPECT_EQ(kernel_of({4, 384}, {51865, 384}, true), "gemm_few_rows");
  EXPECT_EQ(kernel_of({1, 32}, {100, 32}, true), "gemm_few_rows");
  EXPECT_EQ(kernel_of({8, 576}, {576, 576}, true), "gemm_few_rows");
  EXPECT_EQ(kernel_of({9, 576}, {576, 576}, true), "gemm");
  EXPECT_EQ(kernel_of({4, 576}, {576, 576}, false), "gemm");
  EXPECT_EQ(kernel_of({4, 31}, {576, 31}, true), "gemm");
  const target::GemmProduct long_k{.m = 1, .n = 576, .k = 4096, .b_transposed = true};
  target::DeviceTraits switched = device;
  switched.switches = testing::switches();
  EXPECT_EQ(kernels::gemm_k_splits(long_k, switched), 1);
  EXPECT_GT(kernels::gemm_k_splits({.m = 1, .n = 576, .k = 4100, .b_transposed = true}, switched),
            1);
  {
    const ScopedSwitch off("MEGANEURA_FEW_ROWS_GEMM", "0");
    EXPECT_EQ(kernel_of({4, 384}, {51865, 384}, true), "gemm");
    switched.switches = testing::switches();
    EXPECT_GT(kernels::gemm_k_splits(long_k, switched), 1);
  }
  const ScopedSwitch tile("MEGANEURA_GEMM_TILE", "64");
  EXPECT_EQ(kernel_of({4, 384}, {51865, 384}, true), "gemm");
}

}  // namespace
}  // namespace mg
