#pragma once
// The one parser of the switches' numbers (config/switches.cpp), also used by the kernels that
// read a tile override's text (MEGANEURA_GEMM_TILE, MEGANEURA_COOP_BLOCK).
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace mg::config {

// Exactly `count` whole numbers separated by `separator` ("64,32,4"), or nothing when `text` is
// not exactly that.
std::optional<std::vector<int64_t>> parse_integers(std::string_view text, size_t count,
                                                   char separator = ',');

}  // namespace mg::config
