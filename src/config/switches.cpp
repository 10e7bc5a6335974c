// The switch table: the one place that reads MEGANEURA_* variables (and, for the kernel
// cache's folder, XDG_CACHE_HOME and HOME). Every switch is one line below; its kind says how
// its text is parsed, and every bad value is rejected by the same message.
#include "meganeura/switches.hpp"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include "config/integer_list.hpp"
#include "meganeura/error.hpp"

namespace mg {
namespace config {

std::optional<std::vector<int64_t>> parse_integers(std::string_view text, size_t count,
                                                   char separator) {
  std::vector<int64_t> values(count);
  const char* at = text.data();
  const char* end = text.data() + text.size();
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) {
      if (at == end || *at != separator) return std::nullopt;
      ++at;
    }
    const auto [next, error] = std::from_chars(at, end, values[i]);
    if (error != std::errc{}) return std::nullopt;
    at = next;
  }
  if (at != end) return std::nullopt;
  return values;
}

}  // namespace config

namespace {

// Reads each switch through a lookup, records its name (Switches::names) and rejects a bad
// value with the one message: "NAME='value': expected <what it takes>; unset it for <default>".
class Reader {
 public:
  explicit Reader(const Switches::Lookup& lookup) : lookup_(lookup) {}

  const std::vector<std::string>& names() const { return names_; }

  std::optional<std::string> text(const char* name) {
    names_.emplace_back(name);
    return lookup_(name);
  }

  // A path or selector: empty counts as unset.
  std::string nonempty_text(const char* name) { return text(name).value_or(""); }

  // 0 or 1.
  std::optional<bool> flag(const char* name, const char* off, const char* on, const char* unset) {
    const std::optional<std::string> value = text(name);
    if (!value) return std::nullopt;
    if (*value == "0") return false;
    if (*value == "1") return true;
    reject(name, *value, std::string("0 (") + off + ") or 1 (" + on + ")", unset);
  }

  // One whole number in [low, high].
  std::optional<int64_t> integer(const char* name, int64_t low, int64_t high, const char* what,
                                 const char* unset) {
    const std::optional<std::string> value = text(name);
    if (!value) return std::nullopt;
    const auto parsed = config::parse_integers(*value, 1);
    if (!parsed || (*parsed)[0] < low || (*parsed)[0] > high) reject(name, *value, what, unset);
    return (*parsed)[0];
  }

  // One of `allowed`, a whole number.
  std::optional<int64_t> one_of(const char* name, std::initializer_list<int64_t> allowed,
                                const char* what, const char* unset) {
    const std::optional<std::string> value = text(name);
    if (!value) return std::nullopt;
    const auto parsed = config::parse_integers(*value, 1);
    for (int64_t candidate : allowed)
      if (parsed && (*parsed)[0] == candidate) return candidate;
    reject(name, *value, what, unset);
  }

  // Between `fewest` and `most` comma-separated whole numbers, each in [low, high] and, where
  // `counts` is not empty, as many as one of its entries; empty where unset.
  std::vector<int64_t> integers(const char* name, std::initializer_list<size_t> counts, int64_t low,
                                int64_t high, const char* what, const char* unset) {
    const std::optional<std::string> value = text(name);
    if (!value) return {};
    for (size_t count : counts) {
      const auto parsed = config::parse_integers(*value, count);
      if (!parsed) continue;
      for (int64_t element : *parsed)
        if (element < low || element > high) reject(name, *value, what, unset);
      return *parsed;
    }
    reject(name, *value, what, unset);
  }

  [[noreturn]] static void reject(const char* name, const std::string& value,
                                  const std::string& what, const char* unset) {
    throw Error(std::string(name) + "='" + value + "': expected " + what + "; unset it for " +
                unset);
  }

 private:
  const Switches::Lookup& lookup_;
  std::vector<std::string> names_;
};

// The kernel cache's folder (Switches::cache_dir).
std::string cache_folder(Reader& read, bool no_cache) {
  std::string folder = read.nonempty_text("MEGANEURA_CACHE_DIR");
  if (folder.empty()) {
    if (const std::optional<std::string> xdg = read.text("XDG_CACHE_HOME"); xdg && !xdg->empty())
      folder = *xdg + "/meganeura";
    else if (const std::optional<std::string> home = read.text("HOME"); home && !home->empty())
      folder = *home + "/.cache/meganeura";
  }
  return no_cache ? "" : folder;
}

Switches read_switches(Reader& read) {
  Switches s;
  constexpr const char* kRule = "the built-in rule";
  s.device = read.nonempty_text("MEGANEURA_DEVICE");
  s.validate = read.flag("MEGANEURA_VALIDATE", "no validation layers", "validation layers on",
                         "no validation layers")
                   .value_or(false);
  const bool no_cache = read.flag("MEGANEURA_NO_CACHE", "kernel cache on disk",
                                  "no kernel cache on disk", "the kernel cache on disk")
                            .value_or(false);
  s.cache_dir = cache_folder(read, no_cache);
  s.kernel_stats = read.flag("MEGANEURA_KERNEL_STATS", "no driver statistics",
                             "driver statistics of every kernel", "none")
                       .value_or(false);
  if (const std::optional<std::string> fault = read.text("MEGANEURA_INJECT_FAULT")) {
    const size_t colon = fault->find(':');
    const std::string kind = fault->substr(0, colon);
    const auto at = colon == std::string::npos
                        ? std::nullopt
                        : config::parse_integers(fault->substr(colon + 1), 1);
    if ((kind != "alloc" && kind != "device_lost") || !at || (*at)[0] < 1)
      Reader::reject("MEGANEURA_INJECT_FAULT", *fault,
                     "alloc:N or device_lost:N (N from 1: the allocation or queue submission "
                     "that fails)",
                     "no injected faults");
    s.inject_fault =
        Switches::InjectedFault{kind == "alloc" ? Switches::InjectedFault::Kind::allocation
                                                : Switches::InjectedFault::Kind::device_lost,
                                (*at)[0]};
  }
  s.overlap_reduction =
      read.flag("MEGANEURA_OVERLAP_REDUCTION", "gradient sums after the whole backward pass",
                "gradient sums during backward", "DataParallelOptions::overlap");

  s.split_k = read.flag("MEGANEURA_SPLIT_K",
                        "no split-K, split sums, decomposed batch norms or split attention",
                        "all four on any device", "on GPUs, off on CPU devices");
  s.im2col = read.flag("MEGANEURA_IM2COL", "implicit-GEMM convolutions",
                       "im2col convolutions on any device", "im2col on GPUs");
  s.attention_dq_gemm = read.flag("MEGANEURA_ATTENTION_DQ_GEMM", "the dQ kernel",
                                  "dQ as a matmul of the scores' gradient",
                                  "the matmul on GPUs with the strict attention kernels");
  s.attention_grad_scale = read.flag("MEGANEURA_ATTENTION_GRAD_SCALE", "the cotangent as it is",
                                     "attention gradients over a cotangent scaled into f16's range",
                                     "scaled where attention runs on cooperative matrices");
  s.attention_own_grad_scale = read.flag("MEGANEURA_ATTENTION_OWN_GRAD_SCALE",
                                         "the cotangent's largest element reduced "
                                         "before the attention backward",
                                         "found by each backward kernel in the rows it reads",
                                         "by the kernels where that rereads little");
  s.attention_pad_heads =
      read.flag("MEGANEURA_ATTENTION_PAD_HEADS", "heads of any width as they are",
                "heads padded with zeros to whole cooperative-matrix fragments",
                "padded where attention runs on cooperative matrices");
  s.attention_head_splits =
      read.flag("MEGANEURA_ATTENTION_HEAD_SPLITS", "dK and dV over a group's query heads whole",
                "dK and dV over each query head of a group apart",
                "split where the launch leaves compute units idle");
  s.setup = read.flag("MEGANEURA_SETUP", "fixed work in every run", "fixed work once",
                      "SessionOptions::setup");
  s.schedule_epochs = read.flag("MEGANEURA_SCHEDULE_EPOCHS", "the lowering's order",
                                "launches grouped into epochs", "epochs");
  s.one_pass_variance =
      read.flag("MEGANEURA_ONE_PASS_VARIANCE", "batch norm variances in two passes",
                "batch norm variances in one pass in any precision", "one pass in fast precision");
  s.half_products = read.flag(
      "MEGANEURA_HALF_PRODUCTS", "products round their f32 operands as they load them",
      "operands stored in f16 where that costs nothing, in fast precision", "the same as 1");
  if (const std::optional<std::string> choice = read.text("MEGANEURA_HALF_ACTIVATIONS")) {
    if (*choice == "0")
      s.half_activations = Switches::HalfActivations::off;
    else if (*choice == "1")
      s.half_activations = Switches::HalfActivations::on;
    else if (*choice == "bf16")
      s.half_activations = Switches::HalfActivations::bf16;
    else
      Reader::reject("MEGANEURA_HALF_ACTIVATIONS", *choice,
                     "0 (activations stored in f32), 1 (in the precision's 16-bit format, "
                     "bfloat16 in bf16 precision, f16 in the others) or bf16 (in bfloat16 in any "
                     "precision)",
                     "16-bit activations in fast and bf16 precision");
  }
  s.no_fusion = read.flag("MEGANEURA_NO_FUSION", "fusion", "no fusion", "fusion").value_or(false);
  s.no_epilogue_fusion = read.flag("MEGANEURA_NO_EPILOGUE_FUSION", "matmul epilogues",
                                   "no matmul epilogues", "matmul epilogues")
                             .value_or(false);
  s.no_norm_fusion =
      read.flag("MEGANEURA_NO_NORM_FUSION", "normalisation prologues and epilogues",
                "no normalisation prologues or epilogues", "normalisation prologues and epilogues")
          .value_or(false);
  s.split_k_slices = read.integer("MEGANEURA_SPLIT_K_SLICES", 1, 1024,
                                  "a whole number of K slices from 1 to 1024 (1: no split)",
                                  "the built-in choice");
  s.attention_splits = read.integers(
      "MEGANEURA_ATTENTION_SPLITS", {1, 3}, 1, 1024,
      "N or F,Q,KV, whole numbers of slices from 1 to 1024 (1: no split) for every attention "
      "kernel or for the forward, dQ and dK / dV",
      "the built-in choice");
  s.columns_side_by_side = read.flag("MEGANEURA_COLUMNS_SIDE_BY_SIDE", "every image apart",
                                     "every batch side by side", kRule);

  s.no_coopmat = read.flag("MEGANEURA_NO_COOPMAT", "cooperative matrices in fast precision",
                           "strict kernels only", "cooperative matrices")
                     .value_or(false);
  s.no_cpu_kernels = read.flag("MEGANEURA_NO_CPU_KERNELS", "CPU kernels on CPU devices",
                               "GPU kernels everywhere", "CPU kernels on CPU devices")
                         .value_or(false);
  s.few_rows_gemm = read.flag("MEGANEURA_FEW_ROWS_GEMM", "products of few rows on the tiled GEMM",
                              "products of few rows on their own kernel",
                              "products of few rows on their own kernel")
                        .value_or(true);
  s.reduction_unroll = read.flag("MEGANEURA_REDUCTION_UNROLL", "one element a loop step",
                                 "four elements a loop step", "four elements a loop step")
                           .value_or(true);
  s.join_slices =
      read.flag("MEGANEURA_JOIN_SLICES", "products read the joined attention",
                "products join a split attention's slices themselves", "products join the slices")
          .value_or(true);
  s.inline_small_dags =
      read.flag("MEGANEURA_INLINE_SMALL_DAGS", "small DAGs' results read from their launches",
                "small DAGs evaluated again where they are read", "evaluated again")
          .value_or(true);
  s.transposed_stores =
      read.flag("MEGANEURA_TRANSPOSED_STORES", "transposes in launches of their own",
                "elementwise DAGs store where their transpose moves them", "transposed stores")
          .value_or(true);
  s.transposed_loads =
      read.flag("MEGANEURA_TRANSPOSED_LOADS", "transposes in launches of their own",
                "elementwise DAGs read through the transposes they alone read", "transposed loads")
          .value_or(true);
  s.query_chains =
      read.flag("MEGANEURA_QUERY_CHAINS", "attention reads its queries from their chain's launch",
                "attention computes its queries' index chain as it loads them", "query chains")
          .value_or(true);
  s.packed_columns = read.flag("MEGANEURA_PACKED_COLUMNS", "f32 columns",
                               "f16 pairs where they suit", "f32 columns")
                         .value_or(false);
  if (const std::optional<std::string> choice = read.text("MEGANEURA_COOPMAT")) {
    if (*choice == "nv")
      s.coopmat = Switches::CoopMatrixExtension::nv;
    else if (*choice == "khr")
      s.coopmat = Switches::CoopMatrixExtension::khr;
    else
      Reader::reject("MEGANEURA_COOPMAT", *choice, "nv or khr (the cooperative-matrix extension)",
                     "KHR where the device has it");
  }
  s.coop_gemm_min = read.integer(
      "MEGANEURA_COOP_GEMM_MIN", 0, INT64_MAX / 1024,
      "the multiply-adds per compute unit from which products run on cooperative matrices "
      "(0: every product)",
      kRule);
  s.workgroup_gemm = read.flag("MEGANEURA_WORKGROUP_GEMM", "no workgroup GEMM",
                               "the workgroup GEMM without its size bounds", kRule);
  s.gemm_swizzle = read.flag("MEGANEURA_GEMM_SWIZZLE",
                             "pad A's row quads where shared memory allows", "swizzle them", kRule);
  s.gemm_prefetch = read.integer("MEGANEURA_GEMM_PREFETCH", 1, 8,
                                 "a whole number of K slices from 1 to 8", kRule);
  s.gemm_k_groups =
      read.one_of("MEGANEURA_GEMM_K_GROUPS", {1, 2, 4, 8}, "1, 2, 4 or 8 k-groups", kRule);
  s.gemm_tile = read.text("MEGANEURA_GEMM_TILE");
  s.coop_block = read.text("MEGANEURA_COOP_BLOCK");
  if (const std::optional<std::string> block = read.text("MEGANEURA_WORKGROUP_BLOCK")) {
    std::optional<std::vector<int64_t>> parsed = config::parse_integers(*block, 3);
    if (!parsed) parsed = config::parse_integers(*block, 4);
    // An accumulator 64 rows high beside a block 64 wide would give A and B (each step 64
    // deep) one matrix type, which the KHR form cannot give two uses.
    const auto fits = [](const std::vector<int64_t>& v) {
      const bool split = v.size() == 4 && v[3] == 1;
      const int64_t accumulator_rows = split ? v[0] / 2 : v[0];
      return v[0] >= 16 && v[0] <= 512 && v[0] % (split ? 32 : 16) == 0 && v[1] >= 16 &&
             v[1] <= 512 && v[1] % 16 == 0 && (v[2] == 128 || v[2] == 256) &&
             (v.size() == 3 || v[3] == 0 || v[3] == 1) &&
             !(accumulator_rows == 64 && v[1] == 64);
    };
    if (!parsed || !fits(*parsed))
      Reader::reject("MEGANEURA_WORKGROUP_BLOCK", *block,
                     "M,N,INVOCATIONS[,SPLIT_ROWS]: M and N multiples of 16 from 16 to 512 (M of "
                     "32 with SPLIT_ROWS 1), 128 or 256 invocations, SPLIT_ROWS 0 or 1, not "
                     "64-row accumulators 64 wide",
                     kRule);
    s.workgroup_block = Switches::WorkgroupBlock{(*parsed)[0], (*parsed)[1], (*parsed)[2],
                                                 parsed->size() == 4 && (*parsed)[3] == 1};
  }
  s.coop_split_model = read.flag("MEGANEURA_COOP_SPLIT_MODEL",
                                 "the coarse split-K rule for cooperative-matrix matmuls",
                                 "the modelled split-K rule", "the modelled rule")
                           .value_or(true);
  if (const std::optional<std::string> block = read.text("MEGANEURA_CPU_GEMM_BLOCK")) {
    const auto parsed = config::parse_integers(*block, 2, 'x');
    if (!parsed || (*parsed)[0] < 1 || (*parsed)[0] > 32 || (*parsed)[1] < 1 || (*parsed)[1] > 8)
      Reader::reject("MEGANEURA_CPU_GEMM_BLOCK", *block,
                     "ROWSxCOLS, rows from 1 to 32 and columns from 1 to 8", kRule);
    s.cpu_gemm_block = std::array<int64_t, 2>{(*parsed)[0], (*parsed)[1]};
  }
  s.conv_tiles = read.integer("MEGANEURA_CONV_TILES", 0, 255,
                              "an index into the convolution kernel's tile shapes", kRule);
  s.conv_rows = read.flag("MEGANEURA_CONV_ROWS", "never gemm_rows.comp",
                          "gemm_rows.comp for every product of at most 4 columns", kRule);
  s.direct_weight_grad = read.flag("MEGANEURA_DIRECT_WEIGHT_GRAD", "never the direct kernel",
                                   "the direct kernel without its size minimums", kRule);
  s.winograd_weight_grad = read.flag("MEGANEURA_WINOGRAD_WEIGHT_GRAD", "never Winograd",
                                     "Winograd without its size minimums", kRule);
  s.winograd_weight_grad_tile = read.one_of("MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE", {2, 4},
                                            "2 (F(2 x 2, 3 x 3)) or 4 (F(4 x 4, 3 x 3))", kRule);
  s.winograd_conv = read.flag("MEGANEURA_WINOGRAD_CONV", "never Winograd",
                              "Winograd without its size minimums", kRule);
  s.winograd_f16 = read.flag("MEGANEURA_WINOGRAD_F16", "Winograd's points in f32",
                             "Winograd's points in f16 where its products round to f16", kRule);
  s.half_columns =
      read.flag("MEGANEURA_HALF_COLUMNS", "convolution columns per image in f32",
                "f16 columns side by side wherever the workgroup GEMM takes them", kRule);
  s.half_images = read.flag("MEGANEURA_HALF_IMAGES", "1x1 convolutions' images per image in f32",
                            "f16 images per image wherever the workgroup GEMM takes them", kRule);
  s.attention_blocks = read.integers("MEGANEURA_ATTENTION_BLOCKS", {4, 3, 2}, INT64_MIN, INT64_MAX,
                                     "OWNED,STREAMED[,THREADS[,LANES]]", "the built-in blocks");
  s.attention_coop_block = read.one_of(
      "MEGANEURA_ATTENTION_COOP_BLOCK", {32, 64},
      "32 or 64 (the cooperative-matrix attention kernels' streamed block)", "the built-in choice");
  s.attention_fragment_registers =
      read.flag("MEGANEURA_ATTENTION_FRAGMENT_REGISTERS", "scores staged through shared memory",
                "in registers where the device's fragment layout allows it", "the default (1)");
  s.attention_fused_kv = read.flag("MEGANEURA_ATTENTION_FUSED_KV", "dK and dV in two launches",
                                   "dK and dV in one launch where they suit", "one launch");
  return s;
}

}  // namespace

Switches Switches::parse(const Lookup& lookup) {
  Reader read(lookup);
  return read_switches(read);
}

Switches Switches::from_environment(
    const std::map<std::string, std::string, std::less<>>& overrides) {
  return parse([&overrides](std::string_view name) -> std::optional<std::string> {
    if (auto it = overrides.find(name); it != overrides.end()) return it->second;
    if (const char* value = std::getenv(std::string(name).c_str())) return std::string(value);
    return std::nullopt;
  });
}

std::vector<std::string> Switches::names() {
  const Lookup nothing_set = [](std::string_view) { return std::optional<std::string>(); };
  Reader read(nothing_set);
  read_switches(read);
  std::vector<std::string> names;
  for (const std::string& name : read.names())
    if (name.starts_with("MEGANEURA_")) names.push_back(name);
  return names;
}

std::string switch_text(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t value : values) text += (text.empty() ? "" : ",") + std::to_string(value);
  return text;
}

}  // namespace mg
