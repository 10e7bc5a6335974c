// The switch table (config/switches.cpp): docs/SWITCHES.md lists exactly its switches, each kind
// parses its values and rejects others with the one message, and overrides replace the
// environment's values.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "meganeura/error.hpp"
#include "meganeura/switches.hpp"

namespace mg {
namespace {

// The switches named in the first column of docs/SWITCHES.md's tables.
std::set<std::string> documented_switches() {
  std::ifstream file(std::string(MEGANEURA_SOURCE_DIR) + "/docs/SWITCHES.md");
  EXPECT_TRUE(file) << "docs/SWITCHES.md is missing";
  const std::string start = "| `MEGANEURA_", end = "` |";
  std::set<std::string> names;
  for (std::string line; std::getline(file, line);) {
    if (!line.starts_with(start)) continue;
    const size_t close = line.find(end);
    if (close != std::string::npos) names.insert(line.substr(3, close - 3));
  }
  return names;
}

TEST(Switches, DocsListExactlyTheTable) {
  const std::vector<std::string> table = Switches::names();
  const std::set<std::string> in_table(table.begin(), table.end());
  EXPECT_EQ(in_table.size(), table.size()) << "a switch is read twice";
  const std::set<std::string> documented = documented_switches();
  for (const std::string& name : in_table)
    EXPECT_TRUE(documented.count(name)) << name << " is read but has no row in docs/SWITCHES.md";
  for (const std::string& name : documented)
    EXPECT_TRUE(in_table.count(name))
        << name << " has a row in docs/SWITCHES.md but the switch table does not read it";
}

// Parses `values` alone (no environment).
Switches parse(const std::map<std::string, std::string, std::less<>>& values) {
  return Switches::parse([&values](std::string_view name) -> std::optional<std::string> {
    if (auto it = values.find(name); it != values.end()) return it->second;
    return std::nullopt;
  });
}

void expect_rejected(const std::string& name, const std::string& value) {
  try {
    parse({{name, value}});
    ADD_FAILURE() << name << "=" << value << " was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(name + "='" + value + "': expected "), std::string::npos) << message;
    EXPECT_NE(message.find("; unset it for "), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(Switches, UnsetGivesTheDefaults) {
  const Switches switches = parse({});
  EXPECT_FALSE(switches.no_fusion);
  EXPECT_FALSE(switches.split_k.has_value());
  EXPECT_FALSE(switches.split_k_slices.has_value());
  EXPECT_TRUE(switches.attention_splits.empty());
  EXPECT_FALSE(switches.gemm_tile.has_value());
  EXPECT_EQ(switches.device, "");
  EXPECT_EQ(switches.cache_dir, "");
}

TEST(Switches, EachKindParsesItsValues) {
  const Switches switches = parse({{"MEGANEURA_NO_FUSION", "1"},
                                   {"MEGANEURA_SPLIT_K", "0"},
                                   {"MEGANEURA_SPLIT_K_SLICES", "13"},
                                   {"MEGANEURA_ATTENTION_SPLITS", "2,3,4"},
                                   {"MEGANEURA_GEMM_K_GROUPS", "4"},
                                   {"MEGANEURA_COOPMAT", "nv"},
                                   {"MEGANEURA_HALF_ACTIVATIONS", "bf16"},
                                   {"MEGANEURA_CPU_GEMM_BLOCK", "8x4"},
                                   {"MEGANEURA_GEMM_TILE", "64,x"},
                                   {"MEGANEURA_ATTENTION_BLOCKS", "48,8"},
                                   {"MEGANEURA_DEVICE", "llvmpipe"}});
  EXPECT_TRUE(switches.no_fusion);
  EXPECT_EQ(switches.split_k, false);
  EXPECT_EQ(switches.split_k_slices, 13);
  EXPECT_EQ(switches.attention_splits, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(switches.gemm_k_groups, 4);
  EXPECT_EQ(switches.coopmat, Switches::CoopMatrixExtension::nv);
  EXPECT_EQ(switches.half_activations, Switches::HalfActivations::bf16);
  EXPECT_EQ(parse({{"MEGANEURA_HALF_ACTIVATIONS", "0"}}).half_activations,
            Switches::HalfActivations::off);
  EXPECT_EQ(parse({{"MEGANEURA_HALF_ACTIVATIONS", "1"}}).half_activations,
            Switches::HalfActivations::on);
  EXPECT_EQ(switches.cpu_gemm_block, (std::array<int64_t, 2>{8, 4}));
  // Tile overrides stay text: the kernel reading one warns where it is malformed.
  EXPECT_EQ(switches.gemm_tile, "64,x");
  // Blocks are checked against the device where they are lowered.
  EXPECT_EQ(switch_text(switches.attention_blocks), "48,8");
  EXPECT_EQ(switches.device, "llvmpipe");
  // The workgroup GEMM's forced block: M, N, invocations and whether it splits its rows.
  const std::optional<Switches::WorkgroupBlock> whole =
      parse({{"MEGANEURA_WORKGROUP_BLOCK", "128,112,128"}}).workgroup_block;
  ASSERT_TRUE(whole);
  EXPECT_EQ(std::tuple(whole->m, whole->n, whole->invocations, whole->split_rows),
            std::tuple(int64_t{128}, int64_t{112}, int64_t{128}, false));
  const std::optional<Switches::WorkgroupBlock> split =
      parse({{"MEGANEURA_WORKGROUP_BLOCK", "256,128,256,1"}}).workgroup_block;
  ASSERT_TRUE(split);
  EXPECT_EQ(std::tuple(split->m, split->n, split->invocations, split->split_rows),
            std::tuple(int64_t{256}, int64_t{128}, int64_t{256}, true));
  EXPECT_FALSE(parse({{"MEGANEURA_WORKGROUP_BLOCK", "256,128,256,0"}}).workgroup_block->split_rows);
}

TEST(Switches, BadValuesAreRejectedByOneMessage) {
  for (const char* bad : {"2", "yes", "", "on"}) expect_rejected("MEGANEURA_NO_FUSION", bad);
  for (const char* bad : {"0", "1025", "13x", ""}) expect_rejected("MEGANEURA_SPLIT_K_SLICES", bad);
  for (const char* bad : {"2", "model", ""}) expect_rejected("MEGANEURA_COOP_SPLIT_MODEL", bad);
  for (const char* bad : {"two", "0", "2,2", "3,", "2,2,2,2"})
    expect_rejected("MEGANEURA_ATTENTION_SPLITS", bad);
  expect_rejected("MEGANEURA_GEMM_K_GROUPS", "3");
  expect_rejected("MEGANEURA_COOPMAT", "both");
  for (const char* bad : {"f32", "2", "BF16"}) expect_rejected("MEGANEURA_HALF_ACTIVATIONS", bad);
  expect_rejected("MEGANEURA_CPU_GEMM_BLOCK", "64x4");
  expect_rejected("MEGANEURA_ATTENTION_BLOCKS", "abc");
  expect_rejected("MEGANEURA_ATTENTION_COOP_BLOCK", "48");
  expect_rejected("MEGANEURA_WINOGRAD_WEIGHT_GRAD_TILE", "3");
  expect_rejected("MEGANEURA_COOP_GEMM_MIN", "-1");
  for (const char* bad : {"", "128,128", "100,128,256", "128,128,64", "128,128,128,2",
                          "48,128,256,1", "1024,128,256", "128,x,256", "64,64,256",
                          "128,64,128,1"})
    expect_rejected("MEGANEURA_WORKGROUP_BLOCK", bad);
}

TEST(Switches, CacheFolderFollowsItsFallbacks) {
  EXPECT_EQ(parse({{"HOME", "/home/me"}}).cache_dir, "/home/me/.cache/meganeura");
  EXPECT_EQ(parse({{"HOME", "/home/me"}, {"XDG_CACHE_HOME", "/xdg"}}).cache_dir, "/xdg/meganeura");
  EXPECT_EQ(parse({{"HOME", "/home/me"}, {"MEGANEURA_CACHE_DIR", "/kernels"}}).cache_dir,
            "/kernels");
  EXPECT_EQ(parse({{"HOME", "/home/me"}, {"MEGANEURA_NO_CACHE", "1"}}).cache_dir, "");
}

TEST(Switches, OverridesReplaceTheEnvironment) {
  EXPECT_TRUE(Switches::from_environment({{"MEGANEURA_NO_COOPMAT", "1"}}).no_coopmat);
  EXPECT_FALSE(Switches::from_environment({{"MEGANEURA_NO_COOPMAT", "0"}}).no_coopmat);
}

}  // namespace
}  // namespace mg
