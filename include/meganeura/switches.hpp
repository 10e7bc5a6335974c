#pragma once
// Switches: every MEGANEURA_* environment variable in one typed table, read in one place
// (src/config/switches.cpp) with one parser and one error for a bad value. A Session reads them
// once when it is built (or takes SessionOptions::switches), a device when it opens; tests set
// them in-process. docs/SWITCHES.md lists them, and a test keeps that list and this table equal.
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mg {

struct Switches {
  // Devices and the kernel cache.
  std::string device;     // MEGANEURA_DEVICE: the device selector used where none is given
  bool validate = false;  // MEGANEURA_VALIDATE=1: Vulkan validation layers on every device
  // The kernel cache's folder: MEGANEURA_CACHE_DIR, else $XDG_CACHE_HOME/meganeura, else
  // $HOME/.cache/meganeura; empty (no cache on disk) where none is set or MEGANEURA_NO_CACHE=1.
  std::string cache_dir;
  bool kernel_stats = false;  // MEGANEURA_KERNEL_STATS=1: the driver's per-kernel statistics
  // Testing: MEGANEURA_INJECT_FAULT=alloc:N makes the Nth device memory allocation after a
  // device opens fail as out of device memory; device_lost:N makes the Nth queue submission and
  // every later one report VK_ERROR_DEVICE_LOST.
  struct InjectedFault {
    enum class Kind { allocation, device_lost } kind = Kind::allocation;
    int64_t at = 0;  // counted from 1
  };
  std::optional<InjectedFault> inject_fault;

  // Data-parallel training: MEGANEURA_OVERLAP_REDUCTION=0/1 overrides
  // DataParallelOptions::overlap (gradient sums overlapping backward).
  std::optional<bool> overlap_reduction;

  // Planning: overrides of SessionOptions and plan::PlanOptions (unset: their values).
  std::optional<bool> split_k;            // MEGANEURA_SPLIT_K
  std::optional<bool> im2col;             // MEGANEURA_IM2COL
  std::optional<bool> attention_dq_gemm;  // MEGANEURA_ATTENTION_DQ_GEMM
  std::optional<bool> setup;              // MEGANEURA_SETUP
  std::optional<bool> schedule_epochs;    // MEGANEURA_SCHEDULE_EPOCHS
  // MEGANEURA_ONE_PASS_VARIANCE: a decomposed training batch norm's variance from the mean of
  // squares and the mean, read in one pass (passes::decompose_batch_norm); unset: fast precision.
  std::optional<bool> one_pass_variance;
  // MEGANEURA_HALF_ACTIVATIONS: large f32 values that products and elementwise kernels write and
  // elementwise kernels, reductions and moves read are stored in 16 bits
  // (passes::half_activations): 0 in f32; 1 in the precision's 16-bit format (bfloat16 in bf16
  // precision, f16 in the others); bf16 in bfloat16 in any precision. Unset: 1 in fast and bf16
  // precision on a device with cooperative matrices, 0 elsewhere.
  enum class HalfActivations { off, on, bf16 };
  std::optional<HalfActivations> half_activations;
  // MEGANEURA_HALF_PRODUCTS=0: no products of operands stored in f16 for nothing
  // (passes::half_products); unset or 1: in fast precision on a device with cooperative matrices.
  std::optional<bool> half_products;
  bool no_fusion = false;                 // MEGANEURA_NO_FUSION=1: no fusion at all
  bool no_epilogue_fusion = false;        // MEGANEURA_NO_EPILOGUE_FUSION=1: no matmul epilogues
  bool no_norm_fusion = false;  // MEGANEURA_NO_NORM_FUSION=1: no normalisation prologues/epilogues
  // MEGANEURA_ATTENTION_GRAD_SCALE: attention gradients over a rescaled cotangent
  // (passes::scale_attention_gradients); unset: where attention runs on cooperative matrices.
  std::optional<bool> attention_grad_scale;
  // MEGANEURA_ATTENTION_OWN_GRAD_SCALE: the rescaled cotangent's largest |dO| found by each
  // backward kernel among the rows it reads (1) or by a reduction before it (0); unset: the
  // kernels where that rereads little (target::Target::attention_gradient_scales_itself).
  std::optional<bool> attention_own_grad_scale;
  // MEGANEURA_ATTENTION_PAD_HEADS=0: attention heads keep their width (the strict kernels take
  // heads that are not whole fragments) instead of being padded (passes::pad_attention_heads).
  std::optional<bool> attention_pad_heads;
  // MEGANEURA_ATTENTION_HEAD_SPLITS: dK and dV of grouped-query attention over parts of each
  // group's query heads (passes::split_attention): 1 every head apart on any device, 0 never;
  // unset: where the launch leaves compute units idle.
  std::optional<bool> attention_head_splits;
  // MEGANEURA_SPLIT_K_SLICES=N: every product split-K may cut takes N slices (1: none).
  std::optional<int64_t> split_k_slices;
  // MEGANEURA_ATTENTION_SPLITS=N or F,Q,KV: slices of every attention node, or of the forward,
  // dQ and dK / dV (1: none); empty where unset.
  std::vector<int64_t> attention_splits;
  // MEGANEURA_COLUMNS_SIDE_BY_SIDE: 1 puts every batch's convolution columns side by side (and
  // 1x1 convolutions' images, where the workgroup GEMM takes their product), 0 none; unset, the
  // rules decide.
  std::optional<bool> columns_side_by_side;

  // Kernel choice: kill switches, forced routes and tuning overrides (docs/SWITCHES.md).
  bool no_coopmat = false;      // MEGANEURA_NO_COOPMAT=1: fast precision runs strict kernels
  bool no_cpu_kernels = false;  // MEGANEURA_NO_CPU_KERNELS=1: GPU kernels on CPU devices
  bool packed_columns = false;  // MEGANEURA_PACKED_COLUMNS=1: f16-pair convolution columns
  // MEGANEURA_FEW_ROWS_GEMM=0: products of few rows on gemm.comp's tiles, not gemm_few_rows.comp.
  bool few_rows_gemm = true;
  // MEGANEURA_REDUCTION_UNROLL=0: a reduction's lanes load one element a loop step, not four.
  bool reduction_unroll = true;
  // MEGANEURA_JOIN_SLICES=0: products read a split attention's joined result, not its slices.
  bool join_slices = true;
  // MEGANEURA_INLINE_SMALL_DAGS=0: elementwise kernels read small DAGs' results (a batch norm's
  // per-channel scale) instead of evaluating those DAGs again per element.
  bool inline_small_dags = true;
  // MEGANEURA_TRANSPOSED_STORES=0: an elementwise DAG read by a transpose writes its own result,
  // which the transpose's launch moves, instead of writing the moved value itself (which its
  // other elementwise readers then read where it went).
  bool transposed_stores = true;
  // MEGANEURA_TRANSPOSED_LOADS=0: a transpose read only by elementwise DAGs keeps its launch,
  // instead of those DAGs reading its input where it takes each element.
  bool transposed_loads = true;
  // MEGANEURA_QUERY_CHAINS=0: an attention forward reads its queries from the launch of the index
  // chain that computes them (their projection's sum, heads apart, the rotation) instead of
  // computing that chain itself as it loads them.
  bool query_chains = true;
  // MEGANEURA_COOPMAT=nv|khr: the cooperative-matrix extension where a device has both.
  enum class CoopMatrixExtension { nv, khr };
  std::optional<CoopMatrixExtension> coopmat;
  std::optional<int64_t> coop_gemm_min;  // MEGANEURA_COOP_GEMM_MIN: multiply-adds per unit
  std::optional<bool> workgroup_gemm;    // MEGANEURA_WORKGROUP_GEMM
  std::optional<bool> gemm_swizzle;      // MEGANEURA_GEMM_SWIZZLE
  std::optional<int64_t> gemm_prefetch;  // MEGANEURA_GEMM_PREFETCH: K slices, 1 to 8
  std::optional<int64_t> gemm_k_groups;  // MEGANEURA_GEMM_K_GROUPS: 1, 2, 4 or 8
  // Tile overrides for sweeps, as written: the kernel that reads one ignores it, with a
  // warning, where it is malformed or does not fit the device.
  std::optional<std::string> gemm_tile;   // MEGANEURA_GEMM_TILE
  std::optional<std::string> coop_block;  // MEGANEURA_COOP_BLOCK
  // MEGANEURA_WORKGROUP_BLOCK=M,N,INVOCATIONS[,SPLIT_ROWS]: the workgroup GEMM's block wherever
  // it divides a product (kernels/gemm_workgroup.hpp), where the device runs that form.
  struct WorkgroupBlock {
    int64_t m = 0, n = 0, invocations = 0;
    bool split_rows = false;
  };
  std::optional<WorkgroupBlock> workgroup_block;
  // MEGANEURA_COOP_SPLIT_MODEL=0: cooperative-matrix matmuls take the coarse split-K rule of
  // convolution weight gradients instead of the modelled one (split_k_rule.cpp).
  bool coop_split_model = true;
  // MEGANEURA_CPU_GEMM_BLOCK=ROWSxCOLS: the CPU-device GEMM's block (rows 1-32, columns 1-8).
  std::optional<std::array<int64_t, 2>> cpu_gemm_block;
  std::optional<int64_t> conv_tiles;       // MEGANEURA_CONV_TILES: an index into conv's tile shapes
  std::optional<bool> conv_rows;           // MEGANEURA_CONV_ROWS
  std::optional<bool> direct_weight_grad;  // MEGANEURA_DIRECT_WEIGHT_GRAD
  std::optional<bool> winograd_weight_grad;          // MEGANEURA_WINOGRAD_WEIGHT_GRAD
  std::optional<int64_t> winograd_weight_grad_tile;  // MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE: 2, 4
  std::optional<bool> winograd_conv;                 // MEGANEURA_WINOGRAD_CONV
  std::optional<bool> winograd_f16;                  // MEGANEURA_WINOGRAD_F16
  std::optional<bool> half_columns;                  // MEGANEURA_HALF_COLUMNS
  std::optional<bool> half_images;                   // MEGANEURA_HALF_IMAGES
  // MEGANEURA_ATTENTION_BLOCKS=OWNED,STREAMED[,THREADS[,LANES]] for the strict attention kernels
  // (checked against the device where they are lowered); empty where unset.
  std::vector<int64_t> attention_blocks;
  std::optional<int64_t> attention_coop_block;       // MEGANEURA_ATTENTION_COOP_BLOCK: 32, 64
  std::optional<bool> attention_fragment_registers;  // MEGANEURA_ATTENTION_FRAGMENT_REGISTERS
  std::optional<bool> attention_fused_kv;            // MEGANEURA_ATTENTION_FUSED_KV

  // Reads a switch's text by its name; nothing where it is unset.
  using Lookup = std::function<std::optional<std::string>(std::string_view name)>;

  // Every switch from the process environment, with `overrides` (name -> text) in place of the
  // variables they name: tests set switches in-process so. Throws mg::Error on one line naming
  // the variable, its value, what it takes and what unsetting it gives.
  static Switches from_environment(
      const std::map<std::string, std::string, std::less<>>& overrides = {});
  // The same from `lookup` alone (XDG_CACHE_HOME and HOME included, for the cache folder).
  static Switches parse(const Lookup& lookup);
  // Every switch's name, in the table's order.
  static std::vector<std::string> names();
};

// The text a list switch was given as, "64,32" (errors that kernels raise quote it).
std::string switch_text(const std::vector<int64_t>& values);

}  // namespace mg
