#include "backends/vulkan/kernels/index_codegen.hpp"

#include <cmath>
#include <cstdio>

namespace mg::kernels {

std::string glsl_uint(int64_t value) {
  return std::to_string(value) + "u";
}

std::string glsl_float(double value) {
  if (std::isinf(value)) return value > 0 ? "(1.0 / 0.0)" : "(-1.0 / 0.0)";
  char buffer[48];
  std::snprintf(buffer, sizeof(buffer), "%.9g", value);
  std::string text = buffer;
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

std::string coordinates_glsl(const Shape& shape, const std::string& flat,
                             const std::string& prefix) {
  std::string text = "  uint " + prefix + "_rest = " + flat + ";\n";
  for (size_t axis = shape.size(); axis-- > 0;) {
    const std::string name = prefix + std::to_string(axis);
    text += "  uint " + name + " = " + prefix + "_rest % " + glsl_uint(shape[axis]) + "; " +
            prefix + "_rest /= " + glsl_uint(shape[axis]) + ";\n";
  }
  return text;
}

std::string flat_index_glsl(const Shape& shape, const std::vector<std::string>& coordinates) {
  const std::vector<int64_t> strides = row_major_strides(shape);
  std::string text;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] == 1) continue;
    if (!text.empty()) text += " + ";
    text += coordinates[axis] + " * " + glsl_uint(strides[axis]);
  }
  return text.empty() ? "0u" : text;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string vector_buffer_view(const std::string& array, size_t binding, bool write,
                               const std::string& vector_type) {
  return "layout(std430, set = 0, binding = " + std::to_string(binding) + ") " +
         (write ? "buffer" : "readonly buffer") + " buffer_" + array + " { " + vector_type + " " +
         array + "[]; };\n";
}

}  // namespace mg::kernels
