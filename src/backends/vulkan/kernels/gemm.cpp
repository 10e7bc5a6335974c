// The SIMT GEMM (gemm.comp): its tiles, the rules that choose one per product, and its launches
// over buffers (matmul.cpp, the 1x1 convolutions) and through generated load functions (the
// implicit-GEMM convolutions, conv.cpp). CPU devices run gemm_cpu.comp instead (gemm_cpu.cpp).
#include <algorithm>
#include <array>
#include <optional>
#include <span>
#include <string>

#include "backends/vulkan/kernels/gemm_cpu.hpp"
#include "backends/vulkan/kernels/index_codegen.hpp"
#include "backends/vulkan/kernels/lowering.hpp"
#include "config/integer_list.hpp"
#include "ops/k_split.hpp"

namespace mg::kernels {
namespace {

// gemm.comp's configurations, largest first: TILE_M x TILE_N outputs a workgroup, WORK_M x
// WORK_N a thread, K slices of TILE_K. Every one moves a whole number of vec4s a thread per
// slice, and its two slots of both tiles (2 * TILE_K * (TILE_M + TILE_N) floats) take at most
// 16 KiB of shared memory, the least a Vulkan device offers, so every device runs every tile.
// The 128 tile keeps 8-deep slices: 16-deep ones take more registers than let two of its
// workgroups share a compute unit. k_groups multiplies the threads and the slots (gemm.comp
// K_GROUPS); it is chosen per product.
struct GemmTile {
  int64_t tile_m, tile_n, work_m, work_n, tile_k;
  int64_t k_groups = 1;
  int64_t prefetch = 1;  // slices whose loads a thread keeps in flight (gemm.comp PREFETCH)
  int64_t threads() const { return (tile_m / work_m) * (tile_n / work_n); }
  bool four_by_four() const { return work_m * work_n <= 16; }
  // The TILE_K slices each k-group walks over a K of `k`.
  int64_t chain(int64_t k) const { return (k + tile_k * k_groups - 1) / (tile_k * k_groups); }
};
constexpr std::array<GemmTile, 3> kGemmTiles{
    {{128, 128, 8, 8, 8}, {64, 64, 4, 4, 16}, {32, 32, 4, 4, 16}}};

// Shared memory of gemm.comp's two slots of both tiles for each of `k_groups` k-groups; `padded`
// counts the vec4 of padding that a k row of an operand contiguous along k takes (PAD_K_ROWS),
// for both operands.
int64_t gemm_shared_bytes(const GemmTile& tile, int64_t k_groups, bool padded) {
  return 2 * tile.tile_k * (tile.tile_m + tile.tile_n + (padded ? 8 : 0)) *
         static_cast<int64_t>(sizeof(float)) * k_groups;
}

int64_t workgroup_count(const GemmTile& tile, int64_t m, int64_t n, int64_t entries) {
  return ((m + tile.tile_m - 1) / tile.tile_m) * ((n + tile.tile_n - 1) / tile.tile_n) * entries;
}

// Why gemm.comp cannot run `tile` on `device` (its #error conditions and the device's limits),
// or nothing when it can.
std::optional<std::string> tile_misfit(const GemmTile& tile, const DeviceTraits& device) {
  constexpr int64_t kMostExtent = 1024;  // keeps the products below from overflowing
  for (const int64_t extent : {tile.tile_m, tile.tile_n, tile.work_m, tile.work_n, tile.tile_k}) {
    if (extent < 1 || extent > kMostExtent)
      return "every extent must lie in [1, " + std::to_string(kMostExtent) + "]";
  }
  if (tile.work_m % 4 != 0 || tile.work_n % 4 != 0 || tile.tile_m % tile.work_m != 0 ||
      tile.tile_n % tile.work_n != 0)
    return "work_m and work_n must be multiples of 4 that divide tile_m and tile_n";
  const int64_t threads = tile.threads();
  if ((tile.tile_n / tile.work_n) % 8 != 0 || threads % 32 != 0)
    return "warps are 4 x 8 threads: tile_n / work_n must be a multiple of 8 and the threads of "
           "32";
  if ((tile.tile_m * tile.tile_k) % (4 * threads) != 0 ||
      (tile.tile_n * tile.tile_k) % (4 * threads) != 0)
    return "every thread must move whole vec4s of both tiles' slices";
  if (threads > device.max_workgroup_invocations)
    return std::to_string(threads) + " invocations exceed the device's " +
           std::to_string(device.max_workgroup_invocations);
  const int64_t shared_bytes = gemm_shared_bytes(tile, 1, false);
  if (shared_bytes > device.max_shared_memory_bytes)
    return std::to_string(shared_bytes) + " bytes of shared memory exceed the device's " +
           std::to_string(device.max_shared_memory_bytes);
  return std::nullopt;
}

// MEGANEURA_GEMM_TILE forces a tile (tuning sweeps and tests): 128, 64 or 32 for one of
// kGemmTiles, or tile_m,tile_n,work_m,work_n,tile_k for any that fits the device. A malformed
// value or a tile the device cannot run is ignored with a warning.
std::optional<GemmTile> forced_tile(const DeviceTraits& device) {
  const std::optional<std::string>& text = device.switches.gemm_tile;
  if (!text) return std::nullopt;
  for (const GemmTile& candidate : kGemmTiles)
    if (std::to_string(candidate.tile_m) == *text) return candidate;
  const std::string prefix = "ignoring MEGANEURA_GEMM_TILE=" + *text + ": ";
  const std::optional<std::vector<int64_t>> values = config::parse_integers(*text, 5);
  if (!values) {
    warn_once(prefix + "expected 128, 64, 32 or tile_m,tile_n,work_m,work_n,tile_k");
    return std::nullopt;
  }
  const GemmTile tile{(*values)[0], (*values)[1], (*values)[2], (*values)[3], (*values)[4]};
  if (const std::optional<std::string> misfit = tile_misfit(tile, device)) {
    warn_once(prefix + *misfit + " (" + device.name + ")");
    return std::nullopt;
  }
  return tile;
}

// 64 x 128 with 8 x 8 a thread: a little slower than 128 x 128 on products that fill the GPU, so
// it takes the products where 128 x 128 tiles pad or leave compute units idle. Its K slices are
// 16 deep, which halves the chain of slices a workgroup waits on. A product with short K and
// workgroups to spare keeps 8-deep slices, whose first one costs less before the loop overlaps
// the rest (the ResNet stem). K is the whole product's, not a split-K slice's. The 16-deep
// tile's 24 KiB of shared memory need a device with more than the 16 KiB minimum; elsewhere it
// runs 8-deep slices. The half-wide tile (128 x 64) takes its slices by the same rule.
constexpr GemmTile kHalfTallTile{64, 128, 8, 8, 16};
constexpr GemmTile kHalfWideTile{128, 64, 8, 8, 16};
constexpr int64_t kShallowSliceDepth = 8, kMinKForDeepSlices = 256;
// A product over a short K with tiles to spare (SmolLM's lm_head weight gradient, 49152 x 576
// over K = 128: 1920 tiles of 128 x 128) spends much of each workgroup's time before and after
// its few slices; 64-thread workgroups with the same 8 x 8 a thread overlap more of them on each
// compute unit.
constexpr GemmTile kShortKTile{64, 64, 8, 8, 8};
constexpr int64_t kMaxShortK = 128, kShortKTilesPerUnit = 8;
// Where both M and N leave their last 128 x 128 tiles at most half full, half tiles still pad one
// of them; 64 x 64 tiles with 8 x 8 a thread pad neither (U-Net's 36 products of 320 x 320 in
// its Winograd weight gradient). Its two slots of 16-deep slices fit the 16 KiB every device has.
// Products through generated loads keep their tiles: on this one the implicit GEMM's weight
// gradient moved from conv_igemm.comp to gemm.comp and ran slower.
constexpr GemmTile kQuarterTile{64, 64, 8, 8, 16};

GemmTile half_tile(const GemmTile& half, int64_t m, int64_t n, int64_t whole_k, int64_t entries,
                   const DeviceTraits& device) {
  GemmTile tile = half;
  const bool latency_bound = workgroup_count(tile, m, n, entries) < 2 * device.compute_units;
  if (tile_misfit(tile, device) || (whole_k < kMinKForDeepSlices && !latency_bound))
    tile.tile_k = kShallowSliceDepth;
  return tile;
}

// The largest tile that still gives every compute unit work: 128 x 128 tiles for big products,
// down to 32 x 32 for small ones, over K (per entry, before any split). `entries` counts the
// problems of the launch (batch entries times split-K slices). Where 128 x 128 tiles would be at
// most half full along M or N, or M is a single row of them (the convolutions as matmuls, W [64, C
// * KH * KW] x columns, have 64 rows; U-Net's 320 channels leave the third row of tiles half empty;
// SmolLM's lm_head at sequence 128), the half-tall (half-wide) tile keeps every row of threads
// busy, and where they would be along both, 64 x 64 tiles (kQuarterTile); where they would not
// fill the compute units, the half-tall tile does before 64 x 64 with 4 x 4 a thread is taken,
// as long as it fills half of them (its 8 x 8 a thread reuse each load more).
GemmTile choose_tile_extent(int64_t m, int64_t n, int64_t whole_k, int64_t entries,
                            bool generated_loads, const DeviceTraits& device) {
  if (const std::optional<GemmTile> forced = forced_tile(device)) return *forced;
  const GemmTile& largest = kGemmTiles.front();
  const int64_t units = device.compute_units;
  const int64_t large_tiles = workgroup_count(largest, m, n, entries);
  const GemmTile half_tall = half_tile(kHalfTallTile, m, n, whole_k, entries, device);
  if (whole_k <= kMaxShortK && large_tiles >= kShortKTilesPerUnit * units) return kShortKTile;
  // The last of the 128 x 128 tiles along an extent is at most half full.
  const auto half_full_edge = [&](int64_t extent) {
    return extent % largest.tile_m != 0 && extent % largest.tile_m <= largest.tile_m / 2;
  };
  if (large_tiles >= units) {
    if (!generated_loads && m > largest.tile_m && n > largest.tile_n && half_full_edge(m) &&
        half_full_edge(n))
      return kQuarterTile;
    // One row of 128 x 128 tiles over at least two waves (SmolLM's lm_head, 128 x 49152 x 576):
    // 128 x 64 tiles read the wide operand once where 64 x 128 ones read it twice.
    if (m == largest.tile_m && large_tiles >= 2 * units)
      return half_tile(kHalfWideTile, m, n, whole_k, entries, device);
    if (m <= largest.tile_m || half_full_edge(m)) return half_tall;
    if (n <= 64) return half_tile(kHalfWideTile, m, n, whole_k, entries, device);
    return largest;
  }
  if (workgroup_count(half_tall, m, n, entries) >= units / 2) return half_tall;
  for (const GemmTile& candidate : std::span(kGemmTiles).subspan(1)) {
    if (workgroup_count(candidate, m, n, entries) >= units / 2) return candidate;
  }
  return kGemmTiles.back();
}

// Whether `tile` with `k_groups` k-groups runs on `device`. The k-groups' sums meet in their own
// slots, which hold a whole tile of C only when TILE_M * TILE_N <= 2 * TILE_K * (TILE_M +
// TILE_N) (the 64 and 32 tiles of kGemmTiles).
bool k_groups_fit(const GemmTile& tile, int64_t k_groups, const DeviceTraits& device) {
  if (k_groups == 1) return true;
  const int64_t threads = tile.threads() * k_groups;
  const int64_t shared_bytes = gemm_shared_bytes(tile, k_groups, false);
  return tile.tile_m * tile.tile_n <= 2 * tile.tile_k * (tile.tile_m + tile.tile_n) &&
         shared_bytes <= device.max_shared_memory_bytes &&
         threads <= device.max_workgroup_invocations;
}

// The K slices whose loads a thread of `tile` keeps in flight, for a launch over K slices of
// `k` (`whole_k` before any split). Threads of the 4 x 4 tiles walk a few slices each (SmolLM's
// 128 x 576 x 576 product and its gradients) and hold one vec4 of each operand per slice, so up
// to four slices ahead cost them few registers and hide the fetches these short chains wait on.
// The 128 x 128 tile over a K of at most 128 (ResNet's 1x1 and strided data gradients, 8 and 16
// slices) gains from two. The 8 x 8 tiles over longer K and the short-K tile keep one: their
// extra registers cost more than the latency hidden. No thread fetches past its k-group's
// chain: the slices after the first are all there is to keep in flight.
// MEGANEURA_GEMM_PREFETCH forces the depth (a tuning hook).
int64_t prefetch_depth(const GemmTile& tile, int64_t k, int64_t whole_k,
                       const DeviceTraits& device) {
  if (const std::optional<int64_t> forced = device.switches.gemm_prefetch) return *forced;
  const GemmTile& largest = kGemmTiles.front();
  int64_t depth = 1;
  if (tile.four_by_four()) {
    depth = 4;
  } else if (tile.tile_m == largest.tile_m && tile.tile_n == largest.tile_n &&
             whole_k <= kMaxShortK) {
    depth = 2;
  }
  return std::clamp<int64_t>(tile.chain(k) - 1, 1, depth);
}

// The tile of an M x N product over K (per entry; `k` the split-K slice's, `whole_k` before any
// split) and its k-groups. Fewer workgroups than compute units, or 64-thread workgroups of the
// 32 tile, leave the busy units with a few warps that wait on their long chain of K slices;
// k-groups walk K in parallel, doubling until the launch has the threads of one 256-thread
// workgroup per compute unit (128 x 576 x 576: 72 workgroups of the 32 tile, 8 k-groups where 64
// KiB of shared memory fit them, 4 in 48 KiB). Every k-group keeps at least two slices,
// so that fetching one still overlaps multiplying another, and there are at most 8, which bounds
// k-group 0's reduction. MEGANEURA_GEMM_K_GROUPS=1|2|4|8 forces the count (tuning and tests) where
// the device fits it.
GemmTile choose_gemm_tile(int64_t m, int64_t n, int64_t k, int64_t whole_k, int64_t entries,
                          bool generated_loads, const DeviceTraits& device) {
  constexpr int64_t kMostKGroups = 8;
  const int64_t threads_wanted = device.compute_units * 256;
  GemmTile chosen = choose_tile_extent(m, n, whole_k, entries, generated_loads, device);
  bool forced_k_groups = false;
  if (const std::optional<int64_t> forced = device.switches.gemm_k_groups;
      forced && k_groups_fit(chosen, *forced, device)) {
    chosen.k_groups = *forced;
    forced_k_groups = true;
  }
  const int64_t threads = chosen.threads() * workgroup_count(chosen, m, n, entries);
  while (!forced_k_groups && chosen.k_groups < kMostKGroups &&
         threads * chosen.k_groups < threads_wanted &&
         k / (chosen.tile_k * 2 * chosen.k_groups) >= 2 &&
         k_groups_fit(chosen, 2 * chosen.k_groups, device)) {
    chosen.k_groups *= 2;
  }
  chosen.prefetch = prefetch_depth(chosen, k, whole_k, device);
  return chosen;
}

// The extents and forms of one gemm.comp launch (see its header for each define): `problems`
// workgroup layers (batch entries times K slices), `k_slice` the K range of each.
struct GemmCompForm {
  int64_t m = 0, n = 0, k = 0, k_slice = 0, batches = 1, problems = 1;
  bool split = false, transpose_a = false, transpose_b = false;
  bool a_vec4 = false, b_vec4 = false, generated_loads = false, joined_a = false;
  // C is the product itself, row-major with rows of a multiple of 4 floats, bound as the vec4
  // view c4: four adjacent outputs of a thread are one store (no epilogue to apply).
  bool c_vec4 = false;
};

// The whole K from which a product on the 128 x 128 tile reads A in vec4s of 4 rows at one k.
constexpr int64_t kMinKForQuadA = 1024;

// The wide tile: 128 x 256 with 8 x 16 a thread in 16-deep slices (256 threads, one workgroup a
// compute unit by its registers), for large products that read A as row quads: the fastest form
// of the wide tiles and thread blocks swept. Its two slots of both
// tiles take all of a 48 KiB device, so A's quads are swizzled instead of padded (gemm.comp
// A_SWIZZLE). It takes products with at least two of its workgroups a compute unit.
constexpr GemmTile kWideQuadTile{128, 256, 8, 16, 16};
constexpr int64_t kWideQuadTilesPerUnit = 2;

bool same_extents(const GemmTile& a, const GemmTile& b) {
  return a.tile_m == b.tile_m && a.tile_n == b.tile_n && a.work_m == b.work_m &&
         a.work_n == b.work_n && a.tile_k == b.tile_k;
}

// Whether A (contiguous along k) enters gemm.comp as 4 adjacent rows at one k, four scalar loads
// stored as one vec4 (A_QUADS), instead of vec4s along k scattered into the k-major tile by four
// scalar stores: faster for large products on the 128 x 128 tile, 8-deep slices, one slice in
// flight, padded k rows (unpadded ones would put 8 lanes' stores on the same banks), no split.
// On shorter K or other tiles four loads per vec4 cost more than the scattered stores saved, so
// it stays to that form over a long whole K, and to the wide tile, which swizzles where it has
// no room for the padding.
bool quad_a_loads(const GemmCompForm& form, const GemmTile& tile, bool padded) {
  const bool quad_tile =
      (padded && same_extents(tile, kGemmTiles.front())) || same_extents(tile, kWideQuadTile);
  return !form.transpose_a && !form.generated_loads && !form.joined_a && !form.split && quad_tile &&
         tile.k_groups == 1 && tile.prefetch == 1 && form.k >= kMinKForQuadA;
}

// Whether A's row quads go to a swizzled tile instead of padded k rows (gemm.comp A_SWIZZLE):
// where the padding does not fit, or where MEGANEURA_GEMM_SWIZZLE=1 asks for it (tuning sweeps
// and the tests of a device whose shared memory fits the padding); padding is the faster of the
// two where it fits.
bool swizzled_a_quads(bool padded, const DeviceTraits& device) {
  return !padded || device.switches.gemm_swizzle.value_or(false);
}

// Whether a product that `tile` (chosen by choose_gemm_tile) would run takes the wide tile
// instead (kWideQuadTile): the 128 x 128 tile with A read as row quads over a whole K, no tile
// forced, and at least two wide workgroups a compute unit.
bool wide_quad_tile_suits(const BufferGemm& gemm, const GemmTile& tile, bool split,
                          const DeviceTraits& device) {
  const GemmTile& largest = kGemmTiles.front();
  return same_extents(tile, largest) && tile.k_groups == 1 && tile.prefetch == 1 && !split &&
         !gemm.transpose_a && gemm.joined_a.empty() && gemm.k >= kMinKForQuadA &&
         !forced_tile(device) && !tile_misfit(kWideQuadTile, device) &&
         workgroup_count(kWideQuadTile, gemm.m, gemm.n, gemm.batches) >=
             kWideQuadTilesPerUnit * device.compute_units;
}

// Completes `launch` (label, operands and the GLSL its loads and store need) as gemm.comp in
// `tile` and emits it.
void emit_gemm_comp(LoweringContext& context, const GemmCompForm& form, const GemmTile& tile,
                    Launch launch) {
  const auto flag = [](bool value) { return std::string(value ? "1" : "0"); };
  const bool padded =
      gemm_shared_bytes(tile, tile.k_groups, true) <= context.device().max_shared_memory_bytes;
  const bool quads = quad_a_loads(form, tile, padded);
  launch.kernel = "gemm";
  launch.files = {kernel_source("gemm.comp")};
  launch.defines = {{"M", glsl_uint(form.m)},
                    {"N", glsl_uint(form.n)},
                    {"K", glsl_uint(form.k)},
                    {"SPLIT_K", flag(form.split)},
                    {"K_SLICE", glsl_uint(form.k_slice)},
                    {"BATCHES", glsl_uint(form.batches)},
                    {"TRANSPOSE_A", flag(form.transpose_a)},
                    {"TRANSPOSE_B", flag(form.transpose_b)},
                    {"A_VEC4", flag(form.a_vec4)},
                    {"B_VEC4", flag(form.b_vec4)},
                    {"GENERATED_LOADS", flag(form.generated_loads)},
                    {"JOINED_A", flag(form.joined_a)},
                    {"C_VEC4", flag(form.c_vec4)},
                    {"TILE_M", std::to_string(tile.tile_m)},
                    {"TILE_N", std::to_string(tile.tile_n)},
                    {"WORK_M", std::to_string(tile.work_m)},
                    {"WORK_N", std::to_string(tile.work_n)},
                    {"TILE_K", std::to_string(tile.tile_k)},
                    {"K_GROUPS", std::to_string(tile.k_groups)},
                    {"PREFETCH", std::to_string(tile.prefetch)},
                    {"PAD_K_ROWS", flag(padded)},
                    {"A_QUADS", flag(quads)},
                    {"A_SWIZZLE", flag(quads && swizzled_a_quads(padded, context.device()))}};
  launch.groups = tiled_grid(launch.label, form.n, tile.tile_n, form.m, tile.tile_m, form.problems,
                             context.device());
  context.emit(std::move(launch));
}

// gemm_few_rows.comp: threads a column, columns a workgroup, and the most rows it takes.
constexpr int64_t kFewRowsLanes = 32, kFewRowsColumns = 8, kMostFewRows = 8;

void emit_few_rows_gemm(LoweringContext& context, const BufferGemm& gemm, Launch launch) {
  // vec4 reads of both operands along K: rows of a multiple of 4 floats start 16-byte aligned.
  const bool vec4 = gemm.k % 4 == 0 && !gemm.transpose_a;
  launch.kernel = "gemm_few_rows";
  launch.body = (vec4 ? vector_buffer_view("a4", 0, false) + vector_buffer_view("b4", 1, false)
                      : std::string()) +
                launch.body;
  launch.files = {kernel_source("gemm_few_rows.comp")};
  launch.defines = {{"LANES", std::to_string(kFewRowsLanes)},
                    {"COLUMNS", std::to_string(kFewRowsColumns)},
                    {"GEMM_M", glsl_uint(gemm.m)},
                    {"GEMM_N", glsl_uint(gemm.n)},
                    {"GEMM_K", glsl_uint(gemm.k)},
                    {"A_TRANSPOSED", gemm.transpose_a ? "1" : "0"},
                    {"VEC4", vec4 ? "1" : "0"}};
  launch.groups =
      tiled_grid(launch.label, gemm.n, kFewRowsColumns, 1, 1, gemm.batches, context.device());
  context.emit(std::move(launch));
}

}  // namespace

bool few_rows_gemm_suits(int64_t m, int64_t k, bool b_transposed, const DeviceTraits& device) {
  return device.switches.few_rows_gemm && b_transposed && m <= kMostFewRows && k >= kFewRowsLanes &&
         device.max_workgroup_invocations >= kFewRowsLanes * kFewRowsColumns &&
         !forced_tile(device);
}

SimtGemmLaunch simt_gemm_launch(int64_t m, int64_t n, int64_t k, int64_t whole_k, int64_t entries,
                                bool generated_loads, const DeviceTraits& device) {
  const GemmTile tile = choose_gemm_tile(m, n, k, whole_k, entries, generated_loads, device);
  return {.workgroups = workgroup_count(tile, m, n, entries),
          .chain = tile.chain(k),
          .four_by_four = tile.four_by_four()};
}

void emit_buffer_gemm(LoweringContext& context, const BufferGemm& gemm, Launch launch) {
  if (gemm.splits == 0 && gemm.joined_a.empty() &&
      few_rows_gemm_suits(gemm.m, gemm.k, gemm.transpose_b, context.device()))
    return emit_few_rows_gemm(context, gemm, std::move(launch));
  const bool split = gemm.splits > 0;
  const int64_t splits = split ? gemm.splits : 1;
  const int64_t k_slice = split ? k_slice_length(gemm.k, splits) : gemm.k;
  GemmTile tile = choose_gemm_tile(gemm.m, gemm.n, k_slice, gemm.k, gemm.batches * splits, false,
                                   context.device());
  if (wide_quad_tile_suits(gemm, tile, split, context.device())) tile = kWideQuadTile;
  // vec4 loads need the operand's contiguous extent in multiples of 4: a vec4 then starts
  // 16-byte aligned and lies wholly inside or outside, also at K slice boundaries (multiples
  // of 16).
  const bool a_vec4 = gemm.transpose_a ? gemm.m % 4 == 0 : gemm.k % 4 == 0;
  const bool b_vec4 = gemm.transpose_b ? gemm.k % 4 == 0 : gemm.n % 4 == 0;
  // Vec4 stores are faster everywhere but on the 128 x 128 tile over whole tiles, whose
  // registers just fit two workgroups a compute unit: the vec4 stores' extra registers would
  // leave it one.
  const bool at_register_limit = tile.tile_m == 128 && tile.tile_n == 128 && tile.work_m == 8 &&
                                 tile.work_n == 8 && gemm.m % 128 == 0 && gemm.n % 128 == 0;
  const bool c_vec4 = gemm.row_major_c && gemm.n % 4 == 0 && !at_register_limit;
  const bool joined_a = !gemm.joined_a.empty();
  launch.body = (joined_a ? gemm.joined_a
                 : a_vec4 ? vector_buffer_view("a4", 0, false)
                          : "") +
                (b_vec4 ? vector_buffer_view("b4", 1, false) : "") +
                (c_vec4 ? vector_buffer_view("c4", 2, true) : "") + launch.body;
  emit_gemm_comp(context,
                 GemmCompForm{.m = gemm.m,
                              .n = gemm.n,
                              .k = gemm.k,
                              .k_slice = k_slice,
                              .batches = gemm.batches,
                              .problems = gemm.batches * splits,
                              .split = split,
                              .transpose_a = gemm.transpose_a,
                              .transpose_b = gemm.transpose_b,
                              .a_vec4 = a_vec4,
                              .b_vec4 = b_vec4,
                              .joined_a = joined_a,
                              .c_vec4 = c_vec4},
                 tile, std::move(launch));
}

bool simt_gemm_suits(const GeneratedGemm& gemm, const DeviceTraits& device) {
  // Fitted to ResNet-50's and U-Net's convolutions: the square tiles win where they divide N and
  // K is deep enough for the double-buffered slices; the stem (K = 147) and 320-channel products
  // (N = 320 on 128 tiles) run faster on the convolution kernel's own tiles.
  constexpr int64_t kSmallestSquareTile = 32, kMinimumK = 256;
  if (gemm.m < kSmallestSquareTile || gemm.n < kSmallestSquareTile) return false;
  if (forced_tile(device)) return true;
  return gemm.n % choose_tile_extent(gemm.m, gemm.n, gemm.k, gemm.entries, true, device).tile_n ==
             0 &&
         gemm.k >= kMinimumK;
}

void emit_simt_gemm(LoweringContext& context, const GeneratedGemm& gemm,
                    std::vector<Operand> operands) {
  Launch launch;
  launch.label = context.label();
  launch.body = gemm.functions;
  launch.operands = std::move(operands);
  emit_gemm_comp(
      context,
      GemmCompForm{.m = gemm.m,
                   .n = gemm.n,
                   .k = gemm.k,
                   .k_slice = gemm.k,
                   .batches = gemm.entries,
                   .problems = gemm.entries,
                   .transpose_a = gemm.a_m_contiguous,
                   .transpose_b = gemm.b_k_contiguous,
                   .generated_loads = true},
      choose_gemm_tile(gemm.m, gemm.n, gemm.k, gemm.k, gemm.entries, true, context.device()),
      std::move(launch));
}

}  // namespace mg::kernels
