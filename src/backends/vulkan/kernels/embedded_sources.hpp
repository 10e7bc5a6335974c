#pragma once
#include <string_view>
#include <vector>

namespace mg::kernels {

// A GLSL source compiled into the binary: file name (e.g. "gemm.comp") and its text.
struct EmbeddedSource {
  std::string_view file_name;
  std::string_view text;
};

const std::vector<EmbeddedSource>& embedded_sources();

}  // namespace mg::kernels
