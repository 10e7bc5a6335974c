#include "backends/vulkan/kernels/index_codegen.hpp"

#include <algorithm>
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

namespace {

// The coordinates of `flat` over `extents`, row-major, named prefix0, prefix1, ...; with
// `outermost_modulo` the outermost is reduced modulo its extent like the others, else it is what
// is left after them (for a flat index below the product of the extents).
std::string coordinates_text(const std::vector<int64_t>& extents, const std::string& flat,
                             const std::string& prefix, bool outermost_modulo) {
  std::string text = "  uint " + prefix + "_rest = " + flat + ";\n";
  const size_t last_with_modulo = outermost_modulo ? 0 : 1;
  for (size_t axis = extents.size(); axis-- > last_with_modulo;) {
    const std::string name = prefix + std::to_string(axis);
    text += "  uint " + name + " = " + prefix + "_rest % " + glsl_uint(extents[axis]) + "; " +
            prefix + "_rest /= " + glsl_uint(extents[axis]) + ";\n";
  }
  if (!outermost_modulo && !extents.empty())
    text += "  uint " + prefix + "0 = " + prefix + "_rest;\n";
  return text;
}

}  // namespace

std::string coordinates_glsl(const Shape& shape, const std::string& flat,
                             const std::string& prefix) {
  return coordinates_text(shape, flat, prefix, true);
}

RowLayout row_layout(const Shape& shape, const std::vector<int64_t>& reduced_axes) {
  RowLayout layout;
  const std::vector<int64_t> strides = row_major_strides(shape);
  // Per kind, the merged axes' extents and strides, outermost first.
  std::vector<int64_t> kept_extents, kept_strides, reduced_extents, reduced_strides;
  int previous_kind = -1;  // of the last axis of more than one element: 0 kept, 1 reduced
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] == 1) continue;
    const bool reduced = std::find(reduced_axes.begin(), reduced_axes.end(),
                                   static_cast<int64_t>(axis)) != reduced_axes.end();
    std::vector<int64_t>& extents = reduced ? reduced_extents : kept_extents;
    std::vector<int64_t>& kind_strides = reduced ? reduced_strides : kept_strides;
    // Adjacent in the shape (size-1 axes between take no place) and contiguous: one axis.
    if (previous_kind == static_cast<int>(reduced) &&
        kind_strides.back() == shape[axis] * strides[axis]) {
      extents.back() *= shape[axis];
      kind_strides.back() = strides[axis];
    } else {
      extents.push_back(shape[axis]);
      kind_strides.push_back(strides[axis]);
    }
    previous_kind = static_cast<int>(reduced);
  }
  for (int64_t extent : kept_extents) layout.rows *= extent;
  for (int64_t extent : reduced_extents) layout.row_length *= extent;
  std::string function = "uint input_index(uint o, uint r) {\n";
  function += coordinates_text(kept_extents, "o", "k", false) +
              coordinates_text(reduced_extents, "r", "q", false);
  function += "  return 0u";
  for (size_t k = 0; k < kept_extents.size(); ++k)
    function += " + k" + std::to_string(k) + " * " + glsl_uint(kept_strides[k]);
  for (size_t k = 0; k < reduced_extents.size(); ++k)
    function += " + q" + std::to_string(k) + " * " + glsl_uint(reduced_strides[k]);
  layout.index_function = function + ";\n}\n";
  return layout;
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

std::string transpose_index_function_glsl(const std::vector<int64_t>& permutation,
                                          const Shape& input, const Shape& output,
                                          const std::string& function, bool forward) {
  std::vector<std::string> coordinates(permutation.size());
  for (size_t axis = 0; axis < permutation.size(); ++axis) {
    const size_t from = static_cast<size_t>(permutation[axis]);
    if (forward)
      coordinates[axis] = "c" + std::to_string(from);
    else
      coordinates[from] = "c" + std::to_string(axis);
  }
  return "uint " + function + "(uint i) {\n" + coordinates_glsl(forward ? input : output, "i") +
         "  return " + flat_index_glsl(forward ? output : input, coordinates) + ";\n}\n";
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
