#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scratch_dir.hpp"

namespace mg::data::testing {

inline std::filesystem::path audio_fixture(const std::string& name) {
  return std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests" / "fixtures" / "audio" / name;
}

inline std::filesystem::path whisper_twin() {
  return std::filesystem::path(MEGANEURA_SOURCE_DIR) / "tests" / "parity" / "whisper_features.py";
}

template <typename T>
std::vector<T> read_raw(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<T> values(bytes / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(T)));
  return values;
}

template <typename T>
void write_raw(const std::filesystem::path& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
}

inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double largest = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return largest;
}

}  // namespace mg::data::testing
